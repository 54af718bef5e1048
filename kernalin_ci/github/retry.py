"""Retries for GitHub API calls: which failures are worth another try, and how long to wait.

Retried: 5xx, 429, rate limits (403 whose message says so, or with Retry-After, or with
X-RateLimit-Remaining: 0) and network errors (connection refused or reset, timeouts).
Not retried: every other 4xx; they become GitHubAuthError (401), GitHubPermissionError
(403, 404) or GitHubError. PyGithub's own retries are switched off (`retry=None`) so
the two never multiply.

Waits: what the server asks for (Retry-After, or until X-RateLimit-Reset), else
exponential backoff with jitter (base * 2^n, times a uniform 0.5..1 factor, capped).
The whole call gives up, with GitHubUnavailable, after `attempts` tries or when the
next wait would end past `budget_s` from the first try.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TypeVar

from kernalin_ci.github.errors import GitHubAuthError, GitHubError, GitHubPermissionError, GitHubUnavailable, redact
from kernalin_ci.github.pygithub import GithubException, requests

log = logging.getLogger("kernalin_ci.github")
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6  # tries in all, the first included
    base_delay_s: float = 1.0  # the first backoff; doubles on every retry
    max_delay_s: float = 30.0  # one backoff at most (a server's Retry-After is honoured beyond it)
    budget_s: float = 120.0  # no wait may end later than this after the first try


def message_of(e: GithubException) -> str:
    data = e.data
    if isinstance(data, dict):
        text = data.get("message") or data.get("data") or ""
        details = [_error_text(x) for x in data.get("errors") or [] if _error_text(x)]
        if details:  # "Validation Failed" says little; its errors say what
            text = f"{text} ({'; '.join(details)})"
    else:
        text = data or ""
    text = " ".join(str(text).split())
    return text[:300] if text else "(no message)"


def _error_text(x) -> str:
    if isinstance(x, dict):
        return str(x.get("message") or " ".join(str(x[k]) for k in ("resource", "field", "code") if x.get(k)))
    return str(x)


def is_rate_limited(e: GithubException) -> bool:
    if e.status == 429:
        return True
    if e.status != 403:
        return False
    headers = {k.lower(): v for k, v in (e.headers or {}).items()}
    return (
        "rate limit" in message_of(e).lower() or "retry-after" in headers or headers.get("x-ratelimit-remaining") == "0"
    )


def server_wait_s(e: GithubException) -> float | None:
    """The wait the server asked for, if it did (Retry-After, or the primary rate limit's reset time)."""
    headers = {k.lower(): v for k, v in (e.headers or {}).items()}
    after = headers.get("retry-after")
    if after is not None:
        try:
            return max(float(after), 0.0)
        except ValueError:
            try:
                return max(parsedate_to_datetime(after).timestamp() - time.time(), 0.0)
            except (TypeError, ValueError):
                return None
    if headers.get("x-ratelimit-remaining") == "0" and headers.get("x-ratelimit-reset"):
        try:
            return max(float(headers["x-ratelimit-reset"]) - time.time(), 0.0) + 1.0
        except ValueError:
            return None
    return None


def classify(e: Exception, operation: str, secrets: tuple[str, ...] = ()) -> tuple[GitHubError, bool]:
    """(the exception to raise, whether another try may succeed)."""
    if isinstance(e, GithubException):
        text = redact(f"{operation}: GitHub answered {e.status}: {message_of(e)}", secrets)
        if e.status >= 500 or is_rate_limited(e):
            return GitHubUnavailable(text, status=e.status, operation=operation), True
        if e.status == 401:
            return GitHubAuthError(text, status=401, operation=operation), False
        if e.status in (403, 404):
            return GitHubPermissionError(text, status=e.status, operation=operation), False
        return GitHubError(text, status=e.status, operation=operation), False
    if isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        text = redact(f"{operation}: cannot reach GitHub: {type(e).__name__}: {e}", secrets)
        return GitHubUnavailable(text[:500], operation=operation), True
    raise TypeError(f"not a GitHub failure: {e!r}")


def call_with_retry(fn: Callable[[], T], *, operation: str, policy: RetryPolicy, secrets: tuple[str, ...] = ()) -> T:
    """fn() until it succeeds or the policy gives up; raises a GitHubError subclass."""
    start = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except (GithubException, requests.exceptions.ConnectionError, requests.exceptions.Timeout) as e:
            error, retryable = classify(e, operation, secrets)
            if not retryable:
                raise error from None
            asked = server_wait_s(e) if isinstance(e, GithubException) else None
            if asked is not None:
                wait = asked
            else:
                wait = min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            elapsed = time.monotonic() - start
            if attempt == policy.attempts or elapsed + wait > policy.budget_s:
                raise GitHubUnavailable(
                    f"{error} (gave up after {attempt} tries in {elapsed:.1f}s)",
                    status=error.status,
                    operation=operation,
                    attempts=attempt,
                ) from None
            log.warning(
                "%s; retry %d of %d in %.2fs%s",
                error,
                attempt,
                policy.attempts - 1,
                wait,
                " (as the server asked)" if asked is not None else "",
            )
            time.sleep(wait)
    raise AssertionError("unreachable")
