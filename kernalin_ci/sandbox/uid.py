"""What a user with no claim on a path can read (the sandbox's uid 65534 as root, a worker of its own uid),
and KERNALIN_SANDBOX=uid: a kernel worker as an unprivileged uid of its own, without namespaces
(`uid_plan`, `kill_uid`)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import kernalin_ci
from kernalin_ci.sandbox.bwrap import Plan
from kernalin_ci.sandbox.capped import CappedFolder, copy_new
from kernalin_ci.sandbox.options import ENV_WORKER_SANDBOX, SandboxError, worker_disk

UID_BASE = 0x2A000000  # KERNALIN_SANDBOX=uid: each worker gets a uid of its own from here (no passwd entry)
_uids = itertools.count(1)  # next() is atomic: workers start from several threads at once


def uid_mode_missing() -> str | None:
    """Why workers cannot run as an unprivileged uid of their own here (None: they can)."""
    if os.geteuid() != 0:
        return f"needs root (kernalin-ci runs as uid {os.geteuid()})"
    if not shutil.which("setpriv"):
        return "setpriv (util-linux) is not installed"
    closed = next((p for p in _interpreter_paths() if not _reachable(p)), None)
    if closed:
        return f"the Python installation ({closed}) is not readable by other users"
    return None


def _interpreter_paths() -> list[str]:

    return [os.path.realpath(sys.executable), os.path.dirname(os.path.realpath(kernalin_ci.__file__))]


def _reachable(path: str) -> bool:
    """Whether a user with no claim on PATH reaches and reads it through its real path (every folder on
    the way searchable by others, PATH itself readable)."""
    real = os.path.realpath(path)
    parts = Path(real).parents
    return all(_searchable(str(p)) for p in parts) and others_can_read(real)


def _searchable(folder: str) -> bool:
    try:
        return bool(os.stat(folder).st_mode & 0o001)
    except OSError:
        return False


def others_can_read(path: str) -> bool:
    """Whether a user with no claim on PATH can read it (o+r, and o+x for a folder). The folders above a
    bound path are the sandbox's own (0755) unless bound themselves, when they are checked too."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return bool(st.st_mode & 0o004) and (not os.path.isdir(path) or bool(st.st_mode & 0o001))


def uid_plan(
    readonly: list[str], workdir: str, here: str, writable: tuple[CappedFolder, ...], cache: str | None = None
) -> tuple[Plan, dict]:
    """KERNALIN_SANDBOX=uid: the worker as a uid of its own (UID_BASE + n, no passwd entry) through setpriv,
    in a session of its own, killed with its parent. It reads what every user may read, writes only its
    own HOME/TMPDIR and its results folders (handed to its uid), and `end_worker` kills every process of
    its uid. No namespaces: it sees the network and the host's processes, and its disk is not capped.
    CACHE: the run's compile cache its workers of the same code share (workers.compile_cache): the worker
    gets a copy of it in its HOME (TRITON_CACHE_DIR), its own, and after it ended the plain files it added
    are copied back (`harvest_cache`), as the bubblewrap sandbox's tmpfs copy is."""
    closed = [p for p in [*readonly, workdir] if not _reachable(p)]
    if closed:
        raise SandboxError(
            f"{ENV_WORKER_SANDBOX}=uid: {closed[0]} is not readable by an unprivileged uid (every folder above it "
            f"must be searchable by others): make it readable, or install bubblewrap"
        )
    uid = UID_BASE + (os.getpid() % 4096) * 4096 + next(_uids) % 4096
    home = tempfile.mkdtemp(prefix="kernalin-uid-")
    os.chmod(home, 0o700)
    os.chown(home, uid, uid)
    for f in writable:
        os.chown(f.path, uid, uid)
        os.chmod(f.path, 0o700)
    setpriv = shutil.which("setpriv")
    argv = [setpriv, "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "--pdeathsig", "KILL", "--"]
    limits: dict = {"uid": uid, "network": "host", "home": home}
    compiled = f"{home}/.triton"
    if cache is not None:
        compiled = _seed(cache, home, uid)
        limits["cache"] = (compiled, cache)
    plan = Plan(argv, None, limits, [], home=home, tmp=home)
    # the uid has no passwd entry: name it, or getpass.getuser() (torch's compile caches) raises KeyError
    name = f"kernalin-{uid}"
    env = {"HOME": home, "TMPDIR": home, "XDG_CACHE_HOME": f"{home}/.cache", "TRITON_CACHE_DIR": compiled,
           "USER": name, "LOGNAME": name}  # fmt: skip
    return plan, env


def _seed(cache: str, home: str, uid: int) -> str:
    """HOME/compiled: a copy of CACHE's plain files (never a link), every part of it the worker uid's."""
    path = os.path.join(home, "compiled")
    os.mkdir(path, 0o700)
    copy_new(cache, path, worker_disk(), dir_mode=0o700, file_mode=0o600)
    for folder, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(folder, name), uid, uid)
    os.chown(path, uid, uid)
    return path


def _zombie(proc: str) -> bool:
    """Whether the process at /proc/PID has ended and waits for its parent to reap it (it runs nothing)."""
    with open(f"{proc}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"


def harvest_cache(plan: Plan) -> int:
    """After a uid worker ended, every process of its uid killed (`kill_uid` returned 0: none left to swap a
    folder for a link while root walks it): copy the plain files it added to its copy of the run's compile
    cache back to that cache (never a link, never over a file there); the bytes."""
    pair = plan.limits.get("cache")
    if not pair:
        return 0
    compiled, cache = pair
    return copy_new(compiled, cache, worker_disk(), dir_mode=0o700, file_mode=0o600)


def kill_uid(uid: int, wait_s: float = 5.0) -> int:
    """SIGKILL every process of UID until none is left, for at most WAIT_S; how many are left (0: none; an
    ended process not yet reaped by its parent is not counted)."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if os.stat(entry.path).st_uid == uid and not _zombie(entry.path):
                        pids.append(int(entry.name))
                except OSError:
                    continue
        if not pids or time.monotonic() > deadline:
            return len(pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
