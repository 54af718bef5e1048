"""The durable job queue: one SQLite file in WAL mode (jobs.sqlite3 in the state directory).

Every state change is one transaction, committed (fsync'd: synchronous=FULL) before the
daemon acts on it or answers GitHub, so a `kill -9` at any point loses nothing:

    accept()    delivery id recorded (de-duplication) + jobs queued + superseded jobs cancelled
    claim()     queued -> running (embedded scheduler); the RQ dispatcher uses dispatch()/started()
    complete()  running -> done | failed | cancelled, or queued again (infrastructure retry, shutdown)
    recover()   on start: jobs left running by a dead daemon are queued again
    began()/posted()/post_failed()   what has been shown on GitHub (the poster's bookkeeping)

One connection, used under a lock: every statement is short, and WAL lets readers of other
processes (a second `serve` is refused by a lock file, see app.py) see committed data.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kernalin_ci.daemon.model import CANCELLED, DONE, FAILED, QUEUED, RUNNING, STATES, JobSpec, Outcome
from kernalin_ci.daemon.settings import Backoff
from kernalin_ci.daemon.webhook import Intents

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    id TEXT PRIMARY KEY, event TEXT NOT NULL, action TEXT, received_at REAL NOT NULL, result TEXT);
CREATE INDEX IF NOT EXISTS deliveries_time ON deliveries(received_at);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    repo TEXT NOT NULL, pr INTEGER NOT NULL, head_sha TEXT NOT NULL, base_ref TEXT NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL, not_before REAL NOT NULL DEFAULT 0,
    started_at REAL, finished_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,        -- infrastructure failures so far
    recoveries INTEGER NOT NULL DEFAULT 0,      -- times a daemon died while running it
    cancel_requested INTEGER NOT NULL DEFAULT 0, cancel_reason TEXT,
    slot TEXT, worker TEXT, pid INTEGER,
    gate_started INTEGER NOT NULL DEFAULT 0,    -- the job's command started (policy passed)
    dispatched INTEGER NOT NULL DEFAULT 0, rq_id TEXT,
    outcome TEXT, conclusion TEXT, error TEXT,
    began INTEGER NOT NULL DEFAULT 0, check_run_id INTEGER,
    post_state TEXT NOT NULL DEFAULT 'none',    -- none | pending | posted | failed
    post_attempts INTEGER NOT NULL DEFAULT 0, post_next_at REAL NOT NULL DEFAULT 0, post_error TEXT,
    posted_at REAL);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, not_before);
CREATE INDEX IF NOT EXISTS jobs_pr ON jobs(repo, pr, state);
CREATE INDEX IF NOT EXISTS jobs_post ON jobs(post_state, post_next_at);
CREATE INDEX IF NOT EXISTS jobs_badge ON jobs(repo, base_ref, state, finished_at);
CREATE TABLE IF NOT EXISTS installations (
    id INTEGER PRIMARY KEY, account TEXT, state TEXT NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS merges (             -- pull requests merged into the default branch: history
    repo TEXT NOT NULL, pr INTEGER NOT NULL, head_sha TEXT NOT NULL, merge_sha TEXT NOT NULL,
    received_at REAL NOT NULL, state TEXT NOT NULL DEFAULT 'pending', note TEXT,
    PRIMARY KEY (repo, merge_sha));
CREATE TABLE IF NOT EXISTS repos (
    name TEXT PRIMARY KEY, default_branch TEXT NOT NULL, private INTEGER NOT NULL, installation_id INTEGER);
"""


@dataclass
class Job:
    id: str
    spec: JobSpec
    state: str
    created_at: float
    not_before: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    recoveries: int
    cancel_requested: bool
    cancel_reason: str | None
    slot: str | None
    worker: str | None
    pid: int | None
    gate_started: bool
    dispatched: bool
    rq_id: str | None
    outcome: Outcome | None
    conclusion: str | None
    error: str | None
    began: bool
    check_run_id: int | None
    post_state: str
    post_attempts: int
    post_error: str | None
    posted_at: float | None

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> Job:
        return cls(
            r["id"],
            JobSpec.from_json(json.loads(r["spec"])),
            r["state"],
            r["created_at"],
            r["not_before"],
            r["started_at"],
            r["finished_at"],
            r["attempts"],
            r["recoveries"],
            bool(r["cancel_requested"]),
            r["cancel_reason"],
            r["slot"],
            r["worker"],
            r["pid"],
            bool(r["gate_started"]),
            bool(r["dispatched"]),
            r["rq_id"],
            Outcome.from_json(json.loads(r["outcome"])) if r["outcome"] else None,
            r["conclusion"],
            r["error"],
            bool(r["began"]),
            r["check_run_id"],
            r["post_state"],
            r["post_attempts"],
            r["post_error"],
            r["posted_at"],
        )

    def public(self) -> dict:
        """What GET /jobs/ID shows (no report body, no logs)."""
        s = self.spec
        return {
            "id": self.id,
            "repo": s.repo,
            "pr": s.pr,
            "head_sha": s.head_sha,
            "base_sha": s.base_sha,
            "trigger": s.trigger,
            "state": self.state,
            "conclusion": self.conclusion,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "queue_wait_s": None if self.started_at is None else round(self.started_at - self.created_at, 3),
            "duration_s": None
            if self.started_at is None or self.finished_at is None
            else round(self.finished_at - self.started_at, 3),
            "attempts": self.attempts,
            "slot": self.slot,
            "worker": self.worker,
            "outcome": self.outcome.kind if self.outcome else None,
            "error": self.error,
            "cancel_reason": self.cancel_reason,
            "post_state": self.post_state,
            "posted_at": self.posted_at,
        }


@dataclass
class _Pending:
    args: tuple
    done: bool = False
    result: Accepted | None = None
    error: BaseException | None = None


@dataclass
class Accepted:
    duplicate: bool
    jobs: list[str]
    cancelled: list[str]
    note: str = ""


# outcome kind -> (state, check run conclusion, whether anything is posted)
_FINAL = {
    "report": (DONE, None, True),
    "waiting": (DONE, "neutral", True),
    "skipped": (DONE, None, False),
    "error": (FAILED, "failure", True),
    "timeout": (FAILED, "timed_out", True),
    "infra": (FAILED, "failure", True),
    "cancelled": (CANCELLED, "cancelled", True),
}


class Store:
    def __init__(self, path: str | Path, *, synchronous: str = "FULL"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._commit_lock = threading.Lock()  # group commit of deliveries (accept)
        self._pending_lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("PRAGMA busy_timeout=30000")
        with self._lock:
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- plumbing ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _tx(self):
        """One transaction (BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an exception), under the lock."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _one(self, sql: str, args=()) -> sqlite3.Row | None:
        with self._lock:
            return self._db.execute(sql, args).fetchone()

    def _all(self, sql: str, args=()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # -- deliveries -------------------------------------------------------------------------------
    def accept(
        self, delivery_id: str, event: str, action: str | None, intents: Intents, now: float | None = None
    ) -> Accepted:
        """Record delivery DELIVERY_ID and do what INTENTS ask, atomically; a replayed id does nothing.

        Group commit: deliveries arriving while another commit is on disk wait for it, then go to
        disk together in one transaction (one fsync), so a burst is not serialised on fsyncs.
        """
        item = _Pending((delivery_id, event, action, intents, time.time() if now is None else now))
        with self._pending_lock:
            self._pending.append(item)
        with self._commit_lock:
            if not item.done:
                with self._pending_lock:
                    batch, self._pending = self._pending, []
                try:
                    with self._tx() as db:
                        for p in batch:  # a savepoint each: one bad delivery does not undo the others
                            db.execute("SAVEPOINT delivery")
                            try:
                                p.result = self._accept_one(db, *p.args)
                            except Exception as e:
                                db.execute("ROLLBACK TO delivery")
                                p.error = e
                            db.execute("RELEASE delivery")
                except BaseException as e:  # the commit itself failed: nothing of the batch is recorded
                    for p in batch:
                        p.error = e
                for p in batch:
                    p.done = True
        if item.error is not None:
            raise item.error
        return item.result

    def _accept_one(
        self, db, delivery_id: str, event: str, action: str | None, intents: Intents, now: float
    ) -> Accepted:
        if db.execute("SELECT 1 FROM deliveries WHERE id=?", (delivery_id,)).fetchone():
            return Accepted(True, [], [], "duplicate delivery")
        db.execute(
            "INSERT INTO deliveries (id, event, action, received_at) VALUES (?, ?, ?, ?)",
            (delivery_id, event, action, now),
        )
        jobs, cancelled = [], []
        for name, branch, private, inst in intents.repos:
            db.execute(
                "INSERT INTO repos (name, default_branch, private, installation_id) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET default_branch=excluded.default_branch, "
                "private=excluded.private, installation_id=COALESCE(excluded.installation_id, "
                "repos.installation_id)",
                (name, branch, int(private), inst),
            )
        if intents.installation:
            inst_id, account, state = intents.installation
            db.execute(
                "INSERT INTO installations (id, account, state, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET account=excluded.account, state=excluded.state, "
                "updated_at=excluded.updated_at",
                (inst_id, account, state, now),
            )
            if state != "active":
                for r in db.execute("SELECT * FROM jobs WHERE state IN ('queued', 'running')").fetchall():
                    if JobSpec.from_json(json.loads(r["spec"])).installation_id == inst_id:
                        cancelled += self._cancel(db, r, f"the GitHub App installation was {state}", now)
        for repo, pr, reason in intents.cancel_prs:
            for r in db.execute(
                "SELECT * FROM jobs WHERE repo=? AND pr=? AND state IN ('queued', 'running')", (repo, pr)
            ).fetchall():
                cancelled += self._cancel(db, r, reason, now)
        for repo, pr, head_sha, merge_sha in intents.merged:
            db.execute(
                "INSERT INTO merges (repo, pr, head_sha, merge_sha, received_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (repo, pr, head_sha, merge_sha, now),
            )
        specs = list(intents.jobs)
        note = intents.note
        if intents.rerun_job:
            r = db.execute("SELECT spec FROM jobs WHERE id=?", (intents.rerun_job,)).fetchone()
            old = JobSpec.from_json(json.loads(r["spec"])) if r else None
            if old is None or old.repo != intents.rerun_repo:
                note = "the re-requested check run is not one of this daemon's jobs"
            else:
                d = old.to_json()
                d.pop("id")
                d["trigger"] = f"check_run.rerequested ({old.trigger})"
                specs.append(JobSpec.from_json(d))
        for spec in specs:
            refused = _no_installation(db, spec)
            if refused:  # nothing runs for a repository the App is not (or no longer) installed on
                note = refused
                continue
            cancelled += self._supersede(db, spec, now)
            db.execute(
                "INSERT INTO jobs (id, repo, pr, head_sha, base_ref, spec, state, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, 'queued', ?)",
                (spec.id, spec.repo, spec.pr, spec.head_sha, spec.base_ref, json.dumps(spec.to_json()), now),
            )
            jobs.append(spec.id)
        result = "queued " + ",".join(jobs) if jobs else (note or "recorded")
        db.execute("UPDATE deliveries SET result=? WHERE id=?", (result[:500], delivery_id))
        return Accepted(False, jobs, cancelled, note)

    def _supersede(self, db, spec: JobSpec, now: float) -> list[str]:
        """A new job for a pull request cancels its older jobs, except one already running the same commit."""
        out = []
        for r in db.execute(
            "SELECT * FROM jobs WHERE repo=? AND pr=? AND state IN ('queued', 'running')", (spec.repo, spec.pr)
        ).fetchall():
            if r["head_sha"] == spec.head_sha:
                if r["state"] == RUNNING or r["dispatched"]:
                    continue
                reason = "superseded by a newer request for the same commit"
            else:
                reason = f"superseded by a newer push ({spec.head_sha[:7]})"
            out += self._cancel(db, r, reason, now)
        return out

    @staticmethod
    def _cancel(db, r: sqlite3.Row, reason: str, now: float) -> list[str]:
        if r["state"] == QUEUED and not r["dispatched"]:  # nothing runs it: cancelled now
            db.execute(
                "UPDATE jobs SET state='cancelled', finished_at=?, cancel_reason=?, conclusion='cancelled', "
                "post_state=CASE WHEN began THEN 'pending' ELSE 'none' END WHERE id=?",
                (now, reason, r["id"]),
            )
        else:  # its runner stops it and then completes it as cancelled
            db.execute("UPDATE jobs SET cancel_requested=1, cancel_reason=? WHERE id=?", (reason, r["id"]))
        return [r["id"]]

    def prune(self, older_than_s: float, now: float | None = None) -> list[str]:
        """Forget deliveries and finished jobs older than OLDER_THAN_S; the ids of the jobs removed."""
        cut = (time.time() if now is None else now) - older_than_s
        with self._tx() as db:
            db.execute("DELETE FROM deliveries WHERE received_at < ?", (cut,))
            ids = [
                r[0]
                for r in db.execute(
                    "SELECT id FROM jobs WHERE state IN ('done', 'failed', 'cancelled') AND finished_at < ? "
                    "AND post_state != 'pending'",
                    (cut,),
                )
            ]
            # keep each branch's newest result: the badges read it
            keep = {
                r[0]
                for r in db.execute(
                    "SELECT id FROM jobs j WHERE state='done' AND conclusion IN ('success', 'failure') "
                    "AND finished_at = (SELECT MAX(finished_at) FROM jobs k "
                    "WHERE k.repo=j.repo AND k.base_ref=j.base_ref "
                    "AND k.state='done' AND k.conclusion IN ('success', 'failure'))"
                )
            }
            ids = [i for i in ids if i not in keep]
            db.executemany("DELETE FROM jobs WHERE id=?", [(i,) for i in ids])
        return ids

    # -- reading ----------------------------------------------------------------------------------
    def job(self, job_id: str) -> Job | None:
        r = self._one("SELECT * FROM jobs WHERE id=?", (job_id,))
        return Job.from_row(r) if r else None

    def jobs(self, state: str | None = None) -> list[Job]:
        rows = self._all(
            "SELECT * FROM jobs" + (" WHERE state=?" if state else "") + " ORDER BY created_at, rowid",
            (state,) if state else (),
        )
        return [Job.from_row(r) for r in rows]

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in STATES}
        for r in self._all("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state"):
            out[r["state"]] = r["n"]
        return out

    def queue_depth(self) -> int:
        return self._one("SELECT COUNT(*) FROM jobs WHERE state='queued'")[0]

    def stop_reason(self, job_id: str) -> str | None:
        r = self._one("SELECT cancel_requested, cancel_reason, state FROM jobs WHERE id=?", (job_id,))
        if r is None:
            return "the job no longer exists"
        return (r["cancel_reason"] or "cancelled") if r["cancel_requested"] or r["state"] == CANCELLED else None

    def repo(self, name: str) -> dict | None:
        r = self._one("SELECT * FROM repos WHERE name=?", (name,))
        return dict(r) if r else None

    def latest_result(self, repo: str, branch: str) -> Job | None:
        """The newest finished gate result of the pull requests into BRANCH of REPO."""
        r = self._one(
            "SELECT * FROM jobs WHERE repo=? AND base_ref=? AND state='done' "
            "AND conclusion IN ('success', 'failure') ORDER BY finished_at DESC LIMIT 1",
            (repo, branch),
        )
        return Job.from_row(r) if r else None

    def pending_merges(self) -> list[dict]:
        return [dict(r) for r in self._all("SELECT * FROM merges WHERE state='pending' ORDER BY received_at")]

    def merge_recorded(self, repo: str, merge_sha: str, state: str, note: str = "") -> None:
        with self._tx() as db:
            db.execute("UPDATE merges SET state=?, note=? WHERE repo=? AND merge_sha=?", (state, note, repo, merge_sha))

    def result_for(self, repo: str, pr: int, head_sha: str) -> Job | None:
        """The newest gate result (a report) of pull request PR at commit HEAD_SHA."""
        r = self._one(
            "SELECT * FROM jobs WHERE repo=? AND pr=? AND head_sha=? AND state='done' "
            "AND conclusion IN ('success', 'failure') ORDER BY finished_at DESC LIMIT 1",
            (repo, pr, head_sha),
        )
        return Job.from_row(r) if r else None

    def deliveries(self) -> int:
        return self._one("SELECT COUNT(*) FROM deliveries")[0]

    # -- running (embedded scheduler) -------------------------------------------------------------
    def claim(self, slot: str, worker: str, now: float | None = None) -> Job | None:
        """The oldest queued job that may start now, moved to running on SLOT."""
        now = time.time() if now is None else now
        with self._tx() as db:
            r = db.execute(
                "SELECT id FROM jobs WHERE state='queued' AND dispatched=0 AND not_before <= ? "
                "ORDER BY created_at, rowid LIMIT 1",
                (now,),
            ).fetchone()
            if r is None:
                return None
            db.execute(
                "UPDATE jobs SET state='running', started_at=?, slot=?, worker=?, pid=NULL WHERE id=?",
                (now, slot, worker, r["id"]),
            )
            return Job.from_row(db.execute("SELECT * FROM jobs WHERE id=?", (r["id"],)).fetchone())

    def gate_started(self, job_id: str, pid: int | None = None) -> None:
        """The job's command is running (PID, for the local runner): the poster may show it in progress."""
        with self._tx() as db:
            db.execute("UPDATE jobs SET gate_started=1, pid=COALESCE(?, pid) WHERE id=?", (pid, job_id))

    def complete(
        self, job_id: str, outcome: Outcome, retries: Backoff, *, now: float | None = None, jitter: float = 1.0
    ) -> str:
        """Record how a run ended and move the job on; returns its new state (docs/daemon.md)."""
        now = time.time() if now is None else now
        with self._tx() as db:
            r = db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
            if r is None or r["state"] in (DONE, FAILED, CANCELLED):
                return r["state"] if r else "missing"
            out = json.dumps(outcome.to_json())
            if outcome.kind == "shutdown" and not r["cancel_requested"]:
                db.execute(
                    "UPDATE jobs SET state='queued', slot=NULL, pid=NULL, dispatched=0, rq_id=NULL WHERE id=?",
                    (job_id,),
                )
                return QUEUED
            kind = "cancelled" if r["cancel_requested"] or outcome.kind in ("cancelled", "shutdown") else outcome.kind
            if kind == "infra":
                attempts = r["attempts"] + 1
                if attempts < retries.attempts:
                    db.execute(
                        "UPDATE jobs SET state='queued', attempts=?, not_before=?, error=?, slot=NULL, "
                        "pid=NULL, dispatched=0, rq_id=NULL WHERE id=?",
                        (attempts, now + retries.delay(attempts, jitter), outcome.message[:2000], job_id),
                    )
                    return QUEUED
                outcome.message = f"infrastructure error after {attempts} attempts: {outcome.message}"
                out = json.dumps(outcome.to_json())
                db.execute("UPDATE jobs SET attempts=? WHERE id=?", (attempts, job_id))
            state, conclusion, post = _FINAL[kind]
            if kind == "report":
                conclusion = (outcome.report or {}).get("conclusion") or "neutral"
            if kind == "cancelled":
                post = bool(r["began"])
            error = outcome.message[:2000] if kind in ("error", "timeout", "infra") else r["error"]
            db.execute(
                "UPDATE jobs SET state=?, finished_at=?, outcome=?, conclusion=?, error=?, pid=NULL, "
                "post_state=?, post_next_at=0 WHERE id=?",
                (state, now, out, conclusion, error, "pending" if post else "none", job_id),
            )
            return state

    def recover(self, now: float | None = None, *, max_recoveries: int = 3, keep_dispatched: bool = False) -> list[Job]:
        """On start: jobs a dead daemon left running go back to the queue (or fail after MAX_RECOVERIES).
        Returns them as they were, so the caller can remove what they left (processes, containers)."""
        now = time.time() if now is None else now
        found = []
        with self._tx() as db:
            for r in db.execute(
                "SELECT * FROM jobs WHERE state='running' OR (state='queued' AND dispatched=1)"
            ).fetchall():
                if keep_dispatched and r["dispatched"]:
                    continue
                found.append(Job.from_row(r))
                n = r["recoveries"] + (r["state"] == RUNNING)
                if r["cancel_requested"]:
                    db.execute(
                        "UPDATE jobs SET state='cancelled', finished_at=?, conclusion='cancelled', pid=NULL, "
                        "post_state=CASE WHEN began THEN 'pending' ELSE 'none' END WHERE id=?",
                        (now, r["id"]),
                    )
                elif n > max_recoveries:
                    msg = f"the daemon stopped {n} times while running this job"
                    db.execute(
                        "UPDATE jobs SET state='failed', finished_at=?, conclusion='failure', error=?, "
                        "outcome=?, pid=NULL, post_state='pending', recoveries=? WHERE id=?",
                        (now, msg, json.dumps(Outcome("infra", msg).to_json()), n, r["id"]),
                    )
                else:
                    db.execute(
                        "UPDATE jobs SET state='queued', recoveries=?, slot=NULL, pid=NULL, dispatched=0, "
                        "rq_id=NULL WHERE id=?",
                        (n, r["id"]),
                    )
        return found

    # -- RQ dispatching ---------------------------------------------------------------------------
    def to_dispatch(self, now: float | None = None, limit: int = 50) -> list[Job]:
        now = time.time() if now is None else now
        rows = self._all(
            "SELECT * FROM jobs WHERE state='queued' AND dispatched=0 AND not_before <= ? "
            "ORDER BY created_at, rowid LIMIT ?",
            (now, limit),
        )
        return [Job.from_row(r) for r in rows]

    def dispatched(self) -> list[Job]:
        rows = self._all("SELECT * FROM jobs WHERE dispatched=1 AND state IN ('queued', 'running')")
        return [Job.from_row(r) for r in rows]

    def mark_dispatched(self, job_id: str, rq_id: str) -> bool:
        with self._tx() as db:
            return (
                db.execute(
                    "UPDATE jobs SET dispatched=1, rq_id=? WHERE id=? AND state='queued' AND dispatched=0",
                    (rq_id, job_id),
                ).rowcount
                == 1
            )

    def undispatch(self, job_id: str, rq_id: str) -> None:
        """The enqueue of RQ_ID failed: the job waits for the next dispatch."""
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET dispatched=0, rq_id=NULL WHERE id=? AND rq_id=? AND state='queued'", (job_id, rq_id)
            )

    def started(self, job_id: str, worker: str, started_at: float | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET state='running', started_at=?, worker=?, slot=? WHERE id=? AND state='queued'",
                (started_at or time.time(), worker, worker, job_id),
            )

    # -- posting ----------------------------------------------------------------------------------
    def to_begin(self, limit: int = 20) -> list[Job]:
        rows = self._all(
            "SELECT * FROM jobs WHERE state='running' AND gate_started=1 AND began=0 ORDER BY started_at LIMIT ?",
            (limit,),
        )
        return [Job.from_row(r) for r in rows]

    def mark_began(self, job_id: str, check_run_id: int | None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET began=1, check_run_id=COALESCE(?, check_run_id) WHERE id=?", (check_run_id, job_id)
            )

    def to_post(self, now: float | None = None, limit: int = 20) -> list[Job]:
        now = time.time() if now is None else now
        rows = self._all(
            "SELECT * FROM jobs WHERE post_state='pending' AND post_next_at <= ? ORDER BY finished_at LIMIT ?",
            (now, limit),
        )
        return [Job.from_row(r) for r in rows]

    def next_post_at(self) -> float | None:
        r = self._one("SELECT MIN(post_next_at) FROM jobs WHERE post_state='pending'")
        return r[0] if r else None

    def posted(self, job_id: str, check_run_id: int | None, now: float | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET post_state='posted', posted_at=?, post_error=NULL, "
                "check_run_id=COALESCE(?, check_run_id) WHERE id=?",
                (time.time() if now is None else now, check_run_id, job_id),
            )

    def post_failed(self, job_id: str, error: str, *, retry_at: float | None) -> None:
        """A post that failed: tried again at RETRY_AT, or given up (None)."""
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET post_attempts=post_attempts+1, post_error=?, post_state=?, post_next_at=? WHERE id=?",
                (error[:2000], "pending" if retry_at is not None else "failed", retry_at or 0, job_id),
            )


def _no_installation(db, spec: JobSpec) -> str | None:
    """Why SPEC may not run for want of an active App installation; None when it may."""
    if spec.installation_id is None:
        return "the delivery names no App installation: nothing is run"
    r = db.execute("SELECT state FROM installations WHERE id=?", (spec.installation_id,)).fetchone()
    if r is not None and r["state"] != "active":
        return f"the App installation {spec.installation_id} is {r['state']}: nothing is run"
    return None
