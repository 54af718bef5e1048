"""Dynamic checks, the worker's half: launch the entry on each case and hand back what it produced.

Per case: fresh inputs (own seed), tensors moved into canary-guarded buffers, the call (with poisoned
allocations), then the raw result (verify/exchange.py): the outputs, every input as the call left
it, the guards, all moved to the CPU and written to a file the parent named. Nothing is judged here:
the parent, which never imports the PR's code, builds the inputs again from the same seeds and
computes every finding (verify/judge.py). The child cannot say "pass"; it can only hand back tensors.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from kernalin_ci.device import DEVICES
from kernalin_ci.entry import load_entry, signature_mismatch
from kernalin_ci.errors import UsageError
from kernalin_ci.jobs import DynamicJob, Emit, LaunchJob
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Case, Expected, Op
from kernalin_ci.runtime.cuda_errors import CUDA_ERROR
from kernalin_ci.runtime.interp_bf16 import take_unfaithful
from kernalin_ci.runtime.interp_patches import skip_self_copy
from kernalin_ci.runtime.poison import fill_canary, poisoned_allocations, prime_cuda_allocator
from kernalin_ci.verify import exchange
from kernalin_ci.verify.exchange import GUARD, plain, snapshot, sparse_rows
from kernalin_ci.verify.loop_drive import drive_op_loop
from kernalin_ci.verify.precision import launched_ttir, recorded_launches
from kernalin_ci.verify.support import EntryRaised, Interpreter, Support


class CudaContextLost(Exception):
    """A CUDA error poisons the context: the worker reports it and exits."""


def guard_inputs(kw: dict, skip: set) -> tuple[dict, dict]:
    """Copy each tensor into the middle of a canary-filled buffer; return new kwargs and the guards."""
    out, guards = {}, {}
    for name, t in kw.items():
        if not isinstance(t, torch.Tensor) or name in skip or not t.is_contiguous():
            out[name] = t
            continue
        flat = fill_canary(torch.empty(t.numel() + 2 * GUARD, dtype=t.dtype, device=t.device))
        view = flat[GUARD : GUARD + t.numel()].view(t.shape)
        view.copy_(t)
        out[name] = view
        guards[name] = flat
    return out, guards


def sync(device: str) -> None:
    if DEVICES[device].gpu:
        torch.cuda.synchronize()


def _raised(e: Exception, device: str) -> Exception:
    """What an exception the entry raised becomes: CudaContextLost for a CUDA error on a GPU, else EntryRaised."""
    msg = " ".join(str(e).split())[:400]
    if DEVICES[device].gpu and CUDA_ERROR.search(f"{type(e).__name__} {msg}"):
        return CudaContextLost(f"{type(e).__name__}: {msg}")
    return EntryRaised(f"{type(e).__name__}: {msg}")


def run_case(op: Op, fn, case: Case, params: dict, device: str, poison: bool = True, hand_back=None) -> dict | int:
    """One call of the entry on `case`; its raw result (verify/exchange.py), judged by the parent. For a
    case the op runs as a loop of calls (Op.loop: decode_step), each call's raw result goes to `hand_back`
    as a part, and the number of parts is returned."""
    loop = op.loop(case, params, poison)
    if loop is not None:  # a loop of calls: each step's raw result handed back as a part
        if hasattr(hand_back, "running"):  # each part says which case it belongs to (a case moved to another shape)
            hand_back.running = case
        try:
            return drive_op_loop(fn, loop, device, hand_back)
        except Exception as e:  # the user's kernel: any exception is its error
            raise _raised(e, device) from None
    kw = op.inputs(case, params, device, poison)
    writable = set(op.written_names(params))
    lazy = writable if "huge" in case.tags else set()
    guards = {}
    if poison:
        kw, guards = guard_inputs(kw, skip=lazy)
    raw: dict = {}
    if op.user_code:  # the user's inputs and reference: the parent cannot run them (verify/judge.py)
        before = snapshot(kw, skip=lazy)
        raw["before"] = {
            k: (plain(v) if isinstance(v, torch.Tensor) else v)
            for k, v in before.items()
            if isinstance(v, (torch.Tensor, int, float, bool, str)) or v is None
        }
    if poison and DEVICES[device].gpu:
        prime_cuda_allocator()
    launched = None
    try:
        with (
            poisoned_allocations() if poison else nullcontext(),
            recorded_launches() if DEVICES[device].gpu else nullcontext() as launched,
        ):
            ret = fn(**kw)
        sync(device)
    except Exception as e:  # the user's kernel: any exception is its error
        raise _raised(e, device) from None
    raw["inputs"] = {k: plain(v) for k, v in kw.items() if isinstance(v, torch.Tensor) and k not in lazy}
    raw["sparse"] = {k: sparse_rows(v) for k, v in kw.items() if isinstance(v, torch.Tensor) and k in lazy}
    raw["guards"] = {k: [plain(flat[:GUARD]), plain(flat[-GUARD:])] for k, flat in guards.items()}
    if launched:
        raw["ttir"] = launched_ttir(launched)
    try:
        outs = op.outputs(ret, kw)
    except TypeError as e:
        raw["outputs_error"] = str(e)
        return raw
    raw["outputs"], raw["output_aliases"], raw["output_types"] = {}, {}, {}
    for name, t in outs.items():
        if not isinstance(t, torch.Tensor):
            raw["output_types"][name] = type(t).__name__
            continue
        src = next((k for k, v in kw.items() if isinstance(v, torch.Tensor) and _same(v, t)), None)
        if src is not None:
            raw["output_aliases"][name] = src
        else:
            raw["outputs"][name] = plain(t)
    if op.user_code:
        cpu_before = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in before.items()}
        expected: Expected = op.reference(cpu_before, params)
        raw["expected"] = {k: plain(v) for k, v in expected.tensors.items()}
        raw["row_slack"] = {k: plain(v) for k, v in expected.row_slack.items()}
        raw["tolerance"] = expected.tolerance
    return raw


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """b is a (view equal to) input a: the output is that input, written in place."""
    return a is b or (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def launch(op, fn, case: Case, params: dict, device: str) -> None:
    """One call of the entry on a case, nothing checked: does the kernel take this shape at all?"""
    kw = op.inputs(case, params, device, poison=False)
    try:
        fn(**kw)
        sync(device)
    except Exception as e:
        raise _raised(e, device) from None


def check_signature(op: Op, fn, entry: str, cases: list[Case], params: dict) -> None:
    """Before any case: the entry must take the op's inputs by name (docs/ops.md). A mismatch is the
    user's to fix, one line and exit 2 (the worker hands the UsageError back), never a finding per case."""
    small = next((c for c in cases if "huge" not in c.tags), None)
    if small is None:
        return
    names = list(op.inputs(small, params, "cpu", poison=False))
    why = signature_mismatch(fn, names)
    if why:
        raise UsageError(f"entry {entry}: does not take the inputs of op {op.name} ({', '.join(names)}): {why}")


def run_job(job: DynamicJob, device: str, emit: Emit) -> None:
    """Worker task 'verify-dynamic': run cases[start:]; per case a raw result file and one event."""
    op = get_op(job.op, root=job.root)
    fn = load_entry(job.entry, job.root)
    cases = list(job.cases)
    check_signature(op, fn, job.entry, cases, job.params)
    lazy_ok = not DEVICES[device].interpreted or skip_self_copy()
    params, results = job.params, job.results
    main_dtype = job.main_dtype or (cases[0].dtype if cases else "float32")
    support = Support(
        op,
        params,
        job.domain,
        main_dtype,
        lambda c, p: launch(op, fn, c, p, device),
        unfaithful=lambda: take_unfaithful() if DEVICES[device].interpreted else None,
    )
    interp = Interpreter(DEVICES[device].interpreted)
    for i in range(job.start, len(cases)):
        case = cases[i]
        emit({"event": "case-start", "index": i})
        t0 = time.perf_counter()
        if "huge" in case.tags and not lazy_ok:
            emit(
                {
                    "event": "case-done",
                    "index": i,
                    "seconds": 0.0,
                    "status": "not-run",
                    "not_checked": {
                        "reason": "interpreter",
                        "error": "this Triton interpreter would make the 2^31-element buffers resident",
                    },
                }
            )
            continue
        unfaithful = interp.cannot_run(case.dtype)
        if unfaithful:
            emit({"event": "case-done", "index": i, "seconds": 0.0, "status": "not-run", **unfaithful})
            continue
        try:
            outcome = support.run(
                case,
                lambda c, p: run_case(
                    op,
                    fn,
                    c,
                    p,
                    device,
                    poison=job.poison,
                    hand_back=exchange.hand_back_parts(emit, results, i, case),
                ),
            )
        except CudaContextLost as e:
            emit(
                {
                    "event": "case-done",
                    "index": i,
                    "seconds": time.perf_counter() - t0,
                    "status": "cuda-error",
                    "error": str(e),
                }
            )
            emit({"event": "restart", "reason": "CUDA context lost"})
            return
        unfaithful = interp.after_case()  # then the case is not checked, whatever it showed
        ev = {"event": "case-done", "index": i, "seconds": time.perf_counter() - t0}
        if unfaithful:
            ev.update(status="not-run", **unfaithful)
        elif outcome.error is not None:
            ev.update(status="raised", error=outcome.error, **outcome.event_fields())
        elif isinstance(outcome.result, int):  # handed back in parts (Op.loop)
            ev.update(status="ok", **outcome.event_fields())
        elif outcome.result is not None:
            ev.update(
                status="ok",
                file=exchange.save(results, exchange.file_name(i), outcome.result),
                **outcome.event_fields(),
            )
        else:
            ev.update(status="not-run", **outcome.event_fields())
        emit(ev)


def run_launch_job(job: LaunchJob, device: str, emit: Emit) -> None:
    """Worker task 'verify-launch': launch the entry once on each case, nothing checked here (a tool that wraps
    the worker watches the launches: Compute Sanitizer, kernalin_ci/cuda/sanitizer.py). No poison and no guard
    zones: each input is an allocation of its own, so the tool sees an access past it."""
    op = get_op(job.op, root=job.root)
    fn = load_entry(job.entry, job.root)
    for i, case in enumerate(job.cases):
        emit({"event": "case-start", "index": i})
        t0 = time.perf_counter()
        ev = {"event": "case-done", "index": i, "status": "ok"}
        try:
            launch(op, fn, case, job.params, device)
        except CudaContextLost as e:
            emit({**ev, "status": "cuda-error", "error": str(e), "seconds": time.perf_counter() - t0})
            return
        except EntryRaised as e:
            ev.update(status="raised", error=str(e))
        emit({**ev, "seconds": time.perf_counter() - t0})
