"""`kill -9` of a real `kernalin-ci serve` process, mid-job and mid-post, then a restart: no job is lost,
and each result is posted exactly once (one check run per job, found again by its external_id; one
sticky comment per pull request, edited rather than duplicated)."""

import sqlite3
import time

import pytest

from kernalin_ci.daemon.app import wait_for
from kernalin_ci.daemon.runners.local import marked_pids
from kernalin_ci.testing.daemon_world import ServeProcess, World, fake_gate_command, job_started, wait_job

REPO = "acme/kernels"
FILES = {".kernalin.yml": "version: 1\nkernels: []\n", "verdict.txt": "success\n"}


@pytest.fixture
def world(tmp_path, github_standin):
    w = World(tmp_path / "world", github_standin).start()
    w.add_repo(REPO, FILES)
    yield w
    w.stop()


@pytest.fixture
def serve(tmp_path, world):
    procs = []

    def start(cfg) -> ServeProcess:
        p = ServeProcess(world, cfg).start()
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


def open_prs(world, n: int, first_sleep: float) -> list[tuple[int, dict]]:
    repo = world.repos[REPO]
    out = []
    for number in range(1, n + 1):
        head = repo.commit(
            {
                "sleep.txt": str(first_sleep if number == 1 else 0),
                "verdict.txt": "failure\n" if number == 2 else "success\n",
            },
            f"pr {number}",
            branch=f"pr-{number}",
        )
        out.append((number, world.pull_request(REPO, number, head, repo.main)))
    return out


def assert_posted_once(world, jobs: dict[int, str]) -> None:
    runs = world.standin.check_runs(REPO)
    for number, job_id in jobs.items():
        mine = [r for r in runs if r["external_id"] == job_id]
        assert len(mine) == 1, (number, mine)
        assert mine[0]["status"] == "completed"
        assert len(world.standin.comments(REPO, number)) == 1
    assert len(runs) == len(jobs)


def test_kill_9_mid_job_then_restart(tmp_path, world, serve):
    cfg = world.daemon_config(tmp_path / "state", runner={"command": fake_gate_command()})
    d = serve(cfg)
    jobs = {}
    for number, payload in open_prs(world, 3, first_sleep=8):
        status, answer = d.deliver("pull_request", payload)
        assert status == 202
        jobs[number] = answer["jobs"][0]
    assert wait_for(lambda: job_started(tmp_path / "state" / "jobs" / jobs[1]), 30)
    assert wait_for(
        lambda: any(
            r["external_id"] == jobs[1] and r["status"] == "in_progress" for r in world.standin.check_runs(REPO)
        ),
        30,
    )
    run_before = next(r["id"] for r in world.standin.check_runs(REPO) if r["external_id"] == jobs[1])
    assert marked_pids(jobs[1])  # the job's processes, seen from the host (their own PIDs are namespaced)

    d.kill9_daemon_only()  # the daemon dies; the job's processes must not outlive it
    assert wait_for(lambda: not marked_pids(jobs[1]), 10)

    d = serve(cfg)  # recovers: the running job goes back to the queue, nothing is lost
    for job_id in jobs.values():
        wait_job(d.get, job_id, timeout=120)
    states = {n: d.get(f"/jobs/{j}")[1] for n, j in jobs.items()}
    assert {n: (s["state"], s["conclusion"]) for n, s in states.items()} == {
        1: ("done", "success"),
        2: ("done", "failure"),
        3: ("done", "success"),
    }
    assert_posted_once(world, jobs)
    # the recovered job finished on the check run it had started before the crash
    assert next(r["id"] for r in world.standin.check_runs(REPO) if r["external_id"] == jobs[1]) == run_before
    db = sqlite3.connect(tmp_path / "state" / "jobs.sqlite3")
    assert db.execute("SELECT recoveries FROM jobs WHERE id=?", (jobs[1],)).fetchone() == (1,)
    assert db.execute("SELECT COUNT(*) FROM jobs").fetchone() == (3,)


def test_kill_9_while_posting_then_restart(tmp_path, world, serve):
    cfg = world.daemon_config(
        tmp_path / "state",
        runner={"command": fake_gate_command()},
        posting={"attempts": 50, "base_delay_s": 0.2, "max_delay_s": 0.5},
    )
    outage = world.standin.inject("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}", 503, times=None)
    d = serve(cfg)
    jobs = {}
    for number, payload in open_prs(world, 2, first_sleep=0):
        jobs[number] = d.deliver("pull_request", payload)[1]["jobs"][0]
    db_path = tmp_path / "state" / "jobs.sqlite3"

    def post_attempts():
        db = sqlite3.connect(db_path)
        try:
            return [
                db.execute("SELECT state, post_state, post_attempts FROM jobs WHERE id=?", (j,)).fetchone()
                for j in jobs.values()
            ]
        finally:
            db.close()

    # both jobs are done, GitHub keeps failing: the results wait in the store
    assert wait_for(lambda: all(s == "done" and p == "pending" and a >= 1 for s, p, a in post_attempts()), 60)
    d.kill9()
    outage.times = outage.hits  # GitHub is back
    d = serve(cfg)
    for job_id in jobs.values():
        assert wait_job(d.get, job_id, timeout=60)["post_state"] == "posted"
    assert_posted_once(world, jobs)
    edits = {n: world.standin.comments(REPO, n)[0]["edits"] for n in jobs}

    # a crash between publish() and recording it: the store still says pending; posting again must
    # land on the same check run and the same comment
    d.kill9()
    db = sqlite3.connect(db_path)
    db.execute("UPDATE jobs SET post_state='pending', post_next_at=0")
    db.commit()
    db.close()
    patches_before = len(world.standin.requests_to("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}"))
    d = serve(cfg)
    assert wait_for(lambda: all(p == "posted" for _, p, _ in post_attempts()), 60)
    assert_posted_once(world, jobs)
    assert {n: world.standin.comments(REPO, n)[0]["edits"] for n in jobs} == edits  # unchanged: not rewritten
    assert len(world.standin.requests_to("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}")) > patches_before
    time.sleep(0.5)
    assert len(world.standin.check_runs(REPO)) == 2
