"""End to end with the real gate: a signed delivery -> the daemon fetches the PR -> `kernalin-ci run` (local
runner, CPU interpreter) with the BASE branch's configuration -> check run with annotations and the
sticky comment on the stand-in. The PR both breaks a kernel and tries to switch the gate off in its own
.kernalin.yml; the base configuration still fails it."""

import json
from pathlib import Path

import pytest

from kernalin_ci.daemon.app import Daemon
from kernalin_ci.daemon.deliver import deliver, get_json
from kernalin_ci.testing.daemon_world import WEBHOOK_SECRET, World, settings_for, wait_job

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "decode-kernels"
KERNEL = (EXAMPLE / "kernels" / "kv_cache.py").read_text()
CONFIG = """\
version: 1
kernels:
  - name: kv_append
    op: kv_append
    entry: kernels/kv_cache.py:append
    params: {block_size: 16}
gate:
  bench: false
"""
GOOD = "tl.store(vc_ptr + slot * sc_slot + i, tl.load(value_ptr + t * sv_t + i, mask=mask), mask=mask)"
BAD = "tl.store(vc_ptr + slot * sc_slot + i, tl.load(key_ptr + t * sk_t + i, mask=mask), mask=mask)"


@pytest.mark.slow
def test_the_real_gate_fails_a_broken_kernel_with_the_base_configuration(tmp_path, github_standin):
    assert GOOD in KERNEL
    world = World(tmp_path / "world", github_standin).start()
    repo = world.add_repo("acme/kernels", {".kernalin.yml": CONFIG, "kernels/kv_cache.py": KERNEL})
    head = repo.commit(
        {
            "kernels/kv_cache.py": KERNEL.replace(GOOD, BAD),
            ".kernalin.yml": CONFIG.replace("  bench: false\n", "  bench: false\n  fail_on: []\n"),
        },
        "values are keys; and nothing fails the gate",
        branch="pr-5",
    )
    bad_line = next(i for i, ln in enumerate(KERNEL.splitlines(), start=1) if GOOD in ln)
    settings = settings_for(world, world.daemon_config(tmp_path / "state", runner={"timeout_s": 900}))
    d = Daemon(settings).start()
    try:
        status, answer = deliver(
            d.url + "/webhook", "pull_request", world.pull_request("acme/kernels", 5, head, repo.main), WEBHOOK_SECRET
        )
        assert status == 202
        job = wait_job(lambda p: get_json(d.url + p), answer["jobs"][0], timeout=900)
        assert job["state"] == "done" and job["conclusion"] == "failure", job
        report = json.loads((settings.jobs_dir / job["id"] / "out" / "report.json").read_text())
        assert report["policy"]["fail_on"] == ["finding", "slower"]  # the base's policy, not the PR's []
        (k,) = report["kernels"]
        assert k["name"] == "kv_append" and k["verification"]["verdict"] == "fail" and k["failed_by"] == ["finding"]
        (run,) = github_standin.check_runs("acme/kernels")
        assert run["external_id"] == job["id"] and run["conclusion"] == "failure" and run["head_sha"] == head
        assert any(a["path"] == "kernels/kv_cache.py" and a["start_line"] == bad_line for a in run["annotations"]), run[
            "annotations"
        ]
        (comment,) = github_standin.comments("acme/kernels", 5)
        assert "kv_append" in comment["body"]
        assert get_json(d.url + "/badge/acme/kernels.json")[1]["color"] == "red"
    finally:
        d.stop()
        world.stop()
