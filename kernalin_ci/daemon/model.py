"""Plain data passed between the daemon's parts: what a job is, and how it ended."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field

# job states (docs/daemon.md has the diagram)
QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
STATES = (QUEUED, RUNNING, DONE, FAILED, CANCELLED)


def new_job_id() -> str:
    """Unique across databases, so a fresh state directory never reuses an old check run's external_id."""
    return "kci-" + uuid.uuid4().hex[:20]


@dataclass
class JobSpec:
    """Everything needed to run one gate job; built from a webhook payload, stored as JSON."""

    repo: str  # owner/name of the base repository (where the pull request is)
    pr: int
    head_sha: str
    base_sha: str
    base_ref: str
    head_repo: str | None  # owner/name the head comes from; None when the fork was deleted
    installation_id: int | None
    trigger: str  # "pull_request.opened", "pull_request.labeled", "check_run.rerequested", ...
    label: str | None = None  # the label a `labeled` event added
    private: bool = False
    default_branch: str = "main"
    id: str = field(default_factory=new_job_id)

    @property
    def fork(self) -> bool:
        return self.head_repo != self.repo

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> JobSpec:
        return cls(**d)


# how a job's execution ended (Outcome.kind) -> the job's next state
#   report     the gate ran and wrote report.json (exit 0 or 1)          -> done
#   waiting    a fork's pull request without the maintainer's label      -> done (neutral check run)
#   skipped    nothing to do (no .kernalin.yml on base, another label)   -> done (nothing posted)
#   error      the gate could not run (exit 2: bad base config, ...)     -> failed (no retry)
#   timeout    the job ran past runner.timeout_s and was killed          -> failed (no retry)
#   infra      fetch or container engine failed                         -> queued again with backoff, then failed
#   cancelled  stopped because a newer push superseded it                -> cancelled
#   shutdown   stopped because the daemon is stopping                    -> queued again (no attempt counted)
OUTCOME_KINDS = ("report", "waiting", "skipped", "error", "timeout", "infra", "cancelled", "shutdown")


@dataclass
class Outcome:
    kind: str
    message: str = ""  # one line: why (the check run's title for waiting/error/timeout/infra)
    detail: str = ""  # markdown for the check run's summary, where the message is not enough
    report: dict | None = None  # report.json when kind == "report"
    exit_code: int | None = None
    log_tail: str = ""
    seconds: float = 0.0
    worker: str = ""  # who ran it (host and slot)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Outcome:
        return cls(**d)
