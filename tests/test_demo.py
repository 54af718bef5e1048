"""README command 1 (`examples/demo.sh`) from a clone: it leaves the clone clean and keeps the example
repository, so that the reproduce commands its reports print can be run there."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def _git(cwd, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def test_demo_leaves_the_clone_clean_and_keeps_the_example_repository(tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    shutil.copy(REPO / ".gitignore", clone / ".gitignore")
    shutil.copytree(REPO / "examples", clone / "examples")
    _git(clone, "init", "-q")
    _git(clone, "add", "-A")
    _git(clone, "commit", "-qm", "clone")
    env = dict(os.environ, KERNALIN_DEVICE="cpu", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    # the default output folder, one pull request (the shortest gate)
    r = subprocess.run(
        ["examples/demo.sh", "kernalin-demo", "fused-step-early-store"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert _git(clone, "status", "--porcelain", "--untracked-files=all") == ""
    repo = clone / "kernalin-demo" / "repo"
    assert str(repo) in r.stdout
    report = json.loads((clone / "kernalin-demo" / "fused-step-early-store" / "report.json").read_text())
    gated = [k for k in report["kernels"] if k["verification"]]
    finding = gated[0]["verification"]["findings"][0]
    # the reproduce command printed in the report runs in the kept repository, and finds the bug again
    again = subprocess.run(
        shlex.split(finding["reproduce"]) + ["--quiet", "--device", "cpu"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 1, again.stdout + again.stderr
    assert finding["bug_class"] in again.stdout
