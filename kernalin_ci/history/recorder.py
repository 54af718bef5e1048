"""The daemon's side of history: a pull request merged into the default branch (a `pull_request.closed`
delivery with `merged: true`, recorded in the job store with the delivery) becomes a Run of its merge
commit, from the newest gate result of the PR's head commit. A thread does it after the delivery is
answered; a history database that is down is tried again later, nothing is lost (the merge stays
pending in the job store)."""

from __future__ import annotations

import logging

from kernalin_ci.daemon.loop import BackgroundLoop
from kernalin_ci.history.model import run_from_report

log = logging.getLogger("kernalin_ci.daemon")
RETRY_S = 30.0


class Recorder(BackgroundLoop):
    thread_name = "kernalin-history"

    def __init__(self, store, history, settings):
        super().__init__()
        self.store, self.history, self.settings = store, history, settings

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
            added = self.history.add(run)
            self.store.merge_recorded(m["repo"], m["merge_sha"], "recorded", "" if added else "already recorded")
            n += added
        return n
