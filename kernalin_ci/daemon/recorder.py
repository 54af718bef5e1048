"""The daemon's history recorder: a pull request merged into the default branch (a `pull_request.closed`
delivery with `merged: true`, recorded in the job store with the delivery) becomes a Run of its merge
commit, from the newest gate result of the PR's head commit. A thread does it after the delivery is
answered; a history database that is down is tried again later, nothing is lost (the merge stays
pending in the job store).

The runs are ordered by the default branch's commit graph (history/ancestry.py). Job checkouts are
shallow and removed after the job, so the recorder keeps one of its own per repository: a bare clone
of the default branch without trees or blobs (`--filter=tree:0`, commits only) in
STATE_DIR/history-git/OWNER/NAME.git, fetched after each merge it records."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from kernalin_ci.daemon import workspace
from kernalin_ci.daemon.loop import BackgroundLoop
from kernalin_ci.history.ancestry import Ancestry
from kernalin_ci.history.model import run_from_report

log = logging.getLogger("kernalin_ci.daemon")
RETRY_S = 30.0
MIRRORS = "history-git"


class Recorder(BackgroundLoop):
    thread_name = "kernalin-history"

    def __init__(self, store, history, settings, github=None):
        super().__init__()
        self.store, self.history, self.settings, self.github = store, history, settings, github

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.record_pending()
            except Exception:
                log.exception("history: recording failed (tried again in %.0f s)", RETRY_S)
            self.wake.wait(RETRY_S)
            self.wake.clear()

    def record_pending(self) -> int:
        """Record every pending merge; the number recorded."""
        n = 0
        for m in self.store.pending_merges():
            job = self.store.result_for(m["repo"], m["pr"], m["head_sha"])
            if job is None or job.outcome is None or job.outcome.report is None:
                self.store.merge_recorded(
                    m["repo"], m["merge_sha"], "no-result", f"no gate result for {m['head_sha'][:12]} of #{m['pr']}"
                )
                log.info("history: %s#%d merged without a gate result of its head: not recorded", m["repo"], m["pr"])
                continue
            info = self.store.repo(m["repo"]) or {}
            url = f"{self.settings.public_url}/jobs/{job.id}" if self.settings.public_url else f"/jobs/{job.id}"
            run = run_from_report(
                job.outcome.report,
                repo=m["repo"],
                commit=m["merge_sha"],
                branch=info.get("default_branch") or job.spec.base_ref,
                pr=m["pr"],
                report_url=url,
                recorded_at=m["received_at"],
            )
            self.fetch_graph(m["repo"], run.branch, job.spec)  # before the run shows: it is shown in order
            added = self.history.add(run)
            self.store.merge_recorded(m["repo"], m["merge_sha"], "recorded", "" if added else "already recorded")
            n += added
        return n

    def mirror(self, repo: str) -> Path:
        owner, name = repo.split("/", 1)
        return Path(self.settings.state_dir) / MIRRORS / owner / f"{name}.git"

    def fetch_graph(self, repo: str, branch: str, spec) -> bool:
        """Bring REPO's commit graph of BRANCH up to date (commits only); False (logged) when it cannot be:
        the dashboard then shows the runs in the order recorded, and says so."""

        d = self.mirror(repo)
        url = workspace.clone_url(self.settings.github.clone_url, repo)
        try:
            token = None
            if spec.private and self.github is not None:
                token = self.github.read_token(repo, spec.installation_id)
            if not (d / "HEAD").is_file():
                d.parent.mkdir(parents=True, exist_ok=True)
                tmp = d.with_name(d.name + ".new")
                shutil.rmtree(tmp, ignore_errors=True)
                workspace._git(
                    d.parent, "clone", "-q", "--bare", "--filter=tree:0", "--single-branch", "--branch", branch,
                    "--no-tags", url, str(tmp), token=token,
                )  # fmt: skip
                os.replace(tmp, d)
            else:
                workspace._git(d, "remote", "set-url", "origin", url)  # the configured URL, never credentials
                workspace._git(
                    d, "fetch", "-q", "--no-tags", "origin", f"+refs/heads/{branch}:refs/heads/{branch}", token=token
                )  # the filter is the clone's (remote.origin.partialclonefilter)
            return True
        except Exception as e:  # a fetch that fails leaves the order to the next merge's fetch
            log.warning("history: fetching the commit graph of %s %s failed: %s", repo, branch, e)
            return False

    def ancestry(self, repo: str, branch: str) -> Ancestry:
        """The commit graph of REPO's BRANCH as last fetched."""
        d = self.mirror(repo)
        if not (d / "HEAD").is_file():
            return Ancestry(branch, None, note=f"the daemon has not fetched the commit graph of {repo} yet")
        return Ancestry.from_git(d, f"refs/heads/{branch}")
