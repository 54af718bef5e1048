"""What history keeps of one gate run: plain data, serialised as JSON (docs/history.md: the record).

A Run is one commit of the default branch; its points are the kernels (and, when benchmarked, each
shape) the gate checked at that commit. Times are the medians the gate measured for the base and the
head of the run; `ratio` and `hdi` are the posterior of head/base from the same run (the base being
the commit the gate compared against: the previous recorded commit when pull requests merge in order).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from kernalin_ci import __version__
from kernalin_ci.device import DEVICES
from kernalin_ci.report.model import Report

RECORD_VERSION = 1
MAX_FINDINGS = 20  # findings kept per point (the report keeps them all)
PROVENANCE_KEYS = ("gpu_name", "gpu_uuid", "driver", "torch", "cuda", "triton")


@dataclass
class Point:
    kernel: str
    shape: str  # "" for a kernel without a per-shape benchmark (verification only)
    status: str  # the gate's: changed | new | unchanged
    verification: str | None  # pass | fail | None (not verified at this commit)
    findings: list[dict] = field(default_factory=list)  # {check, bug_class, message, path, line}
    failed_by: list[str] = field(default_factory=list)
    verdict: str | None = None  # faster | slower | equivalent | inconclusive | None
    ratio: float | None = None  # head/base, posterior median
    hdi: list[float] | None = None  # [lo, hi] of head/base
    p_slower: float | None = None
    p_faster: float | None = None
    base_ms: float | None = None  # median time per launch
    head_ms: float | None = None
    clock: str | None = None  # cuda-events | cpu-wall-clock
    # where the timings were taken, when the report's explain.provenance says (gpu_name, driver, versions)
    provenance: dict = field(default_factory=dict)


@dataclass
class Run:
    repo: str
    commit: str  # the commit of the default branch this run stands for
    base: str | None  # the commit the gate compared against
    branch: str
    recorded_at: float
    conclusion: str
    reason: str = ""
    pr: int | None = None
    device: str = ""
    environment: dict = field(default_factory=dict)  # gpu, torch, triton, python, kernalin_ci
    report_url: str | None = None
    points: list[Point] = field(default_factory=list)
    version: int = RECORD_VERSION

    @property
    def key(self) -> str:
        """A commit is recorded once per repository."""
        return f"{self.repo}@{self.commit}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Run:
        d = dict(d)
        d["points"] = [Point(**p) for p in d.get("points", [])]
        return cls(**d)


def _findings(v) -> list[dict]:
    out = []
    for f in v.findings[:MAX_FINDINGS] if v is not None else []:
        out.append(
            {
                "check": f.check,
                "bug_class": f.bug_class,
                "message": f.message,
                "path": f.location.path if f.location else None,
                "line": f.location.line if f.location else None,
            }
        )
    return out


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def points_of(report: Report) -> list[Point]:
    """The points of one report: a point per benchmarked shape, else one per checked kernel."""
    out = []
    for k in report.kernels:
        if k.status == "unchanged":
            continue  # not run at this commit: its series goes on from the last commit that checked it
        v = k.verification
        start = (k.explain.provenance.start if k.explain is not None else None) or {}
        common = dict(
            kernel=k.name,
            status=k.status,
            verification=v.verdict if v is not None else None,
            findings=_findings(v),
            failed_by=list(k.failed_by),
            provenance={key: start[key] for key in PROVENANCE_KEYS if start.get(key) is not None},
        )
        b = k.benchmark
        v = b.verdict if b is not None else None
        clock = (b.clock or None) if b is not None else None
        shapes = [s for s in (b.shapes if b is not None else []) if s.verdict is not None]
        ident = k.explain.identity if k.explain is not None else None
        if not shapes:
            out.append(
                Point(
                    shape="",
                    # byte-identical compiled code was not timed: equivalent by construction (docs/benchmarking.md)
                    verdict=v.verdict if v else ("equivalent" if ident is not None and ident.verdict else None),
                    ratio=_num(v.ratio) if v else None,
                    hdi=list(v.hdi) if v else None,
                    p_slower=_num(v.p_slower) if v else None,
                    p_faster=_num(v.p_faster) if v else None,
                    clock=clock,
                    **common,
                )
            )
            continue
        for s in shapes:
            sv = s.verdict
            out.append(
                Point(
                    shape=str(s.shape),
                    verdict=sv.verdict,
                    ratio=_num(sv.ratio),
                    hdi=list(sv.hdi),
                    p_slower=_num(sv.p_slower),
                    p_faster=_num(sv.p_faster),
                    base_ms=_num(s.base_ms),
                    head_ms=_num(s.head_ms),
                    clock=clock,
                    **common,
                )
            )
    return out


def run_from_report(
    report: Report | dict,
    *,
    repo: str,
    commit: str,
    branch: str,
    pr: int | None = None,
    report_url: str | None = None,
    recorded_at: float | None = None,
) -> Run:
    """The Run a report (or report.json's object, read with Report.from_json) stands for, recorded as
    commit COMMIT of BRANCH."""
    if isinstance(report, dict):
        report = Report.from_json(report)
    return Run(
        repo=repo,
        commit=commit,
        base=(report.base or {}).get("sha"),
        branch=branch,
        recorded_at=time.time() if recorded_at is None else recorded_at,
        conclusion=report.conclusion,
        reason=report.reason,
        pr=pr if pr is not None else report.pr,
        device=report.device,
        environment=dict(report.environment or {}),
        report_url=report_url,
        points=points_of(report),
    )


def environment(device: str) -> dict:
    """The GPU and software the gate ran on (recorded in report.json as `environment`). Nothing is
    imported and CUDA is not initialised here: versions come from the installed packages' metadata,
    the GPU's name from nvidia-smi (the first device CUDA_VISIBLE_DEVICES shows)."""
    import platform
    from importlib import metadata

    env: dict = {"python": platform.python_version(), "kernalin_ci": __version__}
    for pkg in ("torch", "triton"):
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = "not installed"
    env["gpu"] = _gpu_name() if DEVICES[device].gpu else "none (CPU interpreter)"
    return env


def _gpu_name() -> str:
    import os
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return "unknown (no nvidia-smi)"
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    try:
        r = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"] + (["-i", first] if first else []),
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({type(e).__name__})"
    name = r.stdout.strip().splitlines()[0].strip() if r.returncode == 0 and r.stdout.strip() else ""
    return name or "unknown (nvidia-smi failed)"
