"""/metrics in the Prometheus text exposition format (version 0.0.4), written by `prometheus_client`.

Counters and histograms live in memory, in this daemon's own registry (they restart at zero with the
process, as Prometheus expects); gauges (queue depth, jobs by state, GPU busy) are read from the store at
scrape time and handed to `render`; the process's resident memory (and CPU time, open descriptors) comes
from prometheus_client's process collector.
"""

from __future__ import annotations

import os
import threading

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

# generate_latest writes the 0.0.4 text format (our names are plain ASCII: no escaping of the newer versions)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NAMESPACE = "kernalin_ci"

# name -> (kind, help, label names, histogram buckets)
DEFINITIONS = {
    "webhook_deliveries_total": ("counter", "Webhook deliveries by event and result.", ("event", "status"), None),
    "webhook_ack_seconds": (
        "histogram",
        "Time from a delivery's first byte to its answer.",
        (),
        (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    ),
    "job_queue_wait_seconds": (
        "histogram",
        "Time jobs waited for a slot.",
        (),
        (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400),
    ),
    "job_duration_seconds": (
        "histogram",
        "Time jobs ran, by outcome.",
        ("outcome",),
        (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
    ),
    "jobs_finished_total": ("counter", "Job runs that ended, by outcome.", ("outcome",), None),
    "posts_total": ("counter", "Results posted to GitHub, by result.", ("result",), None),
}
# read at scrape time (render's argument): name -> (help, label names)
GAUGES = {
    "queue_depth": ("Jobs waiting for a slot.", ()),
    "jobs": ("Jobs in the store by state.", ("state",)),
    "gpu_busy": ("1 while a slot runs a job.", ("slot",)),
}


class _Gauges:
    """A collector of the gauges `render` was last given."""

    def __init__(self):
        self.values: dict[str, list[tuple[dict, float]]] = {}

    def collect(self):
        for name, (text, labels) in GAUGES.items():
            family = GaugeMetricFamily(f"{NAMESPACE}_{name}", text, labels=list(labels))
            for lb, v in self.values.get(name, []):
                family.add_metric([str(lb[k]) for k in labels], float(v))
            yield family


class Metrics:
    def __init__(self):
        disable_created_metrics()  # no `_created` series beside each counter and histogram: nothing reads them
        self._lock = threading.Lock()
        self.registry = CollectorRegistry()
        self._gauges = _Gauges()
        self.registry.register(self._gauges)
        ProcessCollector(namespace=NAMESPACE, registry=self.registry)
        self._metrics = {}
        for name, (kind, text, labels, buckets) in DEFINITIONS.items():
            full = f"{NAMESPACE}_{name}"
            if kind == "counter":
                self._metrics[name] = Counter(full, text, labels, registry=self.registry)
            else:
                self._metrics[name] = Histogram(full, text, labels, buckets=buckets, registry=self.registry)

    def _child(self, name: str, labels: dict | None):
        m = self._metrics[name]
        return m.labels(**{k: str(v) for k, v in (labels or {}).items()}) if labels else m

    def inc(self, name: str, labels: dict | None = None, by: float = 1) -> None:
        self._child(name, labels).inc(by)

    def observe(self, name: str, value: float, labels: dict | None = None) -> None:
        self._child(name, labels).observe(value)

    def render(self, gauges: dict[str, list[tuple[dict, float]]]) -> str:
        """The exposition text: every metric, the gauges as given by the caller."""
        with self._lock:
            self._gauges.values = gauges
            return generate_latest(self.registry).decode()


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of PID (default: this process), from /proc: what the process collector reports for
    the daemon itself (benchmarks/daemon_load.py reads a daemon's from outside)."""
    try:
        with open(f"/proc/{pid or os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
