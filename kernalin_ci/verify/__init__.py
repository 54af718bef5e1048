"""verify(): run an entry's checks and return a VerifyResult.

The parent never imports the user's code: dynamic checks run in worker child
processes (kernalin_ci.isolate), which hand back raw tensors only; the parent
judges them (verify/judge.py), so the child cannot choose the verdict. A timeout
or crash becomes a finding for the case in flight, and the remaining cases go on
in a fresh child.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kernalin_ci import domain as domain_mod
from kernalin_ci.errors import UsageError
from kernalin_ci.findings import Coverage, Finding, NotChecked, Notice, StructuralStatus, VerifyResult
from kernalin_ci.isolate import run_task
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Case, resolve_params

DEFAULT_TIMEOUT = {"cpu": 600.0, "cuda": 180.0}
MAX_RESTARTS = 8
# Dynamic workers per entry. On a GPU, one per dtype: each pays its own torch import and CUDA
# start (about 4 s on the H200) at the same time and compiles only its dtype's specialisations.
# On the CPU the interpreter already keeps the cores busy.
DYNAMIC_WORKERS = {"cpu": 1, "cuda": 3}


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


class Progress:
    """One line per finished case on stderr (long interpreter runs need a pulse)."""

    def __init__(self, enabled: bool, total: int, label: str, indices: list[int] | None = None):
        self.enabled, self.total, self.label = enabled, total, label
        self.indices = indices  # a shard's case i is case indices[i] of the whole list

    def case_done(self, index: int, name: str, seconds: float, n_findings: int, note: str = "") -> None:
        if self.indices is not None:
            index = self.indices[index]
        if self.enabled:
            status = "ok" if n_findings == 0 else f"FAIL ({n_findings} finding{'s' * (n_findings != 1)})"
            if note:
                status = note if n_findings == 0 else f"{status}; {note}"
            print(
                f"  {self.label} [{index + 1}/{self.total}] {name}: {status} ({seconds:.1f} s)",
                file=sys.stderr,
                flush=True,
            )

    def note(self, text: str) -> None:
        if self.enabled:
            print(f"  {self.label} {text}", file=sys.stderr, flush=True)

    def subset(self, indices: list[int]) -> Progress:
        """The same lines for a shard of the cases, numbered as in the whole list."""
        return Progress(self.enabled, self.total, self.label, indices)


def threads_each(workers: int) -> dict | None:
    """Workers running at once share the cores: their OpenMP pools (the float64 references)
    would otherwise each take all of them, and spin."""
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


def shard(cases: list[Case], workers: int) -> list[list[int]]:
    """Split case indices into at most `workers` groups, one dtype per group where possible.

    A case tagged repeat-of:NAME stays with NAME (the stale-result check compares them in one
    worker). Groups keep the case order; the smallest neighbours merge when there are too many."""
    unit = list(range(len(cases)))
    by_name = {c.name: i for i, c in enumerate(cases)}
    for i, c in enumerate(cases):
        for t in c.tags:
            if t.startswith("repeat-of:") and t.split(":", 1)[1] in by_name:
                unit[i] = unit[by_name[t.split(":", 1)[1]]]
    groups: dict[str, list[int]] = {}
    for i in range(len(cases)):
        groups.setdefault(cases[unit[i]].dtype, []).append(i)
    out = sorted(groups.values())
    while len(out) > max(1, workers):
        j = min(range(len(out) - 1), key=lambda k: len(out[k]) + len(out[k + 1]))
        out[j : j + 2] = [sorted(out[j] + out[j + 1])]
    return out


@dataclass
class CasesRun:
    """What the workers did with a list of cases."""

    findings: list[Finding] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    done: int = 0  # cases finished (run, moved to another shape, or not checked)
    ran: list[Case] = field(default_factory=list)  # the cases as they ran (at the shape they ran at)
    not_checked: list[tuple[str, dict]] = field(default_factory=list)  # (case name, the worker's note)


def bad_result(message: str, case: Case | None = None, repro=None) -> Finding:
    """The worker's report for a case cannot be accepted (the case is attached by `record`)."""
    return Finding(
        "worker-result",
        "bad-result",
        message,
        case=case.to_json() if case else None,
        reproduce=repro(case) if case and repro else None,
    )


def run_cases(
    task: str,
    job: dict,
    cases: list[Case],
    device: str,
    timeout_s: float,
    progress: Progress,
    repro,
    read_case,
    on_other_event=None,
    env: dict | None = None,
) -> CasesRun:
    """Drive worker children over all cases, restarting after a hang or crash.

    The parent knows which cases it asked for, in which order: each case-start and case-done event
    must name the case due next. `read_case(index, case, event, results_dir)` turns a case-done event
    into a CaseResult (verify/judge.py; results_dir is the private directory the worker writes its
    result files into); `read_case.part(...)`, where it exists, reads a case handed back in parts, and
    `read_case.partial(index)` gives the findings of the parts judged before the worker died. A
    result the parent cannot accept is a `bad-result` finding for that case; an event out of turn or a
    malformed one is one too and stops that worker; so is a case that ends with no result, and a file
    no event named.
    """
    from kernalin_ci.verify import exchange
    from kernalin_ci.verify.exchange import BadResult

    run = CasesRun()
    results = tempfile.mkdtemp(prefix="kernalin-results-")
    got: set[int] = set()
    start = 0
    restarts = 0
    explained = False  # the run ended with a finding that says why the remaining cases did not run

    def record(i: int, ran: Case | None, found: list[Finding], note: str = "", seconds: float = 0.0) -> None:
        """Case i is finished: its findings carry the case as it ran and the command that reruns it."""
        got.add(i)
        for f in found:
            f.case = (ran or cases[i]).to_json()
            f.reproduce = repro(ran or cases[i])
        run.findings.extend(found)
        run.done += 1
        progress.case_done(i, cases[i].name, seconds, len(found), note)

    try:
        while start < len(cases):
            state = {"in_flight": None, "due": start, "refused": None}

            def refuse(why: str) -> bool:
                i = state["due"]
                if i < len(cases) and i not in got:
                    record(i, None, [bad_result(why)])
                else:
                    run.findings.append(bad_result(why))
                state["refused"] = why
                return False

            def on_event(ev):
                kind = ev.get("event")
                if kind not in ("case-start", "case-part", "case-done", "malformed"):
                    if on_other_event and kind not in ("done", "restart", "usage-error", "internal-error"):
                        on_other_event(ev)
                    return True
                if kind == "malformed":
                    return refuse(f"a malformed event from the worker: {str(ev.get('line'))[:80]!r}")
                i = ev.get("index")
                if type(i) is not int or i >= len(cases):
                    return refuse(f"an event {kind!r} for a case not asked for ({str(i)[:20]!r})")
                if i != state["due"] or (kind != "case-start" and state["in_flight"] != i):
                    return refuse(f"an event {kind!r} out of turn (case {i}; case {state['due']} was due)")
                if kind == "case-start":
                    state["in_flight"] = i
                    return True
                if kind == "case-part":  # a case handed back in parts (the pipeline's steps)
                    try:
                        if not hasattr(read_case, "part"):
                            raise BadResult("a case-part event: this task hands back whole cases")
                        read_case.part(i, cases[i], ev, results)
                        return True
                    except BadResult as e:
                        state["in_flight"], state["due"] = None, i + 1
                        record(i, None, [bad_result(str(e))])
                        state["refused"] = str(e)
                        return False
                state["in_flight"] = None
                state["due"] = i + 1
                case = cases[i]
                try:
                    r = read_case(i, case, ev, results)
                except BadResult as e:  # this case's result: a finding; the next case may still be reported
                    record(i, None, [bad_result(str(e))])
                    return True
                run.notices.extend(r.notices)
                nc = r.not_checked
                if nc:
                    run.not_checked.append((case.name, nc))
                if r.ran is not None:
                    run.ran.append(r.ran)
                note = ""
                if nc:
                    note = f"{nc.get('shape') or 'this case'}: {nc['reason']}, " + (
                        f"ran at {nc['instead']} instead" if nc.get("instead") else "not checked"
                    )
                secs = ev.get("seconds")
                record(i, r.ran, r.findings, note, float(secs) if isinstance(secs, (int, float)) else 0.0)
                return True

            outcome = run_task(
                {**job, "task": task, "cases": [c.to_json() for c in cases], "start": start, "results": results},
                device,
                timeout_s,
                on_event,
                env=env,
                writable=(results,),
            )
            i = state["in_flight"]
            if i is not None:  # what the dead child may have begun to write for the case in flight is not read
                for name in os.listdir(results):
                    if name.startswith((f"case-{i}.", f"case-{i}-")):
                        with contextlib.suppress(OSError):
                            os.unlink(os.path.join(results, name))
            left = exchange.leftovers(results)
            if left:
                run.findings.append(
                    bad_result(
                        f"the worker wrote files no result named: {', '.join(left[:5])}"
                        + (" ..." if len(left) > 5 else "")
                    )
                )
            if outcome.status == "refused":
                progress.note(f"worker stopped: {state['refused']}")
                break
            outcome.raise_for_error(task)
            if outcome.status == "ok":
                break
            if outcome.status in ("timeout", "crashed"):
                if i is None and not any(e.get("event") == "case-start" for e in outcome.events):
                    # died before any case started: loading the entry itself hangs or crashes
                    run.findings.append(Finding("isolation", outcome.status, f"loading the entry: {outcome.ended()}"))
                    progress.note(f"loading the entry {outcome.status}: {outcome.detail}")
                    explained = True
                    break
                if i is None:
                    i = state["due"]
                if i >= len(cases):
                    break
                kind = outcome.status if outcome.status == "timeout" else "crashed"
                # the steps of a loop case already judged keep their findings (a stray write, then the crash)
                partial = read_case.partial(i) if hasattr(read_case, "partial") else []
                record(i, None, [*partial, Finding("isolation", kind, f"case {cases[i].name!r}: {outcome.ended()}")])
                start = i + 1
            else:  # "restart": the CUDA context was lost after the last case reported
                start = state["due"]
            restarts += 1
            if restarts > MAX_RESTARTS:
                progress.note(f"gave up after {restarts} restarts; {len(cases) - start} cases not run")
                break
    finally:
        shutil.rmtree(results, ignore_errors=True)
    if not explained:
        for i, c in enumerate(cases):
            if i not in got:
                run.findings.append(bad_result("the worker handed back no result", c, repro))
    return run


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
    progress: bool = True,
    raw_domain: dict | None = None,
) -> VerifyResult:
    op = get_op(op_name)
    dom, plan_params = domain_mod.resolve(op, raw_params, raw_domain)
    params = resolve_params(op_name, op.params, plan_params)
    if dtype and dom.dtype and dtype not in dom.dtype:
        raise UsageError(f"dtype {dtype}: outside the declared domain (dtype {', '.join(dom.dtype)})", setting="dtype")
    plan_dtype = dtype or (dom.dtype[0] if len(dom.dtype) == 1 else None)
    main_dtype = plan_dtype or "float32"
    t0 = time.perf_counter()
    result = VerifyResult(op=op_name, entry=entry, device=device)
    timeout_s = timeout_s or DEFAULT_TIMEOUT[device]
    structural = None
    if only in (None, "structural") and not probe and not case_json:
        from kernalin_ci.verify.structural import verify_structural as structural
    # The structural worker compiles while the dynamic worker launches: two processes, so the
    # wall time is the longer of the two instead of their sum (each child imports torch and Triton).
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = (
            pool.submit(structural, op_name, entry, params, device=device, root=root, timeout_s=timeout_s, domain=dom)
            if structural
            else None
        )
        if only in (None, "dynamic") or probe or case_json:
            if case_json:
                cases = [Case.from_json(case_json)]
                problem = op.validate_case(cases[0])
                if problem:
                    raise UsageError(f"case: {problem}", setting="case")
            elif probe:
                cases = [op.probe(params, dtype)]
            else:
                cases = domain_mod.plan(op, params, dom, op.cases(params, device, plan_dtype), main_dtype)
            prog = Progress(progress, len(cases), op_name)
            job = {
                "op": op_name,
                "entry": entry,
                "root": root,
                "params": params,
                "device": device,
                "poison": not probe,
                "domain": dom.to_json(),
                "main_dtype": main_dtype,
            }

            def repro(c):
                return reproduce_command(op_name, entry, raw_params, device, c, raw_domain)

            groups = shard(cases, DYNAMIC_WORKERS[device])
            env = threads_each(len(groups) + (pending is not None))
            # the parent judges every case (verify/judge.py): import torch while the workers start, with a
            # worker's share of the cores (its float64 references run beside the workers' processes)
            _warm_torch(len(groups) + (pending is not None) + 1)

            def reader():  # one per worker group: its memo (stale-result) and the shapes its cases ran at
                from kernalin_ci.verify.judge import CaseReader

                return CaseReader(op, params, dom, main_dtype, device, poison=not probe, root=root)

            with ThreadPoolExecutor(max_workers=len(groups)) as shards:
                runs = [
                    shards.submit(
                        run_cases,
                        "verify-dynamic",
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
            result.cases_run += sum(p.done for p in parts)
            result.coverage = domain_mod.coverage(op, ran, params)
            result.not_checked = _not_checked(op, params, cases, refused)
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
            result.findings += found
            result.notices += notices
            result.structural = status
    result.findings = dedupe(result.findings)
    result.seconds = time.perf_counter() - t0
    return result


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
    progress: bool = True,
) -> VerifyResult:
    """The decode-pipeline check over kv_append + attention.decode_paged (+ rope) entries."""
    from kernalin_ci.verify.pipeline import ROLES

    for role in ("kv_append", "attention.decode_paged"):
        if not entries.get(role):
            raise UsageError(f"pipeline: an entry for {role} is required")
    for role in entries:
        if role not in ROLES:
            raise UsageError(f"pipeline: {role!r} is not a pipeline role ({', '.join(ROLES)})")
    if steps < 1:
        raise UsageError("steps: must be at least 1 (the pipeline's decode steps)", setting="steps")
    params = pipeline_params(entries, raw_params)
    dtype = dtype or "float32"
    label = "+".join(r for r in ROLES if entries.get(r))
    t0 = time.perf_counter()
    result = VerifyResult(op="decode-pipeline", entry=label, device=device)
    prog = Progress(progress, 1, "decode-pipeline")

    def on_step(step: int) -> None:
        if (step + 1) % 8 == 0:
            prog.note(f"step {step + 1}/{steps}")

    def repro(_case):
        parts = ["kernalin-ci", "pipeline"]
        for role, flag in (("kv_append", "--kv-append"), ("attention.decode_paged", "--attention"), ("rope", "--rope")):
            if entries.get(role):
                parts += [flag, entries[role]]
        for k, v in raw_params.items():
            parts += ["--param", f"{k}={v}"]
        parts += ["--device", device, "--dtype", dtype, "--steps", str(steps), "--seed", str(seed)]
        return " ".join(shlex.quote(p) for p in parts)

    case = Case("decode-loop", {"steps": steps, "start_lengths": list(_start_lengths())}, dtype, seed)
    job = {
        "entries": {k: v for k, v in entries.items() if v},
        "root": root,
        "params": params,
        "device": device,
        "dtype": dtype,
        "seed": seed,
        "steps": steps,
    }
    from kernalin_ci.verify.pipeline import PipelineReader

    _warm_torch(2)
    reader = PipelineReader(params, dtype, seed, steps, device, bool(entries.get("rope")), on_step, root)
    run = run_cases("verify-pipeline", job, [case], device, timeout_s or DEFAULT_TIMEOUT[device], prog, repro, reader)
    result.findings = dedupe(run.findings)
    result.notices = run.notices
    result.cases_run = run.done
    result.seconds = time.perf_counter() - t0
    return result


def _start_lengths():
    from kernalin_ci.verify.pipeline import START_LENGTHS

    return START_LENGTHS


__all__ = ["verify", "reproduce_command", "VerifyResult", "Notice", "StructuralStatus", "Coverage"]
