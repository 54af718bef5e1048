"""What can go wrong talking to GitHub, as exceptions callers catch; secrets never appear in them."""

from __future__ import annotations

import re


class GitHubError(Exception):
    """A GitHub API call failed. `status` is the HTTP status (None for a network error).

    Raised by `publish()`, `result` is the PublishResult of what it did post.
    """

    def __init__(self, message: str, *, status: int | None = None, operation: str = "", result=None):
        super().__init__(message)
        self.status = status
        self.operation = operation
        self.result = result


class GitHubAuthError(GitHubError):
    """The credentials were refused (401): a bad or expired token, a bad App key or id."""


class GitHubPermissionError(GitHubError):
    """The token may not do this (403 other than a rate limit, or 404): a fork PR's read-only token,
    a token without the checks/statuses/issues permission, a repository the App is not installed on."""


class GitHubUnavailable(GitHubError):
    """GitHub kept failing (5xx, 429, rate limits, network errors) until the retry budget was spent."""

    def __init__(self, message: str, *, status: int | None = None, operation: str = "", attempts: int = 0, result=None):
        super().__init__(message, status=status, operation=operation, result=result)
        self.attempts = attempts


# tokens GitHub issues (ghp_ personal, gho_ OAuth, ghu_ user-to-server, ghs_ server-to-server, ghr_ refresh,
# github_pat_ fine-grained), JWTs, and PEM private keys
_SECRET_PATTERNS = [
    re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9_]{16,}|github_pat_[A-Za-z0-9_]{20,})"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
]


def redact(text: str, secrets: tuple[str, ...] | list[str] = ()) -> str:
    """TEXT with every known secret and anything shaped like a GitHub token, JWT or private key replaced by ***."""
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "***")
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub("***", text)
    return text
