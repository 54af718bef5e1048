"""Issue 13, attack 6: a pull request's report.json stalls all posting.

Against a real `kernalin-ci serve`: a job writes `{}` as its report.json; on main the poster raised
on it on every pass, and every later job's check run stayed in progress. Now the report is checked
against its schema before anything reads it: that job fails and is posted once, the next pull
request is posted as usual. And /healthz says so when posting keeps failing."""

from hostile_support import PAYLOAD_COMMAND, REPO, check_run_text, pr_with_payload, serve, world  # noqa: F401 (fixtures)

from kernalin_ci.daemon.app import wait_for
from kernalin_ci.testing.daemon_world import wait_job

GOOD = """import sys
from kernalin_ci.report.model import Report
from kernalin_ci.report.writer import write_all
write_all(Report(conclusion="success", reason="fine", base={}, head={}, device="cpu", policy={}), sys.argv[1])
"""


def test_a_bad_report_fails_its_job_once_and_the_queue_moves_on(tmp_path, world, serve):
    bad = pr_with_payload(
        world,
        1,
        "import os, sys\nos.makedirs(sys.argv[1], exist_ok=True)\n"
        "open(os.path.join(sys.argv[1], 'report.json'), 'w').write('{}')\n",
    )
    good = pr_with_payload(world, 2, GOOD)
    daemon = serve(world.daemon_config(tmp_path / "state", runner={"command": PAYLOAD_COMMAND}))
    jobs = [daemon.deliver("pull_request", p)[1]["jobs"][0] for p in (bad, good)]
    first = wait_job(daemon.get, jobs[0], timeout=60)
    second = wait_job(daemon.get, jobs[1], timeout=60)

    assert (first["state"], first["post_state"]) == ("failed", "posted")
    assert "report.json" in check_run_text(world, jobs[0]) and "schema" in check_run_text(world, jobs[0])
    assert (second["state"], second["conclusion"], second["post_state"]) == ("done", "success", "posted")
    runs = {r["external_id"]: r for r in world.standin.check_runs(REPO)}
    assert runs[jobs[0]]["status"] == runs[jobs[1]]["status"] == "completed"
    assert daemon.log.read_text().count("Traceback") == 0


def test_healthz_reports_a_poster_that_keeps_failing(tmp_path, world, serve):
    world.standin.inject("*", "/repos/*/check-runs*", 500, times=None)  # GitHub refuses every check run
    daemon = serve(
        world.daemon_config(
            tmp_path / "state",
            runner={"command": PAYLOAD_COMMAND},
            posting={"attempts": 50, "base_delay_s": 0.05, "max_delay_s": 0.1},
        )
    )
    assert daemon.get("/healthz")[0] == 200
    for number in range(1, 3):
        daemon.deliver("pull_request", pr_with_payload(world, number, GOOD))
    assert wait_for(lambda: daemon.get("/healthz")[0] == 503, 60)
    status, body = daemon.get("/healthz")
    assert "posting failed" in body["error"]
    world.standin.faults.clear()  # GitHub is back: the next publication succeeds and health returns
    assert wait_for(lambda: daemon.get("/healthz")[0] == 200, 60)
