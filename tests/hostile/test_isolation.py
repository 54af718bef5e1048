"""Issue 29, attack 3: the worker sandbox silently off where it matters most. Before the fix, without
bubblewrap (the runner image and the Action installed none) or with a work folder its uid 65534 cannot read
(a plain `mktemp -d` as root), kernel workers ran unsandboxed, said in one stderr line only: as root, a kernel
read the gate's secrets, wrote into site-packages, reached the host's network. Now:

- in CI (GitHub Actions, a daemon job) a sandbox that cannot be made is a refusal (exit 2, the cause and
  the fixes), before any kernel code runs;
- as root elsewhere, kernel code never runs as root: an unprivileged uid of its own, or that refusal;
- a folder the sandbox's user cannot read is shown to it as a copy, never a reason to skip the sandbox;
- every report says what kernel code ran under (tests/hostile/test_gate_config.py reads it)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kernalin_ci import sandbox

ROOT = os.geteuid() == 0
HAVE_SANDBOX = sandbox.bwrap_works(sandbox.SandboxSettings()) is None

# the kernel reports who it ran as and what it could reach, through the error verify prints
ENTRY = """import getpass, json, os


def entry(q, k, positions):
    got = {"uid": os.getuid(), "token": os.environ.get("GITHUB_TOKEN"), "parent_token": None}
    try:
        got["user"] = getpass.getuser()  # what torch's compile caches ask (the uid has no passwd entry)
    except Exception as e:
        got["user"] = type(e).__name__
    try:
        got["parent_token"] = "KERNALIN-CANARY" in open(f"/proc/{os.getppid()}/environ", "rb").read().decode()
    except OSError as e:
        got["parent_token"] = type(e).__name__
    try:
        open(MARKER, "w").write(str(os.getuid()))
    except OSError:
        pass
    raise RuntimeError("SAW" + json.dumps(got) + "SAW")
"""
CASE = json.dumps(
    {"name": "p", "dims": {"D": 64, "Hq": 2, "Hkv": 1, "T": 2, "positions": [0, 1]}, "dtype": "float32", "seed": 1}
)


def verify(folder: Path, marker: Path, **env) -> tuple[subprocess.CompletedProcess, dict | None]:
    kernel = folder / "kernel.py"
    kernel.write_text(ENTRY.replace("MARKER", repr(str(marker))))
    full = {k: v for k, v in os.environ.items() if not k.startswith(("KERNALIN_", "GITHUB_"))}
    for name in ("USER", "LOGNAME", "LNAME", "USERNAME"):  # as in a container (the GPU runner image sets none)
        full.pop(name, None)
    full.update({"GITHUB_TOKEN": "KERNALIN-CANARY", **env})
    argv = [sys.executable, "-m", "kernalin_ci", "verify", "--op", "rope", "--entry", f"{kernel}:entry"]
    p = subprocess.run(
        [*argv, "--only", "dynamic", "--case", CASE], cwd=folder, env=full, capture_output=True, text=True, timeout=300
    )
    out = p.stdout + p.stderr
    saw = json.loads(out.split("SAW")[1].replace("\\'", "'")) if out.count("SAW") >= 2 else None
    return p, saw


@pytest.fixture
def closed_dir():
    """A work folder as `mktemp -d` makes it: 0700, its owner's only."""
    d = Path(tempfile.mkdtemp(prefix="kernalin-closed-"))
    marker = Path(tempfile.mkdtemp(prefix="kernalin-marker-"))
    marker.chmod(0o777)
    yield d, marker / "ran-as"
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(marker, ignore_errors=True)


@pytest.mark.parametrize("ci", [{"GITHUB_ACTIONS": "true"}, {"KERNALIN_DAEMON_JOB": "kci-test"}])
def test_in_ci_a_sandbox_that_cannot_be_made_is_a_refusal(closed_dir, ci):
    folder, marker = closed_dir
    p, saw = verify(folder, marker, KERNALIN_BWRAP="/nonexistent/bwrap", **ci)
    assert p.returncode == 2, p.stdout + p.stderr
    assert saw is None and not marker.exists()  # no kernel code ran
    (line,) = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert "kernel code cannot be sandboxed: bubblewrap (/nonexistent/bwrap) is not installed" in line
    assert "the worker sandbox is required" in line and "apt-get install bubblewrap" in line
    assert "KERNALIN_SANDBOX=off" in line  # the documented opt-out is named


@pytest.mark.skipif(not ROOT, reason="the case of a gate running as root")
def test_as_root_without_bubblewrap_kernel_code_never_runs_as_root(closed_dir):
    folder, marker = closed_dir
    folder.chmod(0o755)
    p, saw = verify(folder, marker, KERNALIN_BWRAP="/nonexistent/bwrap")
    if sandbox.uid_mode_missing() is None:  # an unprivileged uid of its own
        assert saw is not None and saw["uid"] >= sandbox.UID_BASE, p.stdout + p.stderr
        assert saw["token"] is None and saw["parent_token"] in ("PermissionError", False)
        assert saw["user"] == f"kernalin-{saw['uid']}", saw  # not KeyError: getpwuid() knows no such uid
    else:  # or a refusal that says why and what to do
        assert p.returncode == 2 and saw is None and not marker.exists(), p.stdout + p.stderr
        assert "kernel code would run as root" in p.stderr and "apt-get install bubblewrap" in p.stderr
    # the attack is real: the explicit opt-out runs it as root, and it reads the gate's secret
    p, saw = verify(folder, marker, KERNALIN_BWRAP="/nonexistent/bwrap", KERNALIN_SANDBOX="off")
    assert saw is not None and saw["uid"] == 0 and saw["parent_token"] is True, p.stdout + p.stderr


@pytest.mark.skipif(not (ROOT and HAVE_SANDBOX), reason="bubblewrap as root")
def test_a_folder_the_sandbox_user_cannot_read_is_copied_never_skipped(closed_dir):
    folder, marker = closed_dir
    (folder / ".env").write_text("SECRET=1\n")  # hidden files stay out of the copy
    p, saw = verify(folder, marker)
    assert saw is not None, p.stdout + p.stderr
    assert (
        saw["uid"] == sandbox.SANDBOX_UID
        and saw["token"] is None
        and saw["parent_token"] in ("PermissionError", "FileNotFoundError")
    )
    assert not marker.exists()  # nothing of the host is writable inside
    assert f"{folder.resolve()} is not readable by uid 65534" in p.stderr and "see a copy of it" in p.stderr
    # before the fix: unsandboxed, as root, with the gate's secret in reach
    p, saw = verify(folder, marker, KERNALIN_SANDBOX="off")
    assert saw is not None and saw["uid"] == 0 and saw["parent_token"] is True


def test_the_modes_are_checked():
    p = subprocess.run(
        [sys.executable, "-m", "kernalin_ci", "verify", "--op", "rope", "--entry", "x.py:entry"],
        env={**os.environ, "KERNALIN_SANDBOX": "maybe"},
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "KERNALIN_SANDBOX='maybe': expected one of auto, on, uid, off" in p.stderr
    if not ROOT:
        p = subprocess.run(
            [sys.executable, "-m", "kernalin_ci", "verify", "--op", "rope", "--entry", "x.py:entry"],
            env={**os.environ, "KERNALIN_SANDBOX": "uid"},
            capture_output=True,
            text=True,
        )
        assert p.returncode == 2 and "KERNALIN_SANDBOX=uid: needs root" in p.stderr


PYTHONS = [p for p in (os.path.realpath(sys.executable), "/usr/bin/python3") if os.path.exists(p)]


@pytest.mark.skipif(not (ROOT and shutil.which("setpriv")), reason="KERNALIN_SANDBOX=uid needs root and setpriv")
def test_a_uid_worker_without_a_passwd_entry_still_has_a_user_name(closed_dir):
    """Found on the H100 image (no USER or LOGNAME in the environment): under KERNALIN_SANDBOX=uid the kernel's
    getpass.getuser() (torch's compile caches call it) raised KeyError, as the worker's uid has no passwd entry."""
    from kernalin_ci.sandbox.uid import _reachable, uid_plan

    python = next((p for p in PYTHONS if _reachable(p)), None)
    if python is None:
        pytest.skip("no Python installation an unprivileged uid can read")
    folder, _ = closed_dir
    folder.chmod(0o755)
    plan, env = uid_plan([], str(folder), str(folder), ())
    try:
        p = subprocess.run(
            [*plan.argv_prefix, python, "-c", "import getpass, os; print(os.getuid(), getpass.getuser())"],
            env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=60, cwd=folder,
        )  # fmt: skip
    finally:
        shutil.rmtree(plan.home, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-2000:]
    uid, name = p.stdout.split()
    assert int(uid) >= sandbox.UID_BASE and name == f"kernalin-{uid}", p.stdout + p.stderr


@pytest.mark.skipif(not (ROOT and shutil.which("setpriv")), reason="KERNALIN_SANDBOX=uid needs root and setpriv")
def test_uid_workers_share_the_runs_compile_cache_through_their_own_copies(closed_dir, tmp_path):
    """On the GPU image (no bubblewrap: workers of their own uid) every worker compiled its Triton kernels and
    built its torch extensions again in an empty HOME. Now each gets its own copy of the run's cache and what it
    adds is copied back after it ended: the next worker finds it, plain files only (a link it leaves is not)."""
    from kernalin_ci.sandbox.uid import _reachable, uid_plan
    from kernalin_ci.sandbox.workers import end_worker

    python = next((p for p in PYTHONS if _reachable(p)), None)
    if python is None:
        pytest.skip("no Python installation an unprivileged uid can read")
    folder, _ = closed_dir
    folder.chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)

    def worker(code: str) -> subprocess.CompletedProcess:
        plan, env = uid_plan([], str(folder), str(folder), (), str(cache))
        try:
            return subprocess.run(
                [*plan.argv_prefix, python, "-c", code], env={"PATH": os.environ["PATH"], **env},
                capture_output=True, text=True, timeout=60, cwd=folder,
            )  # fmt: skip
        finally:
            end_worker(plan)

    first = worker(
        "import os; d = os.environ['TRITON_CACHE_DIR']; os.makedirs(d + '/k1'); open(d + '/k1/kernel.bin', 'w')"
        ".write('compiled'); os.symlink('/etc/shadow', d + '/k1/leak')"
    )
    assert first.returncode == 0, first.stderr[-2000:]
    assert (cache / "k1" / "kernel.bin").read_text() == "compiled"
    assert not os.path.lexists(cache / "k1" / "leak")  # a link is never copied back
    second = worker(
        "import os; d = os.environ['TRITON_CACHE_DIR']; print(open(d + '/k1/kernel.bin').read()); "
        "open(d + '/k1/other.bin', 'w').write('x')"  # its copy is its own: it adds to a folder it did not make
    )
    assert second.returncode == 0 and second.stdout.strip() == "compiled", second.stderr[-2000:]
    assert (cache / "k1" / "other.bin").exists()


@pytest.mark.skipif(not (ROOT and shutil.which("setpriv")), reason="KERNALIN_SANDBOX=uid needs root and setpriv")
def test_kill_uid_says_how_many_processes_are_left(closed_dir):
    """end_worker copies a uid worker's cache additions back only when none of its processes is left (one could
    swap a folder for a link while root walks it): kill_uid says how many are left when it gives up."""
    from kernalin_ci.sandbox.uid import kill_uid, uid_plan

    folder, _ = closed_dir
    folder.chmod(0o755)
    plan, env = uid_plan([], str(folder), str(folder), ())
    try:
        proc = subprocess.Popen([*plan.argv_prefix, "/bin/sleep", "60"], env={"PATH": os.environ["PATH"], **env})
        deadline = time.monotonic() + 10
        while kill_uid(plan.limits["uid"], wait_s=0) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # until setpriv has dropped to the uid
        assert kill_uid(plan.limits["uid"], wait_s=0) == 1  # given no time: the sleeper is still there
        assert kill_uid(plan.limits["uid"]) == 0
        proc.wait(10)
    finally:
        shutil.rmtree(plan.home, ignore_errors=True)
