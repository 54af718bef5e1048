"""Issue 29, attack 2: a forged success in the daemon. The broken kernel's module, when a worker imports it,
starts a detached process (a session of its own) that waits for the gate's `out/report.json` and rewrites
its `conclusion` to `success` before the job's outputs are packed. Before the fix the posted check run said
`success` while the job log said `failure`: the daemon took `conclusion` from any schema-valid report and
ignored the gate's exit status, and the kernel workers inside a job ran with their own sandbox off, so the
PR's process lived on until the job ended.

Now (each layer on its own would have held this attack):
- the kernel workers inside a job run in a sandbox of their own (nested in the job's): the rewriter
  neither sees out/ nor outlives its worker;
- the job's first process kills whatever is left in the job's sandbox once the gate ended, before out/ is
  packed (daemon/jobwrap.py);
- a report whose conclusion disagrees with the gate's exit status is an infrastructure error, never a
  verdict (daemon/execute.py).
The second run switches the nested sandbox off (runner.env: the operator's explicit opt-out): the rewrite
may then land, and the report must still never be posted as a success."""

import json

import pytest
from forge_report import BAD, CONFIG, GOOD, KERNEL, REWRITER  # noqa: E402

from kernalin_ci import sandbox
from kernalin_ci.daemon.app import Daemon
from kernalin_ci.daemon.deliver import deliver, get_json
from kernalin_ci.daemon.execute import exit_mismatch
from kernalin_ci.testing.daemon_world import WEBHOOK_SECRET, World, settings_for, wait_job


def test_a_report_that_disagrees_with_the_gates_exit_is_never_a_verdict():
    assert exit_mismatch({"conclusion": "failure"}, 1) is None
    assert exit_mismatch({"conclusion": "success"}, 0) is None and exit_mismatch({"conclusion": "neutral"}, 0) is None
    assert "infrastructure error" in exit_mismatch({"conclusion": "success"}, 1)
    assert "not trusted" in exit_mismatch({"conclusion": "failure"}, 0)


@pytest.mark.slow
@pytest.mark.skipif(sandbox.bwrap_works(sandbox.SandboxSettings()) is not None, reason="bubblewrap cannot run here")
@pytest.mark.parametrize("nested", ["sandboxed", "off"])
def test_a_kernel_cannot_forge_the_posted_conclusion(tmp_path, github_standin, nested):
    assert GOOD in KERNEL
    world = World(tmp_path / "world", github_standin).start()
    repo = world.add_repo("acme/kernels", {".kernalin.yml": CONFIG, "kernels/kv_cache.py": KERNEL})
    head = repo.commit(
        {"kernels/kv_cache.py": REWRITER + KERNEL.replace(GOOD, BAD)}, "values are keys, and a helper", branch="pr-9"
    )
    runner = {"timeout_s": 900}
    if nested == "off":
        runner["env"] = {"KERNALIN_SANDBOX": "off"}
    settings = settings_for(world, world.daemon_config(tmp_path / "state", runner=runner))
    d = Daemon(settings).start()
    try:
        status, answer = deliver(
            d.url + "/webhook", "pull_request", world.pull_request("acme/kernels", 9, head, repo.main), WEBHOOK_SECRET
        )
        assert status == 202
        job = wait_job(lambda p: get_json(d.url + p), answer["jobs"][0], timeout=900)
        (run,) = github_standin.check_runs("acme/kernels")
        assert run["conclusion"] == "failure", (job, run.get("output"))  # never the forged success
        log = (settings.jobs_dir / job["id"] / "job.log").read_text()
        if nested == "sandboxed":  # the real verdict, from the gate's own report
            assert job["conclusion"] == "failure", job
            report = json.loads((settings.jobs_dir / job["id"] / "out" / "report.json").read_text())
            assert report["conclusion"] == "failure" and report["isolation"]["mode"] == "bubblewrap"
            assert not (settings.jobs_dir / job["id"] / "out" / "report.json.forged").exists()
        else:  # the rewrite may land; it is then refused, and said so
            out = settings.jobs_dir / job["id"] / "out"
            if (out / "report.json.forged").exists():
                assert "infrastructure error" in json.dumps(run.get("output")), run.get("output")
            assert "kernel code runs UNSANDBOXED" in log
    finally:
        d.stop()
        world.stop()
