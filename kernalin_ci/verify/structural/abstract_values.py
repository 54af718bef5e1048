"""An abstract interpreter for TTIR: every program of one captured launch, without data.

Integers, booleans and pointers are concrete: program ids, ranges, strides and
the loaded *index* values (kv_lens, block tables, slot mappings, positions,
from the capture's inputs, which are chosen by the tool, never the user's).
Floats are abstract, lane by lane:

* a constant (`c`, when `lin` and no term has a non-zero coefficient),
* an affine form `c + sum(coef * atom)` over loaded elements (`terms`), kept
  only where a model asks for it (RoPE and KV append: their outputs are linear
  in the inputs), or
* opaque (`lin` false): some function of the data.

Each lane also carries tag bits: which tensors' data flowed in (SRC), whether
that data may be garbage (INV: read past the valid region, out of bounds, or
uninitialised), and the POS label, set on lanes that belong to an invalid
position (the op's model decides which positions are invalid; see
`attention.py`). Integer values carry SRC bits too (an offset computed from a
loaded slot), and PID/IV bits (derived from a program id / loop counter: IVBIT).

The interpreter records every load and store (tensor, element offsets, mask,
value) and every exp; the analyses work on those records and on the IR graph.
Anything outside the op vocabulary raises InterpError, which the caller turns
into a "could not verify" notice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernalin_ci.verify.structural.ir import IROp, Type, Value

PID = (1 << 0, 1 << 1, 1 << 2)
IVBIT = 1 << 3
POS = 1 << 4
SRC_SHIFT, INV_SHIFT = 8, 32
MAX_TENSORS = 24
SRC_MASK = np.uint64(((1 << MAX_TENSORS) - 1) << SRC_SHIFT)
INV_MASK = np.uint64(((1 << MAX_TENSORS) - 1) << INV_SHIFT)
MAX_TERMS = 8
MAX_STEPS = 400_000  # op evaluations per launch


def src_bit(t: int) -> int:
    return 1 << (SRC_SHIFT + t)


def inv_bit(t: int) -> int:
    return 1 << (INV_SHIFT + t)


class InterpError(Exception):
    def __init__(self, msg: str, op: IROp | None = None):
        super().__init__(msg)
        self.op = op


# --------------------------------------------------------------------------- values


def _u64(shape, v=0):
    return np.full(shape, np.uint64(v), dtype=np.uint64)


@dataclass
class IntValue:
    """Integers and booleans (i1): concrete values; `unk` lanes are unknown."""

    v: np.ndarray
    tags: np.ndarray
    unk: np.ndarray

    @staticmethod
    def const(x, shape=(), dtype=np.int64, tags=0):
        return IntValue(np.full(shape, x, dtype=dtype), _u64(shape, tags), np.zeros(shape, dtype=bool))


@dataclass
class PointerValue:
    """Pointers: tensor index per lane (-1 unknown) and byte offset from that tensor's element 0."""

    t: np.ndarray
    off: np.ndarray
    tags: np.ndarray
    esize: int
    pointee: str


@dataclass
class FloatValue:
    """Floats, per lane: `c` where `lin` (plus the affine `terms`: (atom block, index, coefficient)), else
    opaque."""

    c: np.ndarray
    lin: np.ndarray
    terms: list
    tags: np.ndarray

    @staticmethod
    def const(x, shape=()):
        return FloatValue(np.full(shape, float(x)), np.ones(shape, dtype=bool), [], _u64(shape))

    @staticmethod
    def opaque(shape, tags):
        return FloatValue(
            np.zeros(shape), np.zeros(shape, dtype=bool), [], np.broadcast_to(tags, shape).astype(np.uint64)
        )

    def known(self) -> np.ndarray:
        k = self.lin.copy()
        for _, _, coef in self.terms:
            k &= coef == 0
        return k


@dataclass
class Access:
    kind: str  # "load" | "store"
    op: IROp
    program: tuple
    tensor: np.ndarray  # per lane tensor index
    elem: np.ndarray  # per lane element offset (in the tensor's own elements)
    byte: np.ndarray  # per lane byte offset
    mask: np.ndarray  # lanes that access memory
    inb: np.ndarray  # lanes inside their tensor
    value: object = None
    iters: tuple = ()
    block: int = -1  # loads: the atom block id


@dataclass
class ExpEvent:
    op: IROp
    program: tuple
    arg: FloatValue
    result: FloatValue


@dataclass
class SumEvent:
    """A sum over lanes (tt.reduce with addf, or the first operand of tt.dot) that mixes POS-labelled lanes with
    others: the weights the analyses check at positions that must not count."""

    op: IROp
    program: tuple
    operand: Value
    value: FloatValue


@dataclass
class LaunchTrace:
    accesses: list = field(default_factory=list)
    exps: list = field(default_factory=list)
    sums: list = field(default_factory=list)
    blocks: list = field(default_factory=list)  # atom block id -> (tensor idx per lane, elem per lane)
    values: dict = field(default_factory=dict)  # first program only: Value -> last runtime value
    programs: int = 0
    steps: int = 0
    overflow: list = field(default_factory=list)  # (op, program) where a 32-bit op wrapped
    int_tags: dict = field(default_factory=dict)  # integer Value -> OR of its tags over every program


# --------------------------------------------------------------------------- helpers

_NP_FLOAT = {"f16": np.float16, "bf16": np.float32, "f32": np.float32, "f64": np.float64, "f8": np.float32}
_NP_INT = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64}
_ELSIZE = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "f8": 1, "i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "u8": 1}


def _bits(t: Type) -> int:
    return t.bits if t.elem != "i1" else 1


def _wrap(v: np.ndarray, bits: int, unsigned=False) -> np.ndarray:
    if bits >= 64 or bits == 0:
        return v.astype(np.int64)
    if bits == 1:
        return (v & 1).astype(bool)
    m = 1 << bits
    w = np.mod(v.astype(np.int64), m)
    if not unsigned:
        w = np.where(w >= (m >> 1), w - m, w)
    return w


def _bcast_to(a: np.ndarray, shape) -> np.ndarray:
    return np.broadcast_to(a, shape).copy() if a.shape != tuple(shape) else a


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float64 values to bfloat16 (nearest even), returned as float64."""
    f = x.astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.where(np.isfinite(f), out, x)


_ROUND = {
    "f32": lambda x: x.astype(np.float32).astype(np.float64),
    "f16": lambda x: x.astype(np.float16).astype(np.float64),
    "bf16": _bf16,
}


def _round(v: FloatValue, elem: str) -> FloatValue:
    """Known lanes take the value the GPU computes in the result's precision."""
    with np.errstate(all="ignore"):
        c = np.where(v.lin, _ROUND[elem](v.c), v.c)
    return FloatValue(c, v.lin, v.terms, v.tags)


class _Terminator:
    def __init__(self, kind, values):
        self.kind, self.values = kind, values


def _span(info) -> int:
    if not info.shape:
        return 1
    return int(sum((n - 1) * s for n, s in zip(info.shape, info.strides)) + 1)


def _mask(m, shape) -> np.ndarray:
    if isinstance(m, IntValue):
        return np.broadcast_to(m.v.astype(bool) & ~m.unk, shape).copy() | np.broadcast_to(m.unk, shape)
    raise InterpError("mask is not a boolean")


def _as_fv(x, shape=None) -> FloatValue:
    if isinstance(x, FloatValue):
        if shape is None:
            return x
        return FloatValue(
            _bcast_to(x.c, shape),
            _bcast_to(x.lin, shape),
            [(b, _bcast_to(i, shape), _bcast_to(c, shape)) for b, i, c in x.terms],
            _bcast_to(x.tags, shape),
        )
    if isinstance(x, IntValue):
        s = shape if shape is not None else x.v.shape
        return FloatValue(_bcast_to(x.v.astype(np.float64), s), _bcast_to(~x.unk, s), [], _bcast_to(x.tags, s))
    raise InterpError("expected a float value")


# --------------------------------------------------------------------------- shape ops


def _map_value(x, fn):
    if isinstance(x, IntValue):
        return IntValue(fn(x.v), fn(x.tags), fn(x.unk))
    if isinstance(x, PointerValue):
        t = np.broadcast_to(x.t, x.off.shape)
        return PointerValue(fn(t), fn(x.off), fn(np.broadcast_to(x.tags, x.off.shape)), x.esize, x.pointee)
    if isinstance(x, FloatValue):
        shape = x.c.shape
        return FloatValue(
            fn(x.c),
            fn(x.lin),
            [(b, fn(_bcast_to(i, shape)), fn(_bcast_to(c, shape))) for b, i, c in x.terms],
            fn(_bcast_to(x.tags, shape)),
        )
    raise InterpError("unsupported value in a shape operation")
