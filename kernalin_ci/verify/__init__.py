"""verify(): run an entry's checks and return a VerifyResult.

The parent never imports the user's code: dynamic checks run in worker child
processes (kernalin_ci.isolate), which hand back raw tensors only; the parent
judges them (verify/judge.py), so the child cannot choose the verdict. A timeout
or crash becomes a finding for the case in flight, and the remaining cases go on
in a fresh child.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from concurrent.futures import ThreadPoolExecutor

from kernalin_ci import domain as domain_mod
from kernalin_ci.cuda import sanitizer as sanitizer_mod
from kernalin_ci.cuda import task as cuda_task
from kernalin_ci.cuda.sources import CudaSpec
from kernalin_ci.device import DEVICES
from kernalin_ci.errors import UsageError
from kernalin_ci.findings import (
    Coverage,
    Finding,
    Location,
    NotChecked,
    Notice,
    SanitizerStatus,
    StructuralStatus,
    VerifyResult,
)
from kernalin_ci.jobs import DynamicJob, PipelineJob
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Case, resolve_params
from kernalin_ci.ops.decode_loop import pipeline_cases, pipeline_shape_text
from kernalin_ci.ops.roles import PIPELINE, PIPELINE_REQUIRED, pipeline_op
from kernalin_ci.progress import ProgressSink
from kernalin_ci.verify.judge import CaseReader
from kernalin_ci.verify.loop_judge import PipelineReader
from kernalin_ci.verify.structural import verify_structural
from kernalin_ci.verify.structural.registry import not_modelled
from kernalin_ci.verify.supervisor import CasesRun, Progress, run_cases, shard, threads_each


def reproduce_command(
    op: str, entry: str, raw_params: dict, device: str, case: Case | None, raw_domain: dict | None = None
) -> str:
    parts = ["kernalin-ci", "verify", "--op", op, "--entry", entry]
    for k, v in raw_params.items():
        parts += ["--param", f"{k}={json.dumps(v) if isinstance(v, (list, dict)) else v}"]
    for k, v in (raw_domain or {}).items():
        parts += ["--domain", f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"]
    parts += ["--device", device, "--only", "dynamic"]
    if case is not None:
        parts += ["--case", json.dumps(case.to_json(), separators=(",", ":"))]
    return " ".join(shlex.quote(p) for p in parts)


def dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per (check, bug class, location; a bad-result per message), the first case kept, the
    others counted."""
    seen: dict[tuple, Finding] = {}
    extra: dict[tuple, list[str]] = {}
    for f in findings:
        key = (
            f.kind,
            f.check,
            f.bug_class,
            (f.location.path, f.location.line) if f.location else None,
            f.message if f.bug_class == "bad-result" else None,
        )  # each way a report was refused
        if key in seen:
            extra[key].append((f.case or {}).get("name", "?"))
        else:
            seen[key] = f
            extra[key] = []
    out = []
    for key, f in seen.items():
        if extra[key]:
            names = sorted(set(extra[key]))
            f.message += (
                f" (also in {len(extra[key])} more case{'s' * (len(extra[key]) != 1)}: "
                f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''})"
            )
        out.append(f)
    return out


def verify(
    op_name: str,
    entry: str,
    raw_params: dict,
    device: str,
    *,
    dtype: str | None = None,
    only: str | None = None,
    probe: bool = False,
    case_json: str | None = None,
    root: str | None = None,
    timeout_s: float | None = None,
    progress: bool | ProgressSink = True,
    raw_domain: dict | None = None,
    cuda: CudaSpec | None = None,
    sanitizer: bool | None = None,
    engine: str = "ttir",
    cases: list[Case] | None = None,
) -> VerifyResult:
    """Run the entry's checks. CUDA: the kernel's CUDA C++ sources and flags (a CUDA kernel: built once before
    the checks start; on a host without a GPU its dynamic cases are not checked, docs/cuda.md). SANITIZER:
    Compute Sanitizer over a few cases (default: on a GPU, where compute-sanitizer is installed). CASES: the
    dynamic cases instead of the op's plan (a FlashInfer-Bench workload file's, kernalin_ci/workload.py)."""
    given = cases
    op = get_op(op_name)
    dom, plan_params = domain_mod.resolve(op, raw_params, raw_domain)
    params = resolve_params(op_name, op.params, plan_params)
    if dtype and dom.dtype and dtype not in dom.dtype:
        raise UsageError(f"dtype {dtype}: outside the declared domain (dtype {', '.join(dom.dtype)})", setting="dtype")
    plan_dtype = dtype or (dom.dtype[0] if len(dom.dtype) == 1 else None)
    main_dtype = plan_dtype or "float32"
    t0 = time.perf_counter()
    result = VerifyResult(op=op_name, entry=entry, device=device)
    timeout_s = timeout_s or DEVICES[device].verify_timeout_s
    if cuda is not None:  # built once, before any worker of the checks starts (kernalin_ci/cuda/task.py)
        if not cuda_build(result, cuda, entry, op_name, params, device, root, timeout_s, main_dtype, progress):
            result.seconds = time.perf_counter() - t0
            return result
    structural = None
    if only in (None, "structural") and not probe and not case_json:
        unmodelled = not_modelled(op, params)
        if cuda is not None and engine != "ptx":
            result.structural = StructuralStatus("not-analysed", NO_STRUCTURAL_CUDA)
        elif unmodelled:  # its checks would judge the kernel by a definition without these features
            result.structural = StructuralStatus("not-analysed", unmodelled)
        else:
            structural = verify_structural
    # The structural worker compiles while the dynamic worker launches: two processes, so the
    # wall time is the longer of the two instead of their sum (each child imports torch and Triton).
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = (
            pool.submit(
                structural,
                op_name,
                entry,
                params,
                device=device,
                root=root,
                timeout_s=timeout_s,
                domain=dom,
                engine=engine,
            )
            if structural
            else None
        )
        if only in (None, "dynamic", "sanitizer") or probe or case_json:
            if case_json:
                cases = [Case.from_json(case_json)]
                problem = op.validate_case(cases[0])
                if problem:
                    raise UsageError(f"case: {problem}", setting="case")
            elif probe:
                cases = [op.probe(params, dtype)]
            elif given is not None:
                cases = list(given)
                problems = [f"{c.name}: {p}" for c in cases if (p := op.validate_case(c))]
                if problems:
                    raise UsageError(f"workload: {problems[0]}", setting="workload")
            else:
                cases = domain_mod.plan(op, params, dom, op.cases(params, device, plan_dtype), main_dtype)
            if cuda is not None and not DEVICES[device].gpu:  # nothing of a CUDA kernel runs without a GPU
                result.not_checked = _not_checked(
                    op, params, cases, [(c.name, {"reason": "needs-gpu", "error": NEEDS_GPU}) for c in cases]
                )
                result.sanitizer = SanitizerStatus("not-checked", "needs a GPU")
                cases = []
            sanitized = None
            on_gpu_run = sanitizer is not False and DEVICES[device].gpu and not probe and not case_json
            wanted = only == "sanitizer" or on_gpu_run
            if wanted and not DEVICES[device].gpu:
                result.sanitizer = SanitizerStatus("not-checked", "needs a GPU")
            elif wanted and cases:  # beside the dynamic workers (kernalin_ci/cuda/sanitizer.py)
                sanitized = ThreadPoolExecutor(max_workers=1)
                pending_sanitizer = sanitized.submit(
                    sanitizer_mod.check, op_name, entry, params, cases, device, root, timeout_s
                )
            if only == "sanitizer":
                cases = []
            prog = Progress(progress, len(cases), op_name)
            job = DynamicJob(
                op=op_name, entry=entry, root=root, params=params, poison=not probe, domain=dom, main_dtype=main_dtype
            )

            def repro(c):
                return reproduce_command(op_name, entry, raw_params, device, c, raw_domain)

            groups = shard(cases, DEVICES[device].dynamic_workers)
            prog.start(
                f"{len(cases)} case{'s' * (len(cases) != 1)} in {len(groups)} worker{'s' * (len(groups) != 1)}"
                + (" beside the structural analysis" if pending is not None else "")
            )
            env = threads_each(len(groups) + (pending is not None))
            # the parent judges every case (verify/judge.py): import torch while the workers start, with a
            # worker's share of the cores (its float64 references run beside the workers' processes)
            _warm_torch(len(groups) + (pending is not None) + 1)

            def reader():  # one per worker group: its memo (stale-result) and the shapes its cases ran at

                return CaseReader(op, params, dom, main_dtype, device, poison=not probe, root=root)

            with ThreadPoolExecutor(max_workers=max(1, len(groups))) as shards:
                runs = [
                    shards.submit(
                        run_cases,
                        job,
                        [cases[i] for i in g],
                        device,
                        timeout_s,
                        prog.subset(g),
                        repro,
                        reader(),
                        env=env,
                    )
                    for g in groups
                ]
                parts = [r.result() for r in runs]
            for n in (n for p in parts for n in p.notices):  # the same notice from several cases is kept once
                if all(n.message != m.message for m in result.notices):
                    result.notices.append(n)
            order = {c.name: i for i, c in enumerate(cases)}
            found = sorted(
                (f for p in parts for f in p.findings), key=lambda f: order.get((f.case or {}).get("name"), -1)
            )
            ran = sorted((c for p in parts for c in p.ran), key=lambda c: order.get(c.name, -1))
            refused = sorted((x for p in parts for x in p.not_checked), key=lambda x: order.get(x[0], -1))
            result.findings += found
            result.cases = sorted((v for p in parts for v in p.verdicts), key=lambda v: order.get(v.case, -1))
            result.cases_run += sum(p.done for p in parts)
            result.coverage = domain_mod.coverage(op, ran, params)
            result.not_checked += _not_checked(op, params, cases, refused)
            if sanitized is not None:
                found, notices, result.sanitizer = pending_sanitizer.result()
                sanitized.shutdown()
                result.findings += found
                result.notices += notices
            if cases and not ran and any(n.reason == "unsupported" for n in result.not_checked):
                first = result.not_checked[0]
                result.findings.append(
                    Finding(
                        "domain",
                        "entry-error",
                        f"the entry raised at every shape tried ({len(result.not_checked)} "
                        f"shape{'s' * (len(result.not_checked) != 1)}); at {first.shape}: {first.error}",
                        case=cases[0].to_json(),
                        reproduce=repro(cases[0]),
                    )
                )
        if pending is not None:
            found, notices, status = pending.result()
            if engine == "ptx" and (cuda is None or DEVICES[device].gpu):
                replay(
                    op, found, params, dom, main_dtype, device, root, timeout_s, entry, op_name, raw_params, raw_domain
                )
            elif engine == "ptx":
                for f in found:
                    if f.check.startswith("structural:ptx-") and f.case:
                        f.message += f"; not replayed ({NEEDS_GPU})"
            result.findings += found
            result.notices += notices
            result.structural = status
    result.findings = dedupe(result.findings)
    result.seconds = time.perf_counter() - t0
    return result


def replay(
    op, found: list[Finding], params, dom, main_dtype, device, root, timeout_s, entry, op_name, raw_params, raw_domain
) -> None:
    """Run each PTX counterexample (a structural finding carrying its case) through the dynamic checker,
    and say in the finding whether it failed there (docs/structural.md, "Replay")."""
    todo = [f for f in found if f.check.startswith("structural:ptx-") and f.case]
    cases: list[Case] = []
    owner: dict[str, list[Finding]] = {}
    by_dims: dict[str, Case] = {}  # findings with the same counterexample share one run
    for f in todo:
        key = json.dumps({**f.case, "name": ""}, sort_keys=True)
        case = by_dims.get(key) or Case.from_json({**f.case, "name": f"ptx-counterexample-{len(by_dims) + 1}"})
        problem = op.validate_case(case)
        if problem:
            f.message += f"; not replayed (the counterexample is no valid case: {problem})"
            continue
        f.case = case.to_json()
        f.reproduce = reproduce_command(op_name, entry, raw_params, device, case, raw_domain)
        if key not in by_dims:
            by_dims[key] = case
            cases.append(case)
        owner.setdefault(case.name, []).append(f)
    if not cases:
        return
    job = DynamicJob(op=op_name, entry=entry, root=root, params=params, poison=True, domain=dom, main_dtype=main_dtype)
    reader = CaseReader(op, params, dom, main_dtype, device, poison=True, root=root)
    run = run_cases(job, cases, device, timeout_s, Progress(False, len(cases), op_name), lambda c: "", reader)
    failed: dict[str, list[Finding]] = {}
    for d in run.findings:
        failed.setdefault((d.case or {}).get("name", ""), []).append(d)
    skipped = {name for name, _ in run.not_checked}
    for name, fs in owner.items():
        if name in failed:
            d = failed[name][0]
            said = f"; replayed: fails dynamically at case {name} ({d.bug_class}: {d.message[:160]})"
        elif name in skipped:
            said = f"; not replayed (the dynamic checker did not run case {name})"
        else:
            said = f"; replay passed at case {name} (the counterexample did not reproduce)"
        for f in fs:
            f.message += said


NEEDS_GPU = "a CUDA C++ kernel runs only on a GPU"
NO_STRUCTURAL_CUDA = "CUDA C++ kernel: the TTIR engine reads Triton kernels only; --engine ptx analyses CUDA C++"


def cuda_build(result: VerifyResult, spec, entry, op_name, params, device, root, timeout_s, dtype, progress) -> bool:
    """Build a CUDA kernel once before its checks (kernalin_ci/cuda/task.py) and record it on RESULT; False when
    its sources do not compile (a `build-error` finding: nothing else can run)."""

    Progress(progress, 1, op_name).note("building the CUDA sources once for every worker")
    build, seconds = cuda_task.build(spec, entry, op_name, params, device, root, timeout_s, dtype)
    result.build = {
        "status": build.status,
        "sources": build.sources,
        "compiler": build.compiler,
        "arch": build.arch,
        "key": build.key[:24],
        "seconds": round(seconds, 3),
    }
    if build.status == "failed":
        where = build.error_location()
        path = where and (where[0] if os.path.isabs(where[0]) else os.path.join(root or os.getcwd(), where[0]))
        first = next(
            (ln for ln in build.log.splitlines() if "error" in ln), build.log.splitlines()[0] if build.log else ""
        )
        result.findings.append(
            Finding(
                "cuda-build",
                "build-error",
                f"{build.failed or 'the CUDA sources'} does not compile (nvcc -ptx -arch={build.arch}): "
                f"{first.strip()[:300]}",
                Location(path, where[1]) if where else None,
                kind="build",
            )
        )
        return False
    if build.status in ("no-compiler", "no-sources"):
        result.notices.append(Notice("cuda-build", f"CUDA sources not built: {build.log}", kind="build"))
    return True


def _warm_torch(share: int) -> None:
    """Import torch in a thread (a few seconds on a CUDA machine), overlapping the workers' start; the
    parent's intra-op threads are its share of the cores, like each worker's (threads_each): a full-size
    pool beside the workers' (and beside other verifies run at once) spins and stalls them all."""
    import threading

    def warm() -> None:
        import torch

        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // share))

    threading.Thread(target=warm, daemon=True).start()


def _not_checked(op, params: dict, cases: list[Case], refused: list[tuple[str, dict]]) -> list[NotChecked]:
    """The workers' notes, one entry per (shape, reason, error, substitute), with the cases it covers."""
    by_name = {c.name: c for c in cases}
    out: dict[tuple, NotChecked] = {}
    for name, nc in refused:
        shape = nc.get("shape") or domain_mod.shape_text(domain_mod.shape_of(op, by_name[name], params))
        k = (shape, nc["reason"], nc.get("error", ""), nc.get("instead"))
        if k not in out:
            out[k] = NotChecked(shape, nc["reason"], nc.get("error", ""), [], nc.get("instead"))
        out[k].cases.append(name)
    return list(out.values())


def pipeline_params(entries: dict, raw_params: dict) -> dict:
    """One param dict for the pipeline: each op resolves the keys it knows; unknown keys are errors."""
    merged: dict = {}
    used: set = set()
    for role in entries:
        op = get_op(role)
        known = {p.name for p in op.params}
        merged.update(resolve_params(role, op.params, {k: v for k, v in raw_params.items() if k in known}))
        used |= known
    unknown = set(raw_params) - used
    if unknown:
        raise UsageError(f"pipeline: unknown param {sorted(unknown)[0]!r} (params: {', '.join(sorted(used))})")
    if merged.get("mrope_section"):
        raise UsageError(
            "pipeline: param mrope_section: M-RoPE is not supported in a decode loop (its positions are [S, T])"
        )
    merged.setdefault("style", "neox")
    merged.setdefault("base", 10000.0)
    return merged


def verify_pipeline(
    entries: dict,
    raw_params: dict,
    device: str,
    *,
    dtype: str | None = None,
    steps: int = 64,
    seed: int = 0,
    root: str | None = None,
    timeout_s: float | None = None,
    progress: bool | ProgressSink = True,
    cuda: CudaSpec | None = None,
) -> VerifyResult:
    """The decode-pipeline check over kv_append + attention.decode_paged (+ rope) entries. CUDA: the entries'
    CUDA C++ sources and flags, built once before the loop (as verify's); without a GPU the loop's cases are
    not checked (needs a GPU), never run and never a finding."""

    roles = {pipeline_op(role): role for role in PIPELINE}  # the members' ops, in the step's order
    for role in PIPELINE_REQUIRED:
        if not entries.get(pipeline_op(role)):
            raise UsageError(f"pipeline: an entry for {pipeline_op(role)} is required")
    for op in entries:
        if op not in roles:
            raise UsageError(f"pipeline: {op!r} is not a pipeline role ({', '.join(roles)})")
    if steps < 1:
        raise UsageError("steps: must be at least 1 (the pipeline's decode steps)", setting="steps")
    params = pipeline_params(entries, raw_params)
    dtype = dtype or "float32"
    label = "+".join(op for op in roles if entries.get(op))
    t0 = time.perf_counter()
    result = VerifyResult(op="decode-pipeline", entry=label, device=device)

    def on_step(step: int) -> None:
        if (step + 1) % 8 == 0:
            prog.note(f"step {step + 1}/{steps}")

    def repro(case):
        parts = ["kernalin-ci", "pipeline"]
        for op, role in roles.items():  # the command's flags: --kv-append, --attention, --rope
            if entries.get(op):
                parts += ["--" + role.replace("_", "-"), entries[op]]
        pins = {**raw_params, "head_dim": case.dims["D"]} if not params.get("head_dim") else raw_params
        for k, v in pins.items():
            parts += ["--param", f"{k}={v}"]
        parts += ["--device", device, "--dtype", dtype, "--steps", str(case.dims["steps"]), "--seed", str(seed)]
        return " ".join(shlex.quote(p) for p in parts)

    cases = pipeline_cases(params, steps, dtype, seed)
    timeout_s = timeout_s or DEVICES[device].verify_timeout_s
    if cuda is not None:  # one build for the three entries; on a GPU the attention entry's launch warms it
        att = pipeline_op("attention")
        if not cuda_build(result, cuda, entries[att], att, params, device, root, timeout_s, dtype, progress):
            result.seconds = time.perf_counter() - t0
            return result
    prog = Progress(progress, len(cases), "decode-pipeline")
    job = PipelineJob(entries={k: v for k, v in entries.items() if v}, root=root, params=params, dtype=dtype, seed=seed)
    reader = PipelineReader(params, dtype, seed, device, bool(entries.get(pipeline_op("rope"))), on_step, root)
    if cuda is not None and not DEVICES[device].gpu:  # nothing of a CUDA kernel runs without a GPU
        needs = {"reason": "needs-gpu", "error": NEEDS_GPU}
        run = CasesRun(
            not_checked=[(c.name, {**needs, "shape": pipeline_shape_text(params, c.dims["D"], dtype)}) for c in cases]
        )
    else:
        _warm_torch(2)
        run = run_cases(job, cases, device, timeout_s, prog, repro, reader)
    result.findings = dedupe(run.findings)
    if not reader.ran_dims and not run.findings and any(nc["reason"] == "unsupported" for _, nc in run.not_checked):
        error = next(nc["error"] for _, nc in run.not_checked if nc["reason"] == "unsupported")
        result.findings.append(
            Finding(
                "dynamic check domain",
                "entry-error",
                f"the entries raised at every head dim tried ({', '.join(str(c.dims['D']) for c in cases)}): {error}",
            )
        )
    result.notices = run.notices
    result.cases_run = run.done
    result.coverage = Coverage(head_dims=sorted(reader.ran_dims), dtypes=[dtype] if reader.ran_dims else [])
    grouped: dict[tuple, NotChecked] = {}
    for name, nc in run.not_checked:
        k = (nc.get("shape", ""), nc["reason"], nc.get("error", ""), nc.get("instead"))
        grouped.setdefault(k, NotChecked(k[0], k[1], k[2], [], k[3])).cases.append(name)
    result.not_checked = list(grouped.values())
    result.seconds = time.perf_counter() - t0
    return result


__all__ = ["verify", "reproduce_command", "VerifyResult", "Notice", "StructuralStatus", "Coverage"]
