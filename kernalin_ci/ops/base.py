"""The op protocol and the helpers every op shares.

An op (docs/ops.md) is described by one module in this package, a subclass of
`Op` holding all that op's knowledge: its params, a default case set that
reaches where bugs hide, a probe case (the single demo probe most tools use),
an input builder, a float64 reference computed from the op's definition,
reference-free properties, bug fingerprints, benchmark shapes, the structural
capture's calls and the name of its structural analysis.

Everything here is plain data: a `Case` is JSON-serialisable, so a finding can
carry it and `kernalin-ci verify --case JSON` reproduces exactly that case.
"""

from __future__ import annotations

import importlib
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kernalin_ci.errors import UsageError
from kernalin_ci.findings import Finding
from kernalin_ci.lazy import torch
from kernalin_ci.ops.names import MODULES

if TYPE_CHECKING:
    from kernalin_ci.ops.bench_shapes import BenchRequest
    from kernalin_ci.ops.decode_loop import DecodeLoop

DTYPES = ("float32", "float16", "bfloat16")

# Relative-error tolerances (per output row: ||out - ref|| / ||ref||), see docs/verification.md.
# float32 allows tf32 matrix units (Triton's default for a float32 tl.dot), ~3e-4 typical.
# bfloat16: an 8-bit mantissa, and kernels that compute in bfloat16 round every step
# (bf16 x bf16 products, p.to(v.dtype) before a tl.dot).
TOLERANCE = {"float32": 2e-3, "float16": 6e-3, "bfloat16": 3e-2}


@dataclass
class Param:
    name: str
    default: Any
    kind: type
    doc: str
    choices: tuple[Any, ...] | None = None
    check: Callable[[Any], str | None] | None = None  # returns an error text or None


@dataclass
class Case:
    """One launch configuration. `dims` holds shapes, lengths, positions, slots."""

    name: str
    dims: dict[str, Any]
    dtype: str = "float32"
    seed: int = 0
    tags: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tags"] = list(self.tags)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any] | str) -> Case:
        if isinstance(d, str):
            try:
                d = json.loads(d)
            except json.JSONDecodeError as e:
                raise UsageError(f"case: not valid JSON: {e}", setting="case") from None
        if not isinstance(d, dict) or "name" not in d or "dims" not in d:
            raise UsageError("case: expected a JSON object with at least 'name' and 'dims'", setting="case")
        if d.get("dtype", "float32") not in DTYPES:
            raise UsageError(f"case: dtype must be one of {', '.join(DTYPES)}", setting="case")
        return cls(
            name=d["name"],
            dims=dict(d["dims"]),
            dtype=d.get("dtype", "float32"),
            seed=int(d.get("seed", 0)),
            tags=tuple(d.get("tags", ())),
        )

    def summary(self) -> str:
        parts = []
        for k, v in self.dims.items():
            if isinstance(v, list):
                v = _short_list(v)
            parts.append(f"{k}={v}")
        return f"{self.name} [{self.dtype}, seed {self.seed}] " + " ".join(parts)


def _short_list(v: list[Any]) -> str:
    if len(v) <= 8:
        return "[" + ",".join(str(x) for x in v) + "]"
    return "[" + ",".join(str(x) for x in v[:6]) + f",...({len(v)} total)]"


@dataclass
class Expected:
    """What the reference says the entry must produce.

    `tensors`: float64 CPU tensors by output name (compared with a tolerance), or
    exact tensors in the input dtype (`exact=True`: compared bit for bit).
    """

    tensors: dict[str, Any]
    exact: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    # per output name: extra tolerance per row (a float64 vector over the rows of that output), added to
    # the dtype's tolerance where a correct kernel's error provably grows with the input (rope: position)
    row_slack: dict[str, Any] = field(default_factory=dict)
    # per output name: extra tolerance per row added only where the case's dots run on TF32 (a float32 case on
    # a GPU, verify/precision.py): what TF32 operands provably move a row that normalisation does not protect
    tf32_slack: dict[str, Any] = field(default_factory=dict)
    # the relative tolerance when the op holds this dtype to a tighter one than TOLERANCE (float32 rope)
    tolerance: float | None = None


@dataclass(frozen=True)
class Traffic:
    """What one call must move and compute by the op's definition (docs/benchmarking.md): every input
    element the result depends on read once, every output element written once, the arithmetic of the
    definition's dot products and rotations (exp, max, casts not counted)."""

    bytes_read: int
    bytes_written: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


Params = dict[str, Any]  # resolved op params (resolve_params)
Tensors = dict[str, Any]  # keyword arguments of an entry, or outputs, by name


class Op(ABC):
    """The contract every op implements; `get_op(name)` gives an instance.

    Required: the params, the case plans, the input builder, the output mapping and the
    float64 reference. The rest has a default here that an op overrides where it has
    something to say. `root` is the directory user callables named in params resolve
    against (the custom op's reference and inputs; None: the current directory).
    """

    name: str
    params: tuple[Param, ...]
    written: tuple[str, ...] = ()  # inputs the entry may write; every other input must stay unchanged
    # True: outputs are judged bit for bit by `check` (whole buffers), not against `reference`
    exact: bool = False
    # True: `inputs` and `reference` call the user's own code (the custom op): they run in the worker
    # beside the entry, which hands their tensors back; the parent, which never imports user code, judges
    user_code: bool = False
    # the module of kernalin_ci.verify.structural that analyses this op's compiled IR; None: no analysis
    structural: str | None = None
    # True: a benchmark round may redraw the floating-point inputs in place (standard normal); False: it
    # builds them anew from another seed (inputs with structure a redraw would break)
    redraw_inputs: bool = True
    # the shape axes of kernalin_ci.domain.AXES this op's cases vary (a `domain:` may declare them);
    # empty: the user's own cases are the domain, and an error in any of them is a finding
    domain_axes: tuple[str, ...] = ()
    # What the op is, for the code outside ops/ that must know (it never compares op names: tests/test_layers.py).
    # The op's place in a decode step (ops/roles.py): "attention", "rope", "kv_append", or "decode_step" (all
    # three in one entry); None: it has none (custom)
    decode_role: str | None = None
    # True: k_cache and v_cache are paged, [num_blocks, block_size, Hkv, D] in the op's `layout` (ops/paged.py);
    # False: contiguous [B, Hkv, S, D] caches, or none
    paged_cache: bool = False
    # True: the op rotates q and k at `positions` (rope; decode_step, before it attends)
    rotates: bool = False
    # True: the op attends q over the caches up to kv_lens into `out` (the attention ops, decode_step)
    attends: bool = False
    # True: the op writes new tokens into the caches at `slot_mapping` (kv_append, decode_step)
    appends: bool = False
    # True: slot_mapping may hold -1, a padding token the entry must skip (kv_append)
    padding_slots: bool = False
    # the FlashInfer-Bench op_type whose decode definitions this op shares (kernalin_ci/workload.py: gqa_paged
    # for attention.decode_paged); None: none
    flashinfer_bench: str | None = None
    # cache -> the input whose rows its new slots hold unchanged, as the PTX engine's store property checks
    # them (kv_append); empty: the op's own analysis judges its stores (decode_step stores rotated keys)
    cache_copies: dict[str, str] = {}
    # (input, dim) -> the name of that size in the op's contract, where it differs from the usual one
    # (kernalin_ci.verify.structural.ptx_facts.SYMBOLS: B sequences, T tokens, NB cache blocks, W blocks per
    # sequence), e.g. rope's q is [T, Hq, D] and a contiguous cache [B, Hkv, S, D]
    shape_symbols: dict[tuple[str, int], str] = {}

    def __init__(self, root: str | None = None) -> None:
        self.root = root

    # ---------------------------------------------------------------- cases

    @abstractmethod
    def cases(self, params: Params, device: str, dtype: str | None) -> list[Case]:
        """The default case set: where bugs hide. dtype None: the main dtype plus a dtype sweep."""

    @abstractmethod
    def probe(self, params: Params, dtype: str | None) -> Case:
        """The single demo probe most tools use (position 0, batch 1)."""

    def shape_case(self, params: Params, dtype: str) -> Case:
        """A small, cheap, checked case at the op's base shape; kernalin_ci.domain moves it to each head dim,
        dtype, head count or block size it checks on its own, and probes a shape with it."""
        return self.probe(params, dtype)

    def validate_case(self, case: Case) -> str | None:
        """A case given by hand (--case): what breaks the op's shape rules, or None."""
        return None

    def bench_cases(self, params: Params, device: str, request: BenchRequest) -> list[Case]:
        """The shapes to time, from the benchmark request (bench params and device defaults)."""
        raise UsageError(f"op {self.name}: no benchmark shapes")

    def traffic(self, case: Case, params: Params) -> Traffic | None:
        """Bytes moved and FLOPs of one call of `case` by the op's definition; None: no model."""
        return None

    def redraws(self, params: Params) -> bool:
        """Whether a benchmark round may redraw the floating-point inputs in place with these params
        (`redraw_inputs`, unless the params give the inputs structure a redraw would break)."""
        return self.redraw_inputs

    def unanalysed(self, params: Params) -> list[str]:
        """What these params switch on that the op's structural analysis does not model, each named (the
        structural status says "not analysed for" each: never a silent pass). Empty: all of it is."""
        return []

    def capture_cases(self, params: Params) -> list[Case]:
        """Small calls for the structural capture, in preference order (the next is tried when a call
        is refused). Empty: the op has no structural capture."""
        return []

    def capture_twin(self, dims: dict[str, Any]) -> dict[str, Any] | None:
        """The dims of the structural capture's twin call (the PTX engine's shape symbols): the batch and the
        caches of capture call `dims` grown, nothing the kernels specialise on (heads, head dim, dtype)
        changed. None: no twin."""
        return None

    def counterexample_case(
        self, case: Case, params: Params, shape: dict[str, int], index: dict[str, dict[tuple[int, ...], int]]
    ) -> Case | None:
        """The capture case `case` with a PTX counterexample's values (docs/structural.md, "Replay"): `shape`
        the shape symbols (T, B, NB, ...), `index` the index tensors' entries by coordinates
        ({"slot_mapping": {(3,): -1}}). None: the op's cases cannot say it (the finding is not replayed)."""
        return None

    # ---------------------------------------------------------------- one call

    @abstractmethod
    def inputs(self, case: Case, params: Params, device: str, poison: bool = True) -> Tensors:
        """The entry's keyword arguments for `case` (seeded; canary-poisoned unless poison=False)."""

    def capture_inputs(self, case: Case, params: Params) -> Tensors:
        """The inputs of a structural capture call: CPU tensors with no poison."""
        return self.inputs(case, params, "cpu", poison=False)

    @abstractmethod
    def outputs(self, ret: Any, kw: Tensors) -> Tensors:
        """The entry's outputs by name, from its return value (or its written inputs)."""

    def loop(self, case: Case, params: Params, poison: bool) -> DecodeLoop | None:
        """A stateful op's case run as a decode loop of calls (ops/decode_loop.py: the decode_step op), one
        call of the entry per step, each step's raw result handed back as one part and judged by the parent
        (kernalin_ci.verify's loop_drive.py and loop_judge.py). None: the case is one call."""
        return None

    def written_names(self, params: Params) -> tuple[str, ...]:
        """The inputs an entry of this op may write, with these params."""
        return tuple(self.written)

    # ---------------------------------------------------------------- judging a call

    @abstractmethod
    def reference(self, kw: Tensors, params: Params) -> Expected:
        """The float64 reference from the op's definition (`kw`: the inputs before the call)."""

    def fingerprints(self, kw: Tensors, params: Params, case: Case) -> list[tuple[str, Tensors]]:
        """Alternative references, each what a known bug class would produce."""
        return []

    def properties(self, case: Case, kw: Tensors, outs: Tensors, params: Params) -> list[Finding]:
        """Reference-free checks of the outputs."""
        return []

    def check(self, case: Case, before: Tensors, kw: Tensors, outs: Tensors, params: Params) -> list[Finding]:
        """The op's own output check, used instead of the reference when `exact`."""
        return []

    def guard_class(self, name: str, side: str, before: Tensors) -> str | None:
        """The bug class of a write just `side` ("before" or "after") input `name`; None: stray-write."""
        return None

    def row_label(self, case: Case, kw: Tensors, name: str, row: int) -> str:
        """Output `name`'s row `row` (as compared: the last dim is a row), named for a person."""
        return f"{name} row {row}"

    @staticmethod
    def check_params(params: Params) -> str | None:
        """What the resolved params say together that no one of them says alone (`resolve_params` makes it a
        usage error), or None."""
        return None


def resolve_params(op_name: str, specs: tuple[Param, ...], raw: dict[str, Any]) -> Params:
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
    problem = _op_check(op_name, out)
    if problem:
        raise UsageError(f"op {op_name}: {problem}")
    return out


def _op_check(op_name: str, params: Params) -> str | None:
    """The op's own check of its params together (Op.check_params); None for a name that is not an op."""
    if op_name not in MODULES:
        return None
    op_class: type[Op] = importlib.import_module(f"kernalin_ci.ops.{MODULES[op_name]}").OP_CLASS
    return op_class.check_params(params)


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


def positive(v: Any) -> str | None:
    return None if v > 0 else "must be positive"


def valid_dims(dims: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    """None when every key holds a positive integer, else what is wrong (for `Op.validate_case`)."""
    for k in keys:
        v = dims.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return f"{k} must be a positive integer"
    return None


def capture_head_dims(params: Params) -> list[int]:
    """Head dims for the structural capture, in preference order: one that leaves a tail under its
    power-of-two block (48), then a power of two (64) for kernels that require one; or the pinned one."""
    return [int(params["head_dim"])] if params.get("head_dim") else [48, 64]


def capture_heads(params: Params) -> tuple[int, int]:
    """(Hq, Hkv) for the structural capture: a ratio that is neither 1 nor Hkv, unless pinned."""
    hq = int(params.get("num_q_heads") or 6)
    hkv = int(params.get("num_kv_heads") or (2 if hq % 2 == 0 else 1))
    return hq, (hkv if hq % hkv == 0 else 1)


def capture_case(dims: dict[str, Any], dtype: str = "float16") -> Case:
    """A structural capture call: float16 by default (the common serving dtype), a fixed seed."""
    return Case("structural-capture", dims, dtype, 11, ("structural",))


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(shape: tuple[int, ...], g: torch.Generator, dtype: str, device: str, scale: float = 1.0) -> torch.Tensor:
    """Random normal data drawn on the CPU (reproducible everywhere), then moved."""
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    return x.to(torch_dtype(dtype)).to(device)
