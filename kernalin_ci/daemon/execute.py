"""One job, start to end, on one slot: fetch, read the base configuration, apply the fork
policy, run the gate through the runner, read report.json. Returns an Outcome; never posts
anything (the daemon's poster does) and never raises for the job's own failures.

The same function runs in the embedded scheduler (a thread of `serve`) and in an RQ worker
process on another host (`kernalin-ci worker`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from kernalin_ci.daemon import policy, safefile, workspace
from kernalin_ci.daemon.gpus import Slot
from kernalin_ci.daemon.model import JobSpec, Outcome
from kernalin_ci.daemon.runners.protocol import Runner, RunRequest, StopReason
from kernalin_ci.daemon.settings import Settings
from kernalin_ci.report.schema import REPORT_SCHEMA

log = logging.getLogger("kernalin_ci.daemon")


def execute(
    spec: JobSpec,
    slot: Slot,
    settings: Settings,
    runner: Runner,
    stop_reason: StopReason,
    *,
    fetch_token: str | None = None,
    on_start=lambda pid: None,
) -> Outcome:
    t0 = time.monotonic()
    job_dir = settings.jobs_dir / spec.id
    outcome = _execute(spec, slot, settings, runner, stop_reason, job_dir, fetch_token, on_start)
    outcome.seconds = round(time.monotonic() - t0, 3)
    outcome.worker = slot.worker
    return outcome


def _execute(spec, slot, settings, runner, stop_reason, job_dir: Path, token, on_start) -> Outcome:
    url = workspace.clone_url(settings.github.clone_url, spec.repo)
    try:
        ws = workspace.create(job_dir)
        workspace.fetch(ws, url, spec.base_sha, token=token)
        workspace.read_base_config(ws, spec)
    except workspace.FetchError as e:
        return Outcome("infra", f"fetching {spec.repo}: {e}")
    try:
        if ws.config is None:
            return Outcome("skipped", f"no {workspace.DEFAULT_FILE} on the base commit {spec.base_sha[:12]}")
        label = str(ws.repo_settings.get("fork_label") or settings.fork_label)
        decision = policy.decide(spec, label)
        if decision.action == "skip":
            return Outcome("skipped", decision.summary)
        if decision.action == "wait":
            return Outcome("waiting", decision.title, detail=decision.summary)
        reason = stop_reason()
        if reason:
            return Outcome("shutdown" if reason == "shutdown" else "cancelled", reason)
        try:  # only now is the pull request's code fetched
            workspace.fetch(ws, url, spec.head_sha, token=token)
            workspace.checkout_head(ws, spec)
        except workspace.FetchError as e:
            return Outcome("infra", f"fetching {spec.repo}: {e}")
        timeout = settings.runner.timeout_s
        repo_timeout = ws.repo_settings.get("timeout_s")
        if isinstance(repo_timeout, (int, float)) and not isinstance(repo_timeout, bool) and repo_timeout > 0:
            timeout = min(timeout, float(repo_timeout))  # a repository may ask for less, never more
        req = RunRequest(
            spec.id,
            job_dir,
            ws.repo,
            ws.out,
            spec.base_sha,
            spec.head_sha,
            slot,
            timeout,
            settings.runner.command,
            dict(settings.runner.env),
        )
        log.info(
            "job %s: %s #%d %s on %s (%s runner)",
            spec.id,
            spec.repo,
            spec.pr,
            spec.head_sha[:12],
            slot.name,
            runner.name,
        )
        res = runner.run(req, stop_reason, on_start)
        return _outcome(res, ws, settings.runner.out_max_bytes)
    finally:
        ws.clean()


class BadReport(ValueError):
    """report.json is a link, too large, not JSON, or does not match its schema."""


REPORT_MAX_BYTES = 32 * 1024 * 1024


def read_report(ws: workspace.Workspace) -> dict:
    """out/report.json, read without following links and checked against its schema before anything
    else reads it (report/schema.py). Raises BadReport."""
    try:
        data = safefile.read_bytes(ws.out / "report.json", ws.job_dir, REPORT_MAX_BYTES)
    except OSError as e:
        raise BadReport(f"refused: {e}") from None
    return check_report(data)


def check_report(data: bytes | str | dict) -> dict:
    """A report (report.json's bytes, or parsed) that matches the schema; BadReport otherwise."""
    import jsonschema

    try:
        report = json.loads(data) if isinstance(data, (bytes, str)) else data
    except (ValueError, RecursionError) as e:
        raise BadReport(f"not JSON ({type(e).__name__})") from None
    try:
        error = jsonschema.exceptions.best_match(_validator(REPORT_SCHEMA).iter_errors(report))
    except RecursionError:
        raise BadReport("nested too deeply") from None
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise BadReport(f"does not match its schema at {where}: {error.message[:200]}")
    return report


_VALIDATORS: dict = {}


def _validator(schema: dict):
    import jsonschema

    if id(schema) not in _VALIDATORS:
        _VALIDATORS[id(schema)] = jsonschema.Draft202012Validator(schema)
    return _VALIDATORS[id(schema)]


def exit_mismatch(report: dict, exit_code: int | None) -> str | None:
    """Why REPORT cannot be the gate's own (its conclusion and the gate's exit status disagree: the gate exits
    1 for a failure, 0 otherwise), else None. Such a report is an infrastructure error, never a verdict."""
    conclusion = report.get("conclusion")
    expected = 1 if conclusion == "failure" else 0
    if exit_code == expected:
        return None
    return (
        f"infrastructure error: the gate exited {exit_code} but report.json says {conclusion!r}: "
        f"the report is not the gate's own and is not trusted"
    )


def _out_too_big(ws: workspace.Workspace, limit: int) -> str | None:
    if ws.out.is_symlink() or not ws.out.is_dir():
        safefile.remove(ws.out)
        ws.out.mkdir()
        return "the job replaced its output directory (a link or a file): refused"
    size = safefile.tree_size(ws.out)
    if size <= limit:
        return None
    safefile.remove(ws.out)
    ws.out.mkdir()
    return f"the job wrote {size} bytes to its output directory, over the limit of {limit} (removed)"


def _outcome(res, ws: workspace.Workspace, out_max_bytes: int) -> Outcome:
    if res.infra_error:
        return Outcome("infra", res.infra_error, log_tail=res.log_tail)
    if res.stopped:
        return Outcome("shutdown" if res.stopped == "shutdown" else "cancelled", res.stopped, log_tail=res.log_tail)
    if res.timed_out:
        return Outcome(
            "timeout", f"the job ran past its time limit ({res.seconds:.0f} s) and was killed", log_tail=res.log_tail
        )
    if res.job_error:  # a cap of the runner's: the disk, out/
        return Outcome("error", res.job_error, exit_code=res.exit_code, log_tail=res.log_tail)
    too_big = _out_too_big(ws, out_max_bytes)
    if too_big:
        return Outcome("error", too_big, exit_code=res.exit_code, log_tail=res.log_tail)
    if res.exit_code in (0, 1) and os.path.lexists(ws.out / "report.json"):
        try:
            report = read_report(ws)
        except BadReport as e:
            return Outcome("error", f"report.json: {e}", exit_code=res.exit_code, log_tail=res.log_tail)
        mismatch = exit_mismatch(report, res.exit_code)
        if mismatch:
            return Outcome("error", mismatch, exit_code=res.exit_code, log_tail=res.log_tail)
        return Outcome(
            "report", report.get("reason", ""), report=report, exit_code=res.exit_code, log_tail=res.log_tail
        )
    why = "it ran out of memory" if res.oom_killed else f"exit code {res.exit_code}"
    last = [ln for ln in res.log_tail.splitlines() if ln.strip()]
    detail = f": {last[-1].strip()[:300]}" if last else ""
    return Outcome("error", f"the gate could not run ({why}){detail}", exit_code=res.exit_code, log_tail=res.log_tail)
