"""The hostile-PR suite's helpers and fixtures (test modules import the fixtures they use: a conftest.py
here would shadow tests/conftest.py, which other test modules import as `conftest`).

A pull request's code is made to run with `runner.command` = `{python} payload.py {out}` in the
checkout: payload.py comes from the PR's head commit, exactly as kernel code would run inside the
gate, without the minutes the real gate takes on a CPU."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from kernalin_ci.daemon.app import wait_for
from kernalin_ci.testing.daemon_world import ServeProcess, World

REPO = "acme/kernels"
BASE_FILES = {".kernalin.yml": "version: 1\nkernels: []\n"}
PAYLOAD_COMMAND = ["{python}", "payload.py", "{out}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pr_with_payload(world, number: int, payload: str, files: dict | None = None) -> dict:
    """A pull request whose head adds payload.py (the 'kernel code' that runs in the job)."""
    repo = world.repos[REPO]
    head = repo.commit({"payload.py": payload, **(files or {})}, f"pr {number}", branch=f"pr-{number}")
    return world.pull_request(REPO, number, head, repo.main)


def check_run_text(world, job_id: str) -> str:
    runs = [r for r in world.standin.check_runs(REPO) if r["external_id"] == job_id]
    assert runs, f"no check run for {job_id}"
    out = runs[-1].get("output") or {}
    return " ".join(str(out.get(k) or "") for k in ("title", "summary", "text"))


def proc_threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture
def world(tmp_path, github_standin):
    w = World(tmp_path / "world", github_standin).start()
    w.add_repo(REPO, BASE_FILES)
    yield w
    w.stop()


@pytest.fixture
def serve(world):
    procs = []

    def start(cfg, **kw) -> ServeProcess:
        p = ServeProcess(world, cfg, **kw).start()
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


@pytest.fixture
def redis_url(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    import redis

    port = free_port()
    d = tmp_path / "redis"
    d.mkdir()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(d),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    r = redis.Redis(port=port)

    def up():
        try:
            return r.ping()
        except Exception:
            return False

    assert wait_for(up, 20), "redis-server did not start"
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)
