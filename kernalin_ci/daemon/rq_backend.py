"""More than one GPU host: jobs go through a shared Redis with RQ (python-rq), not a protocol of our own.

    serve (one host)                                    kernalin-ci worker (each GPU host)
      store: queued ──Dispatcher──> RQ queue ─────────>  one RQ worker process per slot
      store: running <── polls RQ job status              run_job(): execute() on its slot
      store: done/failed <── the RQ result (Outcome) <──  returns Outcome.to_json()
      poster posts (the App key never leaves serve)

The SQLite store stays the record of every job: RQ only carries them. A job whose RQ job
vanished (Redis lost its data) or failed (a worker died: RQ reports it abandoned) is an
infrastructure failure, queued again with backoff. Cancelling a queued RQ job removes it; a
started one is asked to stop through a Redis key its worker polls. Jobs travel as JSON
(RQ's JSONSerializer), never pickles. Workers get a read-only, one-hour fetch token for a
private repository with the job, and nothing else.
"""
from __future__ import annotations

import logging
import os
import socket
import time
import uuid

from kernalin_ci.daemon.execute import execute
from kernalin_ci.daemon.loop import BackgroundLoop
from kernalin_ci.daemon.model import JobSpec, Outcome
from kernalin_ci.daemon.store import Job, Store

log = logging.getLogger("kernalin_ci.daemon")
POLL_S = 0.5
CANCEL_TTL_S = 86400
RESULT_TTL_S = 86400


def cancel_key(job_id: str) -> str:
    return f"kernalin-ci:cancel:{job_id}"


def _rq():
    from redis import Redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    return Redis, Queue, JSONSerializer


class Dispatcher(BackgroundLoop):
    thread_name = "kernalin-dispatcher"

    def __init__(self, store: Store, settings, app, metrics, on_finished=lambda: None):
        from rq.job import Job as RQJob

        Redis, Queue, JSONSerializer = _rq()
        self.store, self.settings, self.app, self.metrics, self.on_finished = store, settings, app, metrics, on_finished
        self.redis = Redis.from_url(settings.queue.redis_url, socket_timeout=10, socket_connect_timeout=5)
        self.serializer = JSONSerializer
        self.queue = Queue(settings.queue.name, connection=self.redis, serializer=JSONSerializer)
        self.RQJob = RQJob
        super().__init__()

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self.step()
                failures = 0
            except Exception as e:  # Redis down: the store keeps every job; try again
                failures += 1
                log.warning("dispatcher: %s: %s", type(e).__name__, e)
            self.wake.wait(min(POLL_S * 2 ** failures, 30.0))
            self.wake.clear()

    def step(self) -> None:
        for job in self.store.to_dispatch():
            self._dispatch(job)
        jobs = self.store.dispatched()
        if not jobs:
            return
        found = self.RQJob.fetch_many([j.rq_id for j in jobs], connection=self.redis, serializer=self.serializer)
        for job, rq_job in zip(jobs, found):
            self._track(job, rq_job)

    def _dispatch(self, job: Job) -> None:
        token = None
        if job.spec.private and self.app is not None:
            try:
                token = self.app.read_token(job.spec.repo, job.spec.installation_id)
            except Exception as e:
                self._complete(job, Outcome("infra", f"cannot get a token to fetch {job.spec.repo}: {e}"))
                return
        rq_id = f"{job.id}-{uuid.uuid4().hex[:8]}"
        if not self.store.mark_dispatched(job.id, rq_id):  # recorded first: a crash now leaves a lost RQ id,
            return                                          # which _track() turns into a retry
        try:
            self.queue.enqueue_call("kernalin_ci.daemon.rq_backend.run_job", args=(job.spec.to_json(), token),
                                    job_id=rq_id, timeout=int(self.settings.runner.timeout_s + 900),
                                    result_ttl=RESULT_TTL_S, failure_ttl=RESULT_TTL_S,
                                    description=f"{job.spec.repo}#{job.spec.pr} {job.spec.head_sha[:12]}")
        except Exception:
            self.store.undispatch(job.id, rq_id)
            raise
        log.info("job %s: queued in RQ as %s", job.id, rq_id)

    def _track(self, job: Job, rq_job) -> None:
        if rq_job is None:
            return self._complete(job, Outcome("infra", "the job vanished from Redis"))
        status = str(getattr(rq_job.get_status(refresh=False), "value", rq_job.get_status(refresh=False)))
        if job.cancel_requested:
            if status in ("queued", "deferred", "scheduled"):
                rq_job.cancel()
                return self._complete(job, Outcome("cancelled", job.cancel_reason or "cancelled"))
            if status == "started":
                self.redis.set(cancel_key(job.id), job.cancel_reason or "cancelled", ex=CANCEL_TTL_S)
        if status in ("started", "finished", "failed", "stopped") and job.state == "queued":
            started = rq_job.started_at.timestamp() if rq_job.started_at else time.time()
            self.store.started(job.id, rq_job.worker_name or "rq", started)
            self.metrics.observe("job_queue_wait_seconds", max(started - job.created_at, 0.0))
        if (rq_job.meta or {}).get("gate_started") and not job.gate_started:
            self.store.gate_started(job.id)
            self.on_finished()  # the poster shows it in progress
        if status == "finished":
            result = rq_job.latest_result()
            try:
                outcome = Outcome.from_json(result.return_value)
            except (AttributeError, TypeError) as e:
                outcome = Outcome("infra", f"the worker's result is unreadable: {e}")
            return self._complete(job, outcome)
        if status in ("failed", "stopped", "canceled"):
            result = rq_job.latest_result()
            text = (getattr(result, "exc_string", None) or status).strip().splitlines()
            return self._complete(job, Outcome("infra", f"the RQ job {status}: {text[-1][:300] if text else ''}"))

    def _complete(self, job: Job, outcome: Outcome) -> None:
        state = self.store.complete(job.id, outcome, self.settings.retries)
        if state != "queued":
            self.metrics.observe("job_duration_seconds", outcome.seconds, {"outcome": outcome.kind})
        self.metrics.inc("jobs_finished_total", {"outcome": outcome.kind})
        log.info("job %s: %s -> %s (%s)", job.id, outcome.kind, state, outcome.message[:200])
        self.on_finished()


# -- the worker side (kernalin-ci worker) ------------------------------------------------------------
_CTX: dict = {}  # set in the worker process before it forks its work horses


def run_job(spec_json: dict, token: str | None) -> dict:
    """The RQ job: run one gate job on this worker's slot; the Outcome as JSON."""
    from rq import get_current_job

    current = get_current_job()
    settings, slot, runner = _CTX["settings"], _CTX["slot"], _CTX["runner"]
    spec = JobSpec.from_json(spec_json)
    last = [0.0, None]

    def stop_reason():
        now = time.monotonic()
        if now - last[0] >= POLL_S:
            value = current.connection.get(cancel_key(spec.id))
            last[0], last[1] = now, value.decode() if value else None
        return last[1]

    def on_start(pid):
        current.meta["gate_started"] = True
        current.save_meta()

    outcome = execute(spec, slot, settings, runner, stop_reason, fetch_token=token, on_start=on_start)
    return outcome.to_json()


def work(settings, slot, *, burst: bool = False) -> None:
    """One RQ worker for SLOT, taking jobs until stopped (SIGTERM: after the current job)."""
    from rq import Worker

    from kernalin_ci.daemon.runners import get_runner

    Redis, Queue, JSONSerializer = _rq()
    _CTX.update(settings=settings, slot=slot, runner=get_runner(settings))
    redis = Redis.from_url(settings.queue.redis_url)
    queue = Queue(settings.queue.name, connection=redis, serializer=JSONSerializer)
    name = f"{socket.gethostname()}.{slot.name}.{os.getpid()}"
    Worker([queue], connection=redis, name=name, serializer=JSONSerializer).work(
        burst=burst, logging_level="WARNING", with_scheduler=False)
