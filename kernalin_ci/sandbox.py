"""The local runner's sandbox: a pull request's code runs where it can reach nothing it could misuse.

A job runs under bubblewrap (`bwrap`) with

- its own user, PID, network, IPC, UTS and cgroup namespaces: it sees only its own processes (no
  /proc/<daemon pid>/environ), has no network but its own loopback, and when the sandbox's PID 1 ends
  (the job ended, or the daemon died: `--die-with-parent`) the kernel kills everything left in it;
- an allowlisted file system: the system (/usr, /etc, /opt; read-only), the Python installation and
  the kernalin_ci package (read-only); for a daemon's job one size-capped tmpfs (the disk cap) holds
  everything it writes (its checkout, copied in from a read-only bind, out/, HOME, /tmp; /dev/shm is a
  tmpfs of the same cap), nothing of the host is writable; a kernel worker gets size-capped tmpfs
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
import hashlib
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

from kernalin_ci.errors import UsageError

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAME = "kernalin-ci"
SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# read-only system folders bound into the sandbox when they exist (the rest of / is not there)
SYSTEM_RO = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# GPU device nodes: /dev in the sandbox is a fresh minimal one, these are added to it
JOB_DIR = "/job"  # prepare(disk=...): the job's capped tmpfs inside the sandbox
CHECKOUT_DIR = "/checkout"  # prepare(checkout=...): the host's checkout, read-only, copied into JOB_DIR
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
) -> Plan:
    """How to start job JOB_ID inside the sandbox. WRITABLE are bound read-write at the same paths;
    HIDE (the daemon's state folder, its secret files) are masked wherever a bound folder holds them.

    With DISK (the daemon's jobs), nothing of the host is writable: the job's files live on one tmpfs of
    DISK bytes at JOB_DIR (/job: HOME, TMPDIR and the copy of the CHECKOUT, bound read-only at
    CHECKOUT_DIR, go there; /tmp is a link to JOB_DIR/tmp, or a tmpfs of DISK bytes of its own where a
    read-only path lives under /tmp), so the job cannot use more disk than that. CAPPED ((path, bytes)):
    a tmpfs of its own at each path (a kernel worker's results: CappedFolder), nothing of the host's."""
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
    argv += ["--die-with-parent", "--new-session"]
    cg_dirs, why = create_cgroup(job_id, memory, settings.pids)
    if why:
        not_enforced.append(f"memory and process caps: {why}")
    for p in SYSTEM_RO:
        if os.path.islink(p):
            argv += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            argv += ["--ro-bind", p, p]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for dev in gpu_devices:
        if os.path.exists(dev):
            argv += ["--dev-bind", dev, dev]
    # the job's own scratch space, writable by its uid (every process in the sandbox is the job's); /dev/shm
    # too (POSIX shared memory: a profiler and its injected library talk through it)
    shm = disk if disk is not None else tmpfs
    argv += ["--perms", "1777", "--size", str(shm), "--tmpfs", "/dev/shm"]
    if disk is not None:
        tmp_own = any(_inside(p, "/tmp") for p in ro)
        argv += ["--perms", "1777", "--size", str(disk), "--tmpfs", JOB_DIR, "--chdir", JOB_DIR]
        argv += ["--perms", "1777", "--size", str(disk), "--tmpfs", "/tmp"] if tmp_own else []
        argv += ["--symlink", f"{JOB_DIR}/tmp", "/tmp"] if not tmp_own else []
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
    made: set[str] = set()

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
    for p in ro:  # after /tmp: a Python installation may live under it
        argv += [*parents(p, bound), "--ro-bind", p, p]
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
        parts.append(f"disk {size_text(lim['disk'])} (a tmpfs for the checkout, out/, HOME and /tmp)")
    else:
        parts.append(f"tmpfs {lim['tmpfs'] >> 20} MiB for HOME and /tmp")
    if lim["memory"] is not None:
        parts.append(f"memory {lim['memory'] >> 20} MiB, {lim['pids']} processes")
    parts += [f"NOT ENFORCED: {w}" for w in plan.not_enforced]
    return "; ".join(parts)


# ------------------------------------------------------------------ kernel workers (verify, bench, the Action)

WORKER_MODES = ("auto", "on", "off")
ENV_WORKER_SANDBOX = "KERNALIN_SANDBOX"  # auto (default) | on | off, for the kernel workers of this process
ENV_WORKER_DISK = "KERNALIN_SANDBOX_DISK"  # the size of each writable file system of a kernel worker
WORKER_DISK = "8g"
FULL_BELOW = 64 * 1024  # a capped folder with less free space than this: its worker reached the cap
ATTACH_S = 30.0  # how long bubblewrap may take to set a sandbox up
_probe: dict = {}
_warned: list = []
_worker_ids = itertools.count(1)  # next() is atomic: workers start from several threads at once


def worker_mode() -> str:
    mode = os.environ.get(ENV_WORKER_SANDBOX, "auto").strip().lower() or "auto"
    if mode not in WORKER_MODES:
        raise SandboxError(f"{ENV_WORKER_SANDBOX}={mode!r}: expected one of {', '.join(WORKER_MODES)}")
    return mode


def worker_disk() -> int:
    """Bytes for each writable file system of a kernel worker: its results folders, HOME, /tmp, /dev/shm
    (KERNALIN_SANDBOX_DISK, default 8 GiB: a result file the parent reads is at most 8 GiB)."""
    text = os.environ.get(ENV_WORKER_DISK, "").strip() or WORKER_DISK
    try:
        return parse_size(text)
    except SandboxError as e:
        raise SandboxError(f"{ENV_WORKER_DISK}: {e}") from None


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


TEMP_MARK = ".kernalin-tmp-"  # in the name of a file _copy_file is writing (never copied by _copy_new)


def _copy_new(src: str, dst: str, budget: int, dir_mode: int, file_mode: int) -> int:
    """Copy each plain file under SRC that DST lacks into DST, at most BUDGET bytes by the files' sizes
    (a sparse file counts whole); never a link, never through one, never over an existing file, each
    whole or not at all (_copy_file). The bytes copied; a file that cannot be copied (the destination is
    full) is left out."""
    copied = 0
    for folder, _, files in os.walk(src):  # links to folders are not followed
        rel = os.path.relpath(folder, src)
        parts = [] if rel == "." else rel.split(os.sep)
        for name in files:
            if TEMP_MARK in name:  # another process's copy in the making (a kept cache): not yet a file
                continue
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
    temp = f"{target}{TEMP_MARK}{os.getpid()}-{next(_worker_ids)}"
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
    """None if bubblewrap can start a sandbox here (probed once), else why not."""
    if "why" not in _probe:
        bwrap = shutil.which(settings.bwrap)
        if not bwrap:
            _probe["why"] = "bubblewrap is not installed"
        else:
            import subprocess

            flags = ["--unshare-pid", "--unshare-net"] if os.geteuid() == 0 else ["--unshare-all"]
            # the sandbox a worker gets, in short: a capped tmpfs the parent opens before the command runs
            folder, hs = CappedFolder("kernalin-probe-", 1 << 20), Handshake()
            argv = [bwrap, *flags, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
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
                    _probe["why"] = f"bubblewrap cannot make a sandbox here ({' '.join(err.split())[:200]})"
                elif attached:
                    _probe["why"] = f"the parent cannot open the sandbox's results folder: {attached}"
                else:
                    _probe["why"] = None
            except (OSError, subprocess.TimeoutExpired) as e:
                _probe["why"] = f"bubblewrap cannot run ({e})"
            finally:
                hs.close()
                folder.close()
    return _probe["why"]


def worker_plan(
    job: dict,
    device: str,
    workdir: str,
    cwd: str | None,
    writable: tuple[CappedFolder, ...] = (),
    readonly: tuple[str, ...] = (),
) -> tuple[Plan | None, dict]:
    """How to start a kernel worker: in a sandbox (a Plan, plus the environment it needs), or not (None).

    The worker sees the system and the Python installation read-only, the folders its job names (the
    checkout, entry files), WORKDIR (its job file) and READONLY (a profiler's installation) read-only;
    each of WRITABLE (the folders the parent reads its raw results from) as a tmpfs of the folder's cap
    (CappedFolder); the Triton cache it shares with the workers of the same code, this run's and later
    ones' (compile_cache), as a tmpfs seeded from it, whose new files the parent copies back after the
    worker ended; fresh tmpfs for HOME and /tmp; each of KERNALIN_SANDBOX_DISK bytes: nothing of the host is
    writable; no network; its own PID namespace; the gate's
    process and every other file of the user (SSH keys, a runner's credentials) do not exist inside.
    KERNALIN_SANDBOX=off runs it unsandboxed; auto (the default) warns once on stderr where bubblewrap
    cannot run; on makes that an error."""
    mode = worker_mode()
    if mode == "off":
        return None, {}
    settings = SandboxSettings(memory=_worker_memory(), tmpfs_size=str(worker_disk()))
    why = _bwrap_works(settings)
    if why:
        if mode == "on":
            raise SandboxError(f"{ENV_WORKER_SANDBOX}=on: {why}")
        if why not in _warned:
            _warned.append(why)
            print(
                f"kernalin-ci: kernel workers run without a sandbox: {why} (set {ENV_WORKER_SANDBOX}=off "
                f"to silence, or install bubblewrap)",
                file=sys.stderr,
            )
        return None, {}
    from kernalin_ci.launch import child_path

    worker_id = f"worker-{os.getpid()}-{next(_worker_ids)}"  # its own cgroup: end_worker kills all of it
    here = os.path.realpath(cwd or os.getcwd())  # relative entries resolve against it, as outside
    rw = {os.path.realpath(f.path) for f in writable}  # named in the job too, but a capped tmpfs (below)
    code = (_named_paths(job) - rw) | {here}  # the code under test: what the compile cache's key covers
    installed = {os.path.realpath(p) for p in child_path(cwd) if os.path.isdir(p)}
    installed |= {os.path.realpath(p) for p in readonly if os.path.exists(p)}  # a profiler's installation
    readonly = sorted(installed | code)
    if os.geteuid() == 0:  # the job drops to an unprivileged uid: it must be able to read what it needs
        closed = [p for p in readonly if not _others_can_read(p)]
        if closed:
            why = (
                f"{closed[0]} is not readable by uid {settings.user.split(':')[0]}, the sandbox's user when "
                f"kernalin-ci runs as root"
            )
            if mode == "on":
                raise SandboxError(f"{ENV_WORKER_SANDBOX}=on: {why}")
            if why not in _warned:
                _warned.append(why)
                print(f"kernalin-ci: kernel workers run without a sandbox: {why}", file=sys.stderr)
            return None, {}
    settings.extra_ro = [*readonly, os.path.realpath(workdir)]  # its job file: read-only too
    cache = compile_cache(device, tuple(sorted(code)), tuple(sorted(installed - code)))
    # each a tmpfs of its cap in the sandbox; the run's Triton cache too, seeded from and copied back to it
    folders = [*writable, CappedFolder(shared=cache)]
    plan = prepare(
        settings,
        worker_id,
        [],
        gpu_device_nodes(None) if device == "cuda" else [],
        capped=[(f.path, f.cap) for f in folders],
    )
    plan.folders = folders
    plan.argv_prefix[1:1] = ["--chdir", here]
    env = {
        "HOME": plan.home,
        "TMPDIR": plan.tmp,
        "XDG_CACHE_HOME": f"{plan.home}/.cache",
        "TRITON_CACHE_DIR": cache,
    }
    return plan, env


# ------------------------------------------------------------------ the kernel workers' compile cache

ENV_COMPILE_CACHE = "KERNALIN_COMPILE_CACHE"  # on (default): kept across runs, one per code | off: per process
CACHE_MAX_BYTES = 2 << 30  # the kept caches, all keys together: the least recently used go first
CACHE_MAX_KEYS = 64
CACHE_KEEP_S = 600.0  # a key handed out this recently is never pruned (a run may still be using it)
WALK_MAX_ENTRIES = 200_000  # the key's walk of the code's folders: past this many entries or WALK_MAX_S,
WALK_MAX_S = 2.0  # the cache is this process's only (said once on stderr)
WALK_CONTENT_BYTES = 1 << 20  # a file up to this size counts by its content, a larger one by its identity
_caches: dict[tuple, tuple[str, bool]] = {}  # view: (path, kept across runs)
_caches_lock = threading.Lock()
_pruning: list[str] = []


def compile_cache(device: str, code: tuple[str, ...], installed: tuple[str, ...] = ()) -> str:
    """The Triton cache (compiled kernels, the launcher and driver stubs gcc builds) of the sandboxed
    workers that see the same files: CODE (the working directory and the folders and files the job names:
    the code under test) and INSTALLED (Python, its site-packages, kernalin_ci, a profiler: the trusted
    installation) on DEVICE. A worker would otherwise compile all of it again in an empty cache: seconds
    per worker on a GPU. Code a worker runs can write to its cache, so the cache is one code's: kept
    across runs (KERNALIN_COMPILE_CACHE=on, the default) as `cache_root()/KEY`, KEY the sha256 of the
    device, the versions of Python, Triton, torch and kernalin-ci, the INSTALLED paths and every entry
    under CODE (`_fingerprint`: a file's content, or a large file's identity), so a worker can poison it
    only for an exact copy of its own files; else (off, or CODE not fingerprinted: past the walk's caps) a
    folder of this process, shared by its workers of the same view and deleted at exit."""
    view = (device, code, installed)
    with _caches_lock:
        if view not in _caches:
            kept = _kept_cache(view)
            _caches[view] = (kept, True) if kept else (_process_cache(), False)
        path, kept = _caches[view]
        if kept:  # its last use (pruning goes by it); made again if a prune took it since
            with contextlib.suppress(OSError):
                os.makedirs(path, 0o700, exist_ok=True)
                os.utime(path)
        return path


def compile_cache_kept() -> bool:
    """KERNALIN_COMPILE_CACHE: whether the workers' compile caches are kept across runs (on, the default)."""
    mode = os.environ.get(ENV_COMPILE_CACHE, "on").strip().lower() or "on"
    if mode not in ("on", "off"):
        raise SandboxError(f"{ENV_COMPILE_CACHE}={mode!r}: expected on or off")
    return mode == "on"


def cache_root() -> str:
    """Where the kept compile caches live: $XDG_CACHE_HOME/kernalin-ci/triton (default ~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    base = base if os.path.isabs(base) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kernalin-ci", "triton")


def _process_cache() -> str:
    path = tempfile.mkdtemp(prefix="kernalin-triton-")  # mode 0700
    atexit.register(shutil.rmtree, path, True)
    return os.path.realpath(path)


def _kept_cache(view: tuple) -> str | None:
    """VIEW's folder under cache_root() (made, mode 0700), or None (off, or why not said once on stderr)."""
    if not compile_cache_kept():
        return None
    root = cache_root()
    try:
        os.makedirs(root, 0o700, exist_ok=True)
        root = os.path.realpath(root)
        st = os.lstat(root)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError("not a folder of this user")
        os.chmod(root, 0o700)
    except OSError as e:
        _note(f"the kernel workers' compile cache is not kept across runs: {root}: {e}")
        return None
    skip = {root, *view[2], *(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *_site_dirs()))}
    key, why = _fingerprint(view, skip)
    if key is None:
        _note(f"the kernel workers' compile cache is not kept across runs: {why}")
        return None
    path = os.path.join(root, key)
    try:
        os.makedirs(path, 0o700, exist_ok=True)
        os.utime(path)
    except OSError as e:
        _note(f"the kernel workers' compile cache is not kept across runs: {path}: {e}")
        return None
    if not _pruning:  # once per process, and at its end (after its workers' files came back)
        _pruning.append(root)
        prune_compile_caches(root)
        atexit.register(prune_compile_caches, root)
    return path


def _site_dirs() -> list[str]:
    import site

    dirs = list(getattr(site, "getsitepackages", list)())
    with contextlib.suppress(Exception):
        dirs.append(site.getusersitepackages())
    return dirs


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("triton", "torch", "kernalin-ci"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "none"
    return out


def _fingerprint(view: tuple, skip: set[str]) -> tuple[str | None, str]:
    """(the sha256 of VIEW: the device, the versions, the installed paths, and every entry under the code's
    folders (path, type, mode, owner; a file up to WALK_CONTENT_BYTES its content's sha256, a larger one its
    size, mtime, ctime, inode and device; a link its target, never followed; a folder in SKIP, the
    installation or the caches, by its path only), ''), or (None, why not: past the walk's caps, or a folder
    it may not list)."""
    device, code, installed = view
    h = hashlib.sha256(json.dumps([device, sys.version, _versions(), code, installed]).encode())
    deadline, count = time.monotonic() + WALK_MAX_S, 0
    for root in code:
        if any(root != other and _inside(root, other) for other in code):
            continue  # walked with the folder that holds it
        h.update(f"\0root\0{root}\n".encode())
        stack = [(root, ".")]
        while stack:
            path, rel = stack.pop()
            count += 1
            if count > WALK_MAX_ENTRIES or time.monotonic() > deadline:
                return None, (
                    f"{root} holds too many files to fingerprint (over {WALK_MAX_ENTRIES} entries or "
                    f"{WALK_MAX_S:g} s): run from a smaller folder, or set {ENV_COMPILE_CACHE}=off"
                )
            try:
                st = os.lstat(path)
            except OSError:
                h.update(f"{rel}\0gone\n".encode())
                continue
            detail = ""
            if stat.S_ISDIR(st.st_mode):
                if path in skip and rel != ".":
                    detail = "by path"
                else:
                    try:
                        names = sorted(os.listdir(path), reverse=True)
                    except PermissionError:  # its files may still be opened by name: they would not count
                        return None, f"cannot list {path} to fingerprint it (permission denied)"
                    except OSError:
                        names, detail = [], "gone"
                    stack += [(os.path.join(path, n), os.path.join(rel, n)) for n in names]
            elif stat.S_ISLNK(st.st_mode):
                with contextlib.suppress(OSError):
                    detail = os.readlink(path)
            elif stat.S_ISREG(st.st_mode) and st.st_size <= WALK_CONTENT_BYTES:
                detail = _content_hash(path)
            if not detail and not stat.S_ISDIR(st.st_mode):
                detail = f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino} {st.st_dev}"
            h.update(f"{rel}\0{st.st_mode:o}\0{st.st_uid}:{st.st_gid}\0{detail}\n".encode())
    return h.hexdigest(), ""


def _content_hash(path: str) -> str:
    """sha256: of the regular file PATH's content; '' where it cannot be read (counted by identity then)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with open(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ""
            return "sha256:" + hashlib.sha256(f.read(WALK_CONTENT_BYTES + 1)).hexdigest()
        except OSError:
            return ""


def prune_compile_caches(root: str, now: float | None = None) -> list[str]:
    """Remove the kept compile caches under ROOT beyond CACHE_MAX_KEYS keys or CACHE_MAX_BYTES in all,
    the least recently used first (a key folder's mtime: compile_cache touches it), never one used in the
    last CACHE_KEEP_S seconds; the keys removed. A key goes by a rename first, so no run sees half of it."""
    now = time.time() if now is None else now
    keys = []
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if name.startswith(".trash-"):  # left by a prune that was killed
                    shutil.rmtree(path, ignore_errors=True)
                elif stat.S_ISDIR(st.st_mode):
                    keys.append((st.st_mtime, name, _tree_bytes(path)))
    removed, kept, total = [], 0, 0
    for used, name, size in sorted(keys, reverse=True):
        if (kept < CACHE_MAX_KEYS and total + size <= CACHE_MAX_BYTES) or now - used < CACHE_KEEP_S:
            kept, total = kept + 1, total + size
            continue
        trash = os.path.join(root, f".trash-{os.getpid()}-{next(_worker_ids)}")
        with contextlib.suppress(OSError):
            os.rename(os.path.join(root, name), trash)
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(name)
    return removed


def _tree_bytes(path: str) -> int:
    total = 0
    for folder, _, files in os.walk(path):  # links to folders are not followed
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def _note(message: str) -> None:
    if message not in _warned:
        _warned.append(message)
        print(f"kernalin-ci: {message}", file=sys.stderr)


def workers_sandboxed() -> bool:
    """Whether kernel workers start in the sandbox here: KERNALIN_SANDBOX is not off and bubblewrap works."""
    return worker_mode() != "off" and _bwrap_works(SandboxSettings()) is None


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
    the sandbox runs any more) copy back what it added to its shared folders, and let go of their tmpfs."""
    if plan is not None and plan.limits.get("cgroup"):
        job_id = Path(plan.limits["cgroup"][0]).name.removeprefix("job-")
        cleanup(job_id)
    for folder in plan.folders if plan is not None else []:
        if folder.shared:
            folder.harvest()
            folder.close()
