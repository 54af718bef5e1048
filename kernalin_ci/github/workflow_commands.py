"""GitHub Actions workflow commands on the job's log: `::error file=F,line=L,title=T::MESSAGE`.

The runner turns such a line into an annotation on the pull request's diff with the job's own token, so a
pull request from a fork, whose read-only token cannot create check runs, still gets its lines annotated
(docs/action.md). Escaping follows GitHub's rules for workflow commands: in the message `%`, CR and LF
become `%25`, `%0D`, `%0A`; in a property value also `:` and `,` become `%3A` and `%2C`. A message so
escaped is one line: nothing in it (a kernel's path or error text) can start a command of its own.
"""

from __future__ import annotations

from collections.abc import Iterable

from kernalin_ci.github.client import Annotation

# GitHub shows at most 10 error annotations per step (docs.github.com: workflow commands' limits)
MAX_PER_STEP = 10
LEVELS = {"failure": "error", "warning": "warning", "notice": "notice"}


def escape_data(text: str) -> str:
    """TEXT as a workflow command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """TEXT as a workflow command's property value (file, title)."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(a: Annotation) -> str:
    """One annotation as a workflow command line."""
    props = [f"file={escape_property(a.path)}", f"line={int(a.start_line)}"]
    if a.end_line and a.end_line != a.start_line:
        props.append(f"endLine={int(a.end_line)}")
    if a.title:
        props.append(f"title={escape_property(a.title)}")
    return f"::{LEVELS.get(a.annotation_level, 'error')} {','.join(props)}::{escape_data(a.message)}"


def commands(annotations: Iterable[Annotation]) -> list[str]:
    """The command lines for ANNOTATIONS, at most MAX_PER_STEP, then a plain line saying how many were left
    out (the job log's summary lists them all)."""
    items = list(annotations)
    out = [command(a) for a in items[:MAX_PER_STEP]]
    if len(items) > MAX_PER_STEP:
        out.append(
            f"kernalin-ci: {len(items) - MAX_PER_STEP} more findings are not annotated (GitHub shows "
            f"{MAX_PER_STEP} error annotations per step); the summary above lists them all"
        )
    return out
