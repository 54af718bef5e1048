"""Issue 13, attacks 4 and 2: a checkout shadows the gate; a kernel reads the gate's secrets.

The gate and its kernel workers run inside checkouts of the pull request. On main, a PR that adds
`kernalin_ci/__main__.py` at its root replaced the gate under the daemon's local runner (check run
`success` in 0.4 s), and one that adds `kernalin_ci/kernel_worker.py` replaced the kernel worker under
`kernalin-ci verify` run in the checkout. Now both start in isolated mode with the tool's own
package path only. The worker's environment is an allowlist, and the parent running it is
non-dumpable: a kernel running as the same unprivileged uid can read neither."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kernalin_ci.daemon.gpus import Slot
from kernalin_ci.daemon.runners.local import LocalRunner
from kernalin_ci.daemon.runners.protocol import RunRequest
from kernalin_ci.launch import PACKAGE_ROOT
from kernalin_ci.testing.daemon_world import git

SHADOW_MAIN = """import os, sys
open(os.path.join(os.environ["MARKER_DIR"], "shadowed"), "w").write("the PR's kernalin_ci ran")
"""


def shadow_package(root: Path, marker_dir: Path) -> None:
    pkg = root / "kernalin_ci"
    pkg.mkdir()
    code = SHADOW_MAIN.replace('os.environ["MARKER_DIR"]', repr(str(marker_dir)))
    for name in ("__init__.py", "__main__.py", "kernel_worker.py"):
        (pkg / name).write_text(code)


def test_the_local_runner_never_runs_a_kernalin_ci_package_from_the_checkout(tmp_path):
    repo = tmp_path / "job" / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / ".kernalin.yml").write_text(
        "version: 1\nkernels:\n  - name: kv\n    op: kv_append\n    entry: kernels/kv.py:append\n"
    )
    (repo / "kernels").mkdir()
    (repo / "kernels" / "kv.py").write_text("def append(*args):\n    pass\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    shadow_package(repo, tmp_path)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "switch the gate off")
    head = git(repo, "rev-parse", "HEAD")
    out = tmp_path / "job" / "out"
    out.mkdir()
    req = RunRequest("kci-shadow", tmp_path / "job", repo, out, base, head, Slot("cpu0", "cpu", ""), 120)
    res = LocalRunner().run(req, lambda: None, lambda pid: None)
    assert not (tmp_path / "shadowed").exists(), "the checkout's kernalin_ci package ran as the gate"
    assert res.exit_code == 0, res.log_tail  # the real gate ran: no kernel changed, success
    assert json.loads((out / "report.json").read_text())["reason"] == "no kernel changed"


ATTACK = """import os
here = os.path.dirname(os.path.abspath(__file__))
dump = {"env": dict(os.environ), "ppid": os.getppid()}
try:
    dump["parent_environ"] = open(f"/proc/{os.getppid()}/environ", "rb").read().decode("latin-1")
except OSError as e:
    dump["parent_error"] = type(e).__name__
open(os.path.join(os.environ.get("TMPDIR", here), "stolen.json"), "w").write(__import__("json").dumps(dump))
raise ImportError("this kernel only came to look around")
"""
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-5ecret-81",
    "HF_TOKEN": "hf_5ecret82",
    "OPENAI_API_KEY": "sk-5ecret83",
    "GITHUB_TOKEN": "ghs_5ecret84",
}
NOBODY = 65534
# an interpreter uid 65534 may run (the default one may live under /root); its minor version must match
PYTHON = os.environ.get("KERNALIN_TEST_UNPRIVILEGED_PYTHON", sys.executable)


def _as_nobody():
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _nobody_can_run_python() -> bool:
    if os.getuid() != 0:
        return False
    try:
        return subprocess.run([PYTHON, "-c", "pass"], preexec_fn=_as_nobody, capture_output=True).returncode == 0
    except OSError:
        return False


def attack(tmp_path, unprivileged: bool) -> tuple[dict, Path]:
    """`kernalin-ci verify` in a checkout holding the attacker's kernel and a kernalin_ci package,
    with secrets in its environment; what the kernel saw, and the checkout."""
    work = tmp_path / "checkout"
    work.mkdir()
    (work / "kernel.py").write_text(ATTACK)
    shadow_package(work, work)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for d in (tmp_path, work, tmp):
        d.chmod(0o777)
    # KERNALIN_SANDBOX=off: the allowlist and the isolated start must hold without the worker sandbox too
    # (test_worker_sandbox.py); the kernel leaves what it saw in TMPDIR
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp),
        "TMPDIR": str(tmp),
        "KERNALIN_SANDBOX": "off",
        "PYTHONPATH": os.pathsep.join([PACKAGE_ROOT, *(p for p in sys.path if p)]),
        **SECRETS,
    }
    # -P: like the kernalin-ci console script, the command itself does not put the checkout on sys.path
    r = subprocess.run(
        [
            PYTHON if unprivileged else sys.executable,
            "-P",
            "-m",
            "kernalin_ci",
            "verify",
            "--op",
            "kv_append",
            "--entry",
            "kernel.py:append",
            "--device",
            "cpu",
            "--only",
            "dynamic",
            "--quiet",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_as_nobody if unprivileged else None,
    )
    assert not (work / "shadowed").exists(), "the checkout's kernalin_ci/kernel_worker.py ran as the kernel worker"
    assert r.returncode != 0, r.stdout + r.stderr  # the entry could not be loaded: an error, never a pass
    assert (tmp / "stolen.json").exists(), r.stdout + r.stderr  # the kernel did run, in the real worker
    return json.loads((tmp / "stolen.json").read_text()), work


@pytest.fixture
def open_dir():
    """A directory uid 65534 can reach (pytest's tmp_path lies under a root-only directory)."""
    d = Path(tempfile.mkdtemp(prefix="kernalin-hostile-"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_worker_gets_an_allowlisted_environment_and_no_checkout_shadows_it(open_dir):
    stolen, _ = attack(open_dir, unprivileged=False)
    leaked = [k for k in SECRETS if k in stolen["env"]]
    assert leaked == [], leaked


@pytest.mark.skipif(
    not _nobody_can_run_python(),
    reason="needs root and an interpreter uid 65534 can run (KERNALIN_TEST_UNPRIVILEGED_PYTHON)",
)
def test_a_same_uid_kernel_cannot_read_the_parents_environment(open_dir):
    """verify runs as uid 65534, like the attacker's kernel it starts (same uid, as on a real runner).
    The test drops to that uid in preexec_fn: CI runs as root, and root could read any process."""
    stolen, _ = attack(open_dir, unprivileged=True)
    assert stolen.get("parent_error") == "PermissionError", stolen.get("parent_error")
    assert not any(v in stolen.get("parent_environ", "") for v in SECRETS.values())
    assert [k for k in SECRETS if k in stolen["env"]] == []


def test_the_docker_runners_command_never_imports_from_the_checkout(tmp_path):
    """Inside the image the gate starts without -I (the image's own sites stay), so the working
    directory, a checkout with its own runpy.py and kernalin_ci/, must leave sys.path before any import."""
    from kernalin_ci.launch import image_module_argv

    shadow_package(tmp_path, tmp_path)
    (tmp_path / "runpy.py").write_text(SHADOW_MAIN.replace('os.environ["MARKER_DIR"]', repr(str(tmp_path))))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": PACKAGE_ROOT}  # as the image's site-packages would
    r = subprocess.run(
        image_module_argv("kernalin_ci", python=sys.executable) + ["--version"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not (tmp_path / "shadowed").exists()
    assert r.returncode == 0 and r.stdout.startswith("kernalin-ci "), r.stderr
