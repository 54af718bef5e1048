"""The GitHub stand-in's state and vocabulary (github_standin.py): permissions, the records it keeps
(tokens, apps, installations, repositories, requests, faults) and the `Ctx` a handler gets."""

from __future__ import annotations

import base64
import fnmatch
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernalin_ci.testing.github_standin import GitHubStandIn

NOT_ACCESSIBLE = "Resource not accessible by integration"
DOCS = "https://docs.github.com/rest"
ACTIONS_APP_ID = 15368  # the "GitHub Actions" app that owns GITHUB_TOKEN's check runs
WRITE_PERMISSIONS = {
    "checks": "write",
    "statuses": "write",
    "issues": "write",
    "pull_requests": "write",
    "contents": "read",
    "metadata": "read",
}
# what the GITHUB_TOKEN of a pull_request event from a fork gets
READ_ONLY_PERMISSIONS = {
    "checks": "read",
    "statuses": "read",
    "issues": "read",
    "pull_requests": "read",
    "contents": "read",
    "metadata": "read",
}
COMMENT_MAX_CHARS = 65536  # GitHub answers 422 for a longer issue comment body (not in the description)
STATUS_DESCRIPTION_MAX_CHARS = 140
_LEVELS = {"read": 1, "write": 2, "admin": 3}


def iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if ts is None else ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_id(kind: str, ident: int) -> str:
    return base64.b64encode(f"0:{kind}{ident}".encode()).decode()


class ApiError(Exception):
    """Raised by a handler to answer an error the way GitHub does."""

    def __init__(self, status: int, message: str, *, headers: dict | None = None, errors: list | None = None):
        super().__init__(message)
        self.status, self.message, self.headers, self.errors = status, message, headers or {}, errors


@dataclass
class Request:
    """One request the stand-in received, and what it answered."""

    method: str
    path: str  # without the base prefix and the query
    query: dict[str, list[str]]
    body: object  # parsed JSON; None when there was none
    headers: dict[str, str]  # lower-case names
    template: str | None = None
    status: int = 0
    fault: bool = False  # answered by an injected fault
    problems: list[str] = field(default_factory=list)


@dataclass
class Fault:
    method: str
    path: str
    status: int
    times: int | None  # None: every matching request
    message: str | None = None
    headers: dict = field(default_factory=dict)
    drop: bool = False
    after: bool = False  # the request takes effect first; only its answer fails (a lost answer)
    hits: int = 0

    def matches(self, method: str, path: str, template: str | None) -> bool:
        if self.method != "*" and self.method != method:
            return False
        if "{" in self.path:
            return self.path == template
        return fnmatch.fnmatchcase(path, self.path)

    @property
    def spent(self) -> bool:
        return self.times is not None and self.hits >= self.times


@dataclass
class Token:
    token: str
    permissions: dict[str, str]
    repos: set[str] | None  # None: every repository
    login: str
    app_id: int | None  # None: a personal access token
    expires_at: float | None = None


@dataclass
class App:
    id: int
    slug: str
    name: str
    public_key: str  # PEM


@dataclass
class Installation:
    id: int
    app_id: int
    account: str
    repos: set[str]
    permissions: dict[str, str]


@dataclass
class Repo:
    id: int
    full_name: str
    commits: set[str] = field(default_factory=set)
    pulls: dict[int, dict] = field(default_factory=dict)
    check_runs: dict[int, dict] = field(default_factory=dict)
    check_suites: dict[tuple, int] = field(default_factory=dict)  # (app_id, head_sha) -> id
    comments: dict[int, dict] = field(default_factory=dict)
    statuses: list[dict] = field(default_factory=list)
    git_dir: str | None = None  # a real (bare) git repository: its branches and commits
    default_branch: str = "main"


@dataclass
class Ctx:
    """What a handler gets: the matched request and helpers to authorise it."""

    standin: GitHubStandIn
    method: str
    template: str
    path_params: dict[str, str]
    query: dict[str, list[str]]
    body: object
    auth: Token | App | None
    response_headers: dict[str, str] = field(default_factory=dict)

    def q(self, name: str, default: str | None = None) -> str | None:
        return self.query.get(name, [default])[0]

    def repo(self, *permission: str, level: str = "read") -> Repo:
        """The repository of the path, once the caller may use it with PERMISSION (any one) at LEVEL."""
        return self.standin._authorise(
            self, f"{self.path_params['owner']}/{self.path_params['repo']}", permission, level
        )

    def app(self) -> App:
        if not isinstance(self.auth, App):
            raise ApiError(401, "A JSON web token could not be decoded")
        return self.auth


Handler = Callable[[Ctx], tuple[int, object]]
