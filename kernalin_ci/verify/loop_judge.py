"""The decode loop, the parent's half (ops/decode_loop.py is the loop's model; verify/loop_drive.py the
worker's half): the same steps are drawn again from the seed and every finding is computed here, from the
raw parts the worker handed back (one per step, read through `LoopReader`).

This is where a stray KV write that heals itself a step later, or surfaces in another sequence's block
many steps on, is caught: nothing in either cache may change except the slots written this step, every
written slot must hold its token's key (rotated) and value, and every step's attention output must match
attention over the reference's own history.

Two judges of a step: the `decode_step` op's loop (`op_loop_judge`: its inputs must stay unchanged) and
the decode pipeline's (`pipeline_judge`: each member's own output inside the step, `PipelineReader` over
its cases and head dims).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernalin_ci.device import DEVICES
from kernalin_ci.findings import Finding, Notice
from kernalin_ci.lazy import torch
from kernalin_ci.ops import paged
from kernalin_ci.ops.base import TOLERANCE, Case
from kernalin_ci.ops.decode_loop import (
    STEP_INPUTS,
    DecodeLoop,
    LoopState,
    Step,
    Written,
    advance,
    attend_history,
    init_state,
    new_rows,
    next_step,
    output_fingerprints,
    pipeline_loop,
    pipeline_shape_text,
    rotated,
    step_arguments,
    step_writes,
)
from kernalin_ci.ops.rope import spec_of
from kernalin_ci.runtime.poison import bits, is_canary
from kernalin_ci.runtime.rows import row_errors
from kernalin_ci.verify import exchange
from kernalin_ci.verify.exchange import BadResult, worker_text
from kernalin_ci.verify.precision import TF32_TOLERANCE, tf32_notice
from kernalin_ci.verify.supervisor import CaseResult


@dataclass
class StepResult:
    """A step's own checks: findings that end the loop early, else its output and what its caches must hold."""

    findings: list[Finding]
    out: Any = None
    k_rows: Written | None = None
    v_rows: Written | None = None


StepCheck = Callable[[Step, dict[str, Any], LoopState], StepResult]


def _slot_name(slot: int, s: LoopState) -> str:
    """'slot 37 (sequence 1, position 12)' or 'slot 37 (a free block)'."""
    bs = s.shape.block_size
    blk, off = divmod(slot, bs)
    hit = (s.tables_cpu == blk).nonzero()
    if hit.numel():
        b, i = (int(x) for x in hit[0])
        return f"slot {slot} (sequence {b}, position {i * bs + off}; {s.lens[b]} tokens before this step)"
    return f"slot {slot} (block {blk}, which no sequence owns)"


def _cache_diff(
    name: str,
    before: torch.Tensor,
    after: torch.Tensor,
    slots: list[int],
    want: Written,
    step: int,
    s: LoopState,
    tol: float,
    check: str,
) -> list[Finding]:
    """Whole-buffer diff: each of this step's slots must hold its token's row, and nothing else may differ.
    Both are reported when both fail (a padded tile can spoil its own slot and spill past it)."""
    bs = s.shape.block_size
    changed = bits(after) != bits(before)
    found = []
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        b, o = divmod(slot, bs)
        got = after[b, o]
        if not found and not want.holds(t, got, tol):
            cls, why = "kv-slot", "does not hold the token appended to it"
            if not bool((bits(got) != bits(before[b, o])).any()):
                cls, why = "kv-coverage", "was not written (it still holds its previous contents)"
            else:
                for alt_cls, alt in want.alternatives:
                    if alt.holds(t, got, tol):
                        note = f" ({alt.note})" if alt.note else ""
                        cls, why = alt_cls, f"holds what a {alt_cls} bug writes{note}"
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


class LoopJudge:
    """Draws each step's inputs again from the seed (on the CPU), keeps the float64 history and the caches
    as the worker's last step left them, and judges one step's raw result. `step_check(step, raw, state)`:
    the way of doing a step's own checks (findings that end the loop early) and what its caches must hold.
    `keys`: the tensors a step hands back (and `ttir`, the TTIR of the kernels that computed the output,
    optional). `check`: the prefix of the findings' check names. `notices`: the TF32 notice, once, when a
    step's float32 attention output was judged at the TF32 tolerance (verify/precision.py)."""

    def __init__(
        self,
        loop: DecodeLoop,
        step_check: StepCheck,
        keys: set[str],
        fingerprints: bool = False,
        check: str = "pipeline",
    ):
        self.loop, self.steps, self.step_check = loop, loop.steps, step_check
        self.keys = keys | {"k_cache", "v_cache", "out"}
        self.fingerprints, self.check = fingerprints, check
        self.s: LoopState | None = None  # init_state on the CPU, made at the first step (torch is imported by then)
        self.notices: list[Notice] = []

    def step(self, index: int, raw: dict[str, Any], device: str = "cpu", root: str | None = None) -> list[Finding]:
        """The findings of step `index` (which must be the next one) as run on `device`; BadResult for a
        result not of it."""
        loop = self.loop
        if self.s is None:
            self.s = init_state(loop, "cpu")
        s, sh = self.s, loop.shape
        if (
            set(raw) - {"ttir"} != self.keys
            or not all(isinstance(t, torch.Tensor) for k, t in raw.items() if k not in ("out", "ttir"))
            or not isinstance(raw["out"], (torch.Tensor, str))
        ):
            raise BadResult(f"step {index}: handed back {sorted(map(str, raw))}, expected {sorted(self.keys)}")
        # only the attention output is a dot's: the caches and the rotated q/k keep `tol`
        tf32 = tf32_notice(raw.get("ttir"), device, loop.dtype, root, "float32 attention output")
        exchange.like(f"step {index} k_cache", raw["k_cache"], s.k_cache)
        exchange.like(f"step {index} v_cache", raw["v_cache"], s.v_cache)
        tol = 2 * TOLERANCE[loop.dtype]  # rounded rotated keys enter the cache: errors compound once
        st = next_step(s, index, loop.dtype, loop.padding)
        q_ref, k_ref = rotated(st, len(s.lens), loop.rope, sh.D)
        kb, vb = s.k_cache, s.v_cache
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
        s.k_cache, s.v_cache = raw["k_cache"], raw["v_cache"]  # the next step starts from them
        old_k, old_v = advance(s, st, *new_rows(s, st, k_ref))
        want_out, slack, tf32_slack = attend_history(s, q_ref, loop.dtype)
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
            slack = slack + tf32_slack
            if all(n.message != tf32.message for n in self.notices):
                self.notices.append(tf32)
        got = out.to(torch.float64)
        err = row_errors(got, want_out)
        limit = out_tol + slack.to(err.dtype).reshape(-1)
        if not bool((err <= limit).all()):
            row = int(err.nan_to_num(float("inf")).argmax())
            b, h = divmod(row, sh.Hq)
            cls, why = "wrong-output", ""
            finite_ref = bool(torch.isfinite(want_out).all())
            if finite_ref and not bool(torch.isfinite(got).all()):
                cls = "non-finite"
            if self.fingerprints:
                bad = ~(err <= limit)
                for fp_cls, alt in output_fingerprints(s, st, q_ref, old_k, old_v, kb, vb, loop.rope):
                    if bool((row_errors(got, alt)[bad] <= limit[bad]).all()):
                        cls, why = fp_cls, f"; it matches what a {fp_cls} bug produces"
                        break
            return [
                Finding(
                    f"{check}-attention",
                    cls,
                    f"step {index}: attention output off the reference at b={b} h={h} (kv_len="
                    f"{s.lens[b]}): relative error {float(err[row]):.3g}, tolerance {float(limit[row]):g}{why}",
                )
            ]
        return []


class LoopReader:
    """Reads a loop case handed back in parts (one per step, in order) and judges each as it arrives with
    its LoopJudge; the first failing step is the finding (later parts are read, not judged). `finish`
    accepts the end of the case only when every step was handed back. `device`: where the worker ran the
    loop; `root`: the folder the notices' paths are relative to."""

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


# --------------------------------------------------------------------------- the decode_step op


def op_loop_judge(loop: DecodeLoop) -> LoopJudge:
    """An op's loop case (`Op.loop`: the decode_step op) judged, one entry doing the whole step: the step's
    inputs must stay unchanged, its caches hold what the step writes (ops/decode_loop.py `step_writes`)."""
    rope = loop.rope
    assert rope is not None  # a whole step rotates

    def step_check(st: Step, raw: dict[str, Any], s: LoopState) -> StepResult:
        given = step_arguments(s, st, "cpu")
        for n in STEP_INPUTS:
            old = given[n]
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
        k_rows, v_rows = step_writes(s, st, rope, loop.shape.D)
        return StepResult([], raw["out"], k_rows, v_rows)

    return LoopJudge(loop, step_check, set(STEP_INPUTS), fingerprints=True, check="decode-step")


# --------------------------------------------------------------------------- the decode pipeline check


def pipeline_judge(loop: DecodeLoop) -> LoopJudge:
    """The pipeline's steps judged (each member's own output inside the step)."""
    tol = 2 * TOLERANCE[loop.dtype]
    rp, D = loop.rope, loop.shape.D

    def step_check(st: Step, raw: dict[str, Any], s: LoopState) -> StepResult:
        k_in = st.k
        if rp is not None:
            pos = torch.tensor(st.positions, dtype=torch.int64)
            spec = spec_of(rp, D)
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
        for name, cache in (("k_cache", s.k_cache), ("v_cache", s.v_cache)):
            exchange.like(f"step {st.index} {name}_append", raw[f"{name}_append"], cache)
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
        # the cache diff (LoopJudge) is of the caches after the whole step: attention changed neither. kv_append
        # stores its own input bit for bit, or with an FP8 cache as its contract quantises it
        ks, vs = s.kv_scales.get("k_scale"), s.kv_scales.get("v_scale")
        k_rows = Written(k_in, True, kv=s.kv, scale=ks).with_scale_bugs(vs)
        return StepResult([], raw["out"], k_rows, Written(st.v, True, kv=s.kv, scale=vs).with_scale_bugs(ks))

    keys = {"k_cache_append", "v_cache_append"} | ({"q", "k"} if rp is not None else set())
    return LoopJudge(loop, step_check, keys)


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
        loop = pipeline_loop(self.params, self.dtype, self.seed, case.dims["steps"], self.rope, D)
        reader = LoopReader(pipeline_judge(loop), self.on_step if index == 0 else None, self.device, self.root)
        self.loops[index] = (D, reader)
        return reader

    def part(self, index: int, case, ev: dict, results: str) -> None:
        self._loop(index, case, ev.get("D", case.dims["D"])).part(index, ev, results)

    def partial(self, index: int) -> list[Finding]:
        return list(self.loops[index][1].found) if index in self.loops else []

    def _with_dim(self, case, D: int):
        return Case(case.name, {**case.dims, "D": D, "instead": []}, case.dtype, case.seed, case.tags)

    def __call__(self, index: int, case, ev: dict, results: str):
        status = ev.get("status")
        if status == "not-run" and isinstance(ev.get("not_checked"), dict) and index not in self.loops:
            nc = ev["not_checked"]
            if nc.get("reason") != "interpreter" or not DEVICES[self.device].interpreted:
                raise BadResult(f"'not checked ({worker_text(nc.get('reason'))[:20]})' claimed on {self.device}")
            return CaseResult(None, [], [], {"reason": "interpreter", "error": worker_text(nc.get("error"))})
        refused = ev.get("refused") or []
        if not isinstance(refused, list) or not all(isinstance(r, dict) for r in refused):
            raise BadResult("a malformed list of refused head dims")
        cand = self._candidates(case)
        dims = [r.get("D") for r in refused]
        if dims != cand[: len(dims)]:
            raise BadResult(f"case {case.name}: head dims said to be refused out of order: {str(dims)[:60]}")
        errors = [worker_text(r.get("error")) for r in refused]
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
                "shape": pipeline_shape_text(self.params, dims[0], self.dtype),
                "reason": "unsupported",
                "error": errors[0],
            }
            if ran_d is not None:
                nc["instead"] = pipeline_shape_text(self.params, ran_d, self.dtype)
        if status == "refused":
            if ran_d is not None or len(dims) != len(cand):
                raise BadResult(f"case {case.name}: said to be refused at every head dim, but not so")
            return CaseResult(None, [], [], nc)
        if ran_d is None:
            if status == "raised":
                return CaseResult(
                    case, [Finding("pipeline", "entry-error", f"an entry raised {worker_text(ev.get('error'))}")]
                )
            raise BadResult(
                f"case {case.name}: the pipeline ended after 0 of {case.dims['steps']} steps, no step handed back"
                f" (status {worker_text(status)[:40]!r})"
            )
        loop = self.loops[index][1]
        ran = self._with_dim(case, ran_d)
        if ran_d not in self.ran_dims:
            self.ran_dims.append(ran_d)
        if loop.found:
            return CaseResult(ran, loop.found, loop.notices, nc)
        if status == "raised":
            return CaseResult(
                ran, [Finding("pipeline", "entry-error", f"an entry raised {worker_text(ev.get('error'))}")], [], nc
            )
        if status == "ok":
            return CaseResult(ran, loop.finish(), loop.notices, nc)
        raise BadResult(
            f"the pipeline ended after {loop.step} of {loop.judge.steps} steps (status {worker_text(status)[:40]!r})"
        )
