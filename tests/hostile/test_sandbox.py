"""A pull request's code inside a real `kernalin-ci serve` job (the local runner) attacks the host.

The daemon runs as it is deployed: its webhook secret and App key in credential files, its state
(database, other jobs) in its state folder. The attack is code of the pull request: the job's command
runs `attack.py` from the checkout, as the gate runs the PR's kernels. It tries to read the daemon's
environment through /proc, the credential files, the database; to reach a TCP listener on the host's
loopback; to write outside its workspace; to allocate past the memory cap; to fork past the process
cap; and to leave a process behind (a clean environment, a session of its own) that outlives the job,
its timeout, and a `kill -9` of the daemon. Each attack succeeds with `runner.sandbox.enabled: false`
(checked by hand: docs/security.md) and must fail with the sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from kernalin_ci.daemon.app import wait_for
from kernalin_ci.testing.daemon_world import ServeProcess, World, wait_job

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

REPO = "acme/kernels"
ATTACK = r"""
import json, os, socket, subprocess, sys, time
out, plan = sys.argv[1], json.load(open("plan.json"))
found = {"secrets_in_environ": [], "files_read": [], "pids_seen": 0}
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    found["pids_seen"] += 1
    try:
        data = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        continue
    for needle in plan["needles"]:
        if needle.encode() in data:
            found["secrets_in_environ"].append(pid)
for path in plan["files"]:
    try:
        text = open(path, errors="replace").read()
        found["files_read"].append(path) if text else None
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", plan["port"]), timeout=2).sendall(b"escaped")
    found["tcp"] = "connected"
except OSError as e:
    found["tcp"] = str(e)
found["wrote_outside"] = []
for path in plan["write"]:
    try:
        open(path, "w").write("escaped")
        found["wrote_outside"].append(path)
    except OSError:
        pass
mem = subprocess.run([sys.executable, "-c", "b = bytearray(%d); b[::4096] = b'x' * len(b[::4096]); print('ok')"
                      % plan["alloc"]], capture_output=True, text=True)
found["alloc"] = mem.stdout.strip() or f"failed ({mem.returncode})"
procs, forked = [], 0
try:
    for _ in range(plan["forks"]):
        procs.append(subprocess.Popen(["sleep", "30"]))
        forked += 1
except OSError:
    pass
for p in procs:
    p.kill()
    p.wait()
found["forked"] = forked
# a process that outlives the job: clean environment, its own session, double fork
subprocess.Popen(["setsid", "env", "-i", sys.executable, "-c",
                  "import time, sys; time.sleep(600)", plan["marker"]], start_new_session=True)
for name in ("HOME", "TMPDIR"):  # its own scratch space works (Triton caches compiled kernels in HOME)
    try:
        os.makedirs(os.path.join(os.environ[name], "scratch", "x"))
        found[name] = "writable"
    except OSError as e:
        found[name] = str(e)
json.dump(found, open(os.path.join(out, "attack.json"), "w"))
print("attack done", flush=True)
time.sleep(plan.get("linger", 0))
"""


def host_processes_with(marker: str) -> list[int]:
    """PIDs on the host whose command line carries MARKER (what an escaped process would show)."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry.name}/cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


@pytest.fixture
def listener():
    """A TCP listener on the host's loopback; records whether anything connected."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    got = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                got.append(conn.recv(64))
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1], got
    stop.set()
    t.join(2)
    srv.close()


@pytest.fixture
def deployment(tmp_path, github_standin):
    """A world with one repository and a daemon whose secrets live in credential files. The files sit
    inside a folder the sandbox binds read-only (this checkout, where kernalin_ci is imported from), so
    only the sandbox's masks keep them out of reach."""
    import kernalin_ci

    world = World(tmp_path / "world", github_standin).start()
    world.add_repo(REPO, {".kernalin.yml": "version: 1\nkernels: []\n"})
    root = Path(kernalin_ci.__file__).resolve().parents[1]
    creds = root / ".cache" / f"hostile-credentials-{os.getpid()}-{time.time_ns()}"
    creds.mkdir(parents=True, mode=0o700)
    (creds / "webhook-secret").write_text(world.secret_env()["KERNALIN_WEBHOOK_SECRET"])
    (creds / "app-key.pem").write_text(world.private_key)
    for f in creds.iterdir():
        f.chmod(0o600)
    procs = []

    def start(timeout_s: float = 120) -> ServeProcess:
        cfg = world.daemon_config(
            tmp_path / "state",
            runner={
                "command": ["{python}", "attack.py", "{out}"],
                "timeout_s": timeout_s,
                "sandbox": {"memory": "512m", "pids": 64, "tmpfs_size": "64m"},
            },
        )
        p = ServeProcess(
            world,
            cfg,
            extra_env={
                "KERNALIN_WEBHOOK_SECRET_FILE": str(creds / "webhook-secret"),
                "KERNALIN_GITHUB_APP_PRIVATE_KEY_PATH": str(creds / "app-key.pem"),
                "KERNALIN_WEBHOOK_SECRET": "",
                "KERNALIN_GITHUB_APP_PRIVATE_KEY": "",
            },
        )
        procs.append(p.start())
        return p

    yield world, creds, start
    for p in procs:
        p.stop()
    shutil.rmtree(creds, ignore_errors=True)
    world.stop()


def attack_plan(world, tmp_path, port: int, creds: Path, marker: str, linger: float = 0) -> dict:
    state = tmp_path / "state"
    return {
        "needles": [world.private_key.splitlines()[1], "KERNALIN_WEBHOOK_SECRET_FILE", "PRIVATE KEY"],
        "files": [str(creds / "webhook-secret"), str(creds / "app-key.pem"), str(state / "jobs.sqlite3")],
        "write": [str(tmp_path / "escaped.txt"), str(state / "escaped.txt"), str(creds / "escaped.txt")],
        "port": port,
        "alloc": 1 << 30,
        "forks": 200,
        "marker": marker,
        "linger": linger,
    }


def push_attack(world, plan: dict, action: str = "opened") -> dict:
    repo = world.repos[REPO]
    head = repo.commit({"attack.py": ATTACK, "plan.json": json.dumps(plan)}, "a faster kernel", branch="pr-1")
    return world.pull_request(REPO, 1, head, repo.main, action=action)


def test_a_pull_requests_code_reaches_nothing_on_the_host(deployment, listener, tmp_path):
    world, creds, start = deployment
    port, connections = listener
    marker = f"kernalin-hostile-{os.getpid()}-{time.time_ns()}"
    d = start()
    plan = attack_plan(world, tmp_path, port, creds, marker)
    status, answer = d.deliver("pull_request", push_attack(world, plan))
    assert status == 202
    job = wait_job(d.get, answer["jobs"][0], posted=False)
    found = json.loads((tmp_path / "state" / "jobs" / job["id"] / "out" / "attack.json").read_text())
    assert found["secrets_in_environ"] == [] and found["files_read"] == []
    assert found["pids_seen"] < 10  # its own PID namespace: not the daemon, not the host
    assert found["tcp"] != "connected" and connections == []
    assert not any(Path(p).exists() for p in plan["write"])  # what it wrote stayed in its own tmpfs
    assert found["alloc"] != "ok"  # 1 GiB against a 512 MiB cap
    assert found["forked"] < 64  # the process cap
    assert found["HOME"] == "writable" and found["TMPDIR"] == "writable"  # and the job can still work
    assert wait_for(lambda: not host_processes_with(marker), 10), "a process outlived its job"
    log = (tmp_path / "state" / "jobs" / job["id"] / "job.log").read_text()
    assert "sandbox: bubblewrap" in log and "memory 512 MiB, 64 processes" in log


def test_nothing_outlives_a_kill_9_of_the_daemon_or_a_timeout(deployment, listener, tmp_path):
    world, creds, start = deployment
    port, _ = listener
    marker = f"kernalin-hostile-{os.getpid()}-{time.time_ns()}"
    d = start()
    d.deliver("pull_request", push_attack(world, attack_plan(world, tmp_path, port, creds, marker, linger=120)))
    assert wait_for(lambda: host_processes_with(marker), 60), "the attack did not start"
    d.kill9_daemon_only()
    assert wait_for(lambda: not host_processes_with(marker), 10), "a process outlived the daemon"

    d = start(timeout_s=8)  # the restarted daemon runs the job again, now with a short time limit
    assert wait_for(lambda: host_processes_with(marker), 60), "the attack did not start again"
    assert wait_for(lambda: not host_processes_with(marker), 30), "a process outlived its job's timeout"
