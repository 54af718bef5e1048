"""The runner image (./Dockerfile), built for real by the test Docker engine and run.

No registry is reachable: BASE_IMAGE is a Debian + Python + torch image made locally
(tests/docker_support.py, docker/). Skipped when no Docker engine answers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from docker_support import EXTRAS, docker_client, kernalin_image, run_container  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parent.parent
CHECKS_IN_IMAGE = "/opt/kernalin/checks"


def test_dockerfile_contract():
    text = (REPO / "Dockerfile").read_text()
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"pytorch/pytorch:[\d.]+-cuda[\d.]+-cudnn\d+-runtime", default)  # never pulled in tests
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert re.findall(r"^USER (\S+)$", text, re.M) == ["kernalin"]
    assert re.findall(r"^ENTRYPOINT (.+)$", text, re.M) == ['["kernalin-ci"]']
    assert f'"/opt/kernalin[{",".join(EXTRAS)}]"' in text  # the wheels the tests provide match what it installs
    assert "kernalin-ci dashboard --fetch-assets;" in text  # Chart.js for /dashboard, at build time
    runner = (REPO / "runners/k8s/runner.Dockerfile").read_text()
    assert "ENV KERNALIN_CHARTJS=" in runner and "kernalin-ci dashboard --fetch-assets" in runner
    ignore = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert ignore[0] == "*" and {"!pyproject.toml", "!kernalin_ci/", "!checks/"} <= set(ignore)


@pytest.mark.docker
def test_image_runs_kernalin_ci_as_an_unprivileged_user(docker_client, kernalin_image):
    config = docker_client.images.get(kernalin_image).attrs["Config"]
    assert config["Entrypoint"] == ["kernalin-ci"] and config["User"] == "kernalin"
    assert config["WorkingDir"] == "/workspace"
    r = run_container(docker_client, kernalin_image, ["--version"], timeout=120)
    assert r.exit_code == 0 and r.stdout.startswith("kernalin-ci "), r.output
    r = run_container(
        docker_client,
        kernalin_image,
        ["-c", "import github, jwt, docker, rq, redis"],
        entrypoint=["python3"],
        timeout=120,
    )  # the extras: posting, the daemon
    assert r.exit_code == 0, r.output
    r = run_container(docker_client, kernalin_image, ["-u"], entrypoint=["id"], timeout=120)
    assert r.exit_code == 0 and int(r.stdout) != 0, r.output
    # Chart.js for /dashboard is in the image and checked (no network here: nothing is fetched)
    r = run_container(docker_client, kernalin_image, ["dashboard", "--fetch-assets"], timeout=120)
    assert r.exit_code == 0 and "/kernalin_ci/dashboard/vendor/chart.umd.min.js" in r.stderr, r.output


@pytest.mark.docker
@pytest.mark.parametrize("kernel, code", [("correct_neox", 0), ("bug_sign_inverse", 1)])
def test_verify_a_catalogue_kernel_in_the_image(docker_client, kernalin_image, kernel, code):
    entry = f"{CHECKS_IN_IMAGE}/rope/{kernel}.py:entry"
    r = run_container(
        docker_client,
        kernalin_image,
        ["verify", "--op", "rope", "--entry", entry, "--device", "cpu", "--dtype", "float32", "--json", "-"],
        timeout=600,
    )
    assert r.exit_code == code, r.output
    result = json.loads(r.stdout)
    assert result["op"] == "rope" and result["entry"] == entry and result["cases_run"] > 0
    if code == 0:
        assert result["verdict"] == "pass" and result["findings"] == []
    else:
        assert result["verdict"] == "fail"
        classes = {(f["check"], f["bug_class"]) for f in result["findings"]}
        assert ("reference", "rope-sign") in classes  # launched under the Triton interpreter
        structural = [f for f in result["findings"] if f["check"].startswith("structural:")]
        assert structural and structural[0]["location"]["path"] == entry.split(":")[0]  # compiled for sm_90


@pytest.mark.docker
def test_catalogue_ships_in_the_image(docker_client, kernalin_image):
    r = run_container(
        docker_client,
        kernalin_image,
        ["catalogue", "--op", "kv_append", "--kinds", "structural", "--device", "cpu", "--json", "-"],
        timeout=600,
    )
    assert r.exit_code in (0, 1), r.output  # 1: a catch-matrix mismatch; the catalogue was found and run
    rows = json.loads(r.stdout)["rows"]
    shipped = {
        f"{CHECKS_IN_IMAGE}/{folder}/{p.name}"
        for folder in ("kv_append", "cuda/kv_append")  # the Triton catalogue and the CUDA C++ one
        for p in (REPO / "checks" / folder).glob("*.py")
    }
    assert {row["path"] for row in rows} == shipped
    assert all(row["results"]["structural"]["error"] is None for row in rows), r.output
    cuda = [row for row in rows if "/cuda/" in row["path"]]
    assert cuda and all(row["results"]["structural"]["not_checked"] for row in cuda), r.output


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=dev", "-c", "user.email=dev@example.invalid", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.mark.docker
def test_gate_in_the_image_on_a_mounted_workspace(docker_client, kernalin_image, tmp_path):
    """`docker run -v $PWD:/workspace IMAGE run`: a checkout owned by another user (git's safe.directory),
    worktrees made by the image's unprivileged user, the report written back to the mount."""
    ws = tmp_path / "ws"
    shutil.copytree(
        REPO / "examples" / "decode-kernels" / "kernels", ws / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    (ws / ".kernalin.yml").write_text(
        "kernels:\n  - {name: rope, op: rope, entry: kernels/rope.py:rope, params: {style: neox}, dtype: float32}\n"
        "gate: {bench: false}\n"
    )
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "base")
    git(ws, "checkout", "-qb", "feature")
    rope = ws / "kernels" / "rope.py"
    rope.write_text(rope.read_text().replace("* log_base)", "* log_base * 1.0)"))
    git(ws, "commit", "-qam", "rope: an equivalent change")
    subprocess.run(["chmod", "-R", "a+rwX", str(ws)], check=True)  # owned by us, writable by the image's user

    r = run_container(
        docker_client,
        kernalin_image,
        ["run", "--base", "main", "--head", "feature", "--device", "cpu", "--out", "/workspace/out"],
        volumes={str(ws): {"bind": "/workspace", "mode": "rw"}},
        timeout=600,
    )

    assert r.exit_code == 0, r.output
    report = json.loads((ws / "out" / "report.json").read_text())
    assert report["conclusion"] == "success" and report["head"]["sha"] == git(ws, "rev-parse", "feature")
    [kernel] = report["kernels"]
    assert (kernel["name"], kernel["status"], kernel["verification"]["verdict"]) == ("rope", "changed", "pass")
    assert git(ws, "worktree", "list").count("\n") == 0  # the gate's worktrees are gone again
