"""GitHub webhook deliveries: the signature check, and what an event asks the daemon to do.

Nothing here talks to GitHub or git: a delivery becomes plain `Intents` (jobs to queue, jobs to
cancel, installation changes) that the store records in one transaction, so the HTTP answer
goes back in milliseconds and the work happens afterwards.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

from kernalin_ci.daemon.model import JobSpec

SIGNATURE_HEADER = "X-Hub-Signature-256"
PR_ACTIONS = ("opened", "synchronize", "reopened", "labeled")
# owner/name; neither part may be "." or ".." (the name goes into API paths and the job directory)
_REPO = re.compile(r"(?!\.\.?/)[A-Za-z0-9_.-]{1,100}/(?!\.\.?$)[A-Za-z0-9_.-]{1,100}")
MAX_ID = 2**53 - 1  # ids and numbers GitHub sends are positive and below this (JSON-safe integers)
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_REF = re.compile(r"[^\x00-\x20~^:?*\[\\]{1,255}")


class BadPayload(ValueError):
    """Valid JSON, but not the event GitHub sends (a field missing or of the wrong shape): 400."""


def signature(secret: bytes, body: bytes) -> str:
    """The X-Hub-Signature-256 value GitHub sends for BODY: sha256=HMAC-SHA256(secret, body) in hex."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def signature_ok(secret: bytes, body: bytes, header: str | None) -> bool:
    """Whether HEADER is BODY's signature; constant-time in the compared value."""
    if not secret or not header:
        return False
    return hmac.compare_digest(signature(secret, body).encode(), header.strip().encode("utf-8", "replace"))


@dataclass
class Intents:
    """What one delivery asks for."""

    jobs: list[JobSpec] = field(default_factory=list)
    cancel_prs: list[tuple[str, int, str]] = field(default_factory=list)  # (repo, pr, reason)
    rerun_job: str | None = None  # check_run rerequested: the job id in the check run's external_id
    rerun_repo: str | None = None
    installation: tuple[int, str, str] | None = None  # (id, account, state)
    repos: list[tuple[str, str, bool, int | None]] = field(default_factory=list)  # (name, branch, private, inst)
    merged: list[tuple[str, int, str, str]] = field(default_factory=list)  # (repo, pr, head_sha, merge sha): history
    note: str = ""  # why nothing is done, for the answer and the log

    @property
    def empty(self) -> bool:
        return not (self.jobs or self.cancel_prs or self.rerun_job or self.installation or self.repos or self.merged)


def _get(d, *path, kind=None, pattern=None, optional=False):
    cur = d
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            if optional:
                return None
            raise BadPayload(f"missing {'.'.join(path)}")
        cur = cur[p]
    if cur is None and optional:
        return None
    if kind is not None and (not isinstance(cur, kind) or isinstance(cur, bool) and kind is not bool):
        raise BadPayload(f"{'.'.join(path)}: expected {kind.__name__}")
    if kind is int and not 0 < cur <= MAX_ID:
        raise BadPayload(f"{'.'.join(path)}: out of range")
    if pattern is not None and not pattern.fullmatch(str(cur)):
        raise BadPayload(f"{'.'.join(path)}: unexpected value")
    return cur


def _repo_info(payload: dict, installation_id: int | None) -> tuple[str, str, bool, int | None]:
    name = _get(payload, "repository", "full_name", kind=str, pattern=_REPO)
    branch = _get(payload, "repository", "default_branch", kind=str, pattern=_REF, optional=True) or "main"
    private = bool(_get(payload, "repository", "private", kind=bool, optional=True))
    return name, branch, private, installation_id


def _installation_id(payload: dict) -> int | None:
    return _get(payload, "installation", "id", kind=int, optional=True)


def interpret(event: str, payload: dict) -> Intents:
    """INTENTS for one delivery of EVENT (the X-GitHub-Event header). Raises BadPayload."""
    if not isinstance(payload, dict):
        raise BadPayload("the payload is not a JSON object")
    if event == "ping":
        return Intents(note="pong")
    if event == "pull_request":
        return _pull_request(payload)
    if event == "check_run":
        return _check_run(payload)
    if event == "installation":
        return _installation(payload)
    return Intents(note=f"event {event!r} is not handled")


def _pull_request(payload: dict) -> Intents:
    action = _get(payload, "action", kind=str)
    inst = _installation_id(payload)
    repo_info = _repo_info(payload, inst)
    repo = repo_info[0]
    pr = _get(payload, "pull_request", kind=dict)
    number = _get(pr, "number", kind=int)
    if action == "closed":
        out = Intents(cancel_prs=[(repo, number, "the pull request was closed")], repos=[repo_info])
        if _get(pr, "merged", kind=bool, optional=True) and _get(pr, "base", "ref", kind=str) == repo_info[1]:
            # merged into the default branch: its gate result joins the history (kernalin_ci/history)
            out.merged.append(
                (
                    repo,
                    number,
                    _get(pr, "head", "sha", kind=str, pattern=_SHA),
                    _get(pr, "merge_commit_sha", kind=str, pattern=_SHA),
                )
            )
            out.note = "merged into the default branch: its gate result goes into the history"
        return out
    if action not in PR_ACTIONS:
        return Intents(note=f"pull_request.{action} is not handled", repos=[repo_info])
    head_repo = _get(pr, "head", "repo", "full_name", kind=str, pattern=_REPO, optional=True)
    spec = JobSpec(
        repo=repo,
        pr=number,
        head_sha=_get(pr, "head", "sha", kind=str, pattern=_SHA),
        base_sha=_get(pr, "base", "sha", kind=str, pattern=_SHA),
        base_ref=_get(pr, "base", "ref", kind=str, pattern=_REF),
        head_repo=head_repo,
        installation_id=inst,
        trigger=f"pull_request.{action}",
        private=repo_info[2],
        default_branch=repo_info[1],
    )
    if action == "labeled":
        spec.label = _get(payload, "label", "name", kind=str)
        if not spec.fork:  # labels only matter as a maintainer's approval of a fork's code
            return Intents(note="a label on a pull request from the same repository", repos=[repo_info])
    return Intents(jobs=[spec], repos=[repo_info])


def _check_run(payload: dict) -> Intents:
    action = _get(payload, "action", kind=str)
    inst = _installation_id(payload)
    repo_info = _repo_info(payload, inst)
    if action != "rerequested":
        return Intents(note=f"check_run.{action} is not handled", repos=[repo_info])
    ext = _get(payload, "check_run", "external_id", kind=str, optional=True)
    if not ext:
        return Intents(note="the check run has no external id (not one of ours)", repos=[repo_info])
    return Intents(rerun_job=ext, rerun_repo=repo_info[0], repos=[repo_info])


def _installation(payload: dict) -> Intents:
    action = _get(payload, "action", kind=str)
    inst_id = _get(payload, "installation", "id", kind=int)
    account = _get(payload, "installation", "account", "login", kind=str, optional=True) or ""
    state = {
        "created": "active",
        "unsuspend": "active",
        "new_permissions_accepted": "active",
        "deleted": "deleted",
        "suspend": "suspended",
    }.get(action)
    if state is None:
        return Intents(note=f"installation.{action} is not handled")
    return Intents(installation=(inst_id, account, state))
