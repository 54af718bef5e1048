"""Runs -> one series per kernel and shape, with its change points as commit ranges."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kernalin_ci.history import changepoints
from kernalin_ci.history.model import Run


@dataclass
class SeriesPoint:
    commit: str
    base: str | None
    pr: int | None
    recorded_at: float
    conclusion: str  # the run's
    report_url: str | None
    verification: str | None
    findings: list[dict]
    failed_by: list[str]
    verdict: str | None
    ratio: float | None
    hdi: list[float] | None
    p_slower: float | None
    head_ms: float | None
    base_ms: float | None
    # the band of head times the run's posterior allows: base_ms * hdi (the base timed in the same run)
    band: list[float] | None
    gpu: str | None
    # the previous commit of this series (in the order given: the commit graph's when known); the verdict
    # above is against `base`, which is this commit when pull requests merge in order
    previous: str | None = None
    # the position of this commit among all the page's commits (the commit graph's order when known): the
    # one order of a kernel's timeline across its series
    order: int = 0


@dataclass
class Change:
    index: int  # in the series' points
    first_commit: str  # the first commit at the new level
    last_good: str  # the last commit at the old level: the change came in (last_good, first_commit]
    ratio: float  # new level / old level
    before_ms: float
    after_ms: float


@dataclass
class Series:
    kernel: str
    shape: str
    points: list[SeriesPoint] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    analysed: str = ""  # why change points were not looked for, when they were not

    def to_json(self) -> dict:
        return asdict(self)


def build(runs: list[Run]) -> list[Series]:
    """One series per (kernel, shape) in the order of RUNS (ancestry.arrange puts them in the commit
    graph's order); change points on head times."""
    by_key: dict[tuple[str, str], Series] = {}
    for order, run in enumerate(runs):
        for p in run.points:
            s = by_key.setdefault((p.kernel, p.shape), Series(p.kernel, p.shape))
            band = [p.base_ms * p.hdi[0], p.base_ms * p.hdi[1]] if p.base_ms and p.hdi else None
            s.points.append(
                SeriesPoint(
                    run.commit,
                    run.base,
                    run.pr,
                    run.recorded_at,
                    run.conclusion,
                    run.report_url,
                    p.verification,
                    p.findings,
                    p.failed_by,
                    p.verdict,
                    p.ratio,
                    p.hdi,
                    p.p_slower,
                    p.head_ms,
                    p.base_ms,
                    band,
                    p.provenance.get("gpu_name") or (run.environment or {}).get("gpu"),
                    s.points[-1].commit if s.points else None,
                    order,
                )
            )
    for s in by_key.values():
        find_changes(s)
    return sorted(by_key.values(), key=lambda s: (s.kernel, s.shape))


def find_changes(s: Series) -> None:
    timed = [(i, p) for i, p in enumerate(s.points) if p.head_ms]
    if not timed:
        s.analysed = "no timings (verification only)"
        return
    gpus = {p.gpu for _, p in timed}
    if len(gpus) > 1:  # times of different GPUs are not one series; analyse the newest GPU's
        newest = timed[-1][1].gpu
        timed = [(i, p) for i, p in timed if p.gpu == newest]
    try:
        found = changepoints.detect([p.head_ms for _, p in timed])
    except ImportError:
        s.analysed = "not analysed (ruptures is not installed: pip install 'kernalin-ci[history]')"
        return
    if found is None:
        s.analysed = f"too few timed commits ({len(timed)} < {changepoints.MIN_POINTS})"
        return
    for cp in found:
        i_new, p_new = timed[cp.index]
        s.changes.append(Change(i_new, p_new.commit, timed[cp.index - 1][1].commit, cp.ratio, cp.before, cp.after))
