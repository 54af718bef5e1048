"""Worker task "verify-structural": capture, compile, interpret, analyse, in the child process.

The user's code is imported only here (in `python -m kernalin_ci.worker`), with
TRITON_INTERPRET off: the kernels are compiled for sm_90 on the CPU and never
launched. One event carries the result back:
`{"event": "structural-done", "findings": [...], "notices": [...], "kernels": [...], "seconds": {...}}`.
"""
from __future__ import annotations

import os
import time


def analyze_entry(op_name: str, fn, params: dict, root: str | None = None) -> dict:
    """Run every structural check on one entry (already loaded). Returns plain data; source paths
    under `root` (default: the current directory) are made relative to it."""
    from kernalin_ci.ops import get_op
    from kernalin_ci.verify.structural import analysis_of
    from kernalin_ci.verify.structural.capture import CaptureError, capture
    from kernalin_ci.verify.structural.common import Report, check_bounds, check_precision
    from kernalin_ci.verify.structural.compile import CompileError, ttir
    from kernalin_ci.verify.structural.dataflow import KernelView, link_views
    from kernalin_ci.verify.structural.interp import Interp, InterpError
    from kernalin_ci.verify.structural.ir import ParseError, parse_module

    rep = Report()
    times = {"capture": 0.0, "compile": 0.0, "interpret": 0.0, "analyse": 0.0}
    kernels = []
    analysis = analysis_of(get_op(op_name))
    if analysis is None:
        rep.notice("structural", f"could not verify: no structural checks for op {op_name}")
        return _result(rep, kernels, times, root)
    t0 = time.perf_counter()
    try:
        cap = capture(op_name, fn, params)
    except CaptureError as e:
        rep.notice("capture", f"could not verify: {e}")
        return _result(rep, kernels, times, root)
    times["capture"] = time.perf_counter() - t0
    for note in cap.notes:
        rep.notice("capture", note)
    if not cap.launches:
        rep.notice("capture", "could not verify: the entry launched no Triton kernel")
        return _result(rep, kernels, times, root)
    model = analysis.model(cap)
    views = []
    shadow: dict = {}   # memory written by earlier launches (split-KV partials)
    complete = True
    for la in cap.launches:
        where = (la.path, la.line)
        t1 = time.perf_counter()
        try:
            text = ttir(la)
            module = parse_module(text)
        except (CompileError, ParseError) as e:
            rep.notice("compile", f"could not verify kernel {la.kernel}: {e}", where=where)
            complete = False
            continue
        finally:
            times["compile"] += time.perf_counter() - t1
        t2 = time.perf_counter()
        try:
            trace = Interp(module, la, cap, model, shadow=shadow).run()
        except InterpError as e:
            from kernalin_ci.verify.structural.dataflow import line_of

            at = line_of(e.op, la) if e.op is not None else None
            rep.notice("interpret", f"could not verify kernel {la.kernel}: {e}", where=at or where)
            complete = False
            continue
        finally:
            times["interpret"] += time.perf_counter() - t2
        view = KernelView(la, module, trace, cap, list(cap.tensors))
        views.append(view)
        kernels.append({"kernel": la.kernel, "grid": list(la.grid), "path": la.path, "line": la.line,
                        "ops": sum(1 for _ in module.walk()), "programs": trace.programs})
    t3 = time.perf_counter()
    if views and complete:
        link_views(views)
        for view in views:
            check_bounds(view, rep, stores=analysis.store_bounds)
            check_precision(view, rep)
        analysis.analyze(cap, views, rep, model)
    elif views:
        rep.notice("structural", "could not verify the whole entry: some of its kernels could not be followed "
                                 "(the checks that need every kernel were skipped)")
        for view in views:
            check_bounds(view, rep)
            check_precision(view, rep)
    times["analyse"] = time.perf_counter() - t3
    return _result(rep, kernels, times, root)


def _result(rep, kernels, times, root) -> dict:
    base = os.path.realpath(root or os.getcwd()) + os.sep
    for item in rep.findings + rep.notices:
        if item.location is not None:
            p = os.path.realpath(item.location.path)
            if p.startswith(base):
                item.location.path = p[len(base):]
    return {"findings": [f.to_json() for f in rep.findings], "notices": [n.to_json() for n in rep.notices],
            "kernels": kernels, "seconds": {k: round(v, 4) for k, v in times.items()}}


def run_job(job: dict, emit) -> None:
    """Worker task 'verify-structural'."""
    # kernels are compiled, never interpreted: `triton.jit` must give JITFunctions (set before the entry
    # imports Triton; the parent sets it in the environment too)
    os.environ["TRITON_INTERPRET"] = "0"
    from kernalin_ci.entry import load_entry

    t0 = time.perf_counter()
    fn = load_entry(job["entry"], job.get("root"))
    emit({"event": "structural-start"})
    result = analyze_entry(job["op"], fn, job["params"], job.get("root"))
    result["seconds"]["total"] = round(time.perf_counter() - t0, 4)
    emit({"event": "structural-done", **result})
