"""More than one GPU host: `kernalin-ci serve` with queue.backend redis, a real redis-server, and two
`kernalin-ci worker` processes taking the jobs through RQ."""

import os
import shutil
import socket
import subprocess
import sys

import pytest
import yaml

from kernalin_ci.daemon.app import wait_for
from kernalin_ci.testing.daemon_world import ServeProcess, World, fake_gate_command, job_started, wait_job

REPO = "acme/kernels"
pytestmark = pytest.mark.skipif(
    not shutil.which("redis-server"), reason="needs redis-server (apt-get install redis-server)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
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
            "--protected-mode",
            "yes",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    r = redis.Redis(port=port)
    assert wait_for(lambda: _ping(r), 20), "redis-server did not start"
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


def _ping(r) -> bool:
    try:
        return r.ping()
    except Exception:
        return False


@pytest.fixture
def world(tmp_path, github_standin):
    w = World(tmp_path / "world", github_standin).start()
    w.add_repo(REPO, {".kernalin.yml": "version: 1\nkernels: []\n", "verdict.txt": "success\n"})
    yield w
    w.stop()


def start_worker(cfg_path, state_dir, log):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNALIN_", "GITHUB_"))}
    return subprocess.Popen(
        [sys.executable, "-m", "kernalin_ci", "worker", "--config", str(cfg_path), "--state-dir", str(state_dir)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_two_workers_take_jobs_from_a_shared_redis(tmp_path, world, redis_url):
    cfg = world.daemon_config(
        tmp_path / "serve",
        runner={"command": fake_gate_command()},
        queue={"backend": "redis", "redis_url": redis_url, "name": "kernalin-test"},
    )
    serve = ServeProcess(world, cfg).start()
    worker_cfg = tmp_path / "worker.yml"
    worker_cfg.write_text(
        yaml.safe_dump(
            {k: v for k, v in cfg.items() if k != "github"} | {"github": {"clone_url": cfg["github"]["clone_url"]}}
        )
    )
    log = open(tmp_path / "workers.log", "ab")
    workers = [start_worker(worker_cfg, tmp_path / f"host{i}", log) for i in range(2)]
    try:
        repo = world.repos[REPO]
        jobs = {}
        for number in range(1, 5):
            head = repo.commit(
                {"sleep.txt": "2", "verdict.txt": "failure\n" if number == 3 else "success\n"},
                f"pr {number}",
                branch=f"pr-{number}",
            )
            status, answer = serve.deliver("pull_request", world.pull_request(REPO, number, head, repo.main))
            assert status == 202
            jobs[number] = answer["jobs"][0]
        done = {n: wait_job(serve.get, j, timeout=120) for n, j in jobs.items()}
        assert {n: (j["state"], j["conclusion"]) for n, j in done.items()} == {
            1: ("done", "success"),
            2: ("done", "success"),
            3: ("done", "failure"),
            4: ("done", "success"),
        }
        # two worker processes shared the work, and ran jobs at the same time
        assert len({j["worker"] for j in done.values()}) == 2
        spans = sorted((j["started_at"], j["finished_at"]) for j in done.values())
        assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans
        # each job ran in the checkout of its worker's host directory, and was posted once by serve
        for n, job_id in jobs.items():
            assert any((tmp_path / f"host{i}" / "jobs" / job_id / "out" / "started").exists() for i in range(2))
            runs = [r for r in world.standin.check_runs(REPO) if r["external_id"] == job_id]
            assert len(runs) == 1 and runs[0]["status"] == "completed"
            assert len(world.standin.comments(REPO, n)) == 1
        # a newer push cancels a job a worker is running, through Redis
        head = repo.commit({"sleep.txt": "60"}, "slow", branch="pr-9")
        slow = serve.deliver("pull_request", world.pull_request(REPO, 9, head, repo.main))[1]["jobs"][0]
        assert wait_for(lambda: serve.get(f"/jobs/{slow}")[1]["state"] == "running", 60)
        assert wait_for(lambda: any(job_started(tmp_path / f"host{i}" / "jobs" / slow) for i in range(2)), 30)
        head2 = repo.commit({"sleep.txt": "0"}, "fast", branch="pr-9")
        answer = serve.deliver("pull_request", world.pull_request(REPO, 9, head2, repo.main, action="synchronize"))[1]
        assert wait_job(serve.get, slow, timeout=50, posted=False)["state"] == "cancelled"  # well before its 60 s
        # the worker killed it: it never got to write a report
        assert not any((tmp_path / f"host{i}" / "jobs" / slow / "out" / "report.json").exists() for i in range(2))
        assert wait_job(serve.get, answer["jobs"][0], timeout=60)["conclusion"] == "success"
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, 9)
        serve.stop()
        log.close()
