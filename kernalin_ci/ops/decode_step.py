"""decode_step: a whole attention decode step for a batch (docs/ops.md).

Rotate q and k at `positions`, write the rotated k and v into the paged caches at
`slot_mapping`, then paged decode attention over `kv_lens`, which include the new
token. One launch or several, fused or not: the contract is the step.

Every case is a decode loop (`loop`; the loop's model is ops/decode_loop.py, shared
with the composed rope -> kv_append -> attention pipeline check): many steps on ragged
sequences, the output of each step against float64 attention over the reference's own
history, and both whole caches diffed after each step (the worker runs it, the parent
judges it: kernalin_ci.verify's loop_drive.py and loop_judge.py).
"""

from __future__ import annotations

import math
from typing import Any

from kernalin_ci.device import DEVICES
from kernalin_ci.lazy import torch
from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops import attention_features as af
from kernalin_ci.ops import kv_quant, paged
from kernalin_ci.ops.attention_decode_paged import gather
from kernalin_ci.ops.base import (
    Case,
    Expected,
    Op,
    Param,
    Params,
    Tensors,
    capture_case,
    capture_head_dims,
    positive,
    valid_dims,
)
from kernalin_ci.ops.bench_shapes import BenchRequest, len_label, ragged_lens
from kernalin_ci.ops.decode_loop import (
    DecodeLoop,
    LoopShape,
    crossing_window,
    init_state,
    next_step,
    rope_params,
    step_arguments,
)
from kernalin_ci.ops.rope import PARAMS as ROPE_PARAMS
from kernalin_ci.ops.rope import rotate

PARAMS = tuple(p for p in ROPE_PARAMS if p.name in ("style", "base", "rotary_dim")) + (
    Param("block_size", 16, int, "slots per cache block", check=positive),
    paged.LAYOUT,
    Param("steps", 64, int, "decode steps of each loop case", check=positive),
    Param(
        "head_dim",
        None,
        int,
        "pin D for every case (default: 40 on the CPU, 128 and 80 on a GPU, moved to a head dim the kernel "
        "takes when it refuses one)",
        check=positive,
    ),
    Param("num_q_heads", None, int, "pin Hq", check=positive),
    Param("num_kv_heads", None, int, "pin Hkv", check=positive),
    *af.FEATURE_PARAMS,  # the step's attention, as the attention ops define them (docs/ops.md)
    *kv_quant.KV_PARAMS,  # an FP8 cache: the step quantises on write and dequantises on read
)


class DecodeStep(Op):
    name = "decode_step"
    params = PARAMS
    written = ("k_cache", "v_cache")
    structural = "decode_step"
    decode_role = "decode_step"
    paged_cache = True
    rotates = True
    attends = True
    appends = True
    domain_axes = ("head_dim", "num_q_heads", "num_kv_heads", "dtype", "block_size")

    def _dims(
        self, params: Params, hq: int, hkv: int, D: int, start_lens: list[int], steps: int, **extra: Any
    ) -> dict[str, Any]:
        D = params.get("head_dim") or D
        r = params.get("rotary_dim") or D
        hq = params.get("num_q_heads") or hq
        hkv = params.get("num_kv_heads") or hkv
        if params.get("num_q_heads") and not params.get("num_kv_heads"):
            hkv = hkv if hq % hkv == 0 else 1
        return {"Hq": hq, "Hkv": hkv, "D": max(D, r), "start_lens": list(start_lens), "steps": steps, **extra}

    def cases(self, params: Params, device: str, dtype: str | None) -> list[Case]:
        """Decode loops on ragged sequences (one starts empty: its first token is at position 0), GQA, the
        free blocks canary-filled. `stale`: the free slots of the sequences' own blocks hold finite data
        left by an earlier request, so a step that attends the new token's slot before writing it gives a
        finite wrong output whose cause can be named; without it the same read is the canary. With a
        sliding window, each loop has one more sequence that crosses it mid-loop (`crossing_window`); with a
        soft-cap or sinks, a short loop where each matters (`feature_loops`)."""
        main = dtype or "float32"
        steps = int(params["steps"])

        def lens(start: list[int], n: int) -> list[int]:
            return crossing_window(start, params, n)

        if DEVICES[device].interpreted:  # the interpreter: small heads, one loop
            loop = Case("decode-loop", self._dims(params, 4, 2, 40, lens([0, 17], steps), steps, stale=True), main, 1)
            return [loop, *self.feature_loops(params, main, 4, 2, 40)]
        long = lens([0, 5, 17, 63, 200], 2 * steps)
        cases = [
            Case("decode-loop", self._dims(params, 8, 2, 128, long, 2 * steps, stale=True), main, 1),
            # D 80: a head dim under a power-of-two tile (a padded tile left unmasked spills past the head)
            Case("decode-loop-poisoned", self._dims(params, 16, 4, 80, lens([1, 31, 100], steps), steps), main, 2),
        ]
        if dtype is None:
            for i, dt in enumerate(("float16", "bfloat16")):
                cases.append(
                    Case(
                        f"decode-loop-{dt}",
                        self._dims(params, 8, 2, 128, lens([0, 5, 17, 63, 200], steps), steps, stale=True),
                        dt,
                        10 + i,
                    )
                )
        return cases + self.feature_loops(params, main, 8, 2, 128)

    def feature_loops(self, params: Params, dtype: str, hq: int, hkv: int, D: int) -> list[Case]:
        """The attention ops' `cap-saturation` and `sink-dominates` (docs/ops.md, "Attention features") as short
        loops (4 steps; a sequence starting empty, one across 32- and 64-key tiles, and the one crossing the
        window): queries that put |scale * q.k| around 8 caps (tanh saturated for most keys, its slope still
        there for a few), every sink 7 above N(0, 1) (the sink takes ~99.9% of the mass). The window's edge is
        in every loop (`crossing_window`), ALiBi's ends are every step's first and last key."""
        n = min(int(params["steps"]), 4)
        start = crossing_window([0, 30, 61], params, n)
        cases = []
        if params.get("logit_cap"):  # scale = 0.9 / sqrt(D): |scale * q.k| ~ 0.9 q_std
            q_std = 8.0 * float(params["logit_cap"]) / 0.9
            dims = self._dims(params, hq, hkv, D, start, n, stale=True, q_std=q_std)
            cases.append(Case("cap-saturation", dims, dtype, 61, ("cap",)))
        if params.get("sinks"):
            dims = self._dims(params, hq, hkv, D, start, n, stale=True, sink_shift=7.0)
            cases.append(Case("sink-dominates", dims, dtype, 62, ("sinks",)))
        return cases

    @staticmethod
    def check_params(params: Params) -> str | None:
        return kv_quant.check_params(params)

    def redraws(self, params: Params) -> bool:
        """An FP8 cache and its positive scales are not redrawn (standard normal): each round builds them anew."""
        return self.redraw_inputs and not kv_quant.spec_of(params)

    def unanalysed(self, params: Params) -> list[str]:
        """The attention features and an FP8 cache switched on: the structural analysis does not model them."""
        return af.unanalysed(params) + kv_quant.unanalysed(params)

    def probe(self, params: Params, dtype: str | None) -> Case:
        return Case("pos0-probe", self._dims(params, 8, 2, 64, [0], 1, poison=False), dtype or "float32", 0, ("probe",))

    def shape_case(self, params: Params, dtype: str) -> Case:
        """A short loop (4 steps, one sequence starting empty, one across a block boundary): the small case
        kernalin_ci.domain moves to each head dim, head count, dtype or block size, and probes a shape with."""
        return Case("shape", self._dims(params, 4, 2, 64, [0, 17], 4, stale=True), dtype, 40, ("shape",))

    def validate_case(self, case: Case) -> str | None:
        d = case.dims
        problem = valid_dims(d, ("Hq", "Hkv", "D", "steps"))
        if problem:
            return problem
        if d["Hq"] % d["Hkv"]:
            return "Hq must be a positive multiple of Hkv"
        lens = d.get("start_lens")
        if not isinstance(lens, list) or not lens or not all(isinstance(x, int) and x >= 0 for x in lens):
            return "start_lens must be a non-empty list of lengths >= 0"
        q_std, shift = d.get("q_std", 1.0), d.get("sink_shift", 0.0)
        numbers = (q_std, shift)
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in numbers):
            return "q_std and sink_shift must be finite numbers"
        if q_std <= 0:
            return "q_std must be positive"
        return None

    def loop(self, case: Case, params: Params, poison: bool) -> DecodeLoop:
        """Every case is a decode loop (ops/decode_loop.py), one call of the entry per step. Without poison
        (the probe, a capture) zeros everywhere outside the history."""
        d = case.dims
        shape = LoopShape(
            d["Hq"],
            d["Hkv"],
            d["D"],
            list(d["start_lens"]),
            int(params["block_size"]),
            paged.layout_of(params),
            int(d.get("free_blocks", 5)),
            bool(d.get("stale", False)) and poison,
            bool(d.get("poison", True)) and poison,
        )
        return DecodeLoop(
            shape,
            case.dtype,
            case.seed,
            int(d["steps"]),
            rope_params(params),
            features=af.of_params(params),
            kv=kv_quant.spec_of(params),
            q_std=float(d.get("q_std", 1.0)),
            sink_shift=float(d.get("sink_shift", 0.0)),
        )

    def inputs(self, case: Case, params: Params, device: str, poison: bool = True) -> Tensors:
        """The first step of the case's loop (what the structural capture and a single call see)."""
        loop = self.loop(case, params, poison)
        s = init_state(loop, device)
        return step_arguments(s, next_step(s, 0, case.dtype), device)

    def outputs(self, ret: Any, kw: Tensors) -> Tensors:
        return {"out": ret, "k_cache": kw["k_cache"], "v_cache": kw["v_cache"]}

    def reference(self, kw: Tensors, params: Params) -> Expected:
        """One step in float64 from the inputs before the call: q and k rotated, the new token's rotated key
        and value placed at position kv_len - 1, attention over kv_len positions (with the features). With an
        FP8 cache the cache read with its scales and the new token quantised as it is stored, with the
        attention ops' FP8 slack."""
        D = kw["q"].shape[-1]
        r = params.get("rotary_dim") or D
        pos = kw["positions"].to("cpu")
        qr = rotate(kw["q"].to("cpu"), pos, params["style"], params["base"], r)
        kr = rotate(kw["k"].to("cpu"), pos, params["style"], params["base"], r)
        v = kw["v"].to("cpu", torch.float64)
        lay = paged.layout_of(params)
        kc, vc = paged.nhd(kw["k_cache"], lay).to("cpu"), paged.nhd(kw["v_cache"], lay).to("cpu")
        tb = kw["block_tables"].to("cpu")
        quant = kv_quant.spec_of(params)
        ks, vs = kw.get("k_scale"), kw.get("v_scale")
        if quant:  # the new token as the cache stores it
            kr = kv_quant.dequantise(kv_quant.quantise(kr, ks, quant, 1).permute(1, 0, 2), ks).permute(1, 0, 2)
            v = kv_quant.dequantise(kv_quant.quantise(v, vs, quant, 1).permute(1, 0, 2), vs).permute(1, 0, 2)
        K, V = [], []
        for b, L in enumerate(kw["kv_lens"].tolist()):
            old_k = kv_quant.dequantise(gather(kc, tb, b, L - 1), ks).to(torch.float64)
            old_v = kv_quant.dequantise(gather(vc, tb, b, L - 1), vs).to(torch.float64)
            K.append(torch.cat([old_k, kr[b][:, None, :]], dim=1))
            V.append(torch.cat([old_v, v[b][:, None, :]], dim=1))
        feat = af.Features.of(params, kw)
        out, slack, tf32 = ac.reference_out(qr, K, V, kw["scale"], kc.shape[2], feat, quant is not None, kw["q"].dtype)
        return Expected({"out": out}, row_slack=slack, tf32_slack=tf32)

    def row_label(self, case: Case, kw: Tensors, name: str, row: int) -> str:
        b, h = divmod(row, case.dims["Hq"])
        return f"b={b} h={h} (kv_len={int(kw['kv_lens'][b])})"

    def bench_cases(self, params: Params, device: str, request: BenchRequest) -> list[Case]:
        """One step at each attention shape: B sequences whose kv_len (the new token included) is the shape's."""
        hq, hkv, D = request.heads(params)
        cases = []
        for i, s in enumerate(request.attention_shapes()):
            lens = ragged_lens(s["batch"], s["kv_len"], ragged=not s.get("explicit"))
            dims = self._dims(params, hq, hkv, D, [L - 1 for L in lens], 1, poison=False)
            cases.append(
                Case(
                    f"B={s['batch']} kv_len={len_label(lens)} Hq={dims['Hq']} Hkv={dims['Hkv']} "
                    f"D={dims['D']} {request.dtype}",
                    dims,
                    request.dtype,
                    1000 + i,
                    ("bench",),
                )
            )
        return cases

    def capture_cases(self, params: Params) -> list[Case]:
        """Three sequences (one at position 0), GQA, kv_lens across a block boundary, one step; float32, where
        the precision a float32 model needs (angles) is visible."""
        hq = int(params.get("num_q_heads") or 4)
        hkv = int(params.get("num_kv_heads") or (2 if hq % 2 == 0 else 1))
        return [
            capture_case(
                {
                    "Hq": hq,
                    "Hkv": hkv if hq % hkv == 0 else 1,
                    "D": max(D, params.get("rotary_dim") or D),
                    "start_lens": [0, 5, 19],
                    "steps": 1,
                    "poison": False,
                },
                "float32",
            )
            for D in capture_head_dims(params)
        ]

    def capture_twin(self, dims: dict[str, Any]) -> dict[str, Any] | None:
        """A fourth sequence, 40 tokens in."""
        return {**dims, "start_lens": [*dims["start_lens"], 40]}


OP_CLASS = DecodeStep
