"""Issue 13, attack 5: a pull request makes the daemon read or write through a symbolic link.

Each is tried against a real `kernalin-ci serve` process: the PR's `.kernalin.yml` is a link to a
file the daemon user can write (on main the daemon copied the base configuration onto it); the
job's code replaces `out/report.json` or `job.log` with a link to a secret the daemon can read (on
main the daemon posted what it found there on the check run)."""

import json
import os

from hostile_support import PAYLOAD_COMMAND, REPO, check_run_text, pr_with_payload, serve, world  # noqa: F401 (fixtures)

from kernalin_ci.testing.daemon_world import wait_job

SECRET = "kernalin-secret-6c1f9e0b"


def test_symlinks_from_a_pull_request_are_never_followed(tmp_path, world, serve):
    victim = tmp_path / "victim.txt"  # stands for the database or the App key: writable by the daemon
    victim.write_text("precious\n")
    secret = tmp_path / "secret.json"  # readable by the daemon, must never reach GitHub
    report = {"schema": 1, "conclusion": "success", "reason": SECRET, "kernels": []}
    secret.write_text(json.dumps(report))
    repo = world.repos[REPO]
    # PR 1: the checkout's .kernalin.yml is a link; the base configuration must not be copied through it
    pr_with_payload(world, 1, "import sys; sys.exit(2)\n", {".kernalin.yml": None})
    os.symlink(victim, repo.work / ".kernalin.yml")
    prs = {1: world.pull_request(REPO, 1, repo.commit({}, "the config is a link", branch="pr-1"), repo.main)}
    # PR 2: the job links out/report.json to the secret
    prs[2] = pr_with_payload(
        world,
        2,
        f"import os, sys\nos.makedirs(sys.argv[1], exist_ok=True)\n"
        f"os.symlink({str(secret)!r}, os.path.join(sys.argv[1], 'report.json'))\n",
    )
    # PR 3: the job links job.log to the secret, so the daemon would post 'the end of the job's output'
    prs[3] = pr_with_payload(
        world,
        3,
        f"import os, sys\nlog = os.path.join(sys.argv[1], '..', 'job.log')\n"
        f"os.remove(log)\nos.symlink({str(secret)!r}, log)\nsys.exit(2)\n",
    )

    cfg = world.daemon_config(tmp_path / "state", runner={"command": PAYLOAD_COMMAND})
    daemon = serve(cfg)
    jobs = {}
    for number, payload in prs.items():
        status, answer = daemon.deliver("pull_request", payload)
        assert status == 202, answer
        jobs[number] = answer["jobs"][0]
    for job_id in jobs.values():
        wait_job(daemon.get, job_id, timeout=60)

    assert victim.read_text() == "precious\n"  # attack 5: nothing written through the PR's link
    for number in (2, 3):
        text = check_run_text(world, jobs[number])
        assert SECRET not in text, (number, text)
    _, job2 = daemon.get(f"/jobs/{jobs[2]}")
    assert job2["state"] == "failed" and job2["conclusion"] == "failure"
    assert "symbolic link" in check_run_text(world, jobs[2])
