"""The decode loop (docs/ops.md): many steps on several sequences of different lengths, with the
outputs and the whole caches compared with an independent float64 reference after every step.

One loop serves two ways of doing a step:
- the decode pipeline check: rope -> kv_append -> attention.decode_paged, three entries, where each
  member's own output is also checked inside the step;
- the `decode_step` op: one entry that does the whole step, fused or not.

The loop is split across the two processes. In the worker (`drive_loop`, which runs the PR's code)
each step's entries run and what they produced (outputs, both whole caches) is handed back raw, one
part file per step (verify/exchange.py); nothing is judged there. In the parent (`LoopJudge`, read
through `LoopReader`) the same steps are drawn again from the seed and every finding is computed.

This is where a stray KV write that heals itself a step later, or surfaces in
another sequence's block many steps on, is caught: nothing in either cache may
change except the slots written this step, every written slot must hold its
token's key (rotated) and value, and every step's attention output must match
attention over the reference's own history.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from kernalin_ci.findings import Finding, Notice
from kernalin_ci.jobs import Emit, PipelineJob
from kernalin_ci.lazy import torch
from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops import paged
from kernalin_ci.ops.base import TOLERANCE, Case, generator, randn, torch_dtype
from kernalin_ci.ops.roles import pipeline_op
from kernalin_ci.ops.rope import PARAMS as ROPE_PARAMS
from kernalin_ci.ops.rope import spec_of
from kernalin_ci.runtime.poison import bits, fill_canary, is_canary
from kernalin_ci.runtime.rows import row_errors
from kernalin_ci.verify import exchange
from kernalin_ci.verify.exchange import BadResult, plain
from kernalin_ci.verify.precision import TF32_TOLERANCE, launched_ttir, recorded_launches, tf32_notice

START_LENGTHS = (1, 9, 30, 47)


@dataclass
class LoopShape:
    """The sequences and heads of one decode loop. `start_lens`: the prefill lengths (0: the first step
    writes position 0). `stale`: the free slots of the sequences' own blocks hold finite stale data (a
    block recycled from a finished request) instead of the canary; free blocks always hold the canary.
    `poison` False: zeros everywhere outside the history (the pos-0 probe)."""

    Hq: int
    Hkv: int
    D: int
    start_lens: list[int]
    block_size: int
    layout: str = "nhd"
    free_blocks: int = 5
    stale: bool = False
    poison: bool = True


@dataclass
class Step:
    """One step's inputs (CPU tensors, in the loop's dtype) and where they go."""

    index: int
    q: torch.Tensor  # [n, Hq, D]
    k: torch.Tensor  # [n, Hkv, D]
    v: torch.Tensor  # [n, Hkv, D]
    positions: list[int]  # [n]
    slots: list[int]  # [n], -1 for padding
    kv_lens: list[int]  # [B], including this step's token


@dataclass
class Written:
    """What a step must have written into one cache: per token, the row its slot must hold, either bit for
    bit (`exact`) or within the tolerance of a float64 row; `alternatives`: (bug class, rows) a known
    bug would have written instead."""

    rows: torch.Tensor
    exact: bool
    alternatives: list[tuple[str, torch.Tensor, bool]] = field(default_factory=list)


@dataclass
class StepResult:
    findings: list[Finding]
    out: Any = None
    k_rows: Written | None = None
    v_rows: Written | None = None


def init_state(shape: LoopShape, dtype: str, device: str, seed: int, steps: int) -> dict[str, Any]:
    """Block tables, caches holding each sequence's prefill, and the float64 history."""
    g = generator(seed)
    bs, D, Hkv = shape.block_size, shape.D, shape.Hkv
    lens = list(shape.start_lens)
    B = len(lens)
    per_seq = -(-(max(lens) + steps) // bs)
    num_blocks = B * per_seq + shape.free_blocks
    perm = torch.randperm(num_blocks, generator=g)
    tables = perm[: B * per_seq].reshape(B, per_seq).to(torch.int32)
    cshape = (num_blocks, bs, Hkv, D)
    k_cache = torch.empty(cshape, dtype=torch_dtype(dtype))
    v_cache = torch.empty(cshape, dtype=torch_dtype(dtype))
    for t in (k_cache, v_cache):
        if shape.poison:
            fill_canary(t)
        else:
            t.zero_()
    if shape.stale:  # the sequences' own blocks: finite data left by an earlier request
        own = tables.reshape(-1).long()
        for t in (k_cache, v_cache):
            t[own] = (torch.randn((len(own), bs, Hkv, D), generator=g, dtype=torch.float64) * 2.0).to(t.dtype)
    ref_k = []
    ref_v = []
    for b, L in enumerate(lens):  # the prefill: history already in the cache
        kb, vb = randn((L, Hkv, D), g, dtype, "cpu"), randn((L, Hkv, D), g, dtype, "cpu")
        j = torch.arange(L)
        blk = tables[b, j // bs].long()
        k_cache[blk, j % bs] = kb
        v_cache[blk, j % bs] = vb
        ref_k.append(kb.to(torch.float64).permute(1, 0, 2))
        ref_v.append(vb.to(torch.float64).permute(1, 0, 2))
    return {
        "g": g,
        "shape": shape,
        "lens": lens,
        "tables": tables.to(device),
        "tables_cpu": tables,
        "k_cache": paged.from_nhd(k_cache, shape.layout).to(device),
        "v_cache": paged.from_nhd(v_cache, shape.layout).to(device),
        "ref_k": ref_k,
        "ref_v": ref_v,
        "scale": 0.9 * D**-0.5,
    }


def next_step(s: dict[str, Any], index: int, dtype: str, padding: int = 0) -> Step:
    """The step's random q, k, v (plus `padding` tokens at slot -1) at the sequences' current lengths."""
    sh: LoopShape = s["shape"]
    g, bs, lens, tables = s["g"], sh.block_size, s["lens"], s["tables_cpu"]
    n = len(lens) + padding
    q = randn((n, sh.Hq, sh.D), g, dtype, "cpu")
    k = randn((n, sh.Hkv, sh.D), g, dtype, "cpu")
    v = randn((n, sh.Hkv, sh.D), g, dtype, "cpu")
    slots = [int(tables[b, L // bs]) * bs + L % bs for b, L in enumerate(lens)] + [-1] * padding
    return Step(index, q, k, v, list(lens) + [0] * padding, slots, [L + 1 for L in lens])


def _slot_name(slot: int, s: dict[str, Any]) -> str:
    """'slot 37 (sequence 1, position 12)' or 'slot 37 (a free block)'."""
    bs = s["shape"].block_size
    blk, off = divmod(slot, bs)
    hit = (s["tables_cpu"] == blk).nonzero()
    if hit.numel():
        b, i = (int(x) for x in hit[0])
        return f"slot {slot} (sequence {b}, position {i * bs + off}; {s['lens'][b]} tokens before this step)"
    return f"slot {slot} (block {blk}, which no sequence owns)"


def _cache_diff(
    name: str,
    before: torch.Tensor,
    after: torch.Tensor,
    slots: list[int],
    want: Written,
    step: int,
    s: dict[str, Any],
    tol: float,
    check: str,
) -> list[Finding]:
    """Whole-buffer diff: each of this step's slots must hold its token's row, and nothing else may differ.
    Both are reported when both fail (a padded tile can spoil its own slot and spill past it)."""
    bs = s["shape"].block_size
    changed = bits(after) != bits(before)
    found = []
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        b, o = divmod(slot, bs)
        got = after[b, o]
        if not found and not _holds(got, want.rows[t], want.exact, tol):
            cls, why = "kv-slot", "does not hold the token appended to it"
            if not bool((bits(got) != bits(before[b, o])).any()):
                cls, why = "kv-coverage", "was not written (it still holds its previous contents)"
            else:
                for alt_cls, rows, exact in want.alternatives:
                    if _holds(got, rows[t], exact, tol):
                        cls, why = alt_cls, f"holds what a {alt_cls} bug writes"
                        break
            found.append(Finding(check, cls, f"step {step}: {name} {_slot_name(slot, s)} {why}"))
        changed[b, o] = False
    if bool(changed.any()):
        n = int(changed.sum())
        blk, off, h, d = [int(x) for x in changed.nonzero()[0]]
        found.append(
            Finding(
                check,
                "stray-write",
                f"step {step}: {n} elements of {name} outside this step's slots changed; first at "
                f"{_slot_name(blk * bs + off, s)}, head {h}, dim {d}",
            )
        )
    return found


def _holds(got: torch.Tensor, want: torch.Tensor, exact: bool, tol: float) -> bool:
    if exact:
        return not bool((bits(got) != bits(want.to(got.device, got.dtype))).any())
    err = row_errors(got.detach().to("cpu", torch.float64), want.to(torch.float64))
    return bool((err <= tol).all())


# --------------------------------------------------------------------------- the worker's half


def drive_loop(
    s: dict[str, Any],
    run_step: Callable[[Step], dict[str, Any]],
    dtype: str,
    steps: int,
    hand_back: Callable[[int, dict[str, Any], float], None],
    padding: int = 0,
) -> int:
    """In the worker: run `steps` steps; `run_step` calls the entries and returns what they produced (CPU
    tensors, the caches after the step as `k_cache`, `v_cache`), which `hand_back(step, raw, seconds)`
    writes out. Nothing is judged here. An entry that raises ends the loop (the exception goes up).
    Returns the number of steps handed back."""
    for index in range(steps):
        t0 = time.perf_counter()
        st = next_step(s, index, dtype, padding)
        raw = run_step(st)
        s["lens"] = list(st.kv_lens)
        hand_back(index, raw, time.perf_counter() - t0)
    return steps


def launches(device: str) -> Any:
    """A block that records the compiled kernels launched in it (on a GPU: their TTIR is handed back as
    `ttir`, verify/precision.py); on the CPU nothing is recorded."""
    return recorded_launches() if device == "cuda" else nullcontext()


def raw_out(out: Any) -> Any:
    """The step's output as handed back: a CPU tensor, or the name of what came back instead."""
    return plain(out) if isinstance(out, torch.Tensor) else type(out).__name__


def hand_back_parts(
    emit: Callable[[dict[str, Any]], None], results: str, index: int, planned: Any = None
) -> Callable[..., None]:
    """A step's raw result as part file `case-<index>-<step>.pt` and a `case-part` event naming it. A case
    run at another shape than `planned` (the kernel refused its own: verify/support.py) says so in each
    part (`ran`: `hand_back.running`, set by the caller), so that the parent judges its steps at the shape
    they ran at."""

    def hand_back(step: int, raw: dict[str, Any], seconds: float, **fields: Any) -> None:
        ran = hand_back.running  # type: ignore[attr-defined]
        ev = {
            "event": "case-part",
            "index": index,
            "part": step,
            "seconds": seconds,
            "file": exchange.save(results, exchange.part_name(index, step), raw),
            **fields,
        }
        if ran is not None and planned is not None and ran.to_json() != planned.to_json():
            ev["ran"] = ran.to_json()
        emit(ev)

    hand_back.running = planned  # type: ignore[attr-defined]  # the case being run (verify.dynamic.run_case sets it)
    return hand_back


# --------------------------------------------------------------------------- the parent's half

StepCheck = Callable[[Step, dict[str, Any], dict[str, Any]], StepResult]


class LoopJudge:
    """In the parent: draws each step's inputs again from the seed (on the CPU), keeps the float64
    history and the caches as the worker's last step left them, and judges one step's raw result.
    `step_check(step, raw, state)`: the way of doing a step's own checks (findings that end the loop
    early) and what its caches must hold. `keys`: the tensors a step hands back (and `ttir`, the TTIR of
    the kernels that computed the output, optional). `rope`: the rope params when q and k are rotated in
    the step. `check`: the prefix of the findings' check names. `notices`: the TF32 notice, once, when a
    step's float32 attention output was judged at the TF32 tolerance (verify/precision.py)."""

    def __init__(
        self,
        shape: LoopShape,
        dtype: str,
        seed: int,
        steps: int,
        step_check: StepCheck,
        keys: set[str],
        rope: dict[str, Any] | None,
        padding: int = 0,
        fingerprints: bool = False,
        check: str = "pipeline",
    ):
        self.shape, self.dtype, self.seed, self.steps = shape, dtype, seed, steps
        self.step_check, self.rope, self.padding = step_check, rope, padding
        self.keys = keys | {"k_cache", "v_cache", "out"}
        self.fingerprints, self.check = fingerprints, check
        self.s: dict[str, Any] = {}  # init_state on the CPU, made at the first step (torch is imported by then)
        self.notices: list[Notice] = []

    def step(self, index: int, raw: dict[str, Any], device: str = "cpu", root: str | None = None) -> list[Finding]:
        """The findings of step `index` (which must be the next one) as run on `device`; BadResult for a
        result not of it."""
        if not self.s:
            self.s = init_state(self.shape, self.dtype, "cpu", self.seed, self.steps)
        s, sh = self.s, self.shape
        if (
            set(raw) - {"ttir"} != self.keys
            or not all(isinstance(t, torch.Tensor) for k, t in raw.items() if k not in ("out", "ttir"))
            or not isinstance(raw["out"], (torch.Tensor, str))
        ):
            raise BadResult(f"step {index}: handed back {sorted(map(str, raw))}, expected {sorted(self.keys)}")
        # only the attention output is a dot's: the caches and the rotated q/k keep `tol`
        tf32 = tf32_notice(raw.get("ttir"), device, self.dtype, root, "float32 attention output")
        for name in ("k_cache", "v_cache"):
            exchange.like(f"step {index} {name}", raw[name], s[name])
        tol = 2 * TOLERANCE[self.dtype]  # rounded rotated keys enter the cache: errors compound once
        st = next_step(s, index, self.dtype, self.padding)
        B = len(s["lens"])
        rope = self.rope
        q_ref, k_ref = st.q[:B].to(torch.float64), st.k[:B].to(torch.float64)
        if rope is not None:
            pos = torch.tensor(st.positions[:B], dtype=torch.int64)
            spec = spec_of(rope, sh.D)
            q_ref, k_ref = spec.rotate(st.q[:B], pos), spec.rotate(st.k[:B], pos)
        kb, vb = s["k_cache"], s["v_cache"]
        res = self.step_check(st, raw, s)
        if res.findings:
            return res.findings
        found = []
        for name, before, after, want in (
            ("k_cache", kb, raw["k_cache"], res.k_rows),
            ("v_cache", vb, raw["v_cache"], res.v_rows),
        ):
            assert want is not None
            found += _cache_diff(
                name,
                paged.nhd(before, sh.layout),
                paged.nhd(after, sh.layout),
                st.slots,
                want,
                index,
                s,
                tol,
                f"{self.check}-cache",
            )
        if found:
            return found
        s["k_cache"], s["v_cache"] = raw["k_cache"], raw["v_cache"]  # the next step starts from them
        old_k, old_v = [x.clone() for x in s["ref_k"]], [x.clone() for x in s["ref_v"]]
        for b in range(B):
            s["ref_k"][b] = torch.cat([s["ref_k"][b], k_ref[b][:, None, :]], dim=1)
            s["ref_v"][b] = torch.cat([s["ref_v"][b], st.v[b].to(torch.float64)[:, None, :]], dim=1)
        s["lens"] = list(st.kv_lens)
        hmap = ac.head_map(sh.Hq, sh.Hkv)
        want_out = ac.attend(q_ref, s["ref_k"], s["ref_v"], s["scale"], hmap)
        out = res.out
        check = self.check
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(want_out.shape):
            got_shape = tuple(out.shape) if isinstance(out, torch.Tensor) else str(out)[:40]
            return [
                Finding(
                    f"{check}-attention",
                    "wrong-output",
                    f"step {index}: the output is {got_shape}, expected {tuple(want_out.shape)}",
                )
            ]
        if bool(is_canary(out).any()):
            return [Finding(f"{check}-attention", "unwritten-output", f"step {index}: attention output not written")]
        out_tol = tol
        if tf32 is not None:  # the output a TF32 dot computed
            out_tol = max(tol, TF32_TOLERANCE)
            if all(n.message != tf32.message for n in self.notices):
                self.notices.append(tf32)
        got = out.to(torch.float64)
        err = row_errors(got, want_out)
        if not bool((err <= out_tol).all()):
            row = int(err.nan_to_num(float("inf")).argmax())
            b, h = divmod(row, sh.Hq)
            cls, why = "wrong-output", ""
            finite_ref = bool(torch.isfinite(want_out).all())
            if finite_ref and not bool(torch.isfinite(got).all()):
                cls = "non-finite"
            if self.fingerprints:
                bad = ~(err <= out_tol)
                for fp_cls, alt in _output_fingerprints(s, st, q_ref, k_ref, old_k, old_v, kb, vb, hmap, rope):
                    if bool((row_errors(got, alt)[bad] <= out_tol).all()):
                        cls, why = fp_cls, f"; it matches what a {fp_cls} bug produces"
                        break
            return [
                Finding(
                    f"{check}-attention",
                    cls,
                    f"step {index}: attention output off the reference at b={b} h={h} (kv_len="
                    f"{s['lens'][b]}): relative error {float(err[row]):.3g}, tolerance {out_tol:g}{why}",
                )
            ]
        return []


class LoopReader:
    """In the parent: reads a loop case handed back in parts (one per step, in order) and judges each as
    it arrives with its LoopJudge; the first failing step is the finding (later parts are read, not
    judged). `finish` accepts the end of the case only when every step was handed back. `device`: where
    the worker ran the loop; `root`: the folder the notices' paths are relative to."""

    def __init__(
        self,
        judge: LoopJudge,
        on_step: Callable[[int], None] | None = None,
        device: str = "cpu",
        root: str | None = None,
    ):
        self.judge, self.on_step, self.device, self.root = judge, on_step, device, root
        self.step = 0
        self.found: list[Finding] = []

    def part(self, index: int, ev: dict[str, Any], results: str) -> None:
        step = self.step
        if ev.get("part") != step:
            raise BadResult(f"step {str(ev.get('part'))[:20]} handed back where step {step} was due")
        if step >= self.judge.steps:
            raise BadResult(f"step {step} handed back; the loop has {self.judge.steps} steps")
        raw = exchange.load(results, exchange.part_name(index, step), ev.get("file"))
        if not isinstance(raw, dict):
            raise BadResult(f"step {step}: not a raw result")
        self.step += 1
        if not self.found:
            try:
                self.found = self.judge.step(step, raw, self.device, self.root)
            except BadResult:
                raise
            except Exception as e:  # a result the comparison cannot use: never a pass
                raise BadResult(
                    f"step {step}: the result cannot be compared ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
                ) from None
        if self.on_step:
            self.on_step(step)

    @property
    def notices(self) -> list[Notice]:
        return list(self.judge.notices)

    def finish(self) -> list[Finding]:
        """The case's findings once the worker says the loop ended cleanly."""
        if self.found:
            return self.found
        if self.step != self.judge.steps:
            raise BadResult(f"the loop ended after {self.step} of {self.judge.steps} steps")
        return []


def _output_fingerprints(
    s: dict[str, Any],
    st: Step,
    q_ref: torch.Tensor,
    k_ref: torch.Tensor,
    old_k: list[torch.Tensor],
    old_v: list[torch.Tensor],
    kb: torch.Tensor,
    vb: torch.Tensor,
    hmap: list[int],
    rope: dict[str, Any] | None,
) -> list[tuple[str, torch.Tensor]]:
    """Outputs a step-level bug would produce: the new token attended from the slot's contents before this
    step's write (`step-order`), the new token counted twice (`new-token-twice`), then the attention
    fingerprints (kv-mask, scale, gqa-mapping, ...) over the reference history."""
    sh: LoopShape = s["shape"]
    B = len(st.kv_lens)
    bs = sh.block_size
    kprev, vprev = paged.nhd(kb, sh.layout).to("cpu"), paged.nhd(vb, sh.layout).to("cpu")
    stale_k, stale_v, twice_k, twice_v = [], [], [], []
    for b in range(B):
        blk, off = divmod(st.slots[b], bs)
        sk = kprev[blk, off].to(torch.float64)[:, None, :]
        sv = vprev[blk, off].to(torch.float64)[:, None, :]
        stale_k.append(torch.cat([old_k[b], sk], dim=1))
        stale_v.append(torch.cat([old_v[b], sv], dim=1))
        twice_k.append(torch.cat([s["ref_k"][b], k_ref[b][:, None, :]], dim=1))
        twice_v.append(torch.cat([s["ref_v"][b], st.v[b].to(torch.float64)[:, None, :]], dim=1))
    scale = s["scale"]
    fps = [
        ("step-order", ac.attend(q_ref, stale_k, stale_v, scale, hmap)),
        ("new-token-twice", ac.attend(q_ref, twice_k, twice_v, scale, hmap)),
    ]
    if rope is not None:  # q left unrotated, or rotated at position 0
        fps.append(("rope-position", ac.attend(st.q[:B].to(torch.float64), s["ref_k"], s["ref_v"], scale, hmap)))
    for cls, alt in ac.fingerprints(
        q_ref,
        lambda b, L: s["ref_k"][b][:, :L],
        lambda b, L: s["ref_v"][b][:, :L],
        st.kv_lens,
        scale,
        sh.Hq,
        sh.Hkv,
        sh.D,
        tail_finite=False,
    ):
        fps.append((cls, alt["out"]))
    return fps


# --------------------------------------------------------------------------- the decode pipeline check


USUAL_HEAD_DIMS = (64, 128, 80, 96, 256)  # the main loop's D first (unpinned), then the short loops'
SHAPE_STEPS = 2  # steps of the short loop at each other usual head dim


def _pipeline_shape(params: dict[str, Any], D: int | None = None) -> LoopShape:
    return LoopShape(
        params.get("num_q_heads") or 4,
        params.get("num_kv_heads") or 2,
        D or params.get("head_dim") or USUAL_HEAD_DIMS[0],
        list(START_LENGTHS),
        params["block_size"],
        paged.layout_of(params),
    )


def pipeline_cases(params: dict[str, Any], steps: int, dtype: str, seed: int) -> list[Case]:
    """The pipeline's shape domain (docs/ops.md): the decode loop at the pinned head dim, else at D 64 with
    the other usual head dims, nearest first, as the shapes it moves to when an entry refuses D 64, and a
    short loop at each of those. A pinned head dim is declared: an entry's error there is a finding."""
    pinned = params.get("head_dim")
    main = pinned or USUAL_HEAD_DIMS[0]
    others = [] if pinned else sorted(USUAL_HEAD_DIMS[1:], key=lambda d: (abs(d - main), d))
    cases = [
        Case(
            "decode-loop",
            {"steps": steps, "start_lengths": list(START_LENGTHS), "D": main, "instead": others},
            dtype,
            seed,
        )
    ]
    short = min(SHAPE_STEPS, steps)
    cases += [
        Case(
            f"shape-D{d}",
            {"steps": short, "start_lengths": list(START_LENGTHS), "D": d, "instead": []},
            dtype,
            seed,
            ("shape",),
        )
        for d in USUAL_HEAD_DIMS[1:]
        if not pinned
    ]
    return cases


def shape_text(params: dict[str, Any], D: int, dtype: str) -> str:
    sh = _pipeline_shape(params, D)
    return f"D={D} Hq={sh.Hq} Hkv={sh.Hkv} {dtype} block_size={sh.block_size}"


def _rope_params(params: dict[str, Any]) -> dict[str, Any]:
    """The rope params of a loop, a scaled frequency table included (M-RoPE is refused by `pipeline_params`)."""
    return {p.name: params.get(p.name, p.default) for p in ROPE_PARAMS}


def drive_pipeline(
    fns: dict, params: dict, dtype: str, device: str, seed: int, steps: int, hand_back, D: int | None = None
) -> int:
    """In the worker: each step, B decode tokens plus one padding token (slot -1) that must change
    nothing, through rope (when given), kv_append and attention, at head dim D; handed back: the rope
    outputs, both caches after kv_append and after attention, the attention output."""
    s = init_state(_pipeline_shape(params, D), dtype, device, seed, steps)
    rope_fn, kv_append, attention = (fns.get(pipeline_op(role)) for role in ("rope", "kv_append", "attention"))

    def run_step(st: Step) -> dict[str, Any]:
        B = len(st.kv_lens)
        raw: dict[str, Any] = {}
        q_in, k_in = st.q.to(device), st.k.to(device)
        if rope_fn is not None:
            pos = torch.tensor(st.positions, dtype=torch.int64)
            q_in, k_in = rope_fn(q=q_in, k=k_in, positions=pos.to(device))
            _sync(device)
            raw["q"], raw["k"] = plain(q_in), plain(k_in)
        kv_append(
            key=k_in,
            value=st.v.to(device),
            k_cache=s["k_cache"],
            v_cache=s["v_cache"],
            slot_mapping=torch.tensor(st.slots, dtype=torch.int64, device=device),
        )
        _sync(device)
        # copies: on the CPU plain() keeps the live cache, which attention could still change
        raw["k_cache_append"], raw["v_cache_append"] = plain(s["k_cache"].clone()), plain(s["v_cache"].clone())
        with launches(device) as launched:  # the attention entry's kernels: their TF32 dots
            out = attention(
                q=q_in[:B],
                k_cache=s["k_cache"],
                v_cache=s["v_cache"],
                block_tables=s["tables"],
                kv_lens=torch.tensor(st.kv_lens, dtype=torch.int32, device=device),
                scale=s["scale"],
            )
            _sync(device)
        raw["k_cache"], raw["v_cache"], raw["out"] = plain(s["k_cache"]), plain(s["v_cache"]), raw_out(out)
        raw["ttir"] = launched_ttir(launched)
        return raw

    return drive_loop(s, run_step, dtype, steps, hand_back, padding=1)


def pipeline_judge(params: dict, dtype: str, seed: int, steps: int, rope: bool, D: int | None = None) -> LoopJudge:
    """In the parent: the pipeline's steps at head dim D judged (each member's own output inside the step)."""
    tol = 2 * TOLERANCE[dtype]
    shape = _pipeline_shape(params, D)
    rp = _rope_params(params) if rope else None

    def step_check(st: Step, raw: dict[str, Any], s: dict[str, Any]) -> StepResult:
        k_in = st.k
        if rp is not None:
            pos = torch.tensor(st.positions, dtype=torch.int64)
            spec = spec_of(rp, shape.D)
            for name, src in (("q", st.q), ("k", st.k)):
                if tuple(raw[name].shape) != tuple(src.shape):
                    raise BadResult(
                        f"step {st.index}: rope {name} of shape {tuple(raw[name].shape)}, expected {tuple(src.shape)}"
                    )
                err = row_errors(raw[name].to(torch.float64), spec.rotate(src, pos))
                if not bool((err <= tol).all()):
                    return StepResult(
                        [
                            Finding(
                                "pipeline-rope",
                                "wrong-output",
                                f"step {st.index}: rope {name} off the reference (worst relative "
                                f"error {float(err.nan_to_num(float('inf')).max()):.3g}, tolerance "
                                f"{tol:g})",
                            )
                        ]
                    )
            k_in = raw["k"]
        for name in ("k_cache", "v_cache"):
            exchange.like(f"step {st.index} {name}_append", raw[f"{name}_append"], s[name])
            if bool((bits(raw[name]) != bits(raw[f"{name}_append"])).any()):
                return StepResult(
                    [
                        Finding(
                            "pipeline-attention",
                            "input-modified",
                            f"step {st.index}: the attention entry changed {name}",
                        )
                    ]
                )
        # the cache diff (LoopJudge) is of the caches after the whole step: attention changed neither
        return StepResult([], raw["out"], Written(k_in, exact=True), Written(st.v, exact=True))

    keys = {"k_cache_append", "v_cache_append"} | ({"q", "k"} if rope else set())
    return LoopJudge(shape, dtype, seed, steps, step_check, keys, rp, padding=1)


class PipelineReader:
    """The pipeline's reader for run_cases: each case (pipeline_cases) handed back in parts, one LoopReader
    per case, judged at the head dim the parts ran at (the case's own; a part of the main loop moved to one
    of its other head dims says which: `D`). A head dim the worker says the entries refused (an entry raised before
    the first step was handed back) is *unsupported, not checked*, accepted only where nothing is pinned
    and no loop has run at that head dim (there the error is the kernel's: a finding)."""

    def __init__(
        self,
        params: dict,
        dtype: str,
        seed: int,
        device: str,
        rope: bool,
        on_step=None,
        root: str | None = None,
    ):
        self.params, self.dtype, self.seed, self.device, self.rope = params, dtype, seed, device, rope
        self.on_step, self.root = on_step, root
        self.loops: dict[int, tuple[int, LoopReader]] = {}  # case index -> (D, its reader)
        self.ran_dims: list[int] = []  # head dims a loop ran at, in order

    def _candidates(self, case) -> list[int]:
        return [case.dims["D"], *case.dims.get("instead", [])]

    def _loop(self, index: int, case, D: Any) -> LoopReader:
        if type(D) is not int or D not in self._candidates(case):
            raise BadResult(f"case {case.name}: parts said to have run at head dim {str(D)[:20]}")
        if index in self.loops:
            if self.loops[index][0] != D:
                raise BadResult(f"case {case.name}: its parts ran at different head dims")
            return self.loops[index][1]
        judge = pipeline_judge(self.params, self.dtype, self.seed, case.dims["steps"], self.rope, D)
        loop = LoopReader(judge, self.on_step if index == 0 else None, self.device, self.root)
        self.loops[index] = (D, loop)
        return loop

    def part(self, index: int, case, ev: dict, results: str) -> None:
        self._loop(index, case, ev.get("D", case.dims["D"])).part(index, ev, results)

    def partial(self, index: int) -> list[Finding]:
        return list(self.loops[index][1].found) if index in self.loops else []

    def _with_dim(self, case, D: int):
        from kernalin_ci.ops.base import Case

        return Case(case.name, {**case.dims, "D": D, "instead": []}, case.dtype, case.seed, case.tags)

    def __call__(self, index: int, case, ev: dict, results: str):
        from kernalin_ci.verify.judge import CaseResult, _text

        status = ev.get("status")
        if status == "not-run" and isinstance(ev.get("not_checked"), dict) and index not in self.loops:
            nc = ev["not_checked"]
            if nc.get("reason") != "interpreter" or self.device != "cpu":
                raise BadResult(f"'not checked ({_text(nc.get('reason'))[:20]})' claimed on {self.device}")
            return CaseResult(None, [], [], {"reason": "interpreter", "error": _text(nc.get("error"))})
        refused = ev.get("refused") or []
        if not isinstance(refused, list) or not all(isinstance(r, dict) for r in refused):
            raise BadResult("a malformed list of refused head dims")
        cand = self._candidates(case)
        dims = [r.get("D") for r in refused]
        if dims != cand[: len(dims)]:
            raise BadResult(f"case {case.name}: head dims said to be refused out of order: {str(dims)[:60]}")
        errors = [_text(r.get("error")) for r in refused]
        if refused and self.params.get("head_dim"):  # declared: the entry's error is a finding
            return CaseResult(
                case,
                [
                    Finding(
                        "pipeline", "entry-error", f"an entry raised at the declared head dim {dims[0]}: {errors[0]}"
                    )
                ],
            )
        for D, err in zip(dims, errors):
            if D in self.ran_dims:  # the entries take this head dim: the error is the kernel's
                return CaseResult(
                    case,
                    [Finding("pipeline", "entry-error", f"an entry raised at head dim {D}, where a loop ran: {err}")],
                )
        ran_d = self.loops[index][0] if index in self.loops else None
        nc = None
        if refused:
            nc = {
                "shape": shape_text(self.params, dims[0], self.dtype),
                "reason": "unsupported",
                "error": errors[0],
            }
            if ran_d is not None:
                nc["instead"] = shape_text(self.params, ran_d, self.dtype)
        if status == "refused":
            if ran_d is not None or len(dims) != len(cand):
                raise BadResult(f"case {case.name}: said to be refused at every head dim, but not so")
            return CaseResult(None, [], [], nc)
        if ran_d is None:
            if status == "raised":
                return CaseResult(
                    case, [Finding("pipeline", "entry-error", f"an entry raised {_text(ev.get('error'))}")]
                )
            raise BadResult(
                f"case {case.name}: the pipeline ended after 0 of {case.dims['steps']} steps, no step handed back"
                f" (status {_text(status)[:40]!r})"
            )
        loop = self.loops[index][1]
        ran = self._with_dim(case, ran_d)
        if ran_d not in self.ran_dims:
            self.ran_dims.append(ran_d)
        if loop.found:
            return CaseResult(ran, loop.found, loop.notices, nc)
        if status == "raised":
            return CaseResult(
                ran, [Finding("pipeline", "entry-error", f"an entry raised {_text(ev.get('error'))}")], [], nc
            )
        if status == "ok":
            return CaseResult(ran, loop.finish(), loop.notices, nc)
        raise BadResult(
            f"the pipeline ended after {loop.step} of {loop.judge.steps} steps (status {_text(status)[:40]!r})"
        )


# --------------------------------------------------------------------------- the decode_step op

DECODE_STEP_INPUTS = ("q", "k", "v", "positions", "slot_mapping", "block_tables", "kv_lens")


def drive_decode_step(
    fn: Callable[..., Any],
    shape: LoopShape,
    dtype: str,
    device: str,
    seed: int,
    steps: int,
    hand_back: Callable[[int, dict[str, Any], float], None],
) -> int:
    """In the worker: the `decode_step` op's loop, one entry doing the whole step; handed back: its
    inputs as the call left them, both caches, the output."""
    s = init_state(shape, dtype, device, seed, steps)

    def run_step(st: Step) -> dict[str, Any]:
        pos = torch.tensor(st.positions, dtype=torch.int64)
        kw = {
            "q": st.q.to(device),
            "k": st.k.to(device),
            "v": st.v.to(device),
            "positions": pos.to(device),
            "k_cache": s["k_cache"],
            "v_cache": s["v_cache"],
            "slot_mapping": torch.tensor(st.slots, dtype=torch.int64, device=device),
            "block_tables": s["tables"],
            "kv_lens": torch.tensor(st.kv_lens, dtype=torch.int32, device=device),
            "scale": s["scale"],
        }
        with launches(device) as launched:
            out = fn(**kw)
            _sync(device)
        return {
            **{n: plain(kw[n]) for n in (*DECODE_STEP_INPUTS, "k_cache", "v_cache")},
            "out": raw_out(out),
            "ttir": launched_ttir(launched),
        }

    return drive_loop(s, run_step, dtype, steps, hand_back)


def decode_step_judge(shape: LoopShape, params: dict[str, Any], dtype: str, seed: int, steps: int) -> LoopJudge:
    """In the parent: the `decode_step` op's steps judged; q, k, v and the index tensors must stay unchanged."""
    rope = _rope_params(params)
    spec = spec_of(rope, shape.D)

    def step_check(st: Step, raw: dict[str, Any], s: dict[str, Any]) -> StepResult:
        pos = torch.tensor(st.positions, dtype=torch.int64)
        given = {
            "q": st.q,
            "k": st.k,
            "v": st.v,
            "positions": pos,
            "slot_mapping": torch.tensor(st.slots, dtype=torch.int64),
            "block_tables": s["tables_cpu"],
            "kv_lens": torch.tensor(st.kv_lens, dtype=torch.int32),
        }
        for n, old in given.items():
            exchange.like(f"step {st.index} {n}", raw[n], old)
            if bool((bits(raw[n]) != bits(old)).any()):
                return StepResult(
                    [
                        Finding(
                            "decode-step-inputs",
                            "input-modified",
                            f"step {st.index}: the entry changed {n} (the contract does not let it write it)",
                        )
                    ]
                )
        k_rot = spec.rotate(st.k, pos)
        v_rot = spec.rotate(st.v, pos)
        k_rows = Written(k_rot, exact=False, alternatives=[("kv-unrotated", st.k, True)])
        v_rows = Written(st.v, exact=True, alternatives=[("rope-value", v_rot, False), ("kv-source", k_rot, False)])
        return StepResult([], raw["out"], k_rows, v_rows)

    return LoopJudge(
        shape, dtype, seed, steps, step_check, set(DECODE_STEP_INPUTS), rope, fingerprints=True, check="decode-step"
    )


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run_job(job: PipelineJob, device: str, emit: Emit) -> None:
    """Worker task 'verify-pipeline': each case from `start` on, handed back one step at a time (case-part
    events naming the head dim they ran at). A loop whose entries raise before its first step is handed
    back is refused at that head dim; the main loop then moves to the next of its `instead` head dims."""
    from kernalin_ci.entry import load_entry
    from kernalin_ci.verify.dynamic import Interpreter

    fns = {role: load_entry(spec, job.root) for role, spec in job.entries.items() if spec}
    interp = Interpreter(device == "cpu")
    for index in range(job.start, len(job.cases)):
        dims = job.cases[index].dims
        emit({"event": "case-start", "index": index})
        t0 = time.perf_counter()
        unfaithful = interp.cannot_run(job.dtype)
        if unfaithful:
            emit({"event": "case-done", "index": index, "seconds": 0.0, "status": "not-run", **unfaithful})
            continue
        ev: dict = {"status": "refused"}
        refused: list[dict] = []
        for D in [dims["D"], *dims.get("instead", [])]:
            hand_back = hand_back_parts(emit, job.results, index)
            parts = [0]

            moved = {"D": D} if D != dims["D"] else {}  # a part of a moved loop says where it ran

            def counted(step, raw, seconds, _hand_back=hand_back, _parts=parts, _moved=moved):
                _parts[0] += 1
                _hand_back(step, raw, seconds, **_moved)

            try:
                drive_pipeline(fns, job.params, job.dtype, device, job.seed, dims["steps"], counted, D)
                ev = {"status": "ok"}
            except Exception as e:
                error = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
                unfaithful = interp.after_case()  # the interpreter's error, not the entry's: not checked
                if parts[0] == 0 and not unfaithful:
                    refused.append({"D": D, "error": error})
                    continue
                ev = {"status": "raised", "error": error}
            break
        unfaithful = unfaithful or interp.after_case()
        emit(
            {
                "event": "case-done",
                "index": index,
                "seconds": time.perf_counter() - t0,
                "refused": refused,
                **({"status": "not-run", **unfaithful} if unfaithful else ev),
            }
        )
