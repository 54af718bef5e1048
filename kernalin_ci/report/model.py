"""The gate's Report: plain dataclasses holding the typed results (VerifyResult, BenchResult, Explanation,
ModelResult) until the writer (report/writer.py) serialises them as report.json (schema: docs/report.md);
`Report.from_json` is the one way back from report.json (the daemon, history)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from kernalin_ci.findings import VerifyResult, known
from kernalin_ci.trust import ConfigOrigin, Isolation

if TYPE_CHECKING:
    from kernalin_ci.bench.result import BenchResult
    from kernalin_ci.explain.model import Explanation
    from kernalin_ci.throughput.result import ModelResult

SCHEMA_VERSION = 1


@dataclass
class KernelReport:
    name: str
    op: str
    entry: str
    status: str  # "changed" | "new" | "removed" | "unchanged"
    reasons: list[str] = field(default_factory=list)
    verification: VerifyResult | None = None  # verdict, findings (with case, reproduce, location); None: not run
    benchmark: BenchResult | None = None  # the `kernalin-ci bench` result, or None (new kernel, bench off)
    benchmark_note: str | None = None  # why there is no benchmark, or why it does not gate
    error: str | None = None  # infrastructure failure for this kernel
    failed_by: list[str] = field(default_factory=list)  # policy items this kernel failed: finding/slower/...
    seconds: float = 0.0
    explain: Explanation | None = None  # kernalin_ci.explain: identity, % of peak, why, provenance, re-check

    @property
    def bench_verdict(self) -> str | None:
        """The benchmark's verdict (faster, slower, equivalent, inconclusive), or None (none, or it failed)."""
        b = self.benchmark
        return b.verdict.verdict if b is not None and b.verdict is not None else None

    def to_json(self) -> dict:
        d = _with_verification(replace(self, benchmark=None, explain=None))
        d["benchmark"] = self.benchmark.to_json() if self.benchmark is not None else None
        d["explain"] = self.explain.to_json() if self.explain is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict) -> KernelReport:
        # deferred: keeps the CLI's startup light (`--help` loads every command module)
        from kernalin_ci.bench.result import BenchResult
        from kernalin_ci.explain.model import Explanation

        d = _verification_of(known(cls, d))
        b, e = d.get("benchmark"), d.get("explain")
        return cls(
            **{
                **d,
                "benchmark": BenchResult.from_json(b) if isinstance(b, dict) else None,
                "explain": Explanation.from_json(e) if isinstance(e, dict) else None,
            }
        )


@dataclass
class PipelineReport:
    name: str
    members: dict  # role -> kernel name
    verification: VerifyResult | None = None
    failed_by: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return _with_verification(self)

    @classmethod
    def from_json(cls, d: dict) -> PipelineReport:
        return cls(**_verification_of(known(cls, d)))


@dataclass
class Report:
    conclusion: str  # "success" | "failure" | "neutral"
    reason: str  # one line: why
    base: dict  # {"ref", "sha"}
    head: dict
    device: str
    policy: dict  # fail_on, rope, budget_s, bench
    kernels: list[KernelReport] = field(default_factory=list)
    pipelines: list[PipelineReport] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    repo: str | None = None
    pr: int | None = None
    seconds: float = 0.0
    reproduce: str = ""
    environment: dict = field(default_factory=dict)  # gpu, torch, triton, python, kernalin_ci (history)
    schema: int = SCHEMA_VERSION
    model: ModelResult | None = None  # decode tokens/s and $/Mtok, base against head (docs/tokens.md); None: no model
    configuration: ConfigOrigin | None = None  # where the deciding configuration came from, how the PR's differs
    isolation: Isolation | None = None  # what kernel code ran under (docs/security.md)

    def to_json(self) -> dict:
        d = asdict(replace(self, kernels=[], pipelines=[], model=None, configuration=None, isolation=None))
        d["kernels"] = [k.to_json() for k in self.kernels]
        d["pipelines"] = [p.to_json() for p in self.pipelines]
        d["model"] = self.model.to_json() if self.model is not None else None
        d["configuration"] = self.configuration.to_json() if self.configuration is not None else None
        d["isolation"] = self.isolation.to_json() if self.isolation is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict) -> Report:
        """The typed Report of a report.json (checked against its schema by whoever reads it from outside);
        fields this version does not know (a newer version wrote it) are left out."""
        d = {"base": {}, "head": {}, "device": "", "policy": {}} | known(cls, d)
        d["kernels"] = [KernelReport.from_json(k) for k in d.get("kernels", [])]
        d["pipelines"] = [PipelineReport.from_json(p) for p in d.get("pipelines", [])]
        if isinstance(d.get("model"), dict):
            # deferred: keeps the CLI's startup light (`--help` loads every command module)
            from kernalin_ci.throughput.result import ModelResult

            d["model"] = ModelResult.from_json(d["model"])
        c, i = d.get("configuration"), d.get("isolation")
        d["configuration"] = ConfigOrigin.from_json(c) if isinstance(c, dict) else None
        d["isolation"] = Isolation.from_json(i) if isinstance(i, dict) else None
        return cls(**d)

    @property
    def failed(self) -> bool:
        return self.conclusion == "failure"


def _with_verification(item: KernelReport | PipelineReport) -> dict:
    """ITEM's report.json object: its fields in order, the verification serialised in its place."""
    d = asdict(replace(item, verification=None))
    d["verification"] = item.verification.to_json() if item.verification is not None else None
    return d


def _verification_of(d: dict) -> dict:
    v = d.get("verification")
    return {**d, "verification": VerifyResult.from_json(v) if isinstance(v, dict) else None}
