"""The PR gate: config + refs -> affected kernels -> verify + bench -> Report.

Every kernel is checked in its own worker children (kernalin_ci.verify and
kernalin_ci.bench start them), so one kernel's crash does not stop the gate. An
error while checking one kernel or pipeline (its entry does not load: a UsageError;
a bug of ours: any other exception) is recorded on that kernel, which fails, and
the gate goes on to the others: the report is always written.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kernalin_ci import config as config_mod
from kernalin_ci import explain, sandbox
from kernalin_ci.bench.pair import bench_pair
from kernalin_ci.config import Config
from kernalin_ci.cuda.sources import CudaSpec
from kernalin_ci.device import DEVICES
from kernalin_ci.domain import one_shape
from kernalin_ci.domain import resolve as resolve_domain
from kernalin_ci.errors import InternalError, UsageError, describe, log_text, write_log
from kernalin_ci.explain.gate import failed_by
from kernalin_ci.explain.render import explain_lines, explain_summary
from kernalin_ci.findings import VerifyResult
from kernalin_ci.gate.config_source import gate_config, override_changes
from kernalin_ci.gate.diff import Refs, affected_kernels, changed_files, missing_entry, resolve_refs, worktrees
from kernalin_ci.history.model import environment
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params
from kernalin_ci.ops.roles import FUSED, PIPELINE, pipeline_op
from kernalin_ci.progress import GateStep, KernelExplained, ProgressSink, TerminalSink
from kernalin_ci.report.model import KernelReport, PipelineReport, Report
from kernalin_ci.report.text import (
    benchmark_summary,
    config_change_text,
    config_origin_text,
    faster_text,
    isolation_text,
)
from kernalin_ci.throughput.bench import NOT_MEASURED_CPU, Role, bench_model, not_measured, role_names, unplaced
from kernalin_ci.trust import FILE, HEAD, ConfigOrigin
from kernalin_ci.verify import verify, verify_pipeline

if TYPE_CHECKING:
    from kernalin_ci.throughput.result import ModelResult


def log(msg: str, progress=None) -> None:
    """A step of the gate (shown even with --quiet), to the gate's sink (`gate_sink`)."""
    gate_sink(progress).event(GateStep(msg))


def working(msg: str, progress=None) -> None:
    """A step of the gate that takes a while: said at once, then repeated with its elapsed time while nothing
    else is said (kernalin_ci.progress)."""
    gate_sink(progress).event(GateStep(msg, working=True))


def gate_sink(progress) -> ProgressSink:
    """The gate's sink: a sink as it is; True/None the terminal; False the terminal with --quiet (its steps)."""
    if isinstance(progress, ProgressSink):
        return progress
    return TerminalSink(quiet=progress is False)


def judge(kr: KernelReport, cfg: Config, device: str) -> list[str]:
    """Which policy items (gate.fail_on) this kernel fails."""
    failed = []
    fail_on = cfg.gate.fail_on
    v = kr.verification
    if kr.error:
        failed.append("error")
    if v and v.findings and "finding" in fail_on:
        failed.append("finding")
    if v and (v.structural.status == "not-analysed" or v.structural.gaps) and "not-analysed" in fail_on:
        failed.append("not-analysed")  # in whole, or in part: a property that could not be checked (a gap)
    if v and v.needs_gpu and "not-checked" in fail_on:  # a CUDA kernel's cases on a host without a GPU
        failed.append("not-checked")
    verdict = kr.bench_verdict
    if verdict and DEVICES[device].timed:  # interpreter wall-clock timings never gate (docs/config.md)
        if verdict == "slower" and "slower" in fail_on:
            failed.append("slower")
        if verdict == "inconclusive" and "inconclusive" in fail_on:
            failed.append("inconclusive")

    failed += [x for x in failed_by(kr, fail_on) if x not in failed]
    return failed


def conclude(report: Report) -> tuple[str, str]:
    bad = [k for k in report.kernels if k.failed_by] + [p for p in report.pipelines if p.failed_by]
    checked = [k for k in report.kernels if k.status in ("changed", "new")]
    if bad:
        parts = []
        for item in bad:
            parts.append(f"{item.name} ({', '.join(item.failed_by)})")
        return "failure", "failed: " + "; ".join(parts)
    if not checked:
        return "success", "no kernel changed"
    unchecked = [k.name for k in checked if k.verification and k.verification.needs_gpu]
    if unchecked:  # never a pass: what could not run here is said, and fails where fail_on has not-checked
        return "neutral", f"not checked (needs a GPU): {', '.join(unchecked)}; nothing else failed"
    faster = [k.name for k in checked if k.bench_verdict == "faster"]
    msg = f"{len(checked)} kernel{'s' * (len(checked) != 1)} verified"
    if faster:
        msg += f"; {faster_text(faster)}"
    blind = [k.name for k in checked if k.verification and k.verification.structural.status == "not-analysed"]
    if blind:
        msg += f"; structure not analysed: {', '.join(blind)}"
    partly = [k.name for k in checked if k.verification and k.verification.structural.gaps]
    if partly:
        msg += f"; structure partly analysed (properties not verified): {', '.join(partly)}"
    return "success", msg


def run_gate(
    repo: Path,
    config_path: str | None,
    base: str | None,
    head: str | None,
    device: str,
    event_path: str | None = None,
    progress: bool | ProgressSink = True,
    on_start=None,
    gate_overrides: dict | None = None,
    profile: bool = False,
    model=None,
    head_branch: str | None = None,
) -> Report:
    """Run the whole gate and return the Report (the caller writes it out and posts it).
    gate_overrides: fields of config.Gate that replace the configuration's (e.g. the Action's fail-on).
    profile: Nsight Compute for the changed kernels where `ncu` is on PATH (kernalin_ci.explain).
    model: a ModelSpec (`--model`) in place of the configuration's `model:` shapes, serving points and price;
    the kernels in its places are the configuration's `model.kernels`, else found (config.place_kernels).
    The configuration is the base revision's (gate/config_source.py); head_branch: the head's branch, for the
    base's gate.trust_head_config (default: the Actions event's, else the branch checked out)."""
    t0 = time.perf_counter()
    progress = gate_sink(progress)
    refs = resolve_refs(repo, base, head, event_path, head_branch)
    cfg, origin, dropped = gate_config(
        repo, config_path, refs.base, refs.head, head_branch=refs.head_branch, fork=refs.fork
    )
    if gate_overrides:
        origin.changes += override_changes(cfg.gate, gate_overrides)
        cfg.gate = replace(cfg.gate, **gate_overrides)
    if model is not None:
        if cfg.model is not None:
            model.kernels = dict(cfg.model.kernels)
            model.budget_s = model.budget_s or cfg.model.budget_s
        cfg.model = config_mod.place_kernels(model, cfg)
    if on_start:
        on_start(refs)
    changed = changed_files(repo, refs.base, refs.head)
    log(
        f"base {refs.base[:12]} ({refs.base_label}), head {refs.head[:12]} ({refs.head_label}): "
        f"{len(changed)} files changed",
        progress,
    )
    log(f"configuration: {config_origin_text(origin)}", progress)
    for c in origin.changes:
        log(f"    {config_change_text(c)}", progress)
    isolation = sandbox.worker_isolation()
    log(f"kernel code runs {isolation_text(isolation)}", progress)
    report = Report(
        conclusion="success",
        reason="",
        base={"ref": refs.base_label, "sha": refs.base},
        head={"ref": refs.head_label, "sha": refs.head},
        device=device,
        policy=asdict(cfg.gate) | {"fail_on": list(cfg.gate.fail_on)},
        repo=refs.repo,
        pr=refs.pr,
        reproduce=reproduce_command(config_path, origin, repo, refs, device),
        configuration=origin,
        isolation=isolation,
    )
    with worktrees(repo, refs.base, refs.head) as (base_root, head_root):
        plan = affected_kernels(cfg, changed, head_root, base_root, dropped)
        report.removed = [a.kernel.name for a in plan if a.status == "removed"]
        plan = [a for a in plan if a.status != "removed"]
        todo = [a for a in plan if a.status != "unchanged"]
        log(
            f"{len(todo)} of {len(plan)} kernels affected"
            + (f"; removed: {', '.join(report.removed)}" if report.removed else ""),
            progress,
        )
        for a in plan:
            if a.status == "unchanged" and a.reasons:  # e.g. a comment: decided from the diff, nothing runs
                log(f"    {a.kernel.name} unchanged: {'; '.join(a.reasons)}", progress)
        results: dict[str, KernelReport] = {}
        for a in plan:
            k = a.kernel
            kr = KernelReport(k.name, k.op, k.entry, a.status, a.reasons)
            results[k.name] = kr
            report.kernels.append(kr)
            if a.status == "unchanged":
                continue
            log(
                f"[{sum(1 for x in report.kernels if x.status != 'unchanged')}/{len(todo)}] {k.name} "
                f"({k.op}, {a.status}): {'; '.join(a.reasons)}",
                progress,
            )
            kt = time.perf_counter()
            try:
                check_kernel(kr, k, cfg, device, base_root, head_root, progress, profile)
            except Exception as e:  # a bug of ours: this kernel is in error, the others go on
                kr.error = internal_error(k.name, e, progress)
            kr.failed_by = judge(kr, cfg, device)
            kr.seconds = time.perf_counter() - kt
            log(f"    {k.name}: {summary_line(kr)}", progress)
            for line in explain_lines(kr.explain):
                progress.event(KernelExplained(k.name, line))
        for p in cfg.pipelines:
            members = {pipeline_op(role): getattr(p, role) for role in PIPELINE}
            names = [n for n in members.values() if n]
            if not any(results[n].status in ("changed", "new") for n in names):
                continue
            report.pipelines.append(check_pipeline(p, members, cfg, device, head_root, progress))
        report.model = check_model(cfg, results, device, base_root, head_root, progress)
    for kr in report.kernels:
        _relativise(kr.verification, head_root)
    report.conclusion, report.reason = conclude(report)

    report.environment = environment(device)
    report.seconds = time.perf_counter() - t0
    return report


def check_kernel(
    kr: KernelReport,
    k,
    cfg: Config,
    device: str,
    base_root: Path,
    head_root: Path,
    progress: ProgressSink,
    profile: bool = False,
) -> None:

    kr.error = missing_entry(k, head_root)  # before a worker says "file not found" in a temporary checkout
    if kr.error:
        return
    working(f"    {k.name}: verifying at head (starting the workers)", progress)
    try:
        vr = verify(
            k.op,
            k.entry,
            k.params,
            device,
            dtype=k.dtype,
            root=str(head_root),
            timeout_s=k.timeout,
            progress=progress,
            raw_domain=k.domain,
            cuda=k.cuda,
        )
        kr.verification = vr
    except UsageError as e:  # the kernel's entry cannot be loaded at head: that fails this kernel
        kr.error = str(e)
        return
    if not cfg.gate.bench:
        kr.benchmark_note = "benchmarks are off (gate.bench: false)"
        return
    if kr.status == "new":
        kr.benchmark_note = "new kernel: nothing to compare against"
        return
    if vr.findings:
        kr.benchmark_note = "not benchmarked: verification failed"
        return
    if vr.needs_gpu:
        kr.benchmark_note = "not benchmarked: a CUDA C++ kernel needs a GPU"
        return

    try:
        _, op_params = resolve_domain(get_op(k.op), k.params, k.domain)  # one declared value pins the shape
        params = {**op_params, **{kk: v for kk, v in k.bench.items() if kk != "regime"}}
        working(f"    {k.name}: compiling base and head at the benchmark shapes", progress)
        plan = explain.plan_kernel(kr, k, k.op, params, device, base_root, head_root)  # docs/benchmarking.md
        if plan is not None and plan.skip_timing:
            return
        if not DEVICES[device].timed:  # interpreter wall-clock never gates: not timed, said once (docs/config.md)
            explain.untimed_on_cpu(kr, plan)
            return
        working(f"    {k.name}: benchmarking base against head (starting the worker)", progress)
        res = bench_pair(
            k.op,
            k.entry,
            k.entry,
            str(base_root),
            str(head_root),
            params,
            device,
            budget_s=cfg.gate.budget_s,
            rope_min=cfg.gate.rope,
            progress=progress,
            shapes=plan.to_time if plan is not None else None,
            regime=k.bench.get("regime"),
        )
        kr.benchmark = res
        if res.failed:  # e.g. base and head disagree on an output, or the head crashed while timed
            kr.error = f"benchmark: {res.error}"
            return
        if plan is not None:
            explain.finish_kernel(kr, plan, k, k.op, params, device, head_root, profile)
    except UsageError as e:
        kr.error = f"benchmark: {e}"


def check_pipeline(p, members: dict, cfg: Config, device: str, head_root: Path, progress) -> PipelineReport:

    t0 = time.perf_counter()
    entries = {}
    params: dict = {}
    dtype = None
    sources: list[str] = []
    flags: list[str] = []
    for role, name in members.items():
        if name:
            k = cfg.kernel(name)
            entries[role] = k.entry
            if k.cuda is not None:  # CUDA C++ members: their sources built once for the loop
                sources += [s for s in k.cuda.sources if s not in sources]
                flags += [f for f in k.cuda.flags if f not in flags]
            p_role, dt = one_shape(get_op(k.op), k.params, k.domain)  # one shape: the first declared one
            params.update(p_role)
            dtype = dtype or dt
    pr = PipelineReport(p.name, {r: n for r, n in members.items() if n})
    log(f"pipeline {p.name}: {' -> '.join(pr.members.values())}, {p.steps} steps", progress)
    try:
        cuda = CudaSpec(tuple(sources), tuple(flags)) if sources else None
        vr = verify_pipeline(
            entries, params, device, dtype=dtype, steps=p.steps, root=str(head_root), progress=progress, cuda=cuda
        )
        pr.verification = vr
        if vr.findings and "finding" in cfg.gate.fail_on:
            pr.failed_by = ["finding"]
    except Exception as e:  # a load error, or a bug of ours (logged): this pipeline fails, the gate goes on
        why = str(e) if isinstance(e, UsageError) else internal_error(f"pipeline {p.name}", e, progress)
        pr.verification = VerifyResult("decode-pipeline", "", error=why)
        pr.failed_by = ["error"]
    pr.seconds = time.perf_counter() - t0
    return pr


def internal_error(what: str, e: Exception, progress=None) -> str:
    """An internal error while checking one kernel: the traceback to a log file named on stderr,
    one line for the report."""
    path = write_log(log_text(e))
    log(f"    {what}: internal error: {describe(e)} (traceback in {path})", progress)
    return f"internal error: {describe(e)} (a bug in kernalin-ci)"


SPEED_VERDICTS = ("slower", "inconclusive")  # the benchmark's: what the decode step's tokens/s puts in context


def verified(kr: KernelReport) -> bool:
    """Whether KR's code may serve in the model's decode step: no error, no finding, no gate item failed
    but the benchmark's own verdicts (a kernel that is only slower is exactly one whose tokens/s a user
    wants to see)."""
    v = kr.verification
    return not kr.error and not (v and v.findings) and all(x in SPEED_VERDICTS for x in kr.failed_by)


def check_model(
    cfg: Config, results: dict, device: str, base_root: Path, head_root: Path, progress
) -> ModelResult | None:
    """Decode tokens/s and $/Mtok with the model's kernels, base against head (docs/tokens.md); None when the
    configuration has no `model:` or none of the kernels in the step changed. Reported, never gating.

    The step is built either with the decode_step kernel in its one place or with the separate rope, kv_append
    and attention kernels: the decode_step one when it changed, else the separate ones. A changed kernel that
    the step does not use says so (`reason`, or a note), never silently."""

    spec = cfg.model
    if spec is None:
        return None
    members = {role: cfg.kernel(name) for role, name in spec.kernels.items()}

    def changed(k) -> bool:
        return results[k.name].status in ("changed", "new")

    fused = members.get(FUSED)
    separate = {role: k for role, k in members.items() if role != FUSED}
    touched_separate = [k.name for k in separate.values() if changed(k)]
    notes = []
    if fused is not None and changed(fused):
        chosen = {FUSED: fused}
        if touched_separate:
            notes.append(
                f"{', '.join(touched_separate)} also changed: not measured (one decode step per report; "
                f"the step with {fused.name} in its place was)"
            )
    elif touched_separate:
        chosen = separate
    else:
        return None
    roles = []
    for role, k in chosen.items():
        _, op_params = resolve_domain(get_op(k.op), k.params, k.domain)
        params = resolve_params(k.op, get_op(k.op).params, op_params)
        roles.append(Role(role, k.op, k.name, k.entry, k.entry, params))
    names = role_names(roles)
    idle = unplaced(roles)
    placed = [k for role, k in chosen.items() if role not in idle]
    touched = [k.name for k in placed if changed(k)]
    for role, why in idle.items():
        if changed(chosen[role]):
            notes.append(f"{chosen[role].name} has no place in this step: {why}")
    new = [k.name for k in placed if results[k.name].status == "new"]
    bad = [k.name for k in placed if not verified(results[k.name])]
    reason = (
        "; ".join(notes)
        if not touched
        else NOT_MEASURED_CPU
        if not DEVICES[device].timed
        else "benchmarks are off (gate.bench: false)"
        if not cfg.gate.bench
        else f"new kernel {', '.join(new)}: nothing to compare against"
        if new
        else f"{', '.join(bad)} failed verification"
        if bad
        else None
    )
    if reason:
        out = not_measured(spec, device, reason, names)
        out.notes = notes if touched else []
        return out
    progress = gate_sink(progress)
    log(f"model {spec.name}: decode step with {', '.join(f'{r} {n}' for r, n in names.items())}", progress)
    try:
        res = bench_model(
            spec,
            [r for r in roles if r.role not in idle],
            str(base_root),
            str(head_root),
            device,
            budget_s=spec.budget_s or cfg.gate.budget_s,
            rope_min=cfg.gate.rope,
            progress=progress,
        )
    except (UsageError, InternalError) as e:  # a kernel that cannot serve the model; the worker failing
        msg = " ".join(str(e).split())[:2000]
        out = not_measured(spec, device, "the model benchmark could not run", names)
        out.error = msg
        return out
    res.roles = names
    res.notes = notes + res.notes
    return res


def _relativise(verification: VerifyResult | None, head_root: Path) -> None:
    """Finding locations inside the head worktree become repository-relative paths."""
    if not verification:
        return
    prefix = str(head_root.resolve()) + "/"
    for f in [*verification.findings, *verification.notices]:
        loc = f.location
        if loc and loc.path.startswith(prefix):
            loc.path = loc.path[len(prefix) :]
        elif loc and loc.path.startswith(str(head_root) + "/"):
            loc.path = loc.path[len(str(head_root)) + 1 :]


def summary_line(kr: KernelReport) -> str:
    if kr.error:
        return f"ERROR {kr.error}"
    v = kr.verification or VerifyResult(kr.op, kr.entry)
    n = len(v.findings)
    word = {"fail": f"FAIL ({n} findings)", "not-checked": "NOT CHECKED (needs a GPU)"}.get(v.verdict, "pass")
    parts = [f"verification {word}"]
    if v.not_checked:
        parts.append(f"{len(v.not_checked)} shape{'s' * (len(v.not_checked) != 1)} not checked")
    if v.structural.status == "not-analysed":
        parts.append(f"structural: not analysed ({v.structural.cause})")
    v = kr.benchmark.verdict if kr.benchmark else None
    if v:
        parts.append(benchmark_summary(v))
    elif kr.benchmark_note:
        parts.append(kr.benchmark_note)

    ex = explain_summary(kr.explain)
    if ex and not (kr.benchmark_note or "").startswith(ex):
        parts.append(ex)
    return "; ".join(parts)


def reproduce_command(config_path: str | None, origin: ConfigOrigin, repo: Path, refs: Refs, device: str) -> str:
    parts = ["kernalin-ci", "run"]
    if origin.source == FILE:
        parts += ["--config", origin.path]
    elif origin.path != config_mod.DEFAULT_FILE:
        parts += ["--config", origin.path]
    parts += ["--base", refs.base, "--head", refs.head, "--device", device]
    if origin.source == HEAD and refs.head_branch:
        parts += ["--head-branch", refs.head_branch]
    return " ".join(shlex.quote(p) for p in parts)
