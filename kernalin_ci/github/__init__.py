"""GitHub: check runs with annotations, the sticky PR comment, the commit status fallback, Actions env.

docs/github.md describes the contract; the parts:
  client.py   GitHubClient: the REST operations, through PyGithub, with retries
  publish.py  Publication -> begin()/publish() -> PublishResult, with the fallbacks
  auth.py     token / GitHub App credentials, Enterprise base URL
  actions.py  the Actions environment (event payload, inputs, outputs, step summary)
  retry.py    which failures are retried and how long to wait
  errors.py   the exceptions callers catch
"""
from kernalin_ci.errors import UsageError

try:
    import github as _pygithub  # noqa: F401  (PyGithub)
except ImportError:  # pragma: no cover - depends on the installation
    raise UsageError("GitHub support needs PyGithub: pip install 'kernalin-ci[github]'") from None

from kernalin_ci.github.client import Annotation, GitHubClient, Posted, sticky_marker
from kernalin_ci.github.errors import GitHubAuthError, GitHubError, GitHubPermissionError, GitHubUnavailable
from kernalin_ci.github.publish import Publication, PublishResult, Started, begin, publish
from kernalin_ci.github.retry import RetryPolicy

__all__ = [
    "Annotation", "GitHubClient", "Posted", "sticky_marker", "GitHubAuthError", "GitHubError",
    "GitHubPermissionError", "GitHubUnavailable", "Publication", "PublishResult", "Started", "begin", "publish",
    "RetryPolicy",
]
