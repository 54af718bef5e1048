"""The daemon: the store, the HTTP server, the scheduler (or the RQ dispatcher) and the poster,
started and stopped together.

    d = Daemon(settings).start()      # recovers what a dead daemon left, then serves
    d.url                             # http://HOST:PORT
    d.stop()                          # running jobs are killed and queued again

One daemon per state directory: a lock file (fcntl) refuses a second one, which would otherwise
re-queue the first one's running jobs as if it had crashed.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import signal
import threading
import time
from pathlib import Path

from kernalin_ci.daemon import gpus
from kernalin_ci.daemon.github_app import GitHubApp
from kernalin_ci.daemon.metrics import Metrics
from kernalin_ci.daemon.model import STATES
from kernalin_ci.daemon.poster import Poster
from kernalin_ci.daemon.recorder import Recorder
from kernalin_ci.daemon.rq_backend import Dispatcher
from kernalin_ci.daemon.runners import get_runner
from kernalin_ci.daemon.runners.local import kill_marked
from kernalin_ci.daemon.scheduler import Scheduler
from kernalin_ci.daemon.server import Server
from kernalin_ci.daemon.store import Store
from kernalin_ci.errors import UsageError
from kernalin_ci.history.store import open_store

log = logging.getLogger("kernalin_ci.daemon")
HOUSEKEEPING_S = 3600


class Daemon:
    def __init__(self, settings, *, github=None, runner=None, slots=None):
        self.settings = settings
        Path(settings.state_dir).mkdir(parents=True, exist_ok=True)
        self._lock_file = self._lock(Path(settings.state_dir) / "daemon.lock")
        self.store = Store(settings.db_path)
        self.metrics = Metrics()
        if github is None and settings.github.app_id is not None:
            github = GitHubApp(settings)
        self.github = github
        self.runner = runner or get_runner(settings)
        self.poster = Poster(self.store, settings, github, self.metrics)
        self.redis_mode = settings.queue.backend == "redis"
        self.slots = [] if self.redis_mode else (slots or gpus.slots(settings.gpus, settings.cpu_slots))
        self.scheduler = (
            None
            if self.redis_mode
            else Scheduler(
                self.store, settings, self.slots, self.runner, github, self.metrics, on_finished=self.poster.wake.set
            )
        )
        self.dispatcher = None
        self.history = self.recorder = None
        if settings.history:
            self.history = open_store(settings.history_location)
            self.recorder = Recorder(self.store, self.history, settings, github)
        self.server: Server | None = None
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()

    @staticmethod
    def _lock(path: Path):
        f = open(path, "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise UsageError(f"another kernalin-ci daemon is using {path.parent}") from None
        return f

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Daemon:
        for job in self.store.recover(keep_dispatched=self.redis_mode):
            killed = kill_marked(job.id) + self.runner.cleanup(job.id)
            log.warning(
                "job %s was %s when the daemon stopped: queued again%s",
                job.id,
                job.state,
                f" ({killed} leftover processes or containers removed)" if killed else "",
            )
        self.poster.start()
        if self.recorder:
            self.recorder.start()
        if self.redis_mode:
            self.dispatcher = Dispatcher(
                self.store, self.settings, self.github, self.metrics, on_finished=self.poster.wake.set
            ).start()
        else:
            self.scheduler.start()
        self.server = Server(self.settings.host_port, self)
        t = threading.Thread(target=self.server.serve_forever, name="kernalin-http", daemon=True)
        t.start()
        h = threading.Thread(target=self._housekeeping, name="kernalin-housekeeping", daemon=True)
        h.start()
        self._threads += [t, h]
        log.info(
            "kernalin-ci daemon on %s: %s queue, %s runner, slots: %s",
            self.url,
            self.settings.queue.backend,
            self.runner.name,
            ", ".join(self.slot_names()) or "(RQ workers)",
        )
        return self

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.server:
            self.server.shutdown()
            self.server.server_close()
        if self.scheduler:
            self.scheduler.stop()
        if self.dispatcher:
            self.dispatcher.stop()
        self.poster.stop()
        if self.recorder:
            self.recorder.stop()
            self.history.close()
        self.store.close()
        self._lock_file.close()

    def serve_forever(self) -> None:
        """Until SIGTERM or SIGINT."""
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        done.wait()
        log.info("stopping: running jobs go back to the queue")
        self.stop()

    # -- for the HTTP server ----------------------------------------------------------------------
    def delivered(self, accepted) -> None:
        if accepted.jobs and self.scheduler:
            self.scheduler.notify()
        if accepted.jobs and self.dispatcher:
            self.dispatcher.wake.set()
        if accepted.cancelled:
            self.poster.wake.set()
        if self.recorder:  # a merge may have come in
            self.recorder.wake.set()

    def visible(self, repo: str) -> bool:
        """Whether badges and job pages of REPO may be shown (private repositories: only when configured)."""
        info = self.store.repo(repo)
        return info is not None and (not info["private"] or self.settings.private_badges)

    def slot_names(self) -> list[str]:
        return [s.name for s in self.slots]

    def render_metrics(self) -> str:
        counts = self.store.counts()
        busy: dict[str, float] = {s.name: 0 for s in self.slots}
        for job in self.store.jobs("running"):
            if job.slot:
                busy[job.slot] = 1
        return self.metrics.render(
            {
                "queue_depth": [({}, counts["queued"])],
                "jobs": [({"state": s}, counts[s]) for s in STATES],
                "gpu_busy": [({"slot": k}, v) for k, v in sorted(busy.items())],
            }
        )

    def _housekeeping(self) -> None:
        while not self._stopped.wait(HOUSEKEEPING_S):
            try:
                for job_id in self.store.prune(self.settings.retention_days * 86400):
                    shutil.rmtree(self.settings.jobs_dir / job_id, ignore_errors=True)
            except Exception:
                log.exception("housekeeping failed")


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:
    """Poll PREDICATE until true or TIMEOUT seconds pass (tests and scripts)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
