"""/metrics in the Prometheus text exposition format (version 0.0.4).

Counters and histograms live in memory (they restart at zero with the process, as Prometheus
expects); gauges (queue depth, jobs by state, GPU busy) are read from the store at scrape time.
"""

from __future__ import annotations

import math
import os
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "kernalin_ci_"

# name -> (type, help, histogram buckets)
DEFINITIONS = {
    "webhook_deliveries_total": ("counter", "Webhook deliveries by event and result.", None),
    "webhook_ack_seconds": (
        "histogram",
        "Time from a delivery's first byte to its answer.",
        (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    ),
    "job_queue_wait_seconds": (
        "histogram",
        "Time jobs waited for a slot.",
        (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400),
    ),
    "job_duration_seconds": (
        "histogram",
        "Time jobs ran, by outcome.",
        (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
    ),
    "jobs_finished_total": ("counter", "Job runs that ended, by outcome.", None),
    "posts_total": ("counter", "Results posted to GitHub, by result.", None),
    "queue_depth": ("gauge", "Jobs waiting for a slot.", None),
    "jobs": ("gauge", "Jobs in the store by state.", None),
    "gpu_busy": ("gauge", "1 while a slot runs a job.", None),
    "process_resident_memory_bytes": ("gauge", "Resident memory of the daemon process.", None),
}


def _labels(labels: dict | None) -> tuple:
    return tuple(sorted((labels or {}).items()))


def _fmt_labels(items: tuple, extra: tuple = ()) -> str:
    items = tuple(items) + tuple(extra)
    if not items:
        return ""
    esc = [(k, str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')) for k, v in items]
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc) + "}"


def _fmt_value(v: float) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._counters: dict[tuple, float] = {}
        self._hist: dict[tuple, list] = {}  # key -> [bucket counts..., sum, count]

    def inc(self, name: str, labels: dict | None = None, by: float = 1) -> None:
        key = (name, _labels(labels))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0) + by

    def observe(self, name: str, value: float, labels: dict | None = None) -> None:
        buckets = DEFINITIONS[name][2]
        key = (name, _labels(labels))
        with self._lock:
            h = self._hist.setdefault(key, [0] * (len(buckets) + 2))
            for i, b in enumerate(buckets):
                if value <= b:
                    h[i] += 1
            h[-2] += value
            h[-1] += 1

    def render(self, gauges: dict[str, list[tuple[dict, float]]]) -> str:
        """The exposition text: every defined metric that has samples, gauges given by the caller."""
        with self._lock:
            counters = dict(self._counters)
            hists = {k: list(v) for k, v in self._hist.items()}
        lines = []
        for name, (kind, text, buckets) in DEFINITIONS.items():
            full = PREFIX + name
            samples = []
            if kind == "counter":
                samples = [
                    f"{full}{_fmt_labels(lb)} {_fmt_value(v)}" for (n, lb), v in sorted(counters.items()) if n == name
                ]
            elif kind == "gauge":
                samples = [f"{full}{_fmt_labels(_labels(lb))} {_fmt_value(float(v))}" for lb, v in gauges.get(name, [])]
            else:
                for (n, lb), h in sorted(hists.items()):
                    if n != name:
                        continue
                    for i, b in enumerate(buckets):
                        samples.append(f"{full}_bucket{_fmt_labels(lb, (('le', _fmt_value(float(b))),))} {h[i]}")
                    samples.append(f"{full}_bucket{_fmt_labels(lb, (('le', '+Inf'),))} {h[-1]}")
                    samples.append(f"{full}_sum{_fmt_labels(lb)} {_fmt_value(float(h[-2]))}")
                    samples.append(f"{full}_count{_fmt_labels(lb)} {h[-1]}")
            if samples:
                lines += [f"# HELP {full} {text}", f"# TYPE {full} {kind}", *samples]
        return "\n".join(lines) + "\n"


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of PID (default: this process), from /proc."""
    try:
        with open(f"/proc/{pid or os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
