"""What attention.decode and attention.decode_paged share: the float64 definition,
the case plan (lengths around tile sizes, GQA ratios, large scores, poisoned tails),
and the bug fingerprints (alternative references a known bug would produce)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeGuard

from kernalin_ci.device import DEVICES
from kernalin_ci.lazy import torch
from kernalin_ci.ops import attention_features as af
from kernalin_ci.ops import kv_quant
from kernalin_ci.ops.base import (
    DTYPE_BYTES,
    Case,
    Op,
    Param,
    Params,
    Traffic,
    capture_case,
    capture_head_dims,
    capture_heads,
    positive,
)
from kernalin_ci.ops.bench_shapes import BenchRequest, len_label, ragged_lens
from kernalin_ci.runtime.rows import row_errors

# Optional shape params: pin a dimension for kernels specialised to one model.
SHAPE_PARAMS = (
    Param("head_dim", None, int, "pin D for every case (default: cases use 64 and 128)", check=positive),
    Param("num_q_heads", None, int, "pin Hq (default: cases vary Hq/Hkv over 1, 4, 6, 8)", check=positive),
    Param("num_kv_heads", None, int, "pin Hkv (default: cases vary it)", check=positive),
)
FEATURE_PARAMS = af.FEATURE_PARAMS + kv_quant.KV_PARAMS

TILES = (16, 32, 64, 128, 256)


def tile_lengths() -> list[int]:
    """kv_len 1 and 2, t-1/t/t+1 around every power-of-two tile, and several tiles."""
    lens = [1, 2]
    for t in TILES:
        lens += [t - 1, t, t + 1]
    return lens + [300, 515, 1000]


def long_length(device: str) -> int:
    return 2048 if DEVICES[device].interpreted else 16384


def plan(params: Params, device: str, dtype: str | None) -> list[Case]:
    """The default case set, as (name, dims, dtype) before op-specific dims are added."""
    main = dtype or "float32"
    D64 = params.get("head_dim") or 64
    D128 = params.get("head_dim") or 128

    def heads(hq: int, hkv: int) -> tuple[int, int]:
        hq = params.get("num_q_heads") or hq
        hkv = params.get("num_kv_heads") or hkv
        if params.get("num_q_heads") and not params.get("num_kv_heads"):
            hkv = hkv if hq % hkv == 0 else 1
        return hq, hkv

    def dims(hq: int, hkv: int, D: int, lens: list[int], **extra: Any) -> dict[str, Any]:
        hq, hkv = heads(hq, hkv)
        return {"Hq": hq, "Hkv": hkv, "D": D, "kv_lens": list(lens), "scale": D**-0.5, **extra}

    long = long_length(device)
    cases: list[Case] = [
        Case("tiles", dims(8, 2, D64, tile_lengths()), main, 1, ("tiles",)),
        Case("gqa-1", dims(4, 4, D128, [1, 33, 64, 200], scale=0.7 * D128**-0.5), main, 2),
        Case("gqa-8", dims(16, 2, D64, [5, 17, 129, 300]), main, 3),
        Case("gqa-6", dims(12, 2, D64, [2, 63, 65, 257]), main, 4),
        Case("large-scores", dims(8, 2, D64, [2, 16, 100, 257], qk_std=6.5), main, 5, ("large-scores",)),
        Case("stale-tail", dims(4, 4, D128, [3, 31, 64, 190], tail="stale"), main, 6, ("stale-tail",)),
        Case("fresh-inputs", dims(4, 4, D128, [1, 33, 64, 200], scale=0.7 * D128**-0.5), main, 7, ("repeat-of:gqa-1",)),
        Case("long", dims(8, 2, D64, [long, long * 3 // 5 + 3]), main, 8, ("long",)),
    ]
    cases += af.plan_cases(params, cases[0].dims, main)  # none unless a feature param is on
    if kv_quant.spec_of(params):  # cache values at the format's largest and smallest normals, subnormals
        cases.append(Case("fp8-edges", dims(8, 4, D64, [1, 17, 64, 129]), main, 64, ("fp8-edges",)))
    if dtype is None:  # dtype sweep on a smaller set
        for i, dt in enumerate(("float16", "bfloat16")):
            cases.append(Case(f"gqa-8-{dt}", dims(16, 2, D64, [5, 17, 129, 300]), dt, 20 + i))
            cases.append(
                Case(
                    f"large-scores-{dt}", dims(8, 2, D64, [2, 16, 100, 257], qk_std=6.5), dt, 30 + i, ("large-scores",)
                )
            )
    return cases


def probe_dims(params: Params) -> dict[str, Any]:
    """The single demo probe: batch 1, kv_len 1, zeros past it, no poison."""
    D = params.get("head_dim") or 64
    hq = params.get("num_q_heads") or 8
    hkv = params.get("num_kv_heads") or 2
    return {"Hq": hq, "Hkv": hkv, "D": D, "kv_lens": [1], "scale": D**-0.5, "tail": "zeros"}


def shape_dims(params: Params) -> dict[str, Any]:
    """A small case for one shape of the domain: two sequences, kv_len 1 and 19, NaN past them."""
    D = params.get("head_dim") or 64
    hq = params.get("num_q_heads") or 8
    hkv = params.get("num_kv_heads") or (2 if hq % 2 == 0 else 1)
    return {"Hq": hq, "Hkv": hkv, "D": D, "kv_lens": [1, 19], "scale": D**-0.5}


def head_map(Hq: int, Hkv: int) -> list[int]:
    return [h // (Hq // Hkv) for h in range(Hq)]


def fp8_fingerprints(
    q: torch.Tensor,
    keys_of: Callable[[int, int, Any], torch.Tensor],
    values_of: Callable[[int, int, Any], torch.Tensor],
    kv_lens: list[int],
    scale: float,
    Hq: int,
    Hkv: int,
    quant: kv_quant.KvQuant,
    scales: dict[str, Any],
    feat: af.Features | None,
) -> list[tuple[str, dict[str, Any]]]:
    """What a kernel that dequantises an FP8 cache with the wrong scale computes (`keys_of(b, L, scale)`:
    [Hkv, L, D] float64 read with that scale): K's scale for V, V's for K, the first head's for every head,
    none, the scale divided."""
    good = head_map(Hq, Hkv)
    out = []
    for _why, wrong in kv_quant.read_variants(scales, quant):
        K = [keys_of(b, L, wrong["k_scale"]) for b, L in enumerate(kv_lens)]
        V = [values_of(b, L, wrong["v_scale"]) for b, L in enumerate(kv_lens)]
        out.append(("kv-scale", {"out": attend(q, K, V, scale, good, feat=feat)}))
    return out


def reference_out(
    q: torch.Tensor,
    K: list[torch.Tensor],
    V: list[torch.Tensor],
    scale: float,
    Hkv: int,
    feat: af.Features,
    quantised: bool,
    dtype: Any = None,
) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
    """The float64 output, its per-row slack (Expected.row_slack) and its per-row TF32 slack
    (Expected.tf32_slack) over the caches' float64 keys and values. With sinks: the output's underflow in the
    kernel's dtype (`dtype`, default q's). With an FP8 cache: a kernel may round each dequantised value to that
    dtype before its dot (a tensor-core FP8 kernel must), a second rounding the stored bytes do not show; the
    slack is how far that rounding moves each row (the same definition over the rounded values). With sinks in
    a float32 case: how far TF32 operands of q.k move each row (`tf32_scores_slack`), added only where the
    case's dots run on TF32."""
    dtype = dtype or q.dtype
    hmap = head_map(q.shape[1], Hkv)
    out = attend(q, K, V, scale, hmap, feat=feat)
    slack = af.underflow_slack(out, dtype) if feat.sinks is not None else torch.zeros(out.shape[:-1])
    if quantised:

        def rounded(ts: list[torch.Tensor]) -> list[torch.Tensor]:
            return [t.to(dtype).to(torch.float64) for t in ts]

        alt = attend(q, rounded(K), rounded(V), scale, hmap, feat=feat)
        slack = slack.reshape(-1) + row_errors(alt, out)
    row_slack = {"out": slack.reshape(-1).to(torch.float64)} if feat.sinks is not None or quantised else {}
    tf32 = {}
    if feat.sinks is not None and dtype == torch.float32:
        tf32 = {"out": tf32_scores_slack(q, K, V, scale, hmap, feat, out)}
    return out, row_slack, tf32


def tf32_operand(t: torch.Tensor) -> torch.Tensor:
    """T as a tensor core reads a float32 operand in TF32: its mantissa truncated to 10 bits (float64 back)."""
    bits = t.to(torch.float32).contiguous().view(torch.int32)
    return (bits & ~0x1FFF).view(torch.float32).to(torch.float64)


def tf32_scores_slack(
    q: torch.Tensor,
    K: list[torch.Tensor],
    V: list[torch.Tensor],
    scale: float,
    hmap: list[int],
    feat: af.Features,
    out: torch.Tensor,
) -> torch.Tensor:
    """Per output row, how far TF32 operands of q.k move it: the same definition over q and keys truncated to
    TF32. Softmax's normalisation cancels most of a score's error (TF32_TOLERANCE covers what is left), but a
    sink's exact logit in the denominator does not share it: where the sink takes most of the mass, a row's
    relative error is the scores' own error (2^-10 of |score|; 0.017 at scores near 100, measured on an H100)."""
    alt = attend(tf32_operand(q), [tf32_operand(k) for k in K], V, scale, hmap, feat=feat)
    return row_errors(alt, out).reshape(-1).to(torch.float64)


def attend(
    q: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    scale: float,
    hmap: list[int],
    normalize: bool = True,
    feat: af.Features | None = None,
    cap_first: bool = False,
) -> torch.Tensor:
    """The definition in float64: q [B, Hq, D]; keys[b], values[b]: [Hkv, L_b, D], the sequence's whole
    history (the query is its last position). `feat`: the attention features (window, soft-cap, ALiBi,
    sinks); `cap_first`: the soft-cap applied before the scale (a bug's fingerprint)."""
    q = q.to(torch.float64)
    out = torch.empty_like(q)
    idx = torch.tensor(hmap)
    heads = torch.arange(q.shape[1])
    for b in range(q.shape[0]):
        K = keys[b].to(torch.float64)[idx]  # [Hq, L, D]
        V = values[b].to(torch.float64)[idx]
        if feat is not None and not feat.off:
            raw = torch.einsum("hd,hld->hl", q[b], K)
            s = af.scores(raw if cap_first else scale * raw, K.shape[1], feat, heads, cap_first, scale)
            out[b] = af.softmax_v(s, V, feat, heads, normalize)
            continue
        s = scale * torch.einsum("hd,hld->hl", q[b], K)
        if normalize:
            p = torch.softmax(s, dim=-1)
        else:
            p = torch.exp(s - s.max(dim=-1, keepdim=True).values)
        out[b] = torch.einsum("hl,hld->hd", p, V)
    return out


def validate_dims(dims: dict[str, Any]) -> str | None:
    """A --case given by hand: the shape rules of docs/ops.md."""
    hq, hkv = dims.get("Hq"), dims.get("Hkv")
    if not _positive_int(hq) or not _positive_int(hkv) or hq % hkv:
        return "Hq must be a positive multiple of Hkv"
    lens = dims.get("kv_lens")
    if not isinstance(lens, list) or not lens or not all(_positive_int(L) for L in lens):
        return "kv_lens must be a non-empty list of lengths >= 1"
    if not _positive_int(dims.get("D")):
        return "D must be a positive integer"
    if not isinstance(dims.get("scale"), (int, float)) or isinstance(dims.get("scale"), bool):
        return "scale must be a number"
    return None


def _positive_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def fingerprints(
    q: torch.Tensor,
    keys_of: Callable[[int, int], torch.Tensor],
    values_of: Callable[[int, int], torch.Tensor],
    kv_lens: list[int],
    scale: float,
    Hq: int,
    Hkv: int,
    D: int,
    tail_finite: bool,
    feat: af.Features | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """Alternative outputs that known bugs would produce. `keys_of(b, L)` gives [Hkv, L, D]. With attention
    features on, each feature's own bugs come first (a wrong window, the cap before the scale, ...)."""
    B = len(kv_lens)
    good = head_map(Hq, Hkv)
    K = [keys_of(b, L) for b, L in enumerate(kv_lens)]
    V = [values_of(b, L) for b, L in enumerate(kv_lens)]
    fps = []
    if feat is not None and not feat.off:
        for cls, wrong, cap_first in af.variants(feat, Hq, Hkv):
            fps.append((cls, {"out": attend(q, K, V, scale, good, feat=wrong, cap_first=cap_first)}))
    if Hq != Hkv:
        fps.append(("gqa-mapping", {"out": attend(q, K, V, scale, [h % Hkv for h in range(Hq)], feat=feat)}))
    fps.append(("softmax-no-normalize", {"out": attend(q, K, V, scale, good, normalize=False, feat=feat)}))
    fps.append(("scale", {"out": attend(q, K, V, 1.0, good, feat=feat)}))
    fps.append(("scale", {"out": attend(q, K, V, scale * scale, good, feat=feat)}))
    if not math.isclose(scale, D**-0.5):
        fps.append(("scale", {"out": attend(q, K, V, D**-0.5, good, feat=feat)}))
    if tail_finite:
        K1 = [keys_of(b, L + 1) for b, L in enumerate(kv_lens)]
        V1 = [values_of(b, L + 1) for b, L in enumerate(kv_lens)]
        fps.append(("kv-mask", {"out": attend(q, K1, V1, scale, good, feat=feat)}))
    Km = [keys_of(b, max(L - 1, 1)) for b, L in enumerate(kv_lens)]
    Vm = [values_of(b, max(L - 1, 1)) for b, L in enumerate(kv_lens)]
    fps.append(("kv-mask", {"out": attend(q, Km, Vm, scale, good, feat=feat)}))
    if B > 1:
        K0 = [keys_of(0, L) for L in kv_lens]
        V0 = [values_of(0, L) for L in kv_lens]
        fps.append(("stride", {"out": attend(q, K0, V0, scale, good, feat=feat)}))
    return fps


def row_label(dims: dict[str, Any], row: int) -> str:
    """Name output row `row` of out [B, Hq, D] with the facts that matter."""
    hq = dims["Hq"]
    b, h = divmod(row, hq)
    return f"b={b} h={h} (kv_len={dims['kv_lens'][b]})"


class AttentionOp(Op):
    """What both attention ops answer alike: shape rules, benchmark shapes, the capture call, the analysis."""

    structural = "attention"
    decode_role = "attention"
    attends = True

    def unanalysed(self, params: Params) -> list[str]:
        """The attention features and an FP8 cache switched on: the structural analysis does not model them."""
        return af.unanalysed(params) + kv_quant.unanalysed(params)

    @staticmethod
    def check_params(params: Params) -> str | None:
        return kv_quant.check_params(params)

    def redraws(self, params: Params) -> bool:
        """An FP8 cache and its positive scales are not redrawn (standard normal): each round builds them anew."""
        return self.redraw_inputs and not kv_quant.spec_of(params)

    def validate_case(self, case: Case) -> str | None:
        return validate_dims(case.dims)

    def bench_cases(self, params: Params, device: str, request: BenchRequest) -> list[Case]:
        hq, hkv, D = request.heads(params)
        cases = []
        for i, s in enumerate(request.attention_shapes()):
            lens = ragged_lens(s["batch"], s["kv_len"], ragged=not s.get("explicit"))
            dims = {"Hq": hq, "Hkv": hkv, "D": D, "kv_lens": lens, "scale": D**-0.5}
            cases.append(
                Case(
                    f"B={s['batch']} kv_len={len_label(lens)} Hq={hq} Hkv={hkv} D={D} {request.dtype}",
                    dims,
                    request.dtype,
                    1000 + i,
                    ("bench",),
                )
            )
        return cases

    def traffic(self, case: Case, params: Params) -> Traffic | None:
        """q read, each sequence's K and V rows read once per KV head, kv_lens (and block tables) read, out
        written; 2·D FLOPs per (query head, key) for q·k and as many for p·v."""
        d = case.dims
        e = DTYPE_BYTES[case.dtype]
        lens = [int(x) for x in d["kv_lens"]]
        B, Hq, Hkv, D = len(lens), int(d["Hq"]), int(d["Hkv"]), int(d["D"])
        kv_e = 1 if kv_quant.spec_of(params) else e  # an FP8 cache: one byte per element
        read = B * Hq * D * e + 2 * sum(lens) * Hkv * D * kv_e + 4 * B
        if params.get("block_size"):  # paged: the block-table entries that are used
            bs = int(params["block_size"])
            read += 4 * sum(-(-L // bs) for L in lens)
        return Traffic(read, B * Hq * D * e, 4 * Hq * D * sum(lens))

    def capture_cases(self, params: Params) -> list[Case]:
        """B > 1, Hq != Hkv, kv_len spanning several tiles with a partial last tile, a head dim with a tail
        under its power-of-two block."""
        hq, hkv = capture_heads(params)
        return [
            capture_case({"Hq": hq, "Hkv": hkv, "D": D, "kv_lens": [37, 100], "scale": 0.7 * D**-0.5, "tail": "zeros"})
            for D in capture_head_dims(params)
        ]

    def capture_twin(self, dims: dict[str, Any]) -> dict[str, Any] | None:
        """A third sequence, longer than the others."""
        return {**dims, "kv_lens": [*dims["kv_lens"], 150]}

    def counterexample_case(
        self, case: Case, params: Params, shape: dict[str, int], index: dict[str, dict[tuple[int, ...], int]]
    ) -> Case | None:
        """B sequences, the counterexample's kv_lens where it names them, the capture's (cycled) for the
        others. A block table the counterexample names is not a case's dim: the case builds its own."""
        lens = list(case.dims["kv_lens"])
        B = int(shape.get("B", len(lens)))
        named = {b[0]: int(v) for b, v in index.get("kv_lens", {}).items() if 0 <= b[0] < B}
        new = [named.get(b, lens[b % len(lens)]) for b in range(B)]
        if B > 64 or max(new) > 8192:
            return None  # a counterexample this large is not run here
        return Case("ptx-counterexample", {**case.dims, "kv_lens": new}, case.dtype, case.seed)
