"""The first process of a job in the local runner's sandbox (standard library only).

    python -m kernalin_ci.daemon.jobwrap CHECKOUT JOB FD -- COMMAND...

The job's files live on the sandbox's own size-capped tmpfs JOB (the disk cap): this copies the
checkout (bound read-only at CHECKOUT) to JOB/repo, makes JOB/out, JOB/home and JOB/tmp, runs COMMAND
in JOB/repo, then kills every other process left in the sandbox (nothing of the job outlives its
gate: out/ holds what the gate alone left), then writes to file descriptor FD one JSON line
(`{"free": the least free space of the job's file systems (JOB's, /tmp's, /dev/shm's:
sandbox.prepare), sampled while COMMAND ran and at its end}`) and `out/` as a tar stream
(daemon/outstream.py), and exits with COMMAND's exit code (125: the checkout could not be copied).
The daemon reads FD only up to its caps; everything here runs as the job, so the daemon trusts none
of it beyond what the caps allow.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from kernalin_ci.daemon.outstream import pack

COPY_FAILED = 125
SAMPLE_S = 0.2
SPACES = ("/tmp", "/dev/shm")  # written by the job besides JOB (/tmp may be a link into it)


def free_bytes(*paths: str) -> int:
    """The least free space among the file systems of PATHS."""
    out = []
    for p in paths:
        try:
            st = os.statvfs(p)
            out.append(st.f_bavail * st.f_frsize)
        except OSError:
            continue
    return min(out) if out else 0


def run(command: list[str], cwd: str, free) -> tuple[int, int]:
    """COMMAND's exit code (128+N: killed by signal N; 127: it could not start) and the least of free()
    sampled while it ran (a job that filled its disk, then cleaned up, still counts)."""
    least = free()
    try:
        proc = subprocess.Popen(command, cwd=cwd)
    except OSError as e:
        print(f"kernalin-ci daemon: cannot start the job's command: {e}", file=sys.stderr)
        return 127, least
    while True:
        try:
            code = proc.wait(SAMPLE_S)
            return (code if code >= 0 else 128 - code), least
        except subprocess.TimeoutExpired:
            least = min(least, free())


def reap() -> int:
    """Kill every process this one may signal but the sandbox's init (bubblewrap, pid 1 of the sandbox's own
    PID namespace): what a job left running after its command ended. Only inside that namespace (pid 1 is
    bubblewrap): kill(-1) anywhere else would reach the user's other processes. How many were left."""
    try:
        with open("/proc/1/comm") as f:
            if f.read().strip() != "bwrap":
                return 0
    except OSError:
        return 0
    mine = os.getpid()
    left = 0
    for _ in range(100):
        alive = [p for p in _pids() if p not in (1, mine)]
        if not alive:
            break
        left = max(left, len(alive))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(-1, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.01)
    return left


def _pids() -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if f.read().rpartition(")")[2].split()[0] != "Z":
                        out.append(int(name))
            except (OSError, IndexError):
                continue
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print("usage: jobwrap CHECKOUT JOB FD -- COMMAND...", file=sys.stderr)
        return 2
    src, job, fd, command = argv[0], argv[1], int(argv[2]), argv[4:]
    with contextlib.suppress(OSError, AttributeError):  # a process of the job must not read or trace this one
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    stream = os.fdopen(fd, "wb")
    repo, out = os.path.join(job, "repo"), os.path.join(job, "out")
    least = free_bytes(job, *SPACES)
    try:
        for d in ("out", "home", "tmp"):
            os.makedirs(os.path.join(job, d), exist_ok=True)
        shutil.copytree(src, repo, symlinks=True)
    except (OSError, shutil.Error) as e:
        detail = e.args[0][0][2] if isinstance(e, shutil.Error) and e.args and e.args[0] else e
        print(f"kernalin-ci daemon: cannot copy the checkout into the job's disk: {detail}", file=sys.stderr)
        code = COPY_FAILED
    else:
        code, seen = run(command, repo, lambda: free_bytes(job, *SPACES))
        least = min(least, seen)
    left = reap()
    if left:
        print(f"kernalin-ci daemon: {left} processes of the job outlived its command: killed", file=sys.stderr)
    sys.stdout.flush()
    try:
        stream.write(json.dumps({"free": min(least, free_bytes(job, *SPACES))}).encode() + b"\n")
        if os.path.isdir(out):
            pack(out, stream)
        stream.close()
    except OSError as e:  # the daemon stopped reading (a cap): its own message says why
        print(f"kernalin-ci daemon: out/ not handed back: {e}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
