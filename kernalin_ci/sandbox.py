"""The local runner's sandbox: a pull request's code runs where it can reach nothing it could misuse.

A job runs under bubblewrap (`bwrap`) with

- its own user, PID, network, IPC, UTS and cgroup namespaces: it sees only its own processes (no
  /proc/<daemon pid>/environ), has no network but its own loopback, and when the sandbox's PID 1 ends
  (the job ended, or the daemon died: `--die-with-parent`) the kernel kills everything left in it;
- an allowlisted file system: the system (/usr, /etc, /opt; read-only), the Python installation and
  the kernalin_ci package (read-only); for a daemon's job one disk cap holds everything it writes: a
  size-capped tmpfs for its checkout (copied in from a read-only bind), out/, HOME and /tmp, and the
  rest of the cap for /dev/shm (`shm_share`), nothing of the host is writable; a kernel worker gets size-capped tmpfs
  for HOME, /tmp, /dev/shm and each folder it hands results back in (CappedFolder), nothing of the
  host writable either. bwrap's own root and /dev are read-only. The daemon's state folder (database,
  other jobs) and the credential files it reads are never bound, so nothing there exists inside;
- when the daemon runs as root, an unprivileged uid (`runner.sandbox.user`, default 65534) outside the
  namespace too, so even a file bound by mistake is read with no privilege;
- a cgroup per job with a memory and a process cap, where the daemon may create cgroups (root, or a
  systemd unit with `Delegate=yes`); a job's cgroup is also how a restarted daemon finds and kills
  anything a previous run left behind.

`prepare()` returns how to start the job (argv prefix, a pre-exec hook that joins the cgroup and drops
the uid) and the limits actually in force; what could not be enforced is stated, never skipped silently.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kernalin_ci import bytecode
from kernalin_ci.cuda import caches as cuda_caches
from kernalin_ci.errors import UsageError
from kernalin_ci.trust import BUBBLEWRAP, NONE, UID, Isolation

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAME = "kernalin-ci"
SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# read-only system folders bound into the sandbox when they exist (the rest of / is not there)
SYSTEM_RO = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# GPU device nodes: /dev in the sandbox is a fresh minimal one, these are added to it
JOB_DIR = "/job"  # prepare(disk=...): the job's capped tmpfs inside the sandbox
CHECKOUT_DIR = "/checkout"  # prepare(checkout=...): the host's checkout, read-only, copied into JOB_DIR
SHM_SHARE_MAX = 64 << 20  # a daemon job's /dev/shm: this much of its disk cap at most (Docker's own default size)
GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


class SandboxError(UsageError):
    """The sandbox cannot be set up as configured (bwrap missing, bad size): a configuration error."""


def parse_size(text: str) -> int:
    s = str(text).strip().lower().removesuffix("b").removesuffix("i")
    unit = s[-1] if s and s[-1] in SIZE_UNITS else ""
    num = s[: len(s) - len(unit)]
    try:
        value = float(num)
    except ValueError:
        raise SandboxError(f"not a size: {text!r} (e.g. 16g, 512m)") from None
    if value <= 0:
        raise SandboxError(f"a size must be positive: {text!r}")
    return int(value * SIZE_UNITS[unit])


def size_text(n: int) -> str:
    """N bytes for a message: '4 MiB', '8 GiB', '1500 bytes'."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit and n % (unit // 16) == 0:
            return f"{n / unit:g} {name}"
    return f"{n} bytes"


@dataclass
class SandboxSettings:
    enabled: bool = True
    memory: str = "16g"  # the job's cgroup: RAM (and its tmpfs pages)
    pids: int = 4096  # the job's cgroup: processes and threads
    tmpfs_size: str = "8g"  # HOME and /tmp inside the sandbox, each
    user: str = "65534:65534"  # uid:gid the job runs as when the daemon is root
    bwrap: str = "bwrap"  # the bubblewrap binary (a name on PATH or a path)
    extra_ro: list[str] = field(default_factory=list)  # more read-only paths (a CUDA toolkit elsewhere)


# ------------------------------------------------------------------ cgroups


def _cgroup_v2() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").exists()


def _cgroup_dirs(job_id: str) -> list[Path]:
    """The job's cgroup folders: one on cgroup v2, one per controller (memory, pids) on v1."""
    if _cgroup_v2():
        return [CGROUP_ROOT / CGROUP_NAME / f"job-{job_id}"]
    return [CGROUP_ROOT / c / CGROUP_NAME / f"job-{job_id}" for c in ("memory", "pids")]


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def create_cgroup(job_id: str, memory: int, pids: int) -> tuple[list[Path], str | None]:
    """The job's cgroup folders with their limits, or ([], why not)."""
    dirs = _cgroup_dirs(job_id)
    try:
        if _cgroup_v2():
            parent = dirs[0].parent
            parent.mkdir(exist_ok=True)
            try:  # let the parent hand memory and pids to its children
                _write(parent / "cgroup.subtree_control", "+memory +pids")
            except OSError:
                pass
            dirs[0].mkdir(exist_ok=True)
            _write(dirs[0] / "memory.max", str(memory))
            if (dirs[0] / "memory.swap.max").exists():
                _write(dirs[0] / "memory.swap.max", "0")
            _write(dirs[0] / "pids.max", str(pids))
        else:
            mem, pid = dirs
            for d in dirs:
                d.parent.mkdir(exist_ok=True)
                d.mkdir(exist_ok=True)
            _write(mem / "memory.limit_in_bytes", str(memory))
            if (mem / "memory.memsw.limit_in_bytes").exists():
                try:
                    _write(mem / "memory.memsw.limit_in_bytes", str(memory))
                except OSError:
                    pass
            _write(pid / "pids.max", str(pids))
    except OSError as e:
        remove_cgroup(job_id)
        return [], f"cannot create the job's cgroup under {CGROUP_ROOT}: {e.strerror or e}"
    return dirs, None


def cgroup_pids(job_id: str) -> list[int]:
    out: set[int] = set()
    for d in _cgroup_dirs(job_id):
        try:
            with open(d / "cgroup.procs") as f:
                out.update(int(x) for x in f.read().split())
        except OSError:
            continue
    return sorted(out)


def kill_cgroup(job_id: str, wait_s: float = 5.0) -> int:
    """SIGKILL everything in the job's cgroup until it is empty; how many processes there were."""
    seen: set[int] = set()
    deadline = time.monotonic() + wait_s
    while True:
        pids = cgroup_pids(job_id)
        if not pids:
            return len(seen)
        for p in pids:
            seen.add(p)
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return len(seen)
        time.sleep(0.02)


def remove_cgroup(job_id: str) -> None:
    for d in _cgroup_dirs(job_id):
        try:
            d.rmdir()
        except OSError:
            pass


def oom_killed(job_id: str) -> bool:
    """Whether the job's cgroup hit its memory cap (read before remove_cgroup)."""
    for d in _cgroup_dirs(job_id):
        for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
            try:
                with open(d / name) as f:
                    for line in f:
                        k, _, v = line.partition(" ")
                        if k == key and int(v) > 0:
                            return True
            except (OSError, ValueError):
                continue
    return False


# ------------------------------------------------------------------ the bwrap command


def _user(text: str) -> tuple[int, int]:
    uid, _, gid = str(text).partition(":")
    try:
        return int(uid), int(gid or uid)
    except ValueError:
        raise SandboxError(f"runner.sandbox.user: expected uid[:gid], got {text!r}") from None


def _python_paths() -> list[str]:
    """The Python installation and the kernalin_ci package, wherever they live."""
    import kernalin_ci

    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(kernalin_ci.__file__)))}
    paths |= {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    return sorted(p for p in paths if p and p != "/")


@dataclass
class Plan:
    argv_prefix: list[str]  # bwrap ... --   (the job's argv follows)
    preexec: object  # callable run in the child before exec (joins the cgroup, drops the uid)
    limits: dict  # what is in force: memory, pids, tmpfs, user, cgroup
    not_enforced: list[str]  # what could not be enforced, and why
    home: str = "/sandbox/home"
    tmp: str = "/tmp"
    job: str | None = None  # the job's capped tmpfs (prepare(disk=...))
    folders: list = field(default_factory=list)  # a kernel worker's CappedFolders (worker_plan): its parent
    # attaches them before the worker runs (Handshake) and end_worker copies back what it added to shared ones
    pycache: str | None = None  # a kernel worker's `-X pycache_prefix` (worker_plan: kernalin_ci/bytecode.py)


def prepare(
    settings: SandboxSettings,
    job_id: str,
    writable: list[Path],
    gpu_devices: list[str],
    hide: list[str] = (),
    *,
    disk: int | None = None,
    checkout: Path | None = None,
    capped: list[tuple[str, int]] = (),
    copies: list[tuple[str, str]] = (),
    proc: list[str] | None = None,
) -> Plan:
    """How to start job JOB_ID inside the sandbox. WRITABLE are bound read-write at the same paths;
    HIDE (the daemon's state folder, its secret files) are masked wherever a bound folder holds them.

    With DISK (the daemon's jobs), nothing of the host is writable and the job writes at most DISK bytes
    in all: its files live on one tmpfs at JOB_DIR (/job: HOME, TMPDIR and the copy of the CHECKOUT,
    bound read-only at CHECKOUT_DIR, go there; /tmp is a relative link to JOB_DIR/tmp, so a read-only
    path under /tmp, a Python installation, is bound inside it), and /dev/shm, which POSIX shared
    memory needs as a file system of its own, is a tmpfs of `shm_share(DISK)`; JOB_DIR gets the rest.
    CAPPED ((path, bytes)): a tmpfs of its own at each path (a kernel worker's results: CappedFolder),
    nothing of the host's.
    COPIES ((source, path)): SOURCE bound read-only at PATH (a readable copy of a folder the job's uid cannot
    read: `_staged`). PROC: how /proc is made (default a fresh one of the sandbox's own PID namespace;
    inside another sandbox, where no fresh one can be mounted, that sandbox's /proc, and its PID namespace
    with it: CUDA reads and writes /proc/<its pid>, which must be its own: `_bwrap_works`). Its other
    processes are out of reach all the same: the worker has no capability in their user namespace, and the
    gate is non-dumpable; /proc/sys stays covered read-only as the enclosing sandbox made it.)"""
    bwrap = shutil.which(settings.bwrap) if os.sep not in settings.bwrap else settings.bwrap
    if not bwrap or not os.access(bwrap, os.X_OK):
        raise SandboxError(
            f"bubblewrap ({settings.bwrap!r}) is not installed: install it (Debian/Ubuntu: "
            f"apt-get install bubblewrap) or set runner.sandbox.enabled: false (unsafe for "
            f"untrusted pull requests)"
        )
    memory, tmpfs = parse_size(settings.memory), parse_size(settings.tmpfs_size)
    not_enforced: list[str] = []
    ro = [p for p in _python_paths() + list(settings.extra_ro) if os.path.exists(p)]
    root = os.geteuid() == 0
    setpriv = shutil.which("setpriv") if root else None
    if root:
        # bwrap sets the sandbox up as root (so it can bind a Python installation under /root), with
        # no user namespace; the job then drops to an unprivileged uid for real, on the host too
        uid, gid = _user(settings.user)
        argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if proc is not None and proc[0] != "--proc":  # inside another sandbox: its PID namespace (below)
            argv.remove("--unshare-pid")
        if setpriv:
            argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            for p in [*writable, *([checkout] if checkout else [])]:  # the job's own files, owned by its uid
                for dirpath, dirnames, filenames in os.walk(p):
                    for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                        try:
                            os.lchown(name, uid, gid)
                        except OSError:
                            pass
        else:
            not_enforced.append(
                "an unprivileged uid: setpriv (util-linux) is not installed, the job keeps uid 0 without capabilities"
            )
            uid, gid = 0, 0
    else:  # an unprivileged daemon: a user namespace, the job's uid is the daemon's outside it
        uid, gid = os.geteuid(), os.getegid()
        argv = [bwrap, "--unshare-all"]
        if proc is not None and proc[0] != "--proc":  # inside another sandbox: its PID namespace (below)
            argv = [bwrap, "--unshare-user", "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    argv += ["--die-with-parent", "--new-session"]
    cg_dirs, why = create_cgroup(job_id, memory, settings.pids)
    if why:
        not_enforced.append(f"memory and process caps: {why}")
    for p in SYSTEM_RO:
        if os.path.islink(p):
            argv += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            argv += ["--ro-bind", p, p]
    argv += [*(proc or ["--proc", "/proc"]), "--dev", "/dev"]
    for dev in gpu_devices:
        if os.path.exists(dev):
            argv += ["--dev-bind", dev, dev]
    # the job's own scratch space, writable by its uid (every process in the sandbox is the job's); /dev/shm
    # too (POSIX shared memory: a profiler and its injected library talk through it)
    shm = shm_share(disk) if disk is not None else tmpfs
    argv += ["--perms", "1777", "--size", str(shm), "--tmpfs", "/dev/shm"]
    if disk is not None:
        # relative: bubblewrap follows it when it binds a read-only path under /tmp (a Python installation)
        argv += ["--perms", "1777", "--size", str(disk - shm), "--tmpfs", JOB_DIR, "--chdir", JOB_DIR]
        argv += ["--perms", "1777", "--dir", f"{JOB_DIR}/tmp", "--symlink", f"{JOB_DIR.lstrip('/')}/tmp", "/tmp"]
        if checkout is not None:
            argv += ["--ro-bind", str(checkout), CHECKOUT_DIR]
    else:
        argv += [
            "--perms",
            "1777",
            "--size",
            str(tmpfs),
            "--tmpfs",
            "/tmp",
            "--perms",
            "0755",
            "--size",
            str(tmpfs),
            "--tmpfs",
            "/sandbox",
            "--perms",
            "0777",
            "--dir",
            "/sandbox/home",
        ]
    made: set[str] = {"/tmp"} if disk is not None else set()  # /tmp: the link made above, left as it is

    def parents(p, bound) -> list[str]:
        # the folders above a bind exist only in the sandbox's tmpfs: make them searchable by the job's uid
        # (bwrap would copy the host's modes: a 0700 /root or state folder would lock the job out)
        out = []
        for a in map(str, reversed(Path(p).parents)):
            if a != "/" and a not in made and not any(_inside(a, b) for b in bound):
                out += ["--perms", "0755", "--dir", a]
                made.add(a)
        return out

    bound: tuple[str, ...] = SYSTEM_RO
    # after /tmp (a Python installation may live under it); a folder before what lies inside it, so that a
    # copy (which leaves hidden entries out) never covers a bind inside it (a checkout's .venv)
    for source, p in sorted([*((p, p) for p in ro), *copies], key=lambda sp: Path(sp[1]).parts):
        argv += [*parents(p, bound), "--ro-bind", source, p]
        bound += (p,)
    for h in hide:
        if not h or not os.path.exists(h) or not any(_inside(h, b) for b in bound):
            continue
        argv += ["--tmpfs", h, "--remount-ro", h] if os.path.isdir(h) else ["--ro-bind", "/dev/null", h]
    for p in writable:
        argv += [*parents(p, bound), "--bind", str(p), str(p)]
    for p, size in capped:
        argv += [*parents(p, bound), "--perms", "1777", "--size", str(size), "--tmpfs", p]
    # bwrap's own root and /dev are tmpfs without a size, writable by the job in a user namespace
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if root:
        argv += [
            "--",
            *([setpriv, "--reuid", str(uid), "--regid", str(gid), "--clear-groups", "--"] if setpriv else []),
        ]
    else:
        argv += ["--uid", str(uid), "--gid", str(gid), "--"]
    procs = [d / "cgroup.procs" for d in cg_dirs]

    def preexec() -> None:  # in the forked child: no locks, no buffered files
        for f in procs:  # join the job's cgroup before anything of the job runs
            fd = os.open(f, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

    limits = {
        "memory": memory if cg_dirs else None,
        "pids": settings.pids if cg_dirs else None,
        "tmpfs": tmpfs if disk is None else None,
        "disk": disk,
        "uid": uid,
        "network": "none",
        "cgroup": [str(d) for d in cg_dirs],
    }
    if disk is None:
        return Plan(argv, preexec, limits, not_enforced)
    return Plan(argv, preexec, limits, not_enforced, home=f"{JOB_DIR}/home", tmp=f"{JOB_DIR}/tmp", job=JOB_DIR)


def shm_share(disk: int) -> int:
    """The part of a daemon job's disk cap DISK that is its /dev/shm (an eighth, at most SHM_SHARE_MAX): the
    rest holds everything else it writes, so that the two together never exceed DISK."""
    return min(disk // 8, SHM_SHARE_MAX)


def _inside(path: str, folder: str) -> bool:
    p, f = os.path.realpath(path), os.path.realpath(folder)
    return p == f or p.startswith(f.rstrip(os.sep) + os.sep)


def gpu_device_nodes(visible: str | None) -> list[str]:
    """/dev/nvidiaN for the slot's GPUs (all of them when the slot names none) and the control nodes."""
    nodes = [d for d in GPU_DEVICES if os.path.exists(d)]
    if not nodes:
        return []
    try:
        numbered = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
    except OSError:
        numbered = []
    return nodes + [f"/dev/{n}" for n in numbered]


def cleanup(job_id: str) -> int:
    """Kill and remove whatever is left of JOB_ID's cgroup (after a crash of the daemon)."""
    n = kill_cgroup(job_id)
    remove_cgroup(job_id)
    return n


def describe(plan: Plan) -> str:
    """One line for the job log: what is in force, and what is not."""
    lim = plan.limits
    parts = [f"bubblewrap, uid {lim['uid']}, no network, PID namespace"]
    if lim.get("disk") is not None:
        shm = shm_share(lim["disk"])
        parts.append(
            f"disk {size_text(lim['disk'])} in all (a tmpfs of {size_text(lim['disk'] - shm)} for the checkout, "
            f"out/, HOME and /tmp, {size_text(shm)} for /dev/shm)"
        )
    else:
        parts.append(f"tmpfs {lim['tmpfs'] >> 20} MiB for HOME and /tmp")
    if lim["memory"] is not None:
        parts.append(f"memory {lim['memory'] >> 20} MiB, {lim['pids']} processes")
    parts += [f"NOT ENFORCED: {w}" for w in plan.not_enforced]
    return "; ".join(parts)


# ------------------------------------------------------------------ kernel workers (verify, bench, the Action)

WORKER_MODES = ("auto", "on", "uid", "off")
ENV_WORKER_SANDBOX = "KERNALIN_SANDBOX"  # auto (default) | on | uid | off, for the kernel workers of this process
ENV_WORKER_DISK = "KERNALIN_SANDBOX_DISK"  # the size of each writable file system of a kernel worker
ENV_COPY_MAX = "KERNALIN_SANDBOX_COPY_MAX"  # the most a sandbox copies of folders its user cannot read
ENV_BWRAP = "KERNALIN_BWRAP"  # the bubblewrap binary kernel workers use (a name on PATH or a path; default bwrap)
WORKER_DISK = "8g"
COPY_MAX = "1g"
SANDBOX_UID = 65534  # the bubblewrap sandbox's user when kernalin-ci runs as root (SandboxSettings.user)
UID_BASE = 0x2A000000  # KERNALIN_SANDBOX=uid: each worker gets a uid of its own from here (no passwd entry)
FULL_BELOW = 64 * 1024  # a capped folder with less free space than this: its worker reached the cap
ATTACH_S = 30.0  # how long bubblewrap may take to set a sandbox up
# what a user can do when the sandbox that kernel code needs cannot be made
FIXES = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or, as root, set KERNALIN_SANDBOX=uid "
    "(an unprivileged uid without namespaces), or set KERNALIN_SANDBOX=off to run kernel code unsandboxed "
    "(trusted code only; docs/security.md)"
)
NESTED = "inside another sandbox (a daemon job's): the job's PID namespace and /proc, shared"
_probe: dict = {}
_warned: list = []
_worker_ids = itertools.count(1)  # next() is atomic: workers start from several threads at once
_isolation: dict = {}


def worker_mode() -> str:
    mode = os.environ.get(ENV_WORKER_SANDBOX, "auto").strip().lower() or "auto"
    if mode not in WORKER_MODES:
        raise SandboxError(f"{ENV_WORKER_SANDBOX}={mode!r}: expected one of {', '.join(WORKER_MODES)}")
    return mode


def in_ci() -> str | None:
    """The CI this process gates in (GitHub Actions, a daemon job), where kernel code is a pull request's and
    the worker sandbox is required unless KERNALIN_SANDBOX says otherwise; None elsewhere."""
    if os.environ.get("KERNALIN_DAEMON_JOB"):
        return "a kernalin-ci daemon job"
    if os.environ.get("GITHUB_ACTIONS") == "true":
        return "GitHub Actions"
    return None


def worker_disk() -> int:
    """Bytes for each writable file system of a kernel worker: its results folders, HOME, /tmp, /dev/shm
    (KERNALIN_SANDBOX_DISK, default 8 GiB: a result file the parent reads is at most 8 GiB)."""
    text = os.environ.get(ENV_WORKER_DISK, "").strip() or WORKER_DISK
    try:
        return parse_size(text)
    except SandboxError as e:
        raise SandboxError(f"{ENV_WORKER_DISK}: {e}") from None


def worker_isolation() -> Isolation:
    """The isolation this process's kernel workers run under (KERNALIN_SANDBOX, decided once per value):

    - `on`: the bubblewrap sandbox, or an error naming the cause and the fixes;
    - `auto` (the default): the sandbox where bubblewrap can make one; else, in CI (GitHub Actions, a daemon
      job), the same error: kernel code is a pull request's there; as root elsewhere, an unprivileged uid
      of its own (`uid`), or that error where it cannot have one: kernel code never runs as root; as
      another user elsewhere, unsandboxed, said once on stderr;
    - `uid` (root only): an unprivileged uid of its own per worker, no namespaces (network and the
      processes of the host visible, nothing of root's readable or writable);
    - `off`: unsandboxed, as this process's user (trusted code only).
    Raises SandboxError (a usage error: exit 2) where the mode cannot be had."""
    mode = worker_mode()
    if mode not in _isolation:
        _isolation[mode] = _decide(mode)
    return _isolation[mode]


def _decide(mode: str) -> Isolation:
    root = os.geteuid() == 0
    me = os.geteuid()
    if mode == "off":
        return Isolation(NONE, me, True, f"{ENV_WORKER_SANDBOX}=off")
    if mode == "uid":
        why = _uid_mode_missing()
        if why:
            raise SandboxError(f"{ENV_WORKER_SANDBOX}=uid: {why}")
        return Isolation(UID, UID_BASE, True, f"{ENV_WORKER_SANDBOX}=uid")
    settings = _worker_settings()
    why = _bwrap_works(settings)
    if why is None:
        nested = (_proc_args(settings) or ["--proc"])[0] != "--proc"
        return Isolation(BUBBLEWRAP, SANDBOX_UID if root else me, False, NESTED if nested else "")
    ci = in_ci()
    if mode == "on" or ci:
        required = f"{ENV_WORKER_SANDBOX}=on" if mode == "on" else f"in {ci} the worker sandbox is required"
        raise SandboxError(f"kernel code cannot be sandboxed: {why} ({required}): {FIXES}")
    if root:
        missing = _uid_mode_missing()
        if missing:
            raise SandboxError(
                f"kernel code would run as root: {why}, and an unprivileged uid cannot be used either ({missing}): "
                f"{FIXES}"
            )
        return Isolation(UID, UID_BASE, True, why)
    if why not in _warned:
        _warned.append(why)
        print(
            f"kernalin-ci: kernel workers run without a sandbox: {why} (install bubblewrap, or set "
            f"{ENV_WORKER_SANDBOX}=off to say that this is intended)",
            file=sys.stderr,
        )
    return Isolation(NONE, me, True, why)


def _worker_settings() -> SandboxSettings:
    return SandboxSettings(
        memory=_worker_memory(), tmpfs_size=str(worker_disk()), bwrap=os.environ.get(ENV_BWRAP, "").strip() or "bwrap"
    )


def _uid_mode_missing() -> str | None:
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
    import kernalin_ci

    return [os.path.realpath(sys.executable), os.path.dirname(os.path.realpath(kernalin_ci.__file__))]


def _reachable(path: str) -> bool:
    """Whether a user with no claim on PATH reaches and reads it through its real path (every folder on
    the way searchable by others, PATH itself readable)."""
    real = os.path.realpath(path)
    parts = Path(real).parents
    return all(_searchable(str(p)) for p in parts) and _others_can_read(real)


def _searchable(folder: str) -> bool:
    try:
        return bool(os.stat(folder).st_mode & 0o001)
    except OSError:
        return False


class CappedFolder:
    """A folder a kernel worker writes and its parent reads (its raw results), of at most `cap` bytes.

    In the worker sandbox the worker sees at `path` a tmpfs of `cap` bytes of its own: nothing it writes
    there reaches the host's disk, and a write past the cap fails (ENOSPC). The host folder `path` stays
    empty: the parent opens that tmpfs through /proc/<sandbox pid>/root after bubblewrap set it up and
    before the worker runs (`Handshake`), and reads it through `view`; the descriptor keeps the tmpfs,
    files and all, after the worker ended, until the folder's next worker starts or `close()`. `full()`
    says whether the worker reached the cap. Unsandboxed (KERNALIN_SANDBOX=off, or no bubblewrap: said
    on stderr), `view` is `path`, on the host's disk, with no cap.

    SHARED names a host folder that several workers share and that outlives them (a Triton cache)
    instead of a fresh one: its worker's tmpfs is mounted at that folder's path and starts as a copy of
    it (made by the parent before the worker runs), and after the worker ended the parent copies back
    the plain files it added (`harvest`: never a link, never over an existing file, at most the cap).
    `close()` then leaves the folder in place. One object serves one worker at a time (workers started
    at once take one each; several may name the same SHARED folder)."""

    def __init__(self, prefix: str = "kernalin-", cap: int | None = None, *, shared: str | None = None):
        self.cap = worker_disk() if cap is None else cap
        self.shared = shared is not None
        self.path = os.path.realpath(shared if shared is not None else tempfile.mkdtemp(prefix=prefix))
        self._fd: int | None = None
        self.least_free: int | None = None  # the least free space seen on the attached tmpfs

    @property
    def view(self) -> str:
        """Where the parent reads what the worker wrote."""
        return f"/proc/self/fd/{self._fd}" if self._fd is not None else self.path

    def attach(self, fd: int) -> None:
        """FD (a directory) is the sandbox's tmpfs at `path` from now on; the previous one is dropped."""
        self._release()
        self._fd, self.least_free = fd, None
        self.sample()
        if self.shared:  # the worker starts with what the folder holds (what does not fit is left out)
            _copy_new(self.path, self.view, self.cap, dir_mode=0o777, file_mode=0o666)

    def harvest(self) -> int:
        """After a worker of a SHARED folder ended: copy the plain files it added to the host folder (at
        most `cap` bytes by their sizes); the bytes copied."""
        if not self.shared or self._fd is None:
            return 0
        return _copy_new(self.view, self.path, self.cap, dir_mode=0o755, file_mode=0o644)

    def sample(self) -> None:
        if self._fd is not None:
            try:
                st = os.statvfs(self._fd)
            except OSError:
                return
            free = st.f_bavail * st.f_frsize
            self.least_free = free if self.least_free is None else min(self.least_free, free)

    def full(self) -> str | None:
        """Why the worker's results stop here, when it filled the folder to its cap (else None)."""
        if self.least_free is None or self.least_free >= FULL_BELOW:
            return None
        return (
            f"the worker filled its results folder to its disk cap of {size_text(self.cap)} ({ENV_WORKER_DISK}): "
            f"writes past it failed; nothing of it reached the host's disk"
        )

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._release()
        if not self.shared:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> CappedFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start(plan: Plan | None, argv: list[str], **popen):
    """Start ARGV in PLAN's sandbox (unsandboxed for None; POPEN: subprocess.Popen's arguments, `preexec_fn`
    and the pass_fds bubblewrap needs added) with PLAN's capped folders attached before anything of ARGV
    runs: (the process, None), or (the process, why the sandbox could not be readied: kill it)."""
    import subprocess

    hs = Handshake() if plan is not None and plan.folders else None
    prefix = [*plan.argv_prefix[:1], *(hs.argv() if hs else []), *plan.argv_prefix[1:]] if plan else []
    popen["pass_fds"] = (*popen.get("pass_fds", ()), *(hs.child_fds() if hs else ()))
    try:
        proc = subprocess.Popen([*prefix, *argv], preexec_fn=plan.preexec if plan else None, **popen)
    except BaseException:
        if hs:
            hs.close()
        raise
    return proc, (hs.attach(proc, plan.folders) if hs else None)


def _copy_new(src: str, dst: str, budget: int, dir_mode: int, file_mode: int) -> int:
    """Copy each plain file under SRC that DST lacks into DST, at most BUDGET bytes by the files' sizes
    (a sparse file counts whole); never a link, never through one, never over an existing file. The
    bytes copied; a file that cannot be copied (the destination is full) is left out."""
    copied = 0
    for folder, _, files in os.walk(src):  # links to folders are not followed
        rel = os.path.relpath(folder, src)
        parts = [] if rel == "." else rel.split(os.sep)
        for name in files:
            source = os.path.join(folder, name)
            try:
                st = os.lstat(source)
                if not stat.S_ISREG(st.st_mode) or copied + st.st_size > budget:
                    continue
                target = os.path.join(_mkdirs(dst, parts, dir_mode), name)
                if os.path.lexists(target):
                    continue
                _copy_file(source, target, st.st_size, file_mode)
            except OSError:
                continue
            copied += st.st_size
    return copied


def _mkdirs(root: str, parts: list[str], mode: int) -> str:
    """ROOT/PARTS, the missing folders made with MODE; OSError where a part is not a folder (a link)."""
    path = root
    for part in parts:
        path = os.path.join(path, part)
        if not os.path.lexists(path):
            os.mkdir(path)
            os.chmod(path, mode)
        elif os.path.islink(path) or not os.path.isdir(path):
            raise OSError(f"not a folder: {path}")
    return path


def _copy_file(source: str, target: str, size: int, mode: int) -> None:
    """SOURCE's first SIZE bytes as the new file TARGET (written beside it, then linked into place)."""
    temp = f"{target}.kernalin-{os.getpid()}-{next(_worker_ids)}"
    fin = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fout = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with open(fout, "wb") as out:
            os.fchmod(fout, mode)
            left = size
            while left > 0 and (chunk := os.read(fin, min(left, 1 << 20))):
                out.write(chunk)
                left -= len(chunk)
        os.link(temp, target)  # FileExistsError: another worker's copy came first
    finally:
        os.close(fin)
        with contextlib.suppress(OSError):
            os.unlink(temp)


class Handshake:
    """bubblewrap's --info-fd (the sandbox's pid) and --block-fd (it waits, set up, before running the
    command): the parent opens the sandbox's capped folders in between (`attach`)."""

    def __init__(self) -> None:
        self.info_r, self.info_w = os.pipe()
        self.block_r, self.block_w = os.pipe()

    def argv(self) -> list[str]:
        """bubblewrap's options; pass child_fds() to the process."""
        return ["--info-fd", str(self.info_w), "--block-fd", str(self.block_r)]

    def child_fds(self) -> tuple[int, int]:
        return self.info_w, self.block_r

    def close(self) -> None:
        """Close what is still open of both pipes (after attach, or when bubblewrap could not start)."""
        for name in ("info_r", "info_w", "block_r", "block_w"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def attach(self, proc, folders, timeout_s: float = ATTACH_S) -> str | None:
        """After PROC (bubblewrap) started: attach each of FOLDERS to its tmpfs in the sandbox, then let
        the command run. None, or why not (PROC is then the caller's to kill)."""
        os.close(self.info_w)
        os.close(self.block_r)
        self.info_w = self.block_r = -1
        deadline = time.monotonic() + timeout_s
        try:
            info = b""
            while select.select([self.info_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                chunk = os.read(self.info_r, 4096)
                if not chunk:
                    break
                info += chunk
            try:
                pid = int(json.loads(info)["child-pid"])
            except (ValueError, KeyError, TypeError):
                return "bubblewrap did not start the sandbox"
            for f in folders:
                why = _open_in(pid, f, proc, deadline)
                if why:
                    return why
            return None
        finally:
            try:
                os.write(self.block_w, b"x")
            except OSError:
                pass
            self.close()


def _open_in(pid: int, folder: CappedFolder, proc, deadline: float) -> str | None:
    """Attach FOLDER to the tmpfs at its path in PID's sandbox: the directory there on another file
    system than the host's folder, of the folder's cap (bubblewrap mounts it before it waits)."""
    host = os.stat(folder.path).st_dev
    where = f"/proc/{pid}/root{folder.path}"
    while True:
        try:
            fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            fd = -1
        if fd >= 0:
            st = os.statvfs(fd)
            if os.fstat(fd).st_dev != host and st.f_blocks * st.f_frsize >= folder.cap:
                folder.attach(fd)
                return None
            os.close(fd)
        if proc.poll() is not None:
            return "bubblewrap ended before the sandbox was set up"
        if time.monotonic() > deadline:
            return f"the worker's results folder could not be opened in its sandbox ({where})"
        time.sleep(0.002)


def _named_paths(value) -> set[str]:
    """Absolute paths that exist among the strings of a job (its roots, entry files, sources)."""
    out: set[str] = set()
    if isinstance(value, dict):
        for v in value.values():
            out |= _named_paths(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out |= _named_paths(v)
    elif isinstance(value, str) and value.startswith(os.sep):
        path = os.path.realpath(value.split(":", 1)[0])  # an entry "FILE:FUNCTION"
        folder = os.path.dirname(path)
        if os.path.isfile(path) and folder not in _SHARED_DIRS and os.stat(folder).st_mode & 0o001:
            path = folder  # the modules beside it too (when others may search it, as the job's uid must)
        if os.path.exists(path):
            out.add(path)
    return out


_SHARED_DIRS = ("/", "/tmp", "/var/tmp", "/dev/shm")  # a file named there is bound alone


def _bwrap_works(settings: SandboxSettings) -> str | None:
    """None if bubblewrap can start a worker's sandbox here (probed once per binary), else why not. Inside
    another sandbox (a daemon job's) a fresh /proc cannot be mounted: the worker's sandbox then keeps the
    enclosing sandbox's PID namespace and its /proc (`_proc_args`): the processes it sees
    are the job's own, and the job's first process kills what outlives a worker (daemon/jobwrap.py)."""
    if settings.bwrap not in _probe:
        bwrap = shutil.which(settings.bwrap)
        found: tuple[str | None, list[str] | None] = (f"bubblewrap ({settings.bwrap}) is not installed", None)
        if bwrap:
            # the enclosing /proc writable: CUDA writes to its own /proc/self (read-only: error 304, seen on an H100)
            for proc in (["--proc", "/proc"], ["--bind", "/proc", "/proc"]):
                found = (_probe_once(bwrap, proc), proc)
                if found[0] is None:
                    break
        _probe[settings.bwrap] = found
    return _probe[settings.bwrap][0]


def _proc_args(settings: SandboxSettings) -> list[str] | None:
    """How the worker's sandbox gets its /proc (after _bwrap_works found that it can)."""
    return _probe[settings.bwrap][1] if settings.bwrap in _probe else None


def _probe_once(bwrap: str, proc: list[str]) -> str | None:
    """Start the sandbox a worker gets, in short: a capped tmpfs the parent opens before the command runs."""
    import subprocess

    flags = ["--unshare-pid", "--unshare-net"] if os.geteuid() == 0 else ["--unshare-all"]
    if proc[0] != "--proc":  # the enclosing sandbox's /proc: its PID namespace too
        flags = ["--unshare-net"] if os.geteuid() == 0 else ["--unshare-user", "--unshare-net"]
    folder, hs = CappedFolder("kernalin-probe-", 1 << 20), Handshake()
    argv = [bwrap, *flags, "--ro-bind", "/", "/", *proc, "--dev", "/dev"]
    argv += ["--size", str(folder.cap), "--tmpfs", folder.path, *hs.argv(), "true"]
    try:
        p = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=hs.child_fds(), text=True,
        )  # fmt: skip
        attached = hs.attach(p, [folder])
        if attached:
            p.kill()
        err = p.communicate(timeout=30)[1]
        if p.returncode not in (0, -signal.SIGKILL):  # it failed by itself (not killed here)
            return f"bubblewrap cannot make a sandbox here ({' '.join(err.split())[:200]})"
        if attached:
            return f"the parent cannot open the sandbox's results folder: {attached}"
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap cannot run ({e})"
    finally:
        hs.close()
        folder.close()


def worker_plan(
    job: dict,
    device: str,
    workdir: str,
    cwd: str | None,
    writable: tuple[CappedFolder, ...] = (),
    readonly: tuple[str, ...] = (),
) -> tuple[Plan | None, dict]:
    """How to start a kernel worker under `worker_isolation()`: a Plan (None: unsandboxed) and the
    environment it needs.

    In the bubblewrap sandbox the worker sees the system and the Python installation read-only, the
    folders its job names (the checkout, entry files), WORKDIR (its job file) and READONLY (a profiler's
    installation) read-only; each of WRITABLE (the folders the parent reads its raw results from) as a
    tmpfs of the folder's cap (CappedFolder); the Triton cache it shares with this process's workers of
    the same code (compile_cache) as a tmpfs seeded from it, whose new files the parent copies back after
    the worker ended; fresh tmpfs for HOME and /tmp; each of KERNALIN_SANDBOX_DISK bytes: nothing of the
    host is writable; no network; its own PID namespace; the gate's process and every other file of the
    user (SSH keys, a runner's credentials) do not exist inside. As root its user is uid 65534; a folder
    that user cannot read is shown as a copy (`_staged`), never skipped.

    With KERNALIN_SANDBOX=uid (or as root where bubblewrap cannot run) the worker runs as an unprivileged
    uid of its own (`_uid_plan`)."""
    iso = worker_isolation()
    here = os.path.realpath(cwd or os.getcwd())  # relative entries resolve against it, as outside
    if iso.mode == NONE:  # Triton's own cache; the CUDA builds (torch extensions, ...) per view still
        named = _named_paths(job) - {os.path.realpath(f.path) for f in writable}
        return None, cuda_caches.cache_env(compile_cache((device, NONE, here, *sorted(named))))
    rw = {os.path.realpath(f.path) for f in writable}  # named in the job too, but a capped tmpfs (below)
    from kernalin_ci.launch import child_path

    readonly = sorted(
        {os.path.realpath(p) for p in child_path(cwd) if os.path.isdir(p)}
        | (_named_paths(job) - rw)
        | {here}
        | {os.path.realpath(p) for p in readonly if os.path.exists(p)}
    )
    if iso.mode == UID:
        return _uid_plan(readonly, workdir, here, writable)
    settings = _worker_settings()
    worker_id = f"worker-{os.getpid()}-{next(_worker_ids)}"  # its own cgroup: end_worker kills all of it
    copies = []
    if os.geteuid() == 0:  # the job drops to uid 65534: what it cannot read, it sees as a copy
        copies = [(_staged(p), p) for p in readonly if not _others_can_read(p)]
        readonly = [p for p in readonly if _others_can_read(p)]
    pycache = bytecode.worker_prefix()  # torch's bytecode, compiled once by a trusted child: read-only here
    if pycache and (os.geteuid() != 0 or _others_can_read(pycache)):
        readonly.append(os.path.realpath(pycache))
    else:
        pycache = None
    settings.extra_ro = [*readonly, os.path.realpath(workdir)]  # its job file: read-only too
    cache = compile_cache((device, *readonly, *(p for _, p in copies)))
    # each a tmpfs of its cap in the sandbox; the run's Triton cache too, seeded from and copied back to it
    folders = [*writable, CappedFolder(shared=cache)]
    plan = prepare(
        settings,
        worker_id,
        [],
        gpu_device_nodes(None) if device == "cuda" else [],
        capped=[(f.path, f.cap) for f in folders],
        copies=copies,
        proc=_proc_args(settings),
    )
    plan.folders = folders
    plan.pycache = pycache
    plan.argv_prefix[1:1] = ["--chdir", here]
    env = {
        "HOME": plan.home,
        "TMPDIR": plan.tmp,
        "XDG_CACHE_HOME": f"{plan.home}/.cache",
        "TRITON_CACHE_DIR": cache,
        **cuda_caches.cache_env(cache),  # torch extensions, CuPy, NVRTC: built once per view, as Triton's kernels
    }
    return plan, env


_stages: dict[str, tuple[tuple, str]] = {}
_stage_lock = threading.Lock()
_stage_root: list[str] = []


def _staged(path: str) -> str:
    """A copy of PATH (a file, or a folder without its hidden entries: `.git`, `.env`, ...) that the
    sandbox's user can read, made where root's sandbox binds it at PATH; the same copy while PATH does not
    change. SandboxError where the folder is larger than KERNALIN_SANDBOX_COPY_MAX."""
    limit = parse_size(os.environ.get(ENV_COPY_MAX, "").strip() or COPY_MAX)
    with _stage_lock:
        files = _visible_files(path)
        key = tuple((rel, st.st_size, st.st_mtime_ns) for rel, st in files)
        old = _stages.get(path)
        if old is not None and old[0] == key:
            return old[1]
        total = sum(st.st_size for _, st in files)
        if total > limit:
            raise SandboxError(
                f"{path} is not readable by uid {SANDBOX_UID}, the sandbox's user when kernalin-ci runs as root, "
                f"and too large to copy for it ({size_text(total)}, over {ENV_COPY_MAX}={size_text(limit)}): make it "
                f"readable (chmod -R o+rX), or run kernalin-ci as another user"
            )
        if not _stage_root:
            _stage_root.append(tempfile.mkdtemp(prefix="kernalin-copies-"))
            atexit.register(shutil.rmtree, _stage_root[0], True)
        dest = tempfile.mkdtemp(dir=_stage_root[0])
        os.chmod(dest, 0o755)
        target = os.path.join(dest, "copy")
        if os.path.isdir(path):
            os.mkdir(target, 0o755)
            for rel, st in files:
                _mkdirs(target, rel.split(os.sep)[:-1], 0o755)
                shutil.copyfile(os.path.join(path, rel), os.path.join(target, rel), follow_symlinks=False)
                os.chmod(os.path.join(target, rel), 0o755 if st.st_mode & 0o111 else 0o644)
        else:
            shutil.copyfile(path, target)
            os.chmod(target, 0o644)
        if path not in _warned:
            _warned.append(path)
            print(
                f"kernalin-ci: {path} is not readable by uid {SANDBOX_UID} (the sandbox's user as root): kernel "
                f"workers see a copy of it, hidden files left out ({len(files)} files, {size_text(total)})",
                file=sys.stderr,
            )
        _stages[path] = (key, target)
        return target


def _visible_files(path: str) -> list[tuple[str, os.stat_result]]:
    """The plain files under PATH (PATH itself for a file) that are not hidden and not under a hidden folder,
    with their stats; links are not followed."""
    if not os.path.isdir(path):
        return [("", os.stat(path))]
    out = []
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            full = os.path.join(folder, name)
            st = os.lstat(full)
            if not name.startswith(".") and stat.S_ISREG(st.st_mode):
                out.append((os.path.relpath(full, path), st))
    return out


def _uid_plan(readonly: list[str], workdir: str, here: str, writable: tuple[CappedFolder, ...]) -> tuple[Plan, dict]:
    """KERNALIN_SANDBOX=uid: the worker as a uid of its own (UID_BASE + n, no passwd entry) through setpriv,
    in a session of its own, killed with its parent. It reads what every user may read, writes only its
    own HOME/TMPDIR and its results folders (handed to its uid), and `end_worker` kills every process of
    its uid. No namespaces: it sees the network and the host's processes, and its disk is not capped."""
    closed = [p for p in [*readonly, workdir] if not _reachable(p)]
    if closed:
        raise SandboxError(
            f"{ENV_WORKER_SANDBOX}=uid: {closed[0]} is not readable by an unprivileged uid (every folder above it "
            f"must be searchable by others): make it readable, or install bubblewrap"
        )
    uid = UID_BASE + (os.getpid() % 4096) * 4096 + next(_worker_ids) % 4096
    home = tempfile.mkdtemp(prefix="kernalin-uid-")
    os.chmod(home, 0o700)
    os.chown(home, uid, uid)
    for f in writable:
        os.chown(f.path, uid, uid)
        os.chmod(f.path, 0o700)
    setpriv = shutil.which("setpriv")
    argv = [setpriv, "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "--pdeathsig", "KILL", "--"]
    plan = Plan(argv, None, {"uid": uid, "network": "host", "home": home}, [], home=home, tmp=home)
    env = {"HOME": home, "TMPDIR": home, "XDG_CACHE_HOME": f"{home}/.cache", "TRITON_CACHE_DIR": f"{home}/.triton"}
    return plan, env


def _kill_uid(uid: int, wait_s: float = 5.0) -> int:
    """SIGKILL every process of UID until none is left; how many there were."""
    seen: set[int] = set()
    deadline = time.monotonic() + wait_s
    while True:
        pids = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if os.stat(entry.path).st_uid == uid:
                        pids.append(int(entry.name))
                except OSError:
                    continue
        if not pids or time.monotonic() > deadline:
            return len(seen)
        for pid in pids:
            seen.add(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


_caches: dict[tuple[str, ...], str] = {}
_caches_lock = threading.Lock()


def compile_cache(view: tuple[str, ...]) -> str:
    """The Triton cache (compiled kernels, the launcher and driver stubs gcc builds; and the CUDA builds of
    kernalin_ci/cuda/caches.py: torch extensions, CuPy, NVRTC, PTX) shared by this
    process's sandboxed workers that see the same files (VIEW: the device and every folder bound into the
    worker). Each worker would otherwise compile all of it again in an empty cache: seconds per worker on
    a GPU. Code a worker runs can write to the cache, so it can poison it only for workers that run the
    same code as itself (the base and head of a pull request see different checkouts: two caches); none
    outlives this process, so nothing reaches a later run."""
    with _caches_lock:
        if view not in _caches:
            path = tempfile.mkdtemp(prefix="kernalin-triton-")
            os.chmod(path, 0o700)  # prepare() hands it to the worker's uid when it drops to one
            atexit.register(shutil.rmtree, path, True)
            _caches[view] = path
        return _caches[view]


def workers_sandboxed() -> bool:
    """Whether kernel workers start in the bubblewrap sandbox here."""
    return worker_isolation().sandboxed


def _others_can_read(path: str) -> bool:
    """Whether a user with no claim on PATH can read it (o+r, and o+x for a folder). The folders above a
    bound path are the sandbox's own (0755) unless bound themselves, when they are checked too."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return bool(st.st_mode & 0o004) and (not os.path.isdir(path) or bool(st.st_mode & 0o001))


def _worker_memory() -> str:
    """A kernel worker's memory cap: 90% of this machine's RAM (it guards the host, not the kernel)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return "64g"
    return str(max(1 << 30, int(total * 0.9)))


def end_worker(plan: Plan | None) -> None:
    """After a sandboxed worker: kill whatever it left in its cgroup, remove the cgroup; then (nothing of
    the sandbox runs any more) copy back what it added to its shared folders, and let go of their tmpfs.
    After a worker of its own uid: kill every process of that uid, remove its HOME."""
    if plan is not None and plan.limits.get("home"):
        _kill_uid(plan.limits["uid"])
        shutil.rmtree(plan.limits["home"], ignore_errors=True)
        return
    if plan is not None and plan.limits.get("cgroup"):
        job_id = Path(plan.limits["cgroup"][0]).name.removeprefix("job-")
        cleanup(job_id)
    for folder in plan.folders if plan is not None else []:
        if folder.shared:
            folder.harvest()
            folder.close()
