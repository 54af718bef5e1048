"""The Action's history: a JSON file (history.json) on a data branch of the repository, the way
github-action-benchmark keeps its data on gh-pages.

A write never touches the work tree or the checked-out branch: it fetches the data branch, builds
the next commit with git plumbing (a private index file), and pushes it without force. When another
job pushed first the push is refused as non-fast-forward; the writer fetches again, adds its run to
the newer file and pushes again, so concurrent writers lose nothing. The push goes through the
repository's configured remote, with the credentials actions/checkout left there (the workflow's
token; `contents: write`).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path

from kernalin_ci.errors import UsageError
from kernalin_ci.history.model import Run

FILE = "history.json"
ATTEMPTS = 20
FORMAT = "kernalin-ci history"


class PushRefused(Exception):
    """Someone else moved the branch first (non-fast-forward)."""


class GitBranchHistory:
    def __init__(self, repo_dir: str | Path, branch: str, remote: str = "origin"):
        self.repo_dir = Path(repo_dir)
        self.branch = branch
        self.remote = remote
        self.attempts_used = 0  # pushes tried by the last add() (tests and logs)
        try:
            self._git("rev-parse", "--git-dir")
        except UsageError:
            raise UsageError(f"history git:{branch}: {self.repo_dir} is not a git repository") from None

    def _git(
        self, *args: str, input: str | None = None, env: dict | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        p = subprocess.run(
            ["git", "-C", str(self.repo_dir), *args],
            input=input,
            capture_output=True,
            text=True,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0", **(env or {})},
        )
        if check and p.returncode != 0:
            raise UsageError(f"git {args[0]}: {' '.join((p.stderr or p.stdout).split())[:300]}")
        return p

    def _ref(self) -> str:
        return f"refs/kernalin-history/{self.branch}"

    def _fetch(self) -> str | None:
        """The data branch's tip on the remote (fetched), or None when it does not exist yet."""
        p = self._git(
            "fetch", "--quiet", "--no-tags", self.remote, f"+refs/heads/{self.branch}:{self._ref()}", check=False
        )
        if p.returncode != 0:
            if "couldn't find remote ref" in p.stderr or "could not find remote ref" in p.stderr.lower():
                return None
            raise UsageError(f"git fetch {self.remote} {self.branch}: {' '.join(p.stderr.split())[:300]}")
        return self._git("rev-parse", self._ref()).stdout.strip()

    def _read(self, tip: str | None) -> list[dict]:
        if tip is None:
            return []
        p = self._git("show", f"{tip}:{FILE}", check=False)
        if p.returncode != 0:
            return []
        try:
            data = json.loads(p.stdout)
        except ValueError:
            raise UsageError(f"{self.branch}:{FILE} is not JSON: the history branch was changed by hand") from None
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            raise UsageError(f"{self.branch}:{FILE}: not a kernalin-ci history")
        return data["runs"]

    def runs(self, repo: str | None = None) -> list[Run]:
        out = [Run.from_json(r) for r in self._read(self._fetch())]
        return [r for r in out if repo is None or r.repo == repo]

    def repos(self) -> list[str]:
        return sorted({r.repo for r in self.runs()})

    def close(self) -> None:
        pass

    def add(self, run: Run) -> bool:
        """Append RUN and push; retried on a refused push. False when its commit is recorded already."""
        for attempt in range(1, ATTEMPTS + 1):
            self.attempts_used = attempt
            tip = self._fetch()
            runs = self._read(tip)
            if any(f"{r.get('repo')}@{r.get('commit')}" == run.key for r in runs):
                return False
            runs.append(run.to_json())
            commit = self._commit(tip, runs, f"kernalin-ci history: {run.repo}@{run.commit[:12]}")
            try:
                self._push(commit)
                return True
            except PushRefused:
                time.sleep(random.uniform(0.05, 0.2) * min(attempt, 5))
        raise UsageError(f"history git:{self.branch}: the push was refused {ATTEMPTS} times (other writers)")

    def _commit(self, parent: str | None, runs: list[dict], message: str) -> str:
        text = json.dumps({"format": FORMAT, "version": 1, "runs": runs}, indent=1) + "\n"
        blob = self._git("hash-object", "-w", "--stdin", input=text).stdout.strip()
        with tempfile.TemporaryDirectory(prefix="kernalin-history-") as tmp:
            env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
            if parent:
                self._git("read-tree", parent, env=env)
            self._git("update-index", "--add", "--cacheinfo", f"100644,{blob},{FILE}", env=env)
            tree = self._git("write-tree", env=env).stdout.strip()
        ident = {"GIT_AUTHOR_NAME": "kernalin-ci", "GIT_AUTHOR_EMAIL": "kernalin-ci@users.noreply.github.com"}
        ident |= {"GIT_COMMITTER_NAME": ident["GIT_AUTHOR_NAME"], "GIT_COMMITTER_EMAIL": ident["GIT_AUTHOR_EMAIL"]}
        args = ["commit-tree", tree, "-m", message] + (["-p", parent] if parent else [])
        return self._git(*args, env=ident).stdout.strip()

    def _push(self, commit: str) -> None:
        p = self._git("push", "--quiet", "--porcelain", self.remote, f"{commit}:refs/heads/{self.branch}", check=False)
        if p.returncode == 0:
            return
        text = p.stdout + p.stderr
        if any(
            s in text
            for s in (
                "non-fast-forward",
                "fetch first",
                "[rejected]",
                "cannot lock ref",
                "failed to update ref",
                "stale info",
            )
        ):
            raise PushRefused(text)
        raise UsageError(f"git push {self.remote} {self.branch}: {' '.join(text.split())[:300]}")
