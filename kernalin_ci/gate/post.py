"""Report -> what GitHub shows: a Publication (check run, annotations, sticky comment), and the
Actions outputs. Rendering comes from kernalin_ci.report; posting from kernalin_ci.github."""

from __future__ import annotations

from kernalin_ci.github.client import Annotation
from kernalin_ci.github.publish import Publication
from kernalin_ci.report.markdown import headline, render_markdown
from kernalin_ci.report.model import Report
from kernalin_ci.report.text import finding_text


def annotations(report: Report) -> list[Annotation]:
    """One annotation per finding that has a source location (paths relative to the repository)."""
    out = []
    for item in list(report.kernels) + list(report.pipelines):
        for f in item.verification.findings if item.verification is not None else []:
            loc = f.location
            if not loc or not loc.path:
                continue
            line = int(loc.line or 1)
            out.append(
                Annotation(
                    path=loc.path,
                    start_line=line,
                    end_line=line,
                    annotation_level="failure",
                    title=f"{item.name}: {f.bug_class} ({f.check})",
                    message=finding_text(f),
                )
            )
    return out


def publication(
    report: Report,
    repo: str,
    head_sha: str,
    pr_number: int | None,
    *,
    details_url: str | None = None,
    name: str = "kernalin-ci",
    external_id: str | None = None,
) -> Publication:
    body = render_markdown(report)
    return Publication(
        repo=repo,
        head_sha=head_sha,
        conclusion=report.conclusion,
        title=headline(report),
        summary=body,
        pr_number=pr_number,
        name=name,
        annotations=annotations(report),
        comment_markdown=body,
        details_url=details_url,
        external_id=external_id,
    )


def verdict_output(report: Report) -> str:
    """The Action's `verdict` output: the benchmark verdict, or name=verdict pairs for several kernels."""
    judged = [(k.name, k.bench_verdict) for k in report.kernels if k.benchmark is not None]
    if not judged:
        return "none"
    if len(judged) == 1:
        return judged[0][1]
    return ",".join(f"{n}={v}" for n, v in judged)
