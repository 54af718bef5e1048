"""GitHub: check runs with annotations, the sticky PR comment, the commit status fallback, Actions env.

docs/github.md describes the contract; the parts:
  client.py   GitHubClient: the REST operations, through PyGithub, with retries
  publish.py  Publication -> begin()/publish() -> PublishResult, with the fallbacks
  auth.py     token / GitHub App credentials, Enterprise base URL
  actions.py  the Actions environment (event payload, inputs, outputs, step summary)
  retry.py    which failures are retried and how long to wait
  errors.py   the exceptions callers catch
  pygithub.py PyGithub's names, or one line saying how to install it (the `github` extra)
"""

from kernalin_ci.errors import UsageError

try:
    from kernalin_ci.github.client import Annotation, GitHubClient, Posted, sticky_marker
    from kernalin_ci.github.errors import GitHubAuthError, GitHubError, GitHubPermissionError, GitHubUnavailable
    from kernalin_ci.github.publish import Publication, PublishResult, Started, begin, publish
    from kernalin_ci.github.retry import RetryPolicy
except UsageError:  # no PyGithub (the `github` extra): `actions` still works, as a local `kernalin-ci run`
    pass  # needs; importing client, publish, auth or retry says how to install it

__all__ = [
    "Annotation",
    "GitHubClient",
    "Posted",
    "sticky_marker",
    "GitHubAuthError",
    "GitHubError",
    "GitHubPermissionError",
    "GitHubUnavailable",
    "Publication",
    "PublishResult",
    "Started",
    "begin",
    "publish",
    "RetryPolicy",
]
