"""A cgroup per sandbox (a daemon's job, a kernel worker) with a memory and a process cap, where this process
may create cgroups (root, or a systemd unit with `Delegate=yes`); also how a restarted daemon finds and kills
anything a previous run left behind (`cleanup`)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAME = "kernalin-ci"


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


def cleanup(job_id: str) -> int:
    """Kill and remove whatever is left of JOB_ID's cgroup (after a crash of the daemon)."""
    n = kill_cgroup(job_id)
    remove_cgroup(job_id)
    return n
