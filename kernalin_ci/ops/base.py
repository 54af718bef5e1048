"""The op protocol and the helpers every op shares.

An op (SPEC-ops.md) is described by one module in this package that defines an
object satisfying `Op`: its params, a default case set that reaches where bugs
hide, a probe case (the single demo probe most tools use), an input builder,
a float64 reference computed from the op's definition, reference-free
properties, bug fingerprints and benchmark shapes.

Everything here is plain data: a `Case` is JSON-serialisable, so a finding can
carry it and `kernalin-ci verify --case JSON` reproduces exactly that case.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol

from kernalin_ci.errors import UsageError
from kernalin_ci.lazy import torch

DTYPES = ("float32", "float16", "bfloat16")

# Relative-error tolerances (per output row: ||out - ref|| / ||ref||), see docs/verification.md.
# float32 allows tf32 matrix units (Triton's default for a float32 tl.dot), ~3e-4 typical.
# bfloat16 is loose for a stated reason: the Triton interpreter truncates fp32->bf16
# instead of rounding (an extra ~2^-9 relative, biased), on top of bf16's 8-bit mantissa.
TOLERANCE = {"float32": 2e-3, "float16": 6e-3, "bfloat16": 3e-2}


@dataclass
class Param:
    name: str
    default: Any
    kind: type
    doc: str
    choices: tuple | None = None
    check: Callable[[Any], str | None] | None = None  # returns an error text or None


@dataclass
class Case:
    """One launch configuration. `dims` holds shapes, lengths, positions, slots."""

    name: str
    dims: dict
    dtype: str = "float32"
    seed: int = 0
    tags: tuple = ()

    def to_json(self) -> dict:
        d = asdict(self)
        d["tags"] = list(self.tags)
        return d

    @classmethod
    def from_json(cls, d: dict | str) -> "Case":
        if isinstance(d, str):
            try:
                d = json.loads(d)
            except json.JSONDecodeError as e:
                raise UsageError(f"--case: not valid JSON: {e}") from None
        if not isinstance(d, dict) or "name" not in d or "dims" not in d:
            raise UsageError("--case: expected a JSON object with at least 'name' and 'dims'")
        if d.get("dtype", "float32") not in DTYPES:
            raise UsageError(f"--case: dtype must be one of {', '.join(DTYPES)}")
        return cls(name=d["name"], dims=dict(d["dims"]), dtype=d.get("dtype", "float32"),
                   seed=int(d.get("seed", 0)), tags=tuple(d.get("tags", ())))

    def summary(self) -> str:
        parts = []
        for k, v in self.dims.items():
            if isinstance(v, list):
                v = _short_list(v)
            parts.append(f"{k}={v}")
        return f"{self.name} [{self.dtype}, seed {self.seed}] " + " ".join(parts)


def _short_list(v: list) -> str:
    if len(v) <= 8:
        return "[" + ",".join(str(x) for x in v) + "]"
    return "[" + ",".join(str(x) for x in v[:6]) + f",...({len(v)} total)]"


@dataclass
class Expected:
    """What the reference says the entry must produce.

    `tensors`: float64 CPU tensors by output name (compared with a tolerance), or
    exact tensors in the input dtype (`exact=True`: compared bit for bit).
    """

    tensors: dict
    exact: bool = False
    info: dict = field(default_factory=dict)
    # per output name: extra tolerance per row (a float64 vector over the rows of that output), added to
    # the dtype's tolerance where a correct kernel's error provably grows with the input (rope: position)
    row_slack: dict = field(default_factory=dict)


class Op(Protocol):
    name: str
    params: tuple[Param, ...]
    written: tuple[str, ...]  # inputs the entry may write; every other input must stay unchanged
    domain_axes: tuple[str, ...]  # the shape axes of kernalin_ci.domain.AXES this op's cases vary

    def cases(self, params: dict, device: str, dtype: str | None) -> list[Case]: ...
    def probe(self, params: dict, dtype: str | None) -> Case: ...
    def shape_case(self, params: dict, dtype: str) -> Case: ...  # small, cheap, checked: one per domain value
    def inputs(self, case: Case, params: dict, device: str, poison: bool = True) -> dict: ...
    def outputs(self, ret: Any, kwargs: dict) -> dict: ...
    def reference(self, kwargs: dict, params: dict) -> Expected: ...
    def fingerprints(self, kwargs: dict, params: dict) -> list[tuple[str, dict]]: ...
    def properties(self, case: Case, kwargs: dict, outs: dict, params: dict) -> list: ...
    def bench_cases(self, params: dict, device: str, dtype: str | None) -> list[Case]: ...


def resolve_params(op_name: str, specs: tuple[Param, ...], raw: dict) -> dict:
    """Defaults plus validated user values; unknown keys and bad values are UsageErrors."""
    known = {p.name: p for p in specs}
    for k in raw:
        if k not in known:
            names = ", ".join(known) or "none"
            raise UsageError(f"op {op_name}: unknown param {k!r} (params: {names})")
    out = {}
    for p in specs:
        v = raw.get(p.name, p.default)
        if v is not None and p.name in raw:
            v = _coerce(op_name, p, v)
        if p.choices and v not in p.choices:
            raise UsageError(f"op {op_name}: param {p.name}={v!r} must be one of {', '.join(map(str, p.choices))}")
        if v is not None and p.check:
            err = p.check(v)
            if err:
                raise UsageError(f"op {op_name}: param {p.name}={v!r}: {err}")
        out[p.name] = v
    return out


def _coerce(op_name: str, p: Param, v: Any) -> Any:
    if isinstance(v, p.kind) and not (p.kind is int and isinstance(v, bool)):
        return v
    try:
        if p.kind is int:
            if isinstance(v, float) and v.is_integer():
                return int(v)
            return int(str(v), 0)
        if p.kind is float:
            f = float(v)
            if not math.isfinite(f):
                raise ValueError
            return f
        if p.kind is str:
            return str(v)
        if p.kind in (list, dict):
            v = json.loads(v) if isinstance(v, str) else v
            if isinstance(v, p.kind):
                return v
            raise ValueError
        if p.kind is bool:
            s = str(v).lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError
    except (TypeError, ValueError, json.JSONDecodeError):
        pass
    raise UsageError(f"op {op_name}: param {p.name}={v!r} is not a valid {p.kind.__name__}")


def positive(v) -> str | None:
    return None if v > 0 else "must be positive"


def power_of_two(v) -> str | None:
    return None if v > 0 and v & (v - 1) == 0 else "must be a positive power of two"


def torch_dtype(name: str):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def generator(seed: int):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(shape, g, dtype: str, device: str, scale: float = 1.0):
    """Random normal data drawn on the CPU (reproducible everywhere), then moved."""
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    return x.to(torch_dtype(dtype)).to(device)
