"""The bubblewrap command both sandboxes start with (`prepare`: a daemon's job, job.py; a kernel worker,
workers.py): namespaces, the read-only system and Python installation, the writable and capped folders,
the cgroup it joins and the uid it drops to; the `Plan` it returns says what is in force and what is not."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import kernalin_ci
from kernalin_ci.sandbox.cgroup import create_cgroup
from kernalin_ci.sandbox.job import CHECKOUT_DIR, JOB_DIR, shm_share
from kernalin_ci.sandbox.options import SandboxError, SandboxSettings, parse_size

# read-only system folders bound into the sandbox when they exist (the rest of / is not there)
SYSTEM_RO = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# GPU device nodes: /dev in the sandbox is a fresh minimal one, these are added to it
GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


def _user(text: str) -> tuple[int, int]:
    uid, _, gid = str(text).partition(":")
    try:
        return int(uid), int(gid or uid)
    except ValueError:
        raise SandboxError(f"runner.sandbox.user: expected uid[:gid], got {text!r}") from None


def _python_paths() -> list[str]:
    """The Python installation and the kernalin_ci package, wherever they live."""

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
    read: `staged`). PROC: how /proc is made (default a fresh one of the sandbox's own PID namespace;
    inside another sandbox, where no fresh one can be mounted, that sandbox's /proc, and its PID namespace
    with it: CUDA reads and writes /proc/<its pid>, which must be its own: `bwrap_works`). Its other
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
