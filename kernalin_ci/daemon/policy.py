"""Which jobs may run code: pull requests from forks wait for a maintainer's label.

A fork's code runs only in a job started by a maintainer adding the fork label (or by a
re-run of such a job, for the same commit). Every other event on a fork's pull request
(opened, a new push, reopened) posts a neutral check run saying what to do: a new push
needs a new approval, so remove and add the label again. The label's name comes from the
daemon's configuration, or from the base branch's `.kernalin.yml` (`daemon: {fork_label: ...}`),
never from the pull request itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernalin_ci.daemon.model import JobSpec


@dataclass
class Decision:
    action: str  # run | wait | skip
    title: str = ""
    summary: str = ""


def decide(spec: JobSpec, fork_label: str) -> Decision:
    approved_by_label = spec.trigger.endswith("pull_request.labeled") or spec.trigger.endswith("(pull_request.labeled)")
    if spec.trigger == "pull_request.labeled" and spec.label != fork_label:
        return Decision("skip", summary=f"label {spec.label!r} is not the approval label {fork_label!r}")
    if not spec.fork:
        return Decision("run")
    if approved_by_label and spec.label == fork_label:
        return Decision("run")
    source = spec.head_repo or "a deleted fork"
    return Decision(
        "wait",
        title=f"Waiting for a maintainer to add the label '{fork_label}'",
        summary=(
            f"This pull request comes from a fork ({source}). kernalin-ci runs a fork's code only "
            f"after a maintainer has read the change and added the label **`{fork_label}`** to the pull "
            f"request. Each new push needs a new approval: remove the label and add it again.\n\n"
            f"Commit `{spec.head_sha[:12]}` has not been checked yet."
        ),
    )
