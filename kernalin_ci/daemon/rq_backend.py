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
(RQ's JSONSerializer), never pickles.

Redis is not trusted with anything: serve and its workers share a key (queue.result_key_file,
never given to a job) with which serve signs each job it enqueues and seals the read-only fetch
token of a private repository (AES-GCM: Redis never holds a token in plain text), and with
which a worker signs the Outcome it returns. A worker runs only `run_job` (OwnJob refuses any
other function name found in Redis, and every RQ callback) and only jobs serve signed; serve
accepts only results signed for the very RQ job it enqueued, and checks report.json's schema.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import socket
import time
import uuid

from kernalin_ci.daemon.execute import BadReport, check_report, execute
from kernalin_ci.daemon.loop import BackgroundLoop
from kernalin_ci.daemon.model import OUTCOME_KINDS, JobSpec, Outcome
from kernalin_ci.daemon.runners import get_runner
from kernalin_ci.daemon.store import Job, Store
from kernalin_ci.errors import UsageError
from kernalin_ci.launch import make_undumpable

log = logging.getLogger("kernalin_ci.daemon")
POLL_S = 0.5
CANCEL_TTL_S = 86400
RESULT_TTL_S = 86400


RUN_JOB = "kernalin_ci.daemon.rq_backend.run_job"


def cancel_key(job_id: str) -> str:
    return f"kernalin-ci:cancel:{job_id}"


# -- what travels through Redis, authenticated ---------------------------------------------------------
def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def mac(key: bytes, kind: str, rq_id: str, value) -> str:
    """HMAC-SHA256 of VALUE for the RQ job RQ_ID; KIND ("job" or "result") keeps the two apart."""
    return hmac.new(
        key, b"kernalin-ci\0" + kind.encode() + b"\0" + rq_id.encode() + b"\0" + _canonical(value), hashlib.sha256
    ).hexdigest()


def mac_ok(key: bytes, kind: str, rq_id: str, value, tag) -> bool:
    return isinstance(tag, str) and hmac.compare_digest(mac(key, kind, rq_id, value), tag)


def _aead(key: bytes):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # with PyJWT[crypto], in the daemon extra

    return AESGCM(hmac.new(key, b"kernalin-ci fetch token", hashlib.sha256).digest())


def seal(key: bytes, rq_id: str, token: str) -> str:
    nonce = os.urandom(12)
    return base64.b64encode(nonce + _aead(key).encrypt(nonce, token.encode(), rq_id.encode())).decode()


def unseal(key: bytes, rq_id: str, sealed: str) -> str:
    raw = base64.b64decode(sealed)
    return _aead(key).decrypt(raw[:12], raw[12:], rq_id.encode()).decode()


def require_key(settings) -> bytes:
    key = settings.secrets.result_key
    if len(key) < 16:
        raise UsageError(
            "queue.backend redis needs a shared key of at least 16 bytes: set KERNALIN_RESULT_KEY_FILE "
            "(or queue.result_key_file) on serve and on every worker"
        )
    return key


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
        self.key = require_key(settings)
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
            self.wake.wait(min(POLL_S * 2**failures, 30.0))
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
            return  # which _track() turns into a retry
        sealed = seal(self.key, rq_id, token) if token else None
        spec = job.spec.to_json()
        try:
            self.queue.enqueue_call(
                RUN_JOB,
                args=(spec, sealed, mac(self.key, "job", rq_id, [spec, sealed])),
                job_id=rq_id,
                timeout=int(self.settings.runner.timeout_s + 900),
                result_ttl=RESULT_TTL_S,
                failure_ttl=RESULT_TTL_S,
                description=f"{job.spec.repo}#{job.spec.pr} {job.spec.head_sha[:12]}",
            )
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
            return self._complete(job, self._result(rq_job))
        if status in ("failed", "stopped", "canceled"):
            result = rq_job.latest_result()
            text = (getattr(result, "exc_string", None) or status).strip().splitlines()
            return self._complete(job, Outcome("infra", f"the RQ job {status}: {text[-1][:300] if text else ''}"))

    def _result(self, rq_job) -> Outcome:
        """The Outcome a worker signed for this RQ job, or an error saying why it is refused."""

        result = rq_job.latest_result()
        value = getattr(result, "return_value", None)
        if not isinstance(value, dict) or not mac_ok(
            self.key, "result", rq_job.id, value.get("outcome"), value.get("mac")
        ):
            log.error("RQ job %s: its result is not signed with the shared key: refused", rq_job.id)
            return Outcome("error", "the worker's result failed its authentication check and was refused")
        try:
            outcome = Outcome.from_json(value["outcome"])
            if outcome.kind not in OUTCOME_KINDS or not isinstance(outcome.message, str):
                raise TypeError(f"kind {outcome.kind!r}")
            if outcome.kind == "report":
                check_report(outcome.report)
        except (TypeError, BadReport) as e:
            return Outcome("error", f"the worker's result is unreadable: {e}")
        return outcome

    def _complete(self, job: Job, outcome: Outcome) -> None:
        state = self.store.complete(job.id, outcome, self.settings.retries)
        if state != "queued":
            self.metrics.observe("job_duration_seconds", outcome.seconds, {"outcome": outcome.kind})
        self.metrics.inc("jobs_finished_total", {"outcome": outcome.kind})
        log.info("job %s: %s -> %s (%s)", job.id, outcome.kind, state, outcome.message[:200])
        self.on_finished()


# -- the worker side (kernalin-ci worker) ------------------------------------------------------------
_CTX: dict = {}  # set in the worker process before it forks its work horses


class ForeignJob(Exception):
    """A job in Redis that serve did not put there (another function, no or a wrong signature)."""


def run_job(spec_json: dict, sealed_token: str | None, tag: str) -> dict:
    """The RQ job: run one gate job on this worker's slot; the Outcome as JSON, signed."""
    from rq import get_current_job

    current = get_current_job()
    settings, slot, runner = _CTX["settings"], _CTX["slot"], _CTX["runner"]
    key = settings.secrets.result_key
    if not mac_ok(key, "job", current.id, [spec_json, sealed_token], tag):
        raise ForeignJob("the job is not signed with the shared key: refused")
    token = unseal(key, current.id, sealed_token) if sealed_token else None
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

    outcome = execute(spec, slot, settings, runner, stop_reason, fetch_token=token, on_start=on_start).to_json()
    return {"outcome": outcome, "mac": mac(key, "result", current.id, outcome)}


def _own_job_class():
    from rq.job import Job as RQJob

    class OwnJob(RQJob):
        """A job that can only ever call run_job: the function name and callbacks in Redis are not trusted."""

        @property
        def func(self):
            if self.func_name != RUN_JOB or self.instance is not None:
                raise ForeignJob(f"this queue runs only {RUN_JOB}, not {self.func_name!r}: refused")
            return run_job

        success_callback = failure_callback = stopped_callback = property(lambda self: None)

    return OwnJob


def work(settings, slot, *, burst: bool = False) -> None:
    """One RQ worker for SLOT, taking jobs until stopped (SIGTERM: after the current job)."""
    from rq import Worker

    require_key(settings)
    make_undumpable()  # a job of the same uid cannot read the key from /proc/PID/mem or environ
    Redis, Queue, JSONSerializer = _rq()
    _CTX.update(settings=settings, slot=slot, runner=get_runner(settings))
    redis = Redis.from_url(settings.queue.redis_url)
    job_class = _own_job_class()
    queue = Queue(settings.queue.name, connection=redis, serializer=JSONSerializer, job_class=job_class)
    name = f"{socket.gethostname()}.{slot.name}.{os.getpid()}"
    _bounded_unsubscribe(Worker)(
        [queue], connection=redis, name=name, serializer=JSONSerializer, job_class=job_class
    ).work(burst=burst, logging_level="WARNING", with_scheduler=False)


def _bounded_unsubscribe(worker_class):
    """WORKER_CLASS whose teardown does not wait up to a minute: redis-py 8.2's PubSubWorkerThread.stop() joins
    the thread, which may be inside a read RQ gave 60 s (the unsubscribe reply came before the stop), so a
    `--burst` worker hung for that long at its end about one time in two."""

    class Worker(worker_class):
        def unsubscribe(self):
            thread = getattr(self, "pubsub_thread", None)
            if not thread:
                return
            self.pubsub.unsubscribe()
            try:
                thread.stop(timeout=1)
            except TypeError:  # redis-py before 8.2: stop() only clears the flag
                thread.stop()
            thread.join(timeout=1)
            self.pubsub.close()

    return Worker
