"""Worker task "verify-structural": capture, compile, interpret, analyse, in the child process.

The user's code is imported only here (in `python -m kernalin_ci.kernel_worker`), with
TRITON_INTERPRET off: the kernels are compiled for sm_90 on the CPU and never
launched. One event carries the result back:
`{"event": "structural-done", "findings": [...], "notices": [...], "kernels": [...], "seconds": {...}}`.
"""

from __future__ import annotations

import os
import time


def analyze_entry(op_name: str, fn, params: dict, root: str | None = None, domain=None) -> dict:
    """Run every structural check on one entry (already loaded). Returns plain data; source paths
    under `root` (default: the current directory) are made relative to it. `status` says whether the
    entry was analysed, and if not, why: a capture the kernel refuses or a kernel that does not
    compile moves on to the next candidate shape (the declared domain first)."""
    from kernalin_ci.ops import get_op
    from kernalin_ci.verify.structural import analysis_of
    from kernalin_ci.verify.structural.abstract_values import InterpError
    from kernalin_ci.verify.structural.capture import CaptureError, capture_at, capture_cases, shape_label
    from kernalin_ci.verify.structural.common import StructuralFindings, check_bounds, check_precision
    from kernalin_ci.verify.structural.compile import CompileError, ttir
    from kernalin_ci.verify.structural.dataflow import KernelView, link_views
    from kernalin_ci.verify.structural.interpreter import Interp
    from kernalin_ci.verify.structural.ir import ParseError, parse_module

    rep = StructuralFindings()
    times = {"capture": 0.0, "compile": 0.0, "interpret": 0.0, "analyse": 0.0}
    kernels: list = []
    op = get_op(op_name)
    analysis = analysis_of(op)
    if analysis is None:
        return _result(rep, kernels, times, root, not_analysed=f"no structural checks for op {op_name}")
    refused: list[str] = []
    cap, modules = None, []
    for case in capture_cases(op, params, domain):
        shape = shape_label(case)
        t0 = time.perf_counter()
        try:
            cap = capture_at(op, fn, params, case)
        except CaptureError as e:
            refused.append(f"at {shape}: {e}")
            continue
        finally:
            times["capture"] += time.perf_counter() - t0
        if not cap.launches:
            refused.append(f"at {shape}: the entry launched no Triton kernel")
            cap = None
            continue
        t1 = time.perf_counter()
        try:
            modules = [parse_module(ttir(la)) for la in cap.launches]
        except (CompileError, ParseError) as e:
            refused.append(f"at {shape}: a kernel does not compile: {e}")
            cap = None
            continue
        finally:
            times["compile"] += time.perf_counter() - t1
        break
    if cap is None:
        more = f" ({len(refused)} shapes tried)" if len(refused) > 1 else ""
        return _result(rep, kernels, times, root, not_analysed=(refused[0] if refused else "no capture call") + more)
    analysed_at = shape_label(case)
    for note in cap.notes:
        rep.notice("structural:capture", note)
    model = analysis.model(cap)
    views = []
    shadow: dict = {}  # memory written by earlier launches (split-KV partials)
    complete = True
    unfollowed = []
    for la, module in zip(cap.launches, modules):
        where = (la.path, la.line)
        t2 = time.perf_counter()
        try:
            trace = Interp(module, la, cap, model, shadow=shadow).run()
        except InterpError as e:
            from kernalin_ci.verify.structural.dataflow import line_of

            at = line_of(e.op, la) if e.op is not None else None
            rep.notice("structural:interpret", f"could not verify kernel {la.kernel}: {e}", where=at or where)
            unfollowed.append(f"kernel {la.kernel} could not be followed: {e}")
            complete = False
            continue
        finally:
            times["interpret"] += time.perf_counter() - t2
        view = KernelView(la, module, trace, cap, list(cap.tensors))
        views.append(view)
        kernels.append(
            {
                "kernel": la.kernel,
                "grid": list(la.grid),
                "path": la.path,
                "line": la.line,
                "ops": sum(1 for _ in module.walk()),
                "programs": trace.programs,
            }
        )
    t3 = time.perf_counter()
    if views and complete:
        link_views(views)
        for view in views:
            check_bounds(view, rep, stores=analysis.store_bounds)
            check_precision(view, rep)
        analysis.analyze(cap, views, rep, model)
    elif views:
        rep.notice(
            "structural:structural",
            "could not verify the whole entry: some of its kernels could not be followed "
            "(the checks that need every kernel were skipped)",
        )
        for view in views:
            check_bounds(view, rep)
            check_precision(view, rep)
    times["analyse"] = time.perf_counter() - t3
    return _result(rep, kernels, times, root, not_analysed="; ".join(unfollowed) or None, shape=analysed_at)


def _result(rep, kernels, times, root, not_analysed: str | None = None, shape: str | None = None) -> dict:
    base = os.path.realpath(root or os.getcwd()) + os.sep
    for item in rep.findings + rep.notices:
        if item.location is not None:
            p = os.path.realpath(item.location.path)
            if p.startswith(base):
                item.location.path = p[len(base) :]
    status = (
        {"status": "not-analysed", "cause": not_analysed, "shape": None}
        if not_analysed
        else {"status": "analysed", "cause": None, "shape": shape}
    )
    return {
        "findings": [f.to_json() for f in rep.findings],
        "notices": [n.to_json() for n in rep.notices],
        "kernels": kernels,
        "seconds": {k: round(v, 4) for k, v in times.items()},
        "status": status,
    }


def run_job(job: dict, emit) -> None:
    """Worker task 'verify-structural'."""
    # kernels are compiled, never interpreted: `triton.jit` must give JITFunctions (set before the entry
    # imports Triton; the parent sets it in the environment too)
    os.environ["TRITON_INTERPRET"] = "0"
    from kernalin_ci.entry import load_entry

    t0 = time.perf_counter()
    fn = load_entry(job["entry"], job.get("root"))
    emit({"event": "structural-start"})
    from kernalin_ci.domain import Domain

    result = analyze_entry(job["op"], fn, job["params"], job.get("root"), Domain.from_json(job.get("domain")))
    result["seconds"]["total"] = round(time.perf_counter() - t0, 4)
    emit({"event": "structural-done", **result})
