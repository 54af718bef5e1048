"""The gate's use of the explanations (kernalin_ci.gate.run calls `before_bench` and `after_bench`).

before_bench: compile base and head at the benchmark shapes (two worker children, side by side), compare
them, record the environment; the shapes to time are the ones whose compiled code differs (all of them
after a toolchain change or when the comparison could not be made). after_bench: % of peak per timed
shape, base against head per changed kernel, the environment again (a change refuses the comparison:
`inconclusive: environment changed`), the correctness re-check, and Nsight Compute when asked.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kernalin_ci.bench.shapes import bench_cases, split_params
from kernalin_ci.device import DEVICES
from kernalin_ci.explain import peak as peak_mod
from kernalin_ci.explain import provenance
from kernalin_ci.explain.identity import EQUIVALENT, Identity, SideCompile, compare, compile_side, why_changed
from kernalin_ci.explain.model import Explanation, Provenance
from kernalin_ci.explain.profile import nsight
from kernalin_ci.explain.recheck import recheck, smallest
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params

ENV_CHANGED = "inconclusive: environment changed"
_COPY: dict = {}  # device -> measured copy GB/s, once per gate process


@dataclass
class ExplainPlan:
    cases: list
    ident: Identity
    base: SideCompile
    head: SideCompile
    env_start: dict
    to_time: list = field(default_factory=list)
    base_root: str = ""

    @property
    def skip_timing(self) -> bool:
        return self.ident.all_identical


def before_bench(
    op_name: str, entry: str, op_params: dict, bench_params: dict, device: str, base_root: str, head_root: str
) -> ExplainPlan:

    resolved = resolve_params(op_name, get_op(op_name).params, op_params)
    cases = bench_cases(op_name, resolved, device, bench_params)
    with ThreadPoolExecutor(2) as pool:  # two children: the compiles overlap
        fb = pool.submit(compile_side, op_name, entry, base_root, resolved, cases)
        fh = pool.submit(compile_side, op_name, entry, head_root, resolved, cases)
        base, head = fb.result(), fh.result()
    ident = compare(base, head, cases)
    if device not in _COPY:
        env = provenance.environment(device, measure_copy=DEVICES[device].gpu)
        _COPY[device] = env.get("copy_gbs")
    else:
        env = provenance.environment(device)
        env["copy_gbs"] = _COPY[device]
    return ExplainPlan(cases, ident, base, head, env, ident.to_time([c.name for c in cases]), base_root)


def skipped(plan: ExplainPlan) -> Explanation:
    """The explanation of a kernel whose compiled code is identical: nothing was timed."""
    return Explanation(plan.ident, EQUIVALENT, peak=[], provenance=Provenance(plan.env_start))


def after_bench(
    plan: ExplainPlan, kr, k, op_name: str, op_params: dict, device: str, head_root: str, profile: bool = False
) -> Explanation:
    """Fill the explanation after timing; may turn the verdict inconclusive or fail the kernel."""

    op = get_op(op_name)
    params = resolve_params(op_name, op.params, op_params)
    bench = kr.benchmark  # the BenchResult this explains
    env_end = provenance.environment(device)
    env_end["copy_gbs"] = _COPY.get(device)
    env_changed = provenance.changed(plan.env_start, env_end) if not env_end.get("error") else []
    env_changed += plan.ident.toolchain_changed
    out = Explanation(plan.ident, peak=[], provenance=Provenance(plan.env_start, env_end, env_changed, _regime(bench)))
    same = [x.shape for x in plan.ident.shapes if x.identical and x.shape not in plan.to_time]
    if same and bench is not None:
        bench.notes.append(
            f"{len(same)} of {len(plan.cases)} shapes not timed: identical compiled code ({', '.join(same)})"
        )
    if env_changed and bench is not None and bench.verdict is not None:
        bench.verdict_measured = bench.verdict.verdict
        bench.verdict.verdict = "inconclusive"
        out.verdict = f"{ENV_CHANGED} ({'; '.join(env_changed)})"
    # % of peak, per timed shape and side
    gpu = plan.env_start.get("gpu_name")
    peaks = peak_mod.gpu_peaks(gpu) if gpu else None
    by_name = {c.name: c for c in plan.cases}
    rows: list[dict] = []
    for s in bench.shapes if bench is not None else []:
        case = by_name.get(s.shape)
        t = op.traffic(case, params) if case is not None else None
        row: dict = {"shape": s.shape, "model": None}
        if t is None:
            row["model"] = f"no bytes/FLOPs model for op {op_name}"
        else:
            j = [c.name for c in plan.cases].index(case.name)
            for side, comp in (("base", plan.base), ("head", plan.head)):
                launches = ((comp.shapes[j] or {}).get("launches") or []) if comp.shapes else []
                # interpreter times are no GPU figures
                ms = (s.base_ms if side == "base" else s.head_ms) if DEVICES[device].timed else None
                row[side] = peak_mod.shape_peak(
                    t,
                    ms,
                    case.dtype,
                    peaks,
                    _COPY.get(device) if DEVICES[device].gpu else None,
                    peak_mod.uses_tensor_cores(launches),
                )
        rows.append(row)
    out.peak = rows
    if not DEVICES[device].timed:
        out.peak_note = "CPU interpreter wall-clock times: % of a GPU's peak is not available on the CPU"
    elif peaks is None:
        out.peak_note = f"GPU {gpu!r} is not in the peak table: shares of peak not available"
    out.above_peak = any((r.get(side) or {}).get("above_peak") for r in rows for side in ("base", "head"))
    out.why = why_changed(plan.base, plan.head, plan.cases, plan.ident)
    # correctness after timing: one timed case of the head, against the reference
    timed = [by_name[n] for n in plan.to_time if n in by_name]
    case = smallest(op, params, timed)
    if case is not None and not kr.error:
        out.recheck = recheck(k, op_name, case, device, head_root)
    out.profile = nsight(profile, op_name, k.entry, str(plan.base_root), head_root, params, case, device)
    return out


def _regime(bench) -> dict:
    """The timing regime BenchResult BENCH reports (clock, L2 flush, per-shape timing, reps)."""
    if bench is None:
        return {"clock": None, "l2_flush": None, "reps": None, "timing": []}
    return {
        "clock": bench.clock,
        "l2_flush": bench.l2_flush,
        "reps": bench.reps,
        "timing": sorted({str(s.timing) for s in bench.shapes if s.timing}),
        "regime": bench.regime,
    }


# --------------------------------------------------------------------------- the gate's two calls


def plan_kernel(kr, k, op_name: str, params: dict, device: str, base_root, head_root) -> ExplainPlan | None:
    """Before timing: the plan, or None (kr.explain says why) when the explanation could not start."""

    op_params, bench_params = split_params(params)
    try:
        plan = before_bench(op_name, k.entry, op_params, bench_params, device, str(base_root), str(head_root))
    except Exception as e:  # never take the gate down: the benchmark runs as without it
        kr.explain = Explanation(error=_error(e))
        return None
    if plan.skip_timing:
        kr.explain = skipped(plan)
        kr.benchmark_note = f"{EQUIVALENT}: every kernel and launch configuration is byte-identical, not timed"
    return plan


CPU_NOT_TIMED = (
    "not timed on the CPU: the Triton interpreter's wall-clock time measures Python, not the kernel, and never "
    "gates (a GPU runner times it)"
)


def untimed_on_cpu(kr, plan: ExplainPlan | None) -> None:
    """The gate on the CPU: no timing (docs/config.md), said once in the note; the explanation is the
    compiled-code comparison alone (which shapes differ, and how), none of a GPU's figures."""
    kr.benchmark_note = CPU_NOT_TIMED
    if plan is not None:  # else the comparison could not start, and kr.explain says why
        kr.explain = Explanation(plan.ident, peak=[], provenance=Provenance(plan.env_start))


def finish_kernel(
    kr, plan: ExplainPlan, k, op_name: str, params: dict, device: str, head_root, profile: bool = False
) -> None:

    op_params, _ = split_params(params)
    try:
        kr.explain = after_bench(plan, kr, k, op_name, op_params, device, str(head_root), profile)
    except Exception as e:
        kr.explain = Explanation(plan.ident, error=_error(e))
        return
    if kr.explain.verdict and kr.explain.verdict.startswith(ENV_CHANGED):
        kr.benchmark_note = kr.explain.verdict


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def failed_by(kr, fail_on) -> list[str]:
    """Policy items the explanation fails: a re-check finding is a finding."""
    rc = (kr.explain.recheck if kr.explain is not None else None) or {}
    return ["finding"] if rc.get("findings") and "finding" in fail_on else []
