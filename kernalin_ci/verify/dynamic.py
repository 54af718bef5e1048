"""Dynamic checks: launch the entry on each case, inside the worker child process.

Per case: fresh inputs (own seed), tensors moved into canary-guarded buffers,
a snapshot of every input, the call (with poisoned allocations), then the
checks: out-of-bounds writes into the guards, inputs the contract does not let
the entry write, and the op's own output check (float64 reference, properties,
or the whole-cache diff of kv_append). The reference is computed after the call.
"""
from __future__ import annotations

import os
import re
import time
from contextlib import nullcontext

import torch

from kernalin_ci.findings import Finding, Notice
from kernalin_ci.ops.base import Case, Op
from kernalin_ci.verify.compare import check_reference
from kernalin_ci.verify.interp import skip_self_copy
from kernalin_ci.verify.interp_bf16 import faithful_bf16, take_unfaithful
from kernalin_ci.verify.poison import bits, fill_canary, is_canary, poisoned_allocations, prime_cuda_allocator
from kernalin_ci.verify.precision import TF32_TOLERANCE, recorded_launches, tf32_locations, where

GUARD = 16384  # canary elements before and after every input tensor
CUDA_ERROR = re.compile(r"CUDA error|illegal memory access|unspecified launch failure|misaligned address|"
                        r"device-side assert|AcceleratorError|cudaErrorIllegalAddress", re.I)


class CudaContextLost(Exception):
    """A CUDA error poisons the context: the worker reports it and exits."""


class EntryRaised(Exception):
    """The entry raised: an `entry-error` finding, or a shape outside the kernel's domain
    (kernalin_ci.verify.support decides which)."""


def guard_inputs(kw: dict, skip: set) -> tuple[dict, dict]:
    """Copy each tensor into the middle of a canary-filled buffer; return new kwargs and the guards."""
    out, guards = {}, {}
    for name, t in kw.items():
        if not isinstance(t, torch.Tensor) or name in skip or not t.is_contiguous():
            out[name] = t
            continue
        flat = fill_canary(torch.empty(t.numel() + 2 * GUARD, dtype=t.dtype, device=t.device))
        view = flat[GUARD:GUARD + t.numel()].view(t.shape)
        view.copy_(t)
        out[name] = view
        guards[name] = flat
    return out, guards


def _guard_findings(op: Op, guards: dict, before: dict) -> list[Finding]:
    found = []
    for name, flat in guards.items():
        for side, part in (("before", flat[:GUARD]), ("after", flat[-GUARD:])):
            hit = ~is_canary(part) if part.dtype.is_floating_point else part != fill_canary(part.clone())
            if bool(hit.any()):
                n = int(hit.sum())
                cls = "stray-write"
                cls = op.guard_class(name, side, before) or cls
                found.append(Finding("out-of-bounds-write", cls,
                                     f"{n} elements written just {side} {name!r} (outside the tensor)"))
    return found


def snapshot(kw: dict, skip: set) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) and k not in skip else v)
            for k, v in kw.items()} | {k: None for k in skip}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_case(op: Op, fn, case: Case, params: dict, device: str, memo: dict, poison: bool = True,
             notices: list | None = None) -> list[Finding]:
    try:
        own = op.drive(fn, case, params, device, poison)
    except Exception as e:  # the user's kernel: any exception is a finding
        msg = " ".join(str(e).split())[:400]
        if device == "cuda" and CUDA_ERROR.search(f"{type(e).__name__} {msg}"):
            raise CudaContextLost(f"{type(e).__name__}: {msg}") from None
        raise EntryRaised(f"{type(e).__name__}: {msg}") from None
    if own is not None:
        return own
    kw = op.inputs(case, params, device, poison)
    writable = set(op.written_names(params))
    lazy = writable if "huge" in case.tags else set()
    guards = {}
    if poison:
        kw, guards = guard_inputs(kw, skip=lazy)
    before = snapshot(kw, skip=lazy)
    if poison and device == "cuda":
        prime_cuda_allocator()
    launched = None
    try:
        with poisoned_allocations() if poison else nullcontext(), \
                recorded_launches() if device == "cuda" else nullcontext() as launched:
            ret = fn(**kw)
        sync(device)
    except Exception as e:  # the user's kernel: any exception is a finding
        msg = " ".join(str(e).split())[:400]
        if device == "cuda" and CUDA_ERROR.search(f"{type(e).__name__} {msg}"):
            raise CudaContextLost(f"{type(e).__name__}: {msg}") from None
        raise EntryRaised(f"{type(e).__name__}: {msg}") from None

    findings = _guard_findings(op, guards, before)
    for name, old in before.items():
        if name in writable or not isinstance(old, torch.Tensor):
            continue
        changed = bits(kw[name]) != bits(old)
        if bool(changed.any()):
            findings.append(Finding("inputs-unchanged", "input-modified",
                                    f"{name}: {int(changed.sum())} of {old.numel()} elements changed by the call "
                                    f"(the contract does not let the entry write it)"))
    try:
        outs = op.outputs(ret, kw)
    except TypeError as e:
        return findings + [Finding("output-shape", "wrong-output", str(e))]
    cpu_before = {k: (v.cpu() if isinstance(v, torch.Tensor) and v.numel() < (1 << 28) else v)
                  for k, v in before.items()}
    if op.exact:
        findings += op.check(case, before, kw, outs, params)
    else:
        tolerance = None
        tf32 = tf32_locations(launched) if case.dtype == "float32" else []
        if tf32:
            tolerance = TF32_TOLERANCE
            if notices is not None:
                notices.append(Notice("tf32", f"float32 judged at TF32 tolerance ({TF32_TOLERANCE:g}): tl.dot input "
                                              f"precision tf32 at {where(tf32[0])}", tf32[0], kind="dynamic"))
        findings += check_reference(op, case, cpu_before, outs, params, memo, tolerance)
        findings += op.properties(case, cpu_before, outs, params)
    return findings


def launch(op, fn, case: Case, params: dict, device: str) -> None:
    """One call of the entry on a case, nothing checked: does the kernel take this shape at all?"""
    kw = op.inputs(case, params, device, poison=False)
    try:
        fn(**kw)
        sync(device)
    except Exception as e:
        msg = " ".join(str(e).split())[:400]
        if device == "cuda" and CUDA_ERROR.search(f"{type(e).__name__} {msg}"):
            raise CudaContextLost(f"{type(e).__name__}: {msg}") from None
        raise EntryRaised(f"{type(e).__name__}: {msg}") from None


class Interpreter:
    """On the CPU: makes the Triton interpreter compute bfloat16 on values, and says which cases it
    still cannot run faithfully. Those are not checked (never a finding): their case-done event
    carries `not_checked` {"reason": "interpreter", "error": why} and `skipped` "interpreter: why"."""

    def __init__(self, cpu: bool):
        self.cpu = cpu
        self.bf16 = faithful_bf16() if cpu else None  # None: bfloat16 is faithful (or not on the CPU)
        take_unfaithful()

    def cannot_run(self, dtype: str) -> dict:
        """case-done fields for a case of this dtype that cannot run faithfully at all ({} if it can)."""
        return self._fields(self.bf16 if self.cpu and dtype == "bfloat16" else None)

    def after_case(self) -> dict:
        """case-done fields for the case just run if it used a construct the interpreter cannot emulate."""
        return self._fields(take_unfaithful() if self.cpu else None)

    @staticmethod
    def _fields(why: str | None) -> dict:
        if not why:
            return {}
        return {"skipped": f"interpreter: {why}", "not_checked": {"reason": "interpreter", "error": why}}


def run_job(job: dict, emit) -> None:
    """Worker task 'verify-dynamic': run cases[start:] and emit one event per case."""
    from kernalin_ci.domain import Domain
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops import get_op
    from kernalin_ci.verify.support import Support

    op = get_op(job["op"], root=job.get("root"))
    fn = load_entry(job["entry"], job.get("root"))
    cases = [Case.from_json(c) for c in job["cases"]]
    memo: dict = {}
    lazy_ok = job["device"] != "cpu" or skip_self_copy()
    device, params = job["device"], job["params"]
    main_dtype = job.get("main_dtype") or (cases[0].dtype if cases else "float32")
    support = Support(op, params, Domain.from_json(job.get("domain")), main_dtype,
                      lambda c, p: launch(op, fn, c, p, device),
                      unfaithful=lambda: take_unfaithful() if device == "cpu" else None)
    interp = Interpreter(device == "cpu")
    for i in range(job.get("start", 0), len(cases)):
        case = cases[i]
        emit({"event": "case-start", "index": i})
        t0 = time.perf_counter()
        if "huge" in case.tags and not lazy_ok:
            emit({"event": "case-done", "index": i, "seconds": 0.0, "findings": [],
                  "not_checked": {"reason": "interpreter", "error": "this Triton interpreter would make the "
                                                                    "2^31-element buffers resident"}})
            continue
        unfaithful = interp.cannot_run(case.dtype)
        if unfaithful:
            emit({"event": "case-done", "index": i, "seconds": 0.0, "findings": [], **unfaithful})
            continue
        notices: list = []
        try:
            outcome = support.run(case, lambda c, p: run_case(op, fn, c, p, device, memo,
                                                              poison=job.get("poison", True), notices=notices))
        except CudaContextLost as e:
            emit({"event": "case-done", "index": i, "seconds": time.perf_counter() - t0,
                  "findings": [Finding("call", "cuda-error", str(e)).to_json()]})
            emit({"event": "restart", "reason": "CUDA context lost"})
            return
        base = os.path.realpath(job.get("root") or os.getcwd()) + os.sep
        for n in notices:
            if n.location and os.path.realpath(n.location.path).startswith(base):
                rel = os.path.realpath(n.location.path)[len(base):]
                n.message = n.message.replace(n.location.path, rel)
                n.location.path = rel
            emit({"event": "notice", "index": i, "notice": n.to_json()})
        unfaithful = interp.after_case()  # then the case is not checked, whatever it showed
        found = [] if unfaithful else [f.to_json() for f in outcome.findings]
        emit({"event": "case-done", "index": i, "seconds": time.perf_counter() - t0, "findings": found,
              **(unfaithful or outcome.event_fields())})
