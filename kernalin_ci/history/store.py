"""The history's storage interface and its two database backends.

    store = open_store("sqlite:///var/lib/kernalin-ci/history.sqlite3")   # or postgresql://...
    store.add(run)          # False when the commit is recorded already (a commit is recorded once)
    store.runs("o/r")       # oldest first
    store.repos()

SQLite is the default (in the daemon's state directory); PostgreSQL when several hosts share one
history. Both keep one row per run: its key columns and the whole record as JSON. The Action keeps
the same records on a git branch (gitbranch.py), behind the same interface.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Protocol

from kernalin_ci.errors import UsageError
from kernalin_ci.history.gitbranch import GitBranchHistory
from kernalin_ci.history.model import Run


class HistoryStore(Protocol):
    def add(self, run: Run) -> bool: ...

    def runs(self, repo: str) -> list[Run]: ...

    def repos(self) -> list[str]: ...

    def close(self) -> None: ...


_SQLITE = """
CREATE TABLE IF NOT EXISTS history_runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE, repo TEXT NOT NULL, commit_sha TEXT NOT NULL, recorded_at REAL NOT NULL,
    record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS history_runs_repo ON history_runs(repo, seq);
"""

_POSTGRES = """
CREATE TABLE IF NOT EXISTS history_runs (
    seq BIGSERIAL PRIMARY KEY,
    key TEXT NOT NULL UNIQUE, repo TEXT NOT NULL, commit_sha TEXT NOT NULL, recorded_at DOUBLE PRECISION NOT NULL,
    record JSONB NOT NULL);
CREATE INDEX IF NOT EXISTS history_runs_repo ON history_runs(repo, seq);
"""


BUSY_S = 30.0  # how long a connection waits for another's lock


def set_wal(db: sqlite3.Connection, timeout: float = BUSY_S) -> None:
    """Put the database in WAL mode, waiting for other connections doing the same.

    Switching a new database to WAL is a write that starts inside a read transaction; SQLite does not
    call the busy handler when a read transaction cannot become a write one (waiting could deadlock),
    so a connection whose switch collides with another's fails at once with "database is locked",
    whatever the busy timeout. Several writers opening a new history at the same moment hit this
    (tests/test_history.py's concurrent writers did, about once in 70 tries; more on a loaded machine).
    The switch is retried until it succeeds or TIMEOUT passes; once the file is in WAL mode (persistent)
    the pragma changes nothing and never collides.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class SQLiteHistory:
    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=BUSY_S)
        set_wal(self._db)
        with self._lock:
            self._db.executescript(_SQLITE)

    def add(self, run: Run) -> bool:
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO history_runs (key, repo, commit_sha, recorded_at, record) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(key) DO NOTHING",
                (run.key, run.repo, run.commit, run.recorded_at, json.dumps(run.to_json())),
            )
            return cur.rowcount == 1

    def runs(self, repo: str) -> list[Run]:
        with self._lock:
            rows = self._db.execute("SELECT record FROM history_runs WHERE repo=? ORDER BY seq", (repo,)).fetchall()
        return [Run.from_json(json.loads(r[0])) for r in rows]

    def repos(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT DISTINCT repo FROM history_runs ORDER BY repo")]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class PostgresHistory:
    """psycopg 3 (the `postgres` extra); one connection per call, so threads and hosts never share one."""

    def __init__(self, dsn: str):
        try:
            import psycopg
        except ImportError:
            raise UsageError("a postgresql:// history needs psycopg: pip install 'kernalin-ci[postgres]'") from None
        self._psycopg = psycopg
        self.dsn = dsn
        with self._connect() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(7155001)")  # several hosts creating the table at once
            conn.execute(_POSTGRES)

    def _connect(self):
        try:
            return self._psycopg.connect(self.dsn, connect_timeout=10)
        except self._psycopg.OperationalError as e:
            raise UsageError(f"the PostgreSQL history is unreachable: {' '.join(str(e).split())[:200]}") from None

    def add(self, run: Run) -> bool:
        with self._connect() as conn:
            cur = conn.execute(
                "INSERT INTO history_runs (key, repo, commit_sha, recorded_at, record) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (key) DO NOTHING",
                (run.key, run.repo, run.commit, run.recorded_at, json.dumps(run.to_json())),
            )
            return cur.rowcount == 1

    def runs(self, repo: str) -> list[Run]:
        with self._connect() as conn:
            rows = conn.execute("SELECT record FROM history_runs WHERE repo=%s ORDER BY seq", (repo,)).fetchall()
        return [Run.from_json(r[0] if isinstance(r[0], dict) else json.loads(r[0])) for r in rows]

    def repos(self) -> list[str]:
        with self._connect() as conn:
            return [r[0] for r in conn.execute("SELECT DISTINCT repo FROM history_runs ORDER BY repo")]

    def close(self) -> None:
        pass


def open_store(url: str) -> HistoryStore:
    """sqlite:///PATH (or a plain path), postgresql://... , or git:BRANCH[@REPO_DIR] (the Action's)."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresHistory(url)
    if url.startswith("git:"):
        branch, _, repo_dir = url[4:].partition("@")
        if not branch:
            raise UsageError(f"history {url!r}: expected git:BRANCH or git:BRANCH@REPO_DIR")
        return GitBranchHistory(repo_dir or ".", branch)
    if url.startswith("sqlite://"):
        url = url[len("sqlite://") :]
    if not url:
        raise UsageError("history: an empty location")
    try:
        return SQLiteHistory(url)
    except sqlite3.DatabaseError as e:  # a file that is not SQLite, a folder, a database of another program
        if "locked" in str(e):
            raise
        raise UsageError(f"history {url}: not a history database ({e})") from None
    except OSError as e:  # its folder cannot be made (a file is in the way, no permission)
        raise UsageError(f"history {url}: cannot open it: {e.strerror or e}") from None
