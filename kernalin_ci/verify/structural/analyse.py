"""The structural analyses, in the parent: the worker's material in, findings and notices out.

Never imports PR code: the material (material.py) is the worker's captured launches, tensors and TTIR
texts, checked field by field on loading. Here each TTIR text is parsed, every kernel is interpreted
abstractly (interpreter.py, op_handlers.py) and the checks run (common.py and the op's own module).
"""

from __future__ import annotations

import time

from kernalin_ci.ops import get_op
from kernalin_ci.verify.structural.abstract_values import InterpError
from kernalin_ci.verify.structural.common import COMMON_PROPERTIES, StructuralFindings, check_bounds, check_precision
from kernalin_ci.verify.structural.dataflow import KernelView, line_of, link_views
from kernalin_ci.verify.structural.interpreter import Interp
from kernalin_ci.verify.structural.ir import ParseError
from kernalin_ci.verify.structural.ir_parser import parse_module
from kernalin_ci.verify.structural.registry import analysis_of
from kernalin_ci.verify.structural.result import analysis_failure, structural_result


def analyse(op_name: str, mat, root: str | None = None, seconds: dict | None = None) -> dict:
    """Findings, notices, kernels and status of one entry from its material (material.Material) as plain
    data; source paths under `root` (default: the current directory) are made relative to it."""
    rep = StructuralFindings()
    times = {"capture": 0.0, "compile": 0.0, **(seconds or {}), "parse": 0.0, "interpret": 0.0, "analyse": 0.0}
    kernels: list = []
    analysis = analysis_of(get_op(op_name))
    if analysis is None:
        return structural_result(rep, kernels, times, root, not_analysed=f"no structural checks for op {op_name}")
    cap = mat.capture
    if cap is None:
        more = f" ({len(mat.refused)} shapes tried)" if len(mat.refused) > 1 else ""
        return structural_result(
            rep, kernels, times, root, not_analysed=(mat.refused[0] if mat.refused else "no capture call") + more
        )
    t0 = time.perf_counter()
    try:
        modules = [parse_module(text) for text in mat.texts]
    except ParseError as e:
        return structural_result(rep, kernels, times, root, not_analysed=f"a kernel's TTIR does not parse: {e}")
    finally:
        times["parse"] = time.perf_counter() - t0
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
            at = line_of(e.op, la) if e.op is not None else None
            rep.notice("structural:interpret", f"could not verify kernel {la.kernel}: {e}", where=at or where)
            unfollowed.append(f"kernel {la.kernel} could not be followed: {e}")
            complete = False
            continue
        except Exception as e:  # an IR our interpreter does not foresee: this kernel is not analysed
            why = analysis_failure(e)
            rep.notice("structural:interpret", f"could not verify kernel {la.kernel}: {why}", where=where)
            unfollowed.append(f"kernel {la.kernel} could not be followed: {why}")
            complete = False
            continue
        finally:
            times["interpret"] += time.perf_counter() - t2
        views.append(KernelView(la, module, trace, cap, list(cap.tensors)))
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
    proved = [*COMMON_PROPERTIES, *(p for p in analysis.properties if p not in rep.gaps)] if complete else []
    return structural_result(
        rep, kernels, times, root, not_analysed="; ".join(unfollowed) or None, shape=mat.label, proved=proved
    )
