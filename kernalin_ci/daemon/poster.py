"""Everything the daemon shows on GitHub, from one thread, driven by the store.

    a job's command started    -> begin(): the check run, in progress (external_id = the job id)
    a job ended                -> publish(): the check run completed, annotations, the sticky comment
    a started job cancelled    -> its check run completed as cancelled

Posting is idempotent, which is what makes it exactly-once across crashes: the check run is
found again by its external_id (kernalin_ci.github: start_check reuses it, a completed run is
updated in place) and the sticky comment is edited, never made twice. A job is marked posted
only after publish() returned; a daemon killed in between posts it again on start, onto the
same check run and comment. GitHub 5xx and network failures wait and try again with backoff
(settings.posting); refusals (401, 403, 422) are recorded and not retried.
"""

from __future__ import annotations

import logging
import random
import time

from kernalin_ci.daemon.loop import BackgroundLoop
from kernalin_ci.daemon.model import CANCELLED
from kernalin_ci.daemon.store import Job, Store
from kernalin_ci.errors import UsageError
from kernalin_ci.gate.post import publication
from kernalin_ci.github.errors import GitHubError, GitHubUnavailable
from kernalin_ci.github.publish import Publication, begin, publish
from kernalin_ci.report.model import Report

log = logging.getLogger("kernalin_ci.daemon")


def details_url(settings, job_id: str) -> str | None:
    return f"{settings.public_url}/jobs/{job_id}" if settings.public_url else None


def _fence(text: str) -> str:
    return "```text\n" + text.replace("```", "``\u200b`").strip() + "\n```"


def publication_for(job: Job, settings) -> Publication:
    """What GitHub should show for a finished job."""

    s, o = job.spec, job.outcome
    name, url = settings.github.check_name, details_url(settings, job.id)
    common = dict(repo=s.repo, head_sha=s.head_sha, pr_number=s.pr, name=name, details_url=url, external_id=job.id)
    if job.state == CANCELLED:
        reason = job.cancel_reason or "cancelled"
        return Publication(
            conclusion="cancelled",
            title=f"Cancelled: {reason}",
            summary=f"This run of kernalin-ci on `{s.head_sha[:12]}` was stopped: {reason}.",
            **common,
        )
    if o is not None and o.kind == "report":
        return publication(
            Report.from_json(o.report), s.repo, s.head_sha, s.pr, details_url=url, name=name, external_id=job.id
        )
    if o is not None and o.kind == "waiting":
        return Publication(conclusion="neutral", title=o.message, summary=o.detail, **common)
    message = (o.message if o else job.error) or "the job failed"
    title = {"timeout": "Timed out", "infra": "kernalin-ci could not run the gate"}.get(
        o.kind if o else "", "kernalin-ci could not run the gate"
    )
    summary = f"**{message}**"
    if o is not None and o.log_tail.strip():
        summary += "\n\nThe end of the job's output:\n\n" + _fence(o.log_tail[-6000:])
    return Publication(
        conclusion=job.conclusion or "failure", title=f"{title}: {message}"[:240], summary=summary, **common
    )


def unshowable(job: Job, settings, why: str) -> Publication:
    """A failure check run for a job whose result cannot be shown (what publication_for() raised)."""
    s = job.spec
    return Publication(
        conclusion="failure",
        title=f"kernalin-ci could not show this job's result: {why}"[:240],
        summary=f"**The result of this job could not be shown: {why}.** Nothing of it is trusted.",
        repo=s.repo,
        head_sha=s.head_sha,
        pr_number=s.pr,
        name=settings.github.check_name,
        details_url=details_url(settings, job.id),
        external_id=job.id,
    )


FAILING_AFTER = 5  # /healthz is 503 after this many posting failures in a row


class Poster(BackgroundLoop):
    thread_name = "kernalin-poster"

    def __init__(self, store: Store, settings, app, metrics):
        self.store, self.settings, self.app, self.metrics = store, settings, app, metrics
        self.failures = 0  # posting failures in a row (GitHub down, refusals, errors); 0 after a success
        self.last_error = ""
        super().__init__()

    def health(self) -> str | None:
        """None while posting works; else why not (for /healthz)."""
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            return "the poster thread stopped"
        if self.failures >= FAILING_AFTER:
            return f"posting failed {self.failures} times in a row: {self.last_error[:200]}"
        return None

    def _failed(self, error: str) -> None:
        self.failures += 1
        self.last_error = error

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.step()
            except Exception as e:  # the store failed: try again after a pause, and say so in /healthz
                log.exception("poster: unexpected error")
                self._failed(f"{type(e).__name__}: {e}")
                busy = 0
            if not busy:
                nxt = self.store.next_post_at()
                wait = 1.0 if nxt is None else min(max(nxt - time.time(), 0.05), 1.0)
                self.wake.wait(wait)
                self.wake.clear()

    def step(self) -> int:
        """One pass: every job to show as started, then every result due. How many it handled."""
        n = 0
        for job in self.store.to_begin():
            if self._stop.is_set():
                return n
            self._begin(job)
            n += 1
        for job in self.store.to_post():
            if self._stop.is_set():
                return n
            self._post(job)
            n += 1
        return n

    def _client(self, job: Job):
        return self.app.client(job.spec.repo, job.spec.installation_id)

    def _begin(self, job: Job) -> None:
        s = job.spec
        try:
            started = begin(
                self._client(job),
                s.repo,
                s.head_sha,
                name=self.settings.github.check_name,
                external_id=job.id,
                details_url=details_url(self.settings, job.id),
            )
            for w in started.warnings:
                log.warning("job %s: %s", job.id, w)
            self.store.mark_began(job.id, started.check_run_id)
        except (GitHubError, UsageError) as e:  # no client (App not installed): publish() tries again later
            log.warning("job %s: cannot show the run as started: %s", job.id, e)
            self.store.mark_began(job.id, None)

    def _post(self, job: Job) -> None:
        try:
            pub = publication_for(job, self.settings)
        except Exception as e:  # one job's result cannot be shown: it is posted as a failure, once
            log.exception("job %s: its result cannot be shown", job.id)
            pub = unshowable(job, self.settings, f"{type(e).__name__}")
        try:
            res = publish(self._client(job), pub, check_run_id=job.check_run_id)
        except GitHubUnavailable as e:
            self._failed(str(e))
            attempt = job.post_attempts + 1
            if attempt >= self.settings.posting.attempts:
                self._give_up(job, f"GitHub unavailable, gave up after {attempt} attempts: {e}")
                return
            wait = self.settings.posting.delay(attempt, random.uniform(0.5, 1.0))
            log.warning("job %s: posting failed (%s); again in %.0f s", job.id, e, wait)
            self.metrics.inc("posts_total", {"result": "retry"})
            self.store.post_failed(job.id, str(e), retry_at=time.time() + wait)
            return
        except (GitHubError, UsageError) as e:
            self._give_up(job, str(e))
            return
        except Exception as e:  # a bug or a result GitHub's client cannot send: this job only, never again
            log.exception("job %s: posting failed", job.id)
            self._give_up(job, f"{type(e).__name__}: {e}")
            return
        self.failures = 0
        for w in res.warnings:
            log.warning("job %s: %s", job.id, w)
        self.metrics.inc("posts_total", {"result": "posted"})  # before the job shows as posted
        self.store.posted(job.id, res.check_run.id if res.check_run else None)
        log.info("job %s: posted %s to %s#%d", job.id, pub.conclusion, job.spec.repo, job.spec.pr)

    def _give_up(self, job: Job, error: str) -> None:
        self._failed(error)
        log.error("job %s: posting failed for good: %s", job.id, error)
        self.metrics.inc("posts_total", {"result": "failed"})
        self.store.post_failed(job.id, error, retry_at=None)
