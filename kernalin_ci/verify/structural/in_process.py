"""Capture and analyse one entry in this process: the catalogue's own kernels, for tests and benchmarks
(never a user's: `verify_structural` runs the capture in a worker)."""

from __future__ import annotations

import tempfile

from kernalin_ci.ops import get_op
from kernalin_ci.verify.structural import material
from kernalin_ci.verify.structural.analyse import analyse
from kernalin_ci.verify.structural.capture import capture_cases
from kernalin_ci.verify.structural.common import StructuralFindings
from kernalin_ci.verify.structural.ptx_run import analyse_ptx
from kernalin_ci.verify.structural.registry import analysis_of, not_modelled
from kernalin_ci.verify.structural.result import structural_result
from kernalin_ci.verify.structural.task import capture_material


def analyze_entry(op_name: str, fn, params: dict, root: str | None = None, domain=None, engine: str = "ttir") -> dict:
    """Capture, hand over and analyse one entry in this process (the catalogue's own kernels: tests and
    benchmarks/structural_bench.py, benchmarks/ptx_bench.py), through the same material file a worker
    writes; engine "ptx": the PTX engine (ptx_run.py)."""
    op = get_op(op_name)
    if analysis_of(op) is None:
        return analyse(op_name, material.Material(None, [], None, []), root)
    unmodelled = not_modelled(op, params)
    if unmodelled:  # as `verify` says it: never analysed by a definition without these features
        return structural_result(StructuralFindings(), [], {}, root, not_analysed=unmodelled)
    raw, seconds = capture_material(op_name, fn, params, domain, engine)
    with tempfile.TemporaryDirectory(prefix="kernalin-structural-") as d:
        name = material.save(d, raw)
        mat = material.load(d, name, capture_cases(op, params, domain), op_name, params)
    if engine == "ptx":
        return analyse_ptx(op_name, mat, params, root, seconds, domain)
    return analyse(op_name, mat, root, seconds)
