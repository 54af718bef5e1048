"""Issue 13, attack 10 (Redis mode) and the caps on a job's output, against real processes.

Whoever can write to Redis (a job that reaches it, a neighbour on the network) is not trusted: on
main a `kernalin-ci worker` ran any function name found in its queue, `serve` posted whatever result
JSON it read back, and a private repository's fetch token sat in Redis in plain text. Now workers
run only kernalin-ci's own job function, for jobs serve signed, and serve accepts only results
signed with the key it shares with its workers; the token travels sealed."""

import os
import subprocess
import sys

import yaml
from hostile_support import PAYLOAD_COMMAND, check_run_text, pr_with_payload, redis_url, serve, world  # noqa: F401 (fixtures)

from kernalin_ci.daemon.app import wait_for
from kernalin_ci.testing.daemon_world import fake_gate_command, wait_job


def _queue(redis_url, name):
    from redis import Redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    return Queue(name, connection=Redis.from_url(redis_url), serializer=JSONSerializer)


def test_a_worker_runs_only_its_own_job_function(tmp_path, world, redis_url):
    cfg = world.daemon_config(
        tmp_path / "serve",
        runner={"command": fake_gate_command()},
        queue={"backend": "redis", "redis_url": redis_url, "name": "kernalin-test"},
    )
    worker_cfg = tmp_path / "worker.yml"
    worker_cfg.write_text(yaml.safe_dump({k: v for k, v in cfg.items() if k != "github"}))
    marker = tmp_path / "pwned"
    job = _queue(redis_url, "kernalin-test").enqueue_call("os.system", args=(f"touch {marker}",))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNALIN_", "GITHUB_"))}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernalin_ci",
            "worker",
            "--config",
            str(worker_cfg),
            "--state-dir",
            str(tmp_path / "host"),
            "--burst",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        worker.wait(60)
    finally:
        if worker.poll() is None:
            worker.kill()
    job.refresh()
    assert not marker.exists(), "the worker ran a function found in Redis"
    assert job.get_status().value == "failed"


def test_serve_refuses_a_forged_result_and_keeps_tokens_out_of_redis(tmp_path, world, serve, redis_url):
    from rq.job import Job, JobStatus
    from rq.results import Result

    cfg = world.daemon_config(
        tmp_path / "serve",
        runner={"command": PAYLOAD_COMMAND},
        queue={"backend": "redis", "redis_url": redis_url, "name": "kernalin-test"},
        badges={"private_repos": True},
    )
    daemon = serve(cfg)  # no worker: the attacker answers in its place
    payload = pr_with_payload(world, 1, "import sys; sys.exit(1)\n")
    payload["repository"]["private"] = True  # serve mints a fetch token for the job
    status, answer = daemon.deliver("pull_request", payload)
    job_id = answer["jobs"][0]
    q = _queue(redis_url, "kernalin-test")
    assert wait_for(lambda: q.count == 1, 30)
    rq_job = Job.fetch(q.job_ids[0], connection=q.connection, serializer=q.serializer)

    tokens = [t.token for t in world.standin.tokens_issued()]
    assert tokens
    dump = b"".join(q.connection.dump(k) or b"" for k in q.connection.keys("*"))
    assert not any(t.encode() in dump for t in tokens), "a fetch token is stored in Redis in plain text"

    forged = {
        "kind": "report",
        "message": "forged",
        "detail": "",
        "exit_code": 0,
        "log_tail": "",
        "seconds": 1.0,
        "worker": "attacker",
        "report": {"schema": 1, "conclusion": "success", "reason": "forged", "kernels": []},
    }
    q.remove(rq_job)
    for value in (forged, {"outcome": forged, "mac": "0" * 64}):  # main's shape, and a guessed signature
        Result.create(rq_job, Result.Type.SUCCESSFUL, ttl=600, return_value=value)
    rq_job.set_status(JobStatus.FINISHED)
    done = wait_job(daemon.get, job_id, timeout=60)
    assert done["conclusion"] != "success", done
    assert "authentication" in check_run_text(world, job_id)


def test_job_log_and_out_are_capped(tmp_path, world, serve):
    payload = (
        "import os, sys\nos.makedirs(sys.argv[1], exist_ok=True)\n"
        "open(os.path.join(sys.argv[1], 'big.bin'), 'wb').write(b'x' * 3_000_000)\n"
        "for _ in range(3000):\n    print('y' * 999)\nsys.exit(1)\n"
    )
    daemon = serve(
        world.daemon_config(
            tmp_path / "state",
            runner={"command": PAYLOAD_COMMAND, "log_max_bytes": 100_000, "out_max_bytes": 1_000_000},
        )
    )
    status, answer = daemon.deliver("pull_request", pr_with_payload(world, 1, payload))
    job = wait_job(daemon.get, answer["jobs"][0], timeout=60)
    job_dir = tmp_path / "state" / "jobs" / job["id"]
    assert (job_dir / "job.log").stat().st_size < 100_000 + 20_000
    assert not (job_dir / "out" / "big.bin").exists()
    assert job["state"] == "failed" and "over the limit" in check_run_text(world, job["id"])
