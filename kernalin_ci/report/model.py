"""The gate's Report: plain dataclasses, serialised as report.json (schema: docs/report.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SCHEMA_VERSION = 1


@dataclass
class KernelReport:
    name: str
    op: str
    entry: str
    status: str  # "changed" | "new" | "removed" | "unchanged"
    reasons: list[str] = field(default_factory=list)
    verification: dict | None = None  # VerifyResult.to_json(): verdict, findings (with case, reproduce, location)
    benchmark: dict | None = None  # the `kernalin-ci bench` verdict JSON, or None (new kernel, bench off)
    benchmark_note: str | None = None  # why there is no benchmark, or why it does not gate
    error: str | None = None  # infrastructure failure for this kernel
    failed_by: list[str] = field(default_factory=list)  # policy items this kernel failed: finding/slower/...
    seconds: float = 0.0
    explain: dict | None = None  # kernalin_ci.explain: identity, % of peak, why, provenance, re-check


@dataclass
class PipelineReport:
    name: str
    members: dict  # role -> kernel name
    verification: dict | None = None
    failed_by: list[str] = field(default_factory=list)
    seconds: float = 0.0


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
    model: dict | None = None  # decode tokens/s and $/Mtok, base against head (docs/tokens.md); None: no `model:`

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Report:
        d = dict(d)
        d["kernels"] = [KernelReport(**k) for k in d.get("kernels", [])]
        d["pipelines"] = [PipelineReport(**p) for p in d.get("pipelines", [])]
        return cls(**d)

    @property
    def failed(self) -> bool:
        return self.conclusion == "failure"
