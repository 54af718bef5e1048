"""The embedded scheduler: one thread per slot (GPU or CPU), each taking the oldest queued job
from the store and running it there, so a GPU never runs two jobs at once.

A job's `stop_reason()` reads the store (a newer push sets cancel_requested) at most every
half second, and says "shutdown" when the daemon stops; the runner then kills the job and the
store puts it back in the queue.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from kernalin_ci.daemon.execute import execute
from kernalin_ci.daemon.gpus import Slot
from kernalin_ci.daemon.model import Outcome
from kernalin_ci.daemon.store import Job, Store

log = logging.getLogger("kernalin_ci.daemon")
STOP_CHECK_S = 0.5


class Scheduler:
    def __init__(self, store: Store, settings, slots: list[Slot], runner, app, metrics, on_finished=lambda: None):
        self.store, self.settings, self.slots, self.runner = store, settings, slots, runner
        self.app, self.metrics, self.on_finished = app, metrics, on_finished
        self.wake = threading.Condition()
        self.busy: dict[str, str | None] = {s.name: None for s in slots}
        self._stopping = False
        self._threads: list[threading.Thread] = []

    def start(self) -> Scheduler:
        for slot in self.slots:
            t = threading.Thread(target=self._loop, args=(slot,), name=f"kernalin-slot-{slot.name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def notify(self) -> None:
        with self.wake:
            self.wake.notify_all()

    def stop(self, timeout: float = 60) -> None:
        """Stop taking jobs; running ones are killed and queued again."""
        self._stopping = True
        self.notify()
        for t in self._threads:
            t.join(timeout)

    def _loop(self, slot: Slot) -> None:
        while not self._stopping:
            try:
                job = self.store.claim(slot.name, slot.worker)
            except Exception:
                log.exception("slot %s: cannot read the queue", slot.name)
                job = None
            if job is None:
                with self.wake:
                    self.wake.wait(0.5)
                continue
            try:
                self.run_one(job, slot)
            except Exception:  # the store failed; the job stays running and is recovered on restart
                log.exception("slot %s: job %s could not be recorded", slot.name, job.id)
                time.sleep(1.0)

    def run_one(self, job: Job, slot: Slot) -> str:
        self.busy[slot.name] = job.id
        self.metrics.observe("job_queue_wait_seconds", max(time.time() - job.created_at, 0.0))
        try:
            outcome = self._execute(job, slot)
        except Exception as e:  # a bug here must not lose the job: it becomes an infrastructure failure
            log.exception("job %s: unexpected error", job.id)
            outcome = Outcome("infra", f"daemon error: {type(e).__name__}: {e}")
        finally:
            self.busy[slot.name] = None
        state = self.store.complete(job.id, outcome, self.settings.retries, jitter=random.uniform(0.5, 1.0))
        self.metrics.observe("job_duration_seconds", outcome.seconds, {"outcome": outcome.kind})
        self.metrics.inc("jobs_finished_total", {"outcome": outcome.kind})
        log.info("job %s: %s -> %s (%s, %.1f s)", job.id, outcome.kind, state, outcome.message[:200], outcome.seconds)
        self.on_finished()
        return state

    def _execute(self, job: Job, slot: Slot) -> Outcome:
        last = [0.0, None]

        def stop_reason():
            if self._stopping:
                return "shutdown"
            now = time.monotonic()
            if now - last[0] >= STOP_CHECK_S:
                last[0], last[1] = now, self.store.stop_reason(job.id)
            return last[1]

        token = None
        if job.spec.private and self.app is not None:
            try:
                token = self.app.read_token(job.spec.repo, job.spec.installation_id)
            except Exception as e:
                return Outcome("infra", f"cannot get a token to fetch {job.spec.repo}: {e}")
        return execute(
            job.spec,
            slot,
            self.settings,
            self.runner,
            stop_reason,
            fetch_token=token,
            on_start=lambda pid: self.store.gate_started(job.id, pid),
        )
