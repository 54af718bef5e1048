"""The hostile-PR suite: each test performs one attack of issue 13 for real (a real `kernalin-ci serve`
process, the real gate, the local runner, a real redis-server) and checks that it is held.

A pull request's code is made to run with `runner.command` = `{python} payload.py {out}` in the
checkout: payload.py comes from the PR's head commit, exactly as kernel code would run inside the
gate, without the minutes the real gate takes on a CPU."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from kernalin_ci.daemon.app import wait_for
from kernalin_ci.daemon.harness import ServeProcess, World

from hostile_support import BASE_FILES, REPO, free_port


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
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
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
