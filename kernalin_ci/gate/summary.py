"""The gate's short summary on the terminal and the CI log, as pytest's short test summary: each finding
with its file:line, bug class, one-line reason and reproduce command, each kernel or pipeline in error with
its cause. report.md has the same findings in full."""

from __future__ import annotations

from kernalin_ci.findings import Finding
from kernalin_ci.report.model import Report
from kernalin_ci.report.text import location_text, plural

REASON_CHARS = 200


def reason(f: Finding) -> str:
    """F's message in one line: its first sentence's worth, whitespace collapsed, cut at REASON_CHARS."""
    msg = " ".join(f.message.split()).split(" (also in ")[0]
    return msg if len(msg) <= REASON_CHARS else msg[: REASON_CHARS - 1] + "…"


def summary_lines(report: Report) -> list[str]:
    """The summary's lines; none when nothing was found and nothing is in error."""
    lines: list[str] = []
    n_findings = n_errors = 0
    for item in [*report.kernels, *report.pipelines]:
        v = item.verification
        error = getattr(item, "error", None) or (v.error if v is not None else None)
        if error:
            n_errors += 1
            lines.append(f"ERROR {item.name}: {' '.join(str(error).split())}")
        for f in v.findings if v is not None else []:
            n_findings += 1
            where = location_text(f.location) or f"entry {v.entry or item.name}"
            lines.append(f"FAIL {where} [{f.bug_class}] {item.name}: {reason(f)} ({f.check})")
            if f.reproduce:
                lines.append(f"     reproduce: {f.reproduce}")
    if not lines:
        return []
    counts = [plural(n_findings, "finding")] + ([plural(n_errors, "error")] if n_errors else [])
    return [f"==== short summary: {', '.join(counts)} (report.md has them in full) ====", *lines]


def emit(report: Report, out, *, annotate: bool) -> None:
    """Write the summary to OUT; with ANNOTATE (in GitHub Actions, where no check run carries the
    annotations) also a workflow-command annotation per finding with a source location."""
    for line in summary_lines(report):
        print(line, file=out)
    if annotate:
        # deferred: PyGithub is optional (the github extra)
        from kernalin_ci.gate.post import annotations
        from kernalin_ci.github.workflow_commands import commands

        for line in commands(annotations(report)):
            print(line, file=out)
    out.flush()
