"""The GitHub Actions environment: the triggering event, the action's inputs, outputs, the step summary.

    ctx = actions.context()               # GITHUB_* variables and the event payload
    pr = ctx.pull_request                 # None unless a pull_request(-like) event
    token = actions.get_input("github-token")
    actions.set_output("conclusion", "failure")
    actions.append_step_summary(markdown)

In a pull_request run GITHUB_SHA is the merge commit GitHub made for the run; check runs,
statuses and annotations belong on the PR's head commit, `pull_request.head_sha`
(`ctx.head_sha` picks it). A pull request from a fork gets a read-only GITHUB_TOKEN
(`pull_request.is_fork`): expect publish() to warn rather than post, and rely on the
step summary.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kernalin_ci.errors import UsageError

STEP_SUMMARY_MAX_BYTES = 1024 * 1024  # GitHub refuses a step's summary above 1 MiB
PULL_REQUEST_EVENTS = ("pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment")


@dataclass
class PullRequest:
    repo: str  # the base repository (owner/name): where checks and comments go
    number: int
    base_sha: str
    base_ref: str
    head_sha: str
    head_ref: str
    head_repo: str | None  # owner/name of the head repository; None when a fork was deleted
    is_fork: bool
    action: str | None = None
    html_url: str | None = None


@dataclass
class ActionsContext:
    event_name: str
    repository: str  # GITHUB_REPOSITORY
    sha: str  # GITHUB_SHA: for pull_request events the merge commit, not the head
    api_url: str  # GITHUB_API_URL
    server_url: str  # GITHUB_SERVER_URL
    run_url: str | None  # the page of this workflow run
    pull_request: PullRequest | None

    @property
    def head_sha(self) -> str:
        """The commit results belong on: the PR head for a PR event, else GITHUB_SHA."""
        return self.pull_request.head_sha if self.pull_request else self.sha


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def in_actions(env: Mapping[str, str] | None = None) -> bool:
    return _env(env).get("GITHUB_ACTIONS") == "true"


def parse_pull_request(payload: dict, event_name: str | None = None) -> PullRequest | None:
    """The pull request of an event payload (None when the event has none)."""
    pr = payload.get("pull_request")
    if not isinstance(pr, dict):
        return None
    try:
        base, head = pr["base"], pr["head"]
        base_repo = base["repo"]["full_name"]
        head_repo = (head.get("repo") or {}).get("full_name")
        return PullRequest(
            repo=base_repo,
            number=int(pr["number"]),
            base_sha=base["sha"],
            base_ref=base["ref"],
            head_sha=head["sha"],
            head_ref=head["ref"],
            head_repo=head_repo,
            is_fork=head_repo != base_repo,
            action=payload.get("action"),
            html_url=pr.get("html_url"),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"the {event_name or 'event'} payload's pull_request lacks {e}") from None


def read_event(path: str | os.PathLike) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
    except OSError as e:
        raise UsageError(f"cannot read the event payload {path}: {e.strerror}") from None
    except ValueError as e:
        raise UsageError(f"the event payload {path} is not JSON: {e}") from None
    if not isinstance(payload, dict):
        raise UsageError(f"the event payload {path} is not a JSON object")
    return payload


def context(env: Mapping[str, str] | None = None) -> ActionsContext:
    """What this workflow run is about, from GITHUB_* and the payload at GITHUB_EVENT_PATH."""
    env = _env(env)
    missing = [k for k in ("GITHUB_EVENT_NAME", "GITHUB_REPOSITORY", "GITHUB_SHA") if not env.get(k)]
    if missing:
        raise UsageError(f"not in a GitHub Actions run: {', '.join(missing)} unset")
    event_name = env["GITHUB_EVENT_NAME"]
    pull_request = None
    if env.get("GITHUB_EVENT_PATH"):
        pull_request = parse_pull_request(read_event(env["GITHUB_EVENT_PATH"]), event_name)
    elif event_name in PULL_REQUEST_EVENTS:
        raise UsageError(f"GITHUB_EVENT_PATH is unset in a {event_name} run")
    server = env.get("GITHUB_SERVER_URL", "https://github.com").rstrip("/")
    run_url = (
        f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}" if env.get("GITHUB_RUN_ID") else None
    )
    return ActionsContext(
        event_name,
        env["GITHUB_REPOSITORY"],
        env["GITHUB_SHA"],
        env.get("GITHUB_API_URL", "https://api.github.com").rstrip("/"),
        server,
        run_url,
        pull_request,
    )


# -- inputs ---------------------------------------------------------------------------------------
def input_variable(name: str) -> str:
    """The variable the runner sets for action input NAME (spaces become _, upper case, '-' kept)."""
    return "INPUT_" + name.replace(" ", "_").upper()


def get_input(
    name: str, *, env: Mapping[str, str] | None = None, required: bool = False, default: str | None = None
) -> str | None:
    """Action input NAME, stripped; DEFAULT when unset or empty."""
    value = _env(env).get(input_variable(name), "").strip()
    if value:
        return value
    if required:
        raise UsageError(f"input required and not supplied: {name}")
    return default


def get_bool_input(name: str, *, env: Mapping[str, str] | None = None, default: bool = False) -> bool:
    """Action input NAME as a YAML 1.2 core boolean (true/True/TRUE, false/False/FALSE)."""
    value = get_input(name, env=env)
    if value is None:
        return default
    if value in ("true", "True", "TRUE"):
        return True
    if value in ("false", "False", "FALSE"):
        return False
    raise UsageError(f"input {name} must be true or false, not {value!r}")


# -- outputs and the step summary -----------------------------------------------------------------
def set_output(name: str, value: object, *, env: Mapping[str, str] | None = None) -> bool:
    """Append output NAME=VALUE to $GITHUB_OUTPUT in the multiline-safe form; False outside Actions.

    NAME<<ghadelimiter_UUID
    VALUE (any lines)
    ghadelimiter_UUID
    """
    path = _env(env).get("GITHUB_OUTPUT")
    if not path:
        return False
    if not name or "\n" in name or "\r" in name:
        raise ValueError(f"bad output name {name!r}")
    text = value if isinstance(value, str) else json.dumps(value)
    delimiter = f"ghadelimiter_{uuid.uuid4()}"
    if delimiter in name or delimiter in text:  # a fresh UUID: never in practice, but never silently
        raise ValueError("output value contains its delimiter")
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{name}<<{delimiter}\n{text}\n{delimiter}\n")
    return True


def append_step_summary(markdown: str, *, env: Mapping[str, str] | None = None) -> bool:
    """Append MARKDOWN to $GITHUB_STEP_SUMMARY (kept under GitHub's 1 MiB); False outside Actions."""
    path = _env(env).get("GITHUB_STEP_SUMMARY")
    if not path:
        return False
    p = Path(path)
    room = STEP_SUMMARY_MAX_BYTES - (p.stat().st_size if p.exists() else 0)
    data = (markdown if markdown.endswith("\n") else markdown + "\n").encode("utf-8")
    if len(data) > room:
        note = b"\n\n*The step summary was cut at GitHub's 1 MiB limit; the full report is in the job's output.*\n"
        head = data[: max(room - len(note), 0)].decode("utf-8", errors="ignore").encode("utf-8")
        data = head + note if room >= len(note) else b""
    with open(p, "ab") as f:
        f.write(data)
    return True
