"""One kernel's explanation, typed until the writer: report.json's `explain` (docs/report.md), built by
gate.py and worded by render.py.

`Explanation.to_json` writes the four shapes report.json has always held, key for key in the same order:
the error alone (the explanation could not start), the identity and the error (it failed after timing),
skipped (identical compiled code: nothing timed) and full (with `peak_note` and `above_peak` where they
apply). `Explanation.from_json` reads any of them back (Report.from_json). The rows inside (% of peak,
why, the re-check, Nsight Compute) stay JSON objects: they are written once and only worded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernalin_ci.explain.identity import Identity
from kernalin_ci.findings import known


@dataclass
class Provenance:
    """Where and how the two sides ran."""

    start: dict | None = None  # provenance.environment() before timing: GPU, driver, clocks, versions, copy_gbs
    end: dict | None = None  # the same after timing; None: nothing was timed
    changed: list[str] = field(default_factory=list)  # what changed between start and end, and the toolchain
    regime: dict | None = None  # clock, l2_flush, reps, timing, regime; None: nothing was timed (not written)

    def to_json(self) -> dict:
        d: dict = {"start": self.start, "end": self.end, "changed": self.changed}
        if self.regime is not None:
            d["regime"] = self.regime
        return d

    @classmethod
    def from_json(cls, d: dict | None) -> Provenance:
        return cls(**known(cls, d or {}))


@dataclass
class Explanation:
    identity: Identity | None = None  # base against head compiled; None: the compiles never started
    verdict: str | None = None  # EQUIVALENT (skipped), or "inconclusive: environment changed (...)"
    peak: list[dict] | None = None  # per timed shape; None: the explanation was not made (`error` says why)
    why: list[dict] = field(default_factory=list)  # per differing launch, base -> head (identity.why_changed)
    provenance: Provenance = field(default_factory=Provenance)
    recheck: dict | None = None  # correctness after timing (recheck.recheck): case, verdict, findings, error
    profile: dict | None = None  # Nsight Compute (profile.nsight); None: not asked
    peak_note: str | None = None  # why shares of peak are missing (the CPU, a GPU not in the table)
    above_peak: bool = False  # a figure above peak: a measurement problem
    error: str | None = None

    @property
    def made(self) -> bool:
        """Whether the explanation was made (skipped or full), not only its error."""
        return self.peak is not None

    def to_json(self) -> dict:
        d: dict = {}
        if self.identity is not None:
            d["identity"] = self.identity.to_json()
        if self.made:
            d["verdict"] = self.verdict
            d["peak"] = self.peak
            d["why"] = self.why
            d["provenance"] = self.provenance.to_json()
            d["recheck"] = self.recheck
            d["profile"] = self.profile
            if self.peak_note is not None:
                d["peak_note"] = self.peak_note
            if self.above_peak:
                d["above_peak"] = True
        if self.error is not None:
            d["error"] = self.error
        return d

    @classmethod
    def from_json(cls, d: dict) -> Explanation:
        """Any explanation report.json holds; one with more than an identity and an error was made."""
        d = known(cls, d)
        ident = d.get("identity")
        return cls(
            **{
                **d,
                "identity": Identity.from_json(ident) if isinstance(ident, dict) else None,
                "peak": (d.get("peak") or []) if d.keys() - {"identity", "error"} else None,
                "why": d.get("why") or [],
                "provenance": Provenance.from_json(d.get("provenance")),
                "above_peak": bool(d.get("above_peak")),
            }
        )
