"""Issue 13, attacks 2, 7 and 8 under `kernalin-ci verify` (and so the Action and `bench`): the kernel
worker runs in a bubblewrap sandbox (kernalin_ci/sandbox.py:worker_plan).

A kernel entry tries, from inside the worker: to read a credential file of the user running the gate,
to see the gate's processes, to reach a TCP listener on the host, and to leave a process behind. It
raises with what it got, so verify prints it. With KERNALIN_SANDBOX=off (the code before the fix) every
attempt succeeds; with the sandbox none does."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

ENTRY = """import json, os, socket, subprocess


def entry(q, k, positions):
    got = {}
    try:
        got["secret"] = open(SECRET).read()
    except OSError as e:
        got["secret"] = type(e).__name__
    got["processes"] = len([d for d in os.listdir("/proc") if d.isdigit()])
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=3).close()
        got["network"] = "connected"
    except OSError as e:
        got["network"] = type(e).__name__
    subprocess.Popen(["sleep", LINGER], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raise RuntimeError("ATTACK" + json.dumps(got) + "ATTACK")
"""


def _lingering(tag: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", tag.encode()]:
                    pids.append(int(d))
        except (OSError, ValueError):
            continue
    return pids


@pytest.fixture
def listener():
    srv = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            accepted.append(1)
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1], accepted
    srv.close()


@pytest.fixture
def open_dir():
    """A folder the sandbox's uid 65534 can read (pytest's tmp_path lies under a root-only folder)."""
    d = Path(tempfile.mkdtemp(prefix="kernalin-hostile-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_kernel_reads_no_credential_sees_no_process_reaches_no_host_and_leaves_nothing(open_dir, listener, mode):
    tmp_path = open_dir
    port, accepted = listener
    home = tmp_path.parent / f"{tmp_path.name}-home"  # beside the checkout, as a user's HOME is
    (home / ".aws").mkdir(parents=True)
    secret = home / ".aws" / "credentials"
    secret.write_text("aws_secret_access_key = KERNALIN-TEST-SECRET\n")
    os.chmod(home, 0o755), os.chmod(home / ".aws", 0o755), os.chmod(secret, 0o644)  # readable by any uid
    tag = f"{3000 + os.getpid() % 1000 + (mode == 'off')}"
    kernel = tmp_path / "evil.py"
    kernel.write_text(
        ENTRY.replace("SECRET", repr(str(secret))).replace("PORT", str(port)).replace("LINGER", repr(tag))
    )
    case = json.dumps(
        {
            "name": "p",
            "dims": {"D": 64, "Hq": 2, "Hkv": 1, "T": 3, "positions": [0, 1, 2]},
            "dtype": "float32",
            "seed": 1,
        }
    )
    env = dict(os.environ, HOME=str(home), KERNALIN_SANDBOX=mode)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernalin_ci",
            "verify",
            "--op",
            "rope",
            "--entry",
            f"{kernel}:entry",
            "--only",
            "dynamic",
            "--case",
            case,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    time.sleep(0.5)
    left = _lingering(tag)
    for pid in left:
        os.kill(pid, 9)
    shutil.rmtree(home, ignore_errors=True)
    out = p.stdout + p.stderr
    assert "ATTACK" in out, out[-3000:]
    got = json.loads(out.split("ATTACK")[1].replace("\\'", "'"))
    if mode == "off":  # the attacks are real: without the sandbox each one works
        assert got["secret"].startswith("aws_secret") and got["network"] == "connected" and left
        return
    assert got["secret"] == "FileNotFoundError"
    assert got["processes"] <= 3, got  # its own PID namespace: the worker and what it started
    assert got["network"] != "connected" and not accepted
    assert left == [], "a process the kernel started outlived its worker"
    assert p.returncode == 1


def test_workers_started_at_once_get_a_cgroup_each(open_dir, monkeypatch):
    """Dynamic shards and the structural worker start from several threads at once; each must get its own
    cgroup, since the end of a worker kills everything in its cgroup (two sharing one: SIGKILL)."""
    from concurrent.futures import ThreadPoolExecutor

    from kernalin_ci import sandbox

    monkeypatch.setenv(sandbox.ENV_WORKER_SANDBOX, "on")
    tmp_path = open_dir
    work = [tmp_path / f"w{i}" for i in range(16)]
    for w in work:
        w.mkdir()
    with ThreadPoolExecutor(16) as pool:
        plans = list(pool.map(lambda w: sandbox.worker_plan({}, "cpu", str(w), str(tmp_path))[0], work))
    try:
        groups = [tuple(p.limits["cgroup"]) for p in plans]
        if not any(groups):
            pytest.skip("no cgroup can be made here")
        assert len(set(groups)) == len(groups)
    finally:
        for p in plans:
            sandbox.end_worker(p)


def _in_worker(plan, env: dict, script: str) -> subprocess.CompletedProcess:
    """Run SCRIPT in PLAN's worker sandbox as a kernel worker is run (its capped folders attached, the
    Triton cache among them), then end it as the gate does (which copies its new cache files back)."""
    from kernalin_ci import sandbox

    proc, why = sandbox.start(
        plan,
        [sys.executable, "-c", script],
        env=dict(os.environ, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert why is None, why
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        sandbox.end_worker(plan)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_workers_of_the_same_code_share_a_compile_cache_and_other_code_gets_its_own(open_dir, monkeypatch):
    """Workers of one run that see the same files share a Triton cache (compiled once per run, not once
    per worker: seconds each on a GPU); a worker that sees other files (the other side of a pull request)
    cannot read or write that cache."""
    from kernalin_ci import sandbox

    monkeypatch.setenv(sandbox.ENV_WORKER_SANDBOX, "on")
    base, head = open_dir / "base", open_dir / "head"
    for d in (base, head):
        d.mkdir()
        d.chmod(0o755)
    (head / "entry.py").write_text("def entry(): pass\n")
    job = {"entry": f"{head / 'entry.py'}:entry"}
    plans = []
    try:
        work = [open_dir / f"w{i}" for i in range(3)]
        for w in work:
            w.mkdir()
        p1, env1 = sandbox.worker_plan(job, "cpu", str(work[0]), str(head))
        p2, env2 = sandbox.worker_plan(job, "cpu", str(work[1]), str(head))
        p3, env3 = sandbox.worker_plan({}, "cpu", str(work[2]), str(base))
        plans += [p1, p2, p3]
        assert env1["TRITON_CACHE_DIR"] == env2["TRITON_CACHE_DIR"] != env3["TRITON_CACHE_DIR"]
        write = "import os; open(os.path.join(os.environ['TRITON_CACHE_DIR'], 'stub.so'), 'w').write('x')"
        r = _in_worker(p1, env1, write)
        assert r.returncode == 0, r.stderr
        r = _in_worker(p2, env2, "import os; print(os.path.exists(os.environ['TRITON_CACHE_DIR'] + '/stub.so'))")
        assert r.stdout.strip() == "True", r.stderr
        other = os.path.join(env1["TRITON_CACHE_DIR"], "stub.so")
        r = _in_worker(p3, env3, f"import os; print(os.path.exists({other!r}))")
        assert r.stdout.strip() == "False", r.stderr  # the head's cache does not exist in the base's worker
    finally:
        for p in plans:
            sandbox.end_worker(p)


BYTECODE_ENTRY = """import json, os, sys

import torch


def entry(q, k, positions):
    cached = torch.__spec__.cached or ""
    got = {"prefix": sys.pycache_prefix, "cached": cached, "exists": os.path.exists(cached)}
    plant = os.path.join(sys.pycache_prefix or "/nonexistent", "planted.pyc")
    for name, path in (("plant", plant), ("overwrite", cached)):
        try:
            with open(path, "ab") as f:
                f.write(b"x")
            got[name] = "written"
        except OSError as e:
            got[name] = type(e).__name__
    raise RuntimeError("ATTACK" + json.dumps(got) + "ATTACK")
"""


def test_a_sandboxed_worker_reads_torch_from_bytecode_it_cannot_change(open_dir):
    """The sandbox cannot write .pyc files into the Python installation; where it has none, every worker
    compiled torch from source (3 s per worker on the H200). The parent compiles a worker's imports once
    into its bytecode cache (kernalin_ci/bytecode.py) and the worker reads them there, read-only: a
    kernel can neither plant bytecode nor change what the next worker imports."""
    cache = open_dir / "bytecode"
    kernel = open_dir / "probe.py"
    kernel.write_text(BYTECODE_ENTRY)
    dims = {"D": 64, "Hq": 2, "Hkv": 1, "T": 3, "positions": [0, 1, 2]}
    case = json.dumps({"name": "p", "dims": dims, "dtype": "float32", "seed": 1})
    env = dict(os.environ, KERNALIN_SANDBOX="on", KERNALIN_BYTECODE_CACHE=str(cache))
    argv = [sys.executable, "-m", "kernalin_ci", "verify", "--op", "rope", "--entry", f"{kernel}:entry"]
    argv += ["--only", "dynamic", "--case", case]
    p = subprocess.run(argv, cwd=open_dir, env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert "ATTACK" in out, out[-3000:]
    got = json.loads(out.split("ATTACK")[1].replace("\\'", "'"))
    assert got["prefix"] == str(cache), got
    assert got["cached"].startswith(str(cache) + os.sep) and got["exists"], got  # compiled before the worker ran
    assert got["plant"] != "written" and got["overwrite"] != "written", got
    assert not (cache / "planted.pyc").exists()
    assert "compiling the kernel workers' bytecode" in p.stderr
    again = subprocess.run(argv, cwd=open_dir, env=env, capture_output=True, text=True, timeout=300)
    assert "ATTACK" in again.stdout + again.stderr and "compiling" not in again.stderr  # once per installation


def test_no_bytecode_cache_when_it_is_off(open_dir, monkeypatch):
    from kernalin_ci import bytecode, sandbox

    monkeypatch.setenv(sandbox.ENV_WORKER_SANDBOX, "on")
    monkeypatch.setenv(bytecode.ENV, "off")
    plan, _ = sandbox.worker_plan({}, "cpu", str(open_dir), str(open_dir))
    try:
        assert plan is not None and plan.pycache is None
    finally:
        sandbox.end_worker(plan)
