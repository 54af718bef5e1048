"""The daemon as a GitHub App: a client per installation (kernalin_ci.github.auth.app_client, its
installation token renewed by PyGithub), and short-lived read-only tokens for fetching private
repositories. The private key stays in this process: it is never written out, logged, or
passed to a job or an RQ worker.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from kernalin_ci.github.auth import app_client
from kernalin_ci.github.client import GitHubClient
from kernalin_ci.github.pygithub import Auth, GithubIntegration
from kernalin_ci.github.retry import RetryPolicy, call_with_retry

MAX_CLIENTS = 256


class GitHubApp:
    def __init__(self, settings):
        g = settings.github
        self.app_id = g.app_id
        self._key = settings.secrets.app_private_key
        self.base_url = g.api_url
        self.retry = RetryPolicy(
            attempts=g.retry_attempts,
            base_delay_s=g.retry_base_delay_s,
            max_delay_s=max(30.0, g.retry_base_delay_s),
            budget_s=g.retry_budget_s,
        )
        self.write_interval_s = g.min_write_interval_s
        self.request_interval_s = g.min_request_interval_s
        self._clients: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def client(self, repo: str, installation_id: int | None) -> GitHubClient:
        """A client acting as the App's installation on REPO (looked up when INSTALLATION_ID is None)."""
        key = installation_id or repo
        with self._lock:
            if key in self._clients:
                self._clients.move_to_end(key)
                return self._clients[key]
        c = app_client(
            repo,
            app_id=self.app_id,
            private_key=self._key,
            installation_id=installation_id,
            base_url=self.base_url,
            retry=self.retry,
            min_write_interval_s=self.write_interval_s,
            min_request_interval_s=self.request_interval_s,
        )
        with self._lock:
            self._clients[key] = c
            while len(self._clients) > MAX_CLIENTS:
                self._clients.popitem(last=False)
        return c

    def read_token(self, repo: str, installation_id: int | None) -> str:
        """An installation token that may only read contents (one hour), for `git fetch` of REPO."""
        gi = GithubIntegration(auth=Auth.AppAuth(self.app_id, self._key), base_url=self.base_url, retry=None)
        if installation_id is None:
            owner, name = repo.split("/", 1)
            installation_id = call_with_retry(
                lambda: gi.get_repo_installation(owner, name).id,
                operation=f"find the App's installation on {repo}",
                policy=self.retry,
                secrets=(self._key,),
            )
        auth = call_with_retry(
            lambda: gi.get_access_token(installation_id, permissions={"contents": "read"}),
            operation="make a read-only installation token",
            policy=self.retry,
            secrets=(self._key,),
        )
        return auth.token
