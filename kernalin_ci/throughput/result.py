"""The typed result of `bench_model` (kernalin_ci.throughput.bench): a ModelResult, the model object of
docs/tokens.md (`to_json`, `from_json`). A leaf: it imports only the statistics and the model's spec, so the
report and the renderers read it without importing the benchmark's driver."""

from __future__ import annotations

from dataclasses import dataclass, field

from kernalin_ci.bench import stats
from kernalin_ci.throughput.spec import ModelSpec, ServingPoint


@dataclass
class ModelResult:
    """The JSON of docs/tokens.md ("model" in report.json, `kernalin-ci bench --model --json`)."""

    spec: ModelSpec
    device: str
    roles: dict = field(default_factory=dict)  # role -> kernel name, or "torch" where no kernel is configured
    measured: bool = False
    reason: str | None = None  # why nothing was measured
    mode: str | None = None  # "full" | "per-layer"
    mode_why: str | None = None
    layers_built: int | None = None
    points: list = field(default_factory=list)
    verdict: stats.Verdict | None = None  # geometric mean over the serving points (step time)
    rounds: int = 0
    stopped: str = ""
    seconds: float = 0.0
    bench_seconds: float = 0.0
    setup_seconds: float = 0.0
    error: str | None = None
    error_kind: str | None = None
    notes: list = field(default_factory=list)
    instances: dict = field(default_factory=dict)  # name -> [rounds, points, reps] ms per step

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_json(self) -> dict:
        s = self.spec
        return {
            "model": s.name,
            "shape": s.shape(),
            "source": s.source,
            "price_per_hour": s.price_per_hour,
            "price_source": s.price_source,
            "device": self.device,
            "kernels": self.roles,
            "measured": self.measured,
            "reason": self.reason,
            "mode": self.mode,
            "mode_why": self.mode_why,
            "layers_built": self.layers_built,
            "points": self.points,
            "verdict": self.verdict.to_json() if self.verdict else None,
            "rounds": self.rounds,
            "stopped": self.stopped,
            "seconds": self.seconds,
            "bench_seconds": self.bench_seconds,
            "setup_seconds": self.setup_seconds,
            "error": self.error,
            "error_kind": self.error_kind,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, d: dict) -> ModelResult:
        """The typed result of a report.json's `model` (its spec: the name, shape, price and serving points
        that object holds; the step times are not in report.json)."""
        points = list(d.get("points") or [])
        spec = ModelSpec(
            name=d.get("model") or "",
            **(d.get("shape") or {}),
            serving=[ServingPoint(p["batch"], p["context"]) for p in points],
            **{k: d[k] for k in ("price_per_hour", "price_source", "source") if k in d},
        )
        v = d.get("verdict")
        return cls(
            spec,
            d.get("device") or "",
            roles=dict(d.get("kernels") or {}),
            measured=bool(d.get("measured")),
            reason=d.get("reason"),
            mode=d.get("mode"),
            mode_why=d.get("mode_why"),
            layers_built=d.get("layers_built"),
            points=points,
            verdict=stats.Verdict.from_json(v) if isinstance(v, dict) else None,
            rounds=d.get("rounds", 0),
            stopped=d.get("stopped", ""),
            seconds=d.get("seconds", 0.0),
            bench_seconds=d.get("bench_seconds", 0.0),
            setup_seconds=d.get("setup_seconds", 0.0),
            error=d.get("error"),
            error_kind=d.get("error_kind"),
            notes=list(d.get("notes") or []),
        )
