"""Compare an entry's outputs with the float64 reference: per-row relative error,
unwritten (canary) elements, non-finite values, and bug fingerprints."""

from __future__ import annotations

import math

from kernalin_ci.findings import CaseErrors, Finding
from kernalin_ci.lazy import torch
from kernalin_ci.ops.base import TOLERANCE, Expected, Op
from kernalin_ci.runtime.poison import is_canary
from kernalin_ci.runtime.rows import row_errors, rows


class NotATensor:
    """An output the entry returned that is not a tensor (its type's name, as the worker saw it)."""

    def __init__(self, type_name: str):
        self.type_name = type_name


def check_reference(
    op: Op,
    case,
    before: dict,
    outs: dict,
    params: dict,
    memo: dict,
    tolerance: float | None = None,
    expected: Expected | None = None,
) -> list[Finding]:
    """Every output against op.reference(before) (or `expected`, already computed); explain failures
    with fingerprints. `tolerance` raises the case's own (float32 computed on TF32), never lowers it; with it,
    each output's Expected.tf32_slack is added to its rows' tolerance."""
    expected = expected if expected is not None else op.reference(before, params)
    tol = expected.tolerance or TOLERANCE.get(case.dtype, TOLERANCE["float32"])
    tol = max(tol, tolerance or 0.0)
    memo[case.name] = expected
    findings: list[Finding] = []
    fps = None
    for name, exp in expected.tensors.items():
        act = outs.get(name)
        if not isinstance(act, torch.Tensor):
            findings.append(
                Finding(
                    "output-shape",
                    "wrong-output",
                    f"output {name!r}: expected a tensor, got {getattr(act, 'type_name', type(act).__name__)}",
                )
            )
            continue
        if tuple(act.shape) != tuple(exp.shape):
            findings.append(
                Finding(
                    "output-shape",
                    "wrong-output",
                    f"output {name!r}: shape {tuple(act.shape)}, expected {tuple(exp.shape)}",
                )
            )
            continue
        canary = rows(is_canary(act).cpu()).any(-1)
        a64 = act.detach().to("cpu", torch.float64)
        finite_exp = torch.isfinite(rows(exp)).all(-1)
        nonfinite = ~torch.isfinite(rows(a64)).all(-1) & finite_exp & ~canary
        if bool(canary.any()):
            r = int(canary.nonzero()[0])
            n_el = int(is_canary(act).sum())
            findings.append(
                Finding(
                    "output-written",
                    "unwritten-output",
                    f"{name}: {n_el} of {act.numel()} elements never written (the poison survived) in "
                    f"{int(canary.sum())} of {canary.numel()} rows; first {op.row_label(case, before, name, r)}",
                )
            )
        if bool(nonfinite.any()):
            r = int(nonfinite.nonzero()[0])
            findings.append(
                Finding(
                    "finite",
                    "non-finite",
                    f"{name}: NaN/Inf in {int(nonfinite.sum())} of {nonfinite.numel()} rows where the reference is "
                    f"finite; first {op.row_label(case, before, name, r)}",
                )
            )
        err = row_errors(a64, exp)
        limit = torch.full_like(err, tol)
        for slack in (expected.row_slack.get(name), expected.tf32_slack.get(name) if tolerance else None):
            if slack is not None:
                limit = limit + slack.to(err.dtype).reshape(-1)
        bad = ~(err <= limit) & ~canary & ~nonfinite
        if not bool(bad.any()):
            continue
        worst = int(torch.where(bad, err, torch.zeros_like(err)).argmax())
        cls = "wrong-output"
        if fps is None:
            fps = op.fingerprints(before, params, case)
        for fp_class, alt in fps:
            if name in alt and bool((row_errors(a64, alt[name])[bad] <= limit[bad]).all()):
                cls = fp_class
                break
        repeat = next((t.split(":", 1)[1] for t in case.tags if t.startswith("repeat-of:")), None)
        if cls == "wrong-output" and repeat in memo:
            old = memo[repeat].tensors.get(name)
            if old is not None and old.shape == exp.shape and bool((row_errors(a64, old)[bad] <= limit[bad]).all()):
                cls = "stale-result"
        why = {
            "stale-result": f"; it equals the output of the earlier case {repeat!r}: results are cached across calls",
            "wrong-output": "",
        }.get(cls, f"; it matches what a {cls} bug produces")
        findings.append(
            Finding(
                "reference",
                cls,
                f"{name}: {int(bad.sum())} of {bad.numel()} rows off the float64 reference (worst relative error "
                f"{float(err[worst]):.3g} at {op.row_label(case, before, name, worst)}; tolerance "
                f"{float(limit[worst]):.3g}){why}",
            )
        )
    return findings


# the relative error's guard against a zero reference element (FlashInfer-Bench's definition of its errors)
REL_EPS = 1e-8


def max_errors(expected: Expected, outs: dict) -> CaseErrors | None:
    """The largest absolute and relative error, element by element, of every output compared with its float64
    reference (an unwritten or non-finite element makes them NaN); None when no output could be compared (not
    a tensor, another shape) or the reference is exact (a bit-for-bit check has no error figure)."""
    if expected.exact:
        return None
    worst_abs, worst_rel, compared = 0.0, 0.0, False
    for name, exp in expected.tensors.items():
        act = outs.get(name)
        if not isinstance(act, torch.Tensor) or tuple(act.shape) != tuple(exp.shape):
            return None
        diff = (act.detach().to("cpu", torch.float64) - exp).abs()
        if diff.numel() == 0:
            continue
        rel = diff / (exp.abs() + REL_EPS)
        # max() keeps NaN: an output element that is NaN where the reference is not is no small error
        worst_abs, worst_rel = _worst(worst_abs, float(diff.max())), _worst(worst_rel, float(rel.max()))
        compared = True
    return CaseErrors(worst_abs, worst_rel) if compared else None


def _worst(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)
