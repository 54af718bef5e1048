"""Credentials: a token (GITHUB_TOKEN in Actions, or any token) or a GitHub App installation.

    client = client_from_env("acme/kernels")                  # what the Action and the CLI use
    client = app_client("acme/kernels", app_id=..., private_key=PEM, installation_id=...)   # a daemon

Environment read by client_from_env (arguments win over it):
  GITHUB_API_URL                       the API root; set by Actions (https://HOST/api/v3 on Enterprise)
  KERNALIN_GITHUB_APP_ID               a GitHub App's id; with one of
  KERNALIN_GITHUB_APP_PRIVATE_KEY      its private key (PEM text; literal \\n are turned into newlines)
  KERNALIN_GITHUB_APP_PRIVATE_KEY_PATH a file holding it
  KERNALIN_GITHUB_APP_INSTALLATION_ID  optional; else looked up for the repository
  GITHUB_TOKEN                         used when no App is configured
An App installation token is made from a JWT signed with the key (RS256, 10 minutes at most)
and renewed by PyGithub before it expires (one hour). Secrets never appear in messages.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kernalin_ci.errors import UsageError
from kernalin_ci.github.client import DEFAULT_API_URL, GitHubClient
from kernalin_ci.github.errors import GitHubPermissionError
from kernalin_ci.github.pygithub import Auth, GithubIntegration, load_pem_private_key
from kernalin_ci.github.retry import RetryPolicy, call_with_retry

ENV_APP_ID = "KERNALIN_GITHUB_APP_ID"
ENV_APP_KEY = "KERNALIN_GITHUB_APP_PRIVATE_KEY"
ENV_APP_KEY_PATH = "KERNALIN_GITHUB_APP_PRIVATE_KEY_PATH"
ENV_INSTALLATION_ID = "KERNALIN_GITHUB_APP_INSTALLATION_ID"


def api_url(env: Mapping[str, str] | None = None, base_url: str | None = None) -> str:
    """The API root: BASE_URL, else GITHUB_API_URL (set in Actions), else api.github.com."""
    env = os.environ if env is None else env
    return (base_url or env.get("GITHUB_API_URL") or DEFAULT_API_URL).rstrip("/")


def enterprise_api_url(host: str) -> str:
    """The REST API root of a GitHub Enterprise Server at HOST."""
    return f"https://{host.strip('/')}/api/v3"


def token_client(token: str, *, base_url: str = DEFAULT_API_URL, **client_kwargs) -> GitHubClient:
    if not token or not token.strip():
        raise UsageError("the GitHub token is empty")
    return GitHubClient(Auth.Token(token.strip()), base_url=base_url, secrets=[token.strip()], **client_kwargs)


def read_private_key(pem: str | None = None, path: str | os.PathLike | None = None) -> str:
    """The App's private key as PEM text, checked to be one; the key itself is never echoed."""
    if pem is None and path is not None:
        try:
            pem = Path(path).read_text()
        except OSError as e:
            raise UsageError(f"cannot read the GitHub App private key file {path}: {e.strerror}") from None
    if not pem:
        raise UsageError("no GitHub App private key given")
    pem = pem.strip().replace("\\n", "\n") + "\n"
    try:
        load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError):
        where = f"file {path}" if path is not None else "value"
        raise UsageError(f"the GitHub App private key {where} is not an unencrypted PEM private key") from None
    return pem


def app_client(
    repo: str,
    *,
    app_id: int | str,
    private_key: str,
    installation_id: int | None = None,
    base_url: str = DEFAULT_API_URL,
    retry: RetryPolicy = RetryPolicy(),
    **client_kwargs,
) -> GitHubClient:
    """A client acting as App APP_ID's installation on REPO (looked up when INSTALLATION_ID is None)."""
    try:
        app_id = int(app_id)
    except ValueError:
        raise UsageError(f"the GitHub App id must be a number, not {app_id!r}") from None
    key = read_private_key(private_key)
    app_auth = Auth.AppAuth(app_id, key)
    if installation_id is None:
        owner, name = repo.split("/", 1)
        gi = GithubIntegration(auth=app_auth, base_url=base_url.rstrip("/"), retry=None)
        try:
            installation = call_with_retry(
                lambda: gi.get_repo_installation(owner, name),
                operation=f"find the App's installation on {repo}",
                policy=retry,
                secrets=(key,),
            )
        except GitHubPermissionError as e:
            raise GitHubPermissionError(
                f"GitHub App {app_id} is not installed on {repo} ({e})", status=e.status, operation=e.operation
            ) from None
        installation_id = installation.id
    return GitHubClient(
        app_auth.get_installation_auth(int(installation_id)),
        base_url=base_url,
        retry=retry,
        secrets=[key],
        **client_kwargs,
    )


def client_from_env(
    repo: str,
    *,
    env: Mapping[str, str] | None = None,
    token: str | None = None,
    base_url: str | None = None,
    **client_kwargs,
) -> GitHubClient:
    """A client for REPO from explicit TOKEN, else a configured GitHub App, else GITHUB_TOKEN."""
    env = os.environ if env is None else env
    url = api_url(env, base_url)
    if token:
        return token_client(token, base_url=url, **client_kwargs)
    if env.get(ENV_APP_ID):
        if not (env.get(ENV_APP_KEY) or env.get(ENV_APP_KEY_PATH)):
            raise UsageError(f"{ENV_APP_ID} is set but neither {ENV_APP_KEY} nor {ENV_APP_KEY_PATH}")
        key = read_private_key(env.get(ENV_APP_KEY) or None, env.get(ENV_APP_KEY_PATH) or None)
        inst = env.get(ENV_INSTALLATION_ID)
        try:
            inst_id = int(inst) if inst else None
        except ValueError:
            raise UsageError(f"{ENV_INSTALLATION_ID} must be a number, not {inst!r}") from None
        return app_client(
            repo, app_id=env[ENV_APP_ID], private_key=key, installation_id=inst_id, base_url=url, **client_kwargs
        )
    if env.get("GITHUB_TOKEN"):
        return token_client(env["GITHUB_TOKEN"], base_url=url, **client_kwargs)
    raise UsageError(
        f"no GitHub credentials: set GITHUB_TOKEN, or {ENV_APP_ID} with {ENV_APP_KEY} or {ENV_APP_KEY_PATH}"
    )
