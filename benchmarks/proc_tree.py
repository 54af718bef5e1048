"""Memory and CPU time of a process tree, sampled from /proc (Linux), for the benchmarks on a shared machine.

getrusage(RUSAGE_CHILDREN) misses the sandboxed kernel workers (the PID namespace's init dies first and the
kernel reaps them, their times lost), and a wall clock on a machine shared with other jobs says as much about
the load as about the gate. So a thread reads /proc every INTERVAL seconds: the largest sum of resident memory
over the tree, and per process its user + system time, summed over every process seen (each process's last
sample: up to INTERVAL of a process's final CPU time is missed, so the CPU figure is a lower bound).
"""

from __future__ import annotations

import json
import os
import threading
import time

INTERVAL = 0.2
TICKS = os.sysconf("SC_CLK_TCK")


def _snapshot() -> dict[int, tuple[int, int, float]]:
    """pid -> (parent pid, resident bytes, CPU seconds) of every process readable in /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # fields[0] is the state (field 3 of stat): ppid is field 4, utime 14, stime 15, rss 24 (pages)
            ppid, cpu = int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS
            rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
        out[int(d)] = (ppid, rss, cpu)
    return out


def _tree(snap: dict, root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in snap.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in snap and pid not in found:
            found.append(pid)
            todo += children.get(pid, [])
    return found


def label(pid: int) -> str:
    """What a process is, for a breakdown: a kernel worker by its task (and the case it starts from, read from
    its job file), `python -m MODULE` by its module, anything else by its program's name."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not argv:
        return "?"
    if os.path.basename(argv[0]) in ("bwrap", "setpriv", "timeout"):  # a wrapper: its own time, apart
        return os.path.basename(argv[0])
    if "kernalin_ci.kernel_worker" in argv:
        i = argv.index("kernalin_ci.kernel_worker")
        try:
            with open(argv[i + 1]) as f:
                job = json.load(f)
            start = (job.get("job") or {}).get("start")
            return f"worker {job.get('task')}" + (f" from case {start}" if start is not None else "")
        except (OSError, ValueError, IndexError):
            return "worker"
    if "-m" in argv[:-1]:
        return f"{os.path.basename(argv[0])} -m {argv[argv.index('-m') + 1]}"
    if "-c" in argv[:3]:
        return f"{os.path.basename(argv[0])} -c"
    return os.path.basename(argv[0])


class TreeSampler:
    """`with TreeSampler(pid) as s: ...` then s.peak_rss_mb and s.cpu_seconds of PID and its descendants;
    s.processes: each process's label, when it was first and last seen (seconds after the start) and its CPU."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak_rss = 0
        self._cpu: dict[int, float] = {}  # pid -> the last CPU seconds seen
        self._seen: dict[int, list] = {}  # pid -> [label, first seen, last seen]
        self._t0 = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        snap = _snapshot()
        pids = _tree(snap, self.pid)
        now = time.monotonic() - self._t0
        self.peak_rss = max(self.peak_rss, sum(snap[p][1] for p in pids))
        for p in pids:
            self._cpu[p] = max(self._cpu.get(p, 0.0), snap[p][2])
            if p not in self._seen:
                self._seen[p] = [label(p), now, now]
            self._seen[p][2] = now

    def _run(self) -> None:
        while not self._done.is_set():
            self._sample()
            self._done.wait(INTERVAL)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    @property
    def peak_rss_mb(self) -> int:
        return round(self.peak_rss / 2**20)

    @property
    def cpu_seconds(self) -> float:
        return round(sum(self._cpu.values()), 1)

    @property
    def processes(self) -> list[dict]:
        """Every process seen, in the order they appeared (the sampling's INTERVAL is the resolution)."""
        rows = [
            {"label": lab, "start": round(a, 1), "end": round(b, 1), "cpu": round(self._cpu.get(p, 0.0), 2)}
            for p, (lab, a, b) in self._seen.items()
        ]
        return sorted(rows, key=lambda r: r["start"])
