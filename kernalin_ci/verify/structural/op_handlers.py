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
loaded slot), and PID/IV bits (derived from a program id / loop counter).

The interpreter records every load and store (tensor, element offsets, mask,
value) and every exp; the analyses work on those records and on the IR graph.
Anything outside the op vocabulary raises InterpError, which the caller turns
into a "could not verify" notice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kernalin_ci.verify.structural.ir import Function, Module, Op, Type, Value, attr_int, parse_constant

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
    def __init__(self, msg: str, op: Op | None = None):
        super().__init__(msg)
        self.op = op


# --------------------------------------------------------------------------- values


def _u64(shape, v=0):
    return np.full(shape, np.uint64(v), dtype=np.uint64)


@dataclass
class IV:
    """Integers and booleans (i1): concrete values; `unk` lanes are unknown."""

    v: np.ndarray
    tags: np.ndarray
    unk: np.ndarray

    @staticmethod
    def const(x, shape=(), dtype=np.int64, tags=0):
        return IV(np.full(shape, x, dtype=dtype), _u64(shape, tags), np.zeros(shape, dtype=bool))


@dataclass
class PV:
    """Pointers: tensor index per lane (-1 unknown) and byte offset from that tensor's element 0."""

    t: np.ndarray
    off: np.ndarray
    tags: np.ndarray
    esize: int
    pointee: str


@dataclass
class FV:
    c: np.ndarray
    lin: np.ndarray
    terms: list
    tags: np.ndarray

    @staticmethod
    def const(x, shape=()):
        return FV(np.full(shape, float(x)), np.ones(shape, dtype=bool), [], _u64(shape))

    @staticmethod
    def opaque(shape, tags):
        return FV(np.zeros(shape), np.zeros(shape, dtype=bool), [], np.broadcast_to(tags, shape).astype(np.uint64))

    def known(self) -> np.ndarray:
        k = self.lin.copy()
        for _, _, coef in self.terms:
            k &= coef == 0
        return k


@dataclass
class Access:
    kind: str  # "load" | "store"
    op: Op
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
    op: Op
    program: tuple
    arg: FV
    result: FV


@dataclass
class SumEvent:
    """A sum over lanes (tt.reduce with addf, or the first operand of tt.dot) that mixes POS-labelled lanes with
    others: the weights the analyses check at positions that must not count."""

    op: Op
    program: tuple
    operand: Value
    value: FV


@dataclass
class Trace:
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


class Interp:
    """Runs one launch's kernel over its grid."""

    def __init__(
        self, module: Module, launch, capture, model=None, max_programs: int = 1024, shadow: dict | None = None
    ):
        self.module = module
        self.launch = launch
        self.capture = capture
        self.model = model
        self.linear = bool(getattr(model, "linear", False))
        self.names = list(capture.tensors)
        if len(self.names) > MAX_TENSORS:
            raise InterpError(f"more than {MAX_TENSORS} tensors")
        self.index = {n: i for i, n in enumerate(self.names)}
        self.infos = [capture.tensors[n] for n in self.names]
        self.max_programs = max_programs
        self.trace = Trace()
        # what earlier kernels (and programs) stored, shared across the launches of one entry:
        # tensor idx -> dict(written=count array, tags=uint64 array, known=bool array, c=float array)
        self.shadow = shadow if shadow is not None else {}
        self.iters: list = []

    # ------------------------------------------------------------------ shadow memory
    def _shadow(self, t: int):
        sh = self.shadow.get(t)
        if sh is None:
            info = self.infos[t]
            n = _span(info)
            sh = {
                "written": np.zeros(n, dtype=np.int32),
                "tags": np.zeros(n, dtype=np.uint64),
                "known": np.zeros(n, dtype=bool),
                "c": np.zeros(n),
            }
            self.shadow[t] = sh
        return sh

    # ------------------------------------------------------------------ running
    def run(self, programs=None) -> Trace:
        fn = self.module.kernel
        gx, gy, gz = self.launch.grid
        total = gx * gy * gz
        if total > self.max_programs and programs is None:
            raise InterpError(f"grid of {total} programs is larger than the {self.max_programs} analysed")
        args = self._bind_args(fn)
        self.trace.values.update(args)
        pids = programs or [(x, y, z) for z in range(gz) for y in range(gy) for x in range(gx)]
        for k, pid in enumerate(pids):
            self.pid = pid
            self.record = k == 0
            env = dict(args)
            self._run_function(fn, env, [])
            self.trace.programs += 1
        return self.trace

    def _bind_args(self, fn: Function) -> dict:
        rt = self.launch.runtime_args
        if len(rt) != len(fn.args):
            raise InterpError(f"the kernel's IR has {len(fn.args)} arguments, the launch {len(rt)}")
        env = {}
        for a, v in zip(rt, fn.args):
            env[v] = self._arg_value(a, v.type)
        return env

    def _arg_value(self, a, t: Type):
        if a.kind == "pointer":
            ti = self.index[a.tensor]
            return PV(
                np.array(ti, dtype=np.int16),
                np.array(a.byte_offset, dtype=np.int64),
                _u64(()),
                _ELSIZE.get(t.pointee, 4),
                t.pointee,
            )
        if a.kind in ("int", "bool"):
            return IV(
                np.array(int(a.value), dtype=np.int64 if a.kind == "int" else bool), _u64(()), np.zeros((), dtype=bool)
            )
        if a.kind == "float":
            return FV.const(a.value)
        raise InterpError(f"unsupported kernel argument {a.name} ({a.kind})")

    def _run_function(self, fn: Function, env, args_vals):
        """Run a function's blocks, following cf.br / cf.cond_br (early returns)."""
        block, vals = fn.body, args_vals
        for _ in range(10_000):
            term = self._run_block(block, env, vals)
            if term is None or term.kind != "branch":
                return term
            label, vals = term.values
            block = fn.block(label)
            if block is None:
                raise InterpError(f"branch to unknown block ^{label}")
        raise InterpError("too many branches")

    def _run_block(self, block, env, args_vals):
        for a, v in zip(block.args, args_vals):
            env[a] = v
        for op in block.ops:
            self.trace.steps += 1
            if self.trace.steps > MAX_STEPS:
                raise InterpError("the kernel runs more operations than the analysis budget allows")
            term = self._exec(op, env)
            if term is not None:
                return term
        return None

    def _exec(self, op: Op, env):
        name = op.name
        handler = _HANDLERS.get(name)
        if handler is None:
            prefix = name.split(".")[0]
            if name in _NOOPS or prefix in ("gpu", "ttg"):
                return None
            raise InterpError(f"unsupported operation {name}", op)
        ins = [env[o] if o in env else self._missing(o, op) for o in op.operands]
        out = handler(self, op, ins, env)
        if isinstance(out, _Terminator):
            return out
        if out is None:
            return None
        if not isinstance(out, (list, tuple)):
            out = [out]
        for r, v in zip(op.results, out):
            if isinstance(v, FV) and r.type.elem in _ROUND:
                v = _round(v, r.type.elem)
            elif isinstance(v, IV) and v.tags.size:
                # the provenance of every integer value, over all programs (width checks need it)
                self.trace.int_tags[r] = self.trace.int_tags.get(r, 0) | int(np.bitwise_or.reduce(v.tags.reshape(-1)))
            env[r] = v
            if self.record:
                self.trace.values[r] = v
        return None

    def _missing(self, v: Value, op: Op):
        raise InterpError(f"value {v.name} used before it is defined", op)

    # ------------------------------------------------------------------ loads and stores
    def load(self, op: Op, ins):
        ptr = ins[0]
        if not isinstance(ptr, PV):
            raise InterpError("load through a non-pointer (block pointers and descriptors are not supported)", op)
        shape = ptr.off.shape
        mask = _mask(ins[1], shape) if len(ins) > 1 else np.ones(shape, dtype=bool)
        other = ins[2] if len(ins) > 2 else None
        rtype = op.result.type
        tidx = np.broadcast_to(ptr.t, shape)
        if tidx.size and (tidx < 0).any():
            raise InterpError("load from a pointer whose tensor cannot be followed", op)
        t = int(tidx.reshape(-1)[0]) if tidx.size else 0
        if tidx.size and not (tidx == t).all():
            raise InterpError("one load from several tensors", op)
        info = self.infos[t]
        elem = np.floor_divide(ptr.off, info.elsize)
        aligned = np.mod(ptr.off, info.elsize) == 0
        inb = info.in_bounds(elem) & aligned
        acc = Access(
            "load",
            op,
            self.pid,
            np.broadcast_to(ptr.t, shape),
            elem,
            ptr.off,
            mask.copy(),
            inb,
            iters=tuple(self.iters),
        )
        self.trace.accesses.append(acc)
        if rtype.is_float:
            val = self._load_float(t, info, elem, mask, inb, other, shape, acc, ptr)
        else:
            val = self._load_int(t, info, ptr, elem, mask, inb, other, shape, rtype)
        acc.value = val
        return val

    def _load_int(self, t, info, ptr, elem, mask, inb, other, shape, rtype):
        npdt = _NP_INT.get(rtype.elem, np.int64)
        sh = self.shadow.get(t)
        if info.is_float:
            return IV(np.zeros(shape, dtype=np.int64), _u64(shape, src_bit(t)), np.ones(shape, dtype=bool))
        vals, ok = info.read(np.where(mask & inb, ptr.off, 0), npdt)
        v = vals.astype(np.int64 if npdt is not np.bool_ else bool)
        unk = mask & ~inb
        if sh is not None:
            e = np.clip(elem, 0, sh["written"].size - 1)
            unk |= mask & inb & (sh["written"][e] > 0)  # written by an earlier kernel: value not computed
        tags = _u64(shape, src_bit(t))
        if other is not None:
            ov = _bcast_to(other.v, shape)
            v = np.where(mask, v, ov.astype(v.dtype))
            unk = np.where(mask, unk, _bcast_to(other.unk, shape))
            tags = np.where(mask, tags, _bcast_to(other.tags, shape))
        else:
            unk = unk | ~mask
        return IV(v, tags, unk)

    def _load_float(self, t, info, elem, mask, inb, other, shape, acc, ptr):
        tags = _u64(shape, src_bit(t))
        invalid = mask & ~inb
        lin = np.ones(shape, dtype=bool)
        c = np.zeros(shape)
        terms = []
        # a table the entry built on the host (RoPE's cos/sin cache) is read with its real values; for other
        # ops a host-computed buffer is data like any input
        role_const = (info.role == "scratch" and info.init == "data" or info.role == "host") and bool(
            getattr(self.model, "host_tables", False)
        )
        sh = self.shadow.get(t)
        written = np.zeros(shape, dtype=bool)
        if sh is not None:
            e = np.clip(elem, 0, sh["written"].size - 1)
            written = mask & inb & (sh["written"][e] > 0)
        if role_const:
            # a table the entry computed on the host (cos/sin cache, inverse frequencies): real values
            npdt = {"float16": np.float16, "float32": np.float32, "float64": np.float64}.get(info.dtype)
            if npdt is None:
                lin[:] = False
            else:
                vals, ok = info.read(np.where(mask & inb, ptr.off, 0), npdt)
                c = np.where(mask & inb, vals.astype(np.float64), 0.0)
        elif info.init in ("uninitialized", "partly-uninitialized") and info.role in ("scratch", "output"):
            invalid |= mask & inb & ~written
            lin &= ~(mask & inb & ~written)
        elif info.init == "zeros" and info.role in ("scratch", "output"):
            pass  # zeros unless written
        else:
            src_t = np.full(shape, t, dtype=np.int16)
            src_elem = elem
            if info.origin is not None and info.role in ("scratch", "output") and info.origin[0] in self.index:
                # a copy or a gather of an input the host made: its elements are that input's
                name, omap = info.origin
                ok = (elem >= 0) & (elem < omap.size)
                oe = np.where(ok, omap[np.clip(elem, 0, max(omap.size - 1, 0))], -1)
                hit = oe >= 0
                src_t = np.where(hit, self.index[name], t).astype(np.int16)
                src_elem = np.where(hit, oe, elem)
                tags = np.where(hit, np.uint64(src_bit(self.index[name])), tags)
            if self.linear:
                bid = len(self.trace.blocks)
                self.trace.blocks.append((src_t, src_elem.copy(), acc.op))
                acc.block = bid
                terms.append(
                    (
                        bid,
                        np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape),
                        np.where(mask & inb & ~written, 1.0, 0.0),
                    )
                )
            else:
                lin &= ~(mask & inb)
        if sh is not None and written.any():
            # values stored by an earlier kernel (or program): known constants, or opaque with their tags
            e = np.clip(elem, 0, sh["written"].size - 1)
            kn = written & sh["known"][e]
            c = np.where(kn, sh["c"][e], c)
            lin = np.where(written, kn, lin)
            tags = np.where(written, sh["tags"][e], tags)
        if self.model is not None:
            bad, pos = self.model.label(info, elem, mask, inb, self)
            if bad is not None:
                invalid |= mask & bad
            if pos is not None:
                tags = tags | np.where(pos, np.uint64(POS), np.uint64(0))
        tags = tags | np.where(invalid, np.uint64(inv_bit(t)), np.uint64(0))
        lin = lin & ~invalid
        # masked-out lanes take `other` (a constant, usually) or are undefined
        if other is not None:
            o = _as_fv(other, shape)
            c = np.where(mask, c, o.c)
            lin = np.where(mask, lin, o.lin)
            tags = np.where(mask, tags, o.tags | (tags & np.uint64(POS)))
            terms = [(b, i, np.where(mask, cf, 0.0)) for b, i, cf in terms]
            for b, i, cf in o.terms:
                terms.append((b, _bcast_to(i, shape), np.where(mask, 0.0, _bcast_to(cf, shape))))
        else:
            lin = lin & mask
            tags = tags | np.where(~mask, np.uint64(inv_bit(t)), np.uint64(0))
        return FV(c, lin, terms, tags)

    def store(self, op: Op, ins):
        ptr, val = ins[0], ins[1]
        if not isinstance(ptr, PV):
            raise InterpError("store through a non-pointer (block pointers and descriptors are not supported)", op)
        shape = ptr.off.shape
        mask = _mask(ins[2], shape) if len(ins) > 2 else np.ones(shape, dtype=bool)
        tidx = np.broadcast_to(ptr.t, shape)
        t = int(tidx.reshape(-1)[0]) if tidx.size else 0
        if tidx.size and not (tidx == t).all():
            raise InterpError("one store to several tensors", op)
        info = self.infos[t]
        elem = np.floor_divide(ptr.off, info.elsize)
        inb = info.in_bounds(elem) & (np.mod(ptr.off, info.elsize) == 0)
        if isinstance(val, FV):
            val = FV(
                _bcast_to(val.c, shape),
                _bcast_to(val.lin, shape),
                [(b, _bcast_to(i, shape), _bcast_to(cf, shape)) for b, i, cf in val.terms],
                _bcast_to(val.tags, shape),
            )
        elif isinstance(val, IV):
            val = IV(_bcast_to(val.v, shape), _bcast_to(val.tags, shape), _bcast_to(val.unk, shape))
        acc = Access("store", op, self.pid, tidx, elem, ptr.off, mask.copy(), inb, val, tuple(self.iters))
        self.trace.accesses.append(acc)
        sh = self._shadow(t)
        w = mask & inb
        e = elem[w]
        if e.size:
            e = np.clip(e, 0, sh["written"].size - 1)
            np.add.at(sh["written"], e, 1)
            if isinstance(val, FV):
                sh["tags"][e] = val.tags[w]
                kn = val.known()[w]
                sh["known"][e] = kn
                sh["c"][e] = np.where(kn, val.c[w], 0.0)
            else:
                sh["tags"][e] = val.tags[w]
                sh["known"][e] = False
        return None


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


def _round(v: FV, elem: str) -> FV:
    """Known lanes take the value the GPU computes in the result's precision."""
    with np.errstate(all="ignore"):
        c = np.where(v.lin, _ROUND[elem](v.c), v.c)
    return FV(c, v.lin, v.terms, v.tags)


class _Terminator:
    def __init__(self, kind, values):
        self.kind, self.values = kind, values


def _span(info) -> int:
    if not info.shape:
        return 1
    return int(sum((n - 1) * s for n, s in zip(info.shape, info.strides)) + 1)


def _mask(m, shape) -> np.ndarray:
    if isinstance(m, IV):
        return np.broadcast_to(m.v.astype(bool) & ~m.unk, shape).copy() | np.broadcast_to(m.unk, shape)
    raise InterpError("mask is not a boolean")


def _as_fv(x, shape=None) -> FV:
    if isinstance(x, FV):
        if shape is None:
            return x
        return FV(
            _bcast_to(x.c, shape),
            _bcast_to(x.lin, shape),
            [(b, _bcast_to(i, shape), _bcast_to(c, shape)) for b, i, c in x.terms],
            _bcast_to(x.tags, shape),
        )
    if isinstance(x, IV):
        s = shape if shape is not None else x.v.shape
        return FV(_bcast_to(x.v.astype(np.float64), s), _bcast_to(~x.unk, s), [], _bcast_to(x.tags, s))
    raise InterpError("expected a float value")


# --------------------------------------------------------------------------- shape ops


def _map_value(x, fn):
    if isinstance(x, IV):
        return IV(fn(x.v), fn(x.tags), fn(x.unk))
    if isinstance(x, PV):
        t = np.broadcast_to(x.t, x.off.shape)
        return PV(fn(t), fn(x.off), fn(np.broadcast_to(x.tags, x.off.shape)), x.esize, x.pointee)
    if isinstance(x, FV):
        shape = x.c.shape
        return FV(
            fn(x.c),
            fn(x.lin),
            [(b, fn(_bcast_to(i, shape)), fn(_bcast_to(c, shape))) for b, i, c in x.terms],
            fn(_bcast_to(x.tags, shape)),
        )
    raise InterpError("unsupported value in a shape operation")


def _splat(interp, op, ins, env):
    shape = op.result.type.shape
    return _map_value(ins[0], lambda a: np.broadcast_to(a, shape).copy())


def _broadcast(interp, op, ins, env):
    shape = op.result.type.shape
    return _map_value(ins[0], lambda a: np.broadcast_to(a, shape).copy())


def _expand_dims(interp, op, ins, env):
    ax = attr_int(op, "axis", 0)
    return _map_value(ins[0], lambda a: np.expand_dims(a, ax))


def _reshape(interp, op, ins, env):
    shape = op.result.type.shape
    return _map_value(ins[0], lambda a: np.reshape(a, shape))


def _trans(interp, op, ins, env):
    order = op.attrs.get("order", "")
    nums = [int(x) for x in __import__("re").findall(r"-?\d+", order.split(":", 1)[-1])] if order else None
    if not nums:
        nums = list(range(len(op.result.type.shape)))[::-1]
    return _map_value(ins[0], lambda a: np.transpose(a, nums))


def _join(interp, op, ins, env):
    a, b = ins
    if type(a) is not type(b):
        raise InterpError("join of different kinds", op)
    if isinstance(a, FV):
        shape = a.c.shape
        terms = [
            (
                bb,
                np.stack([_bcast_to(i, shape), np.zeros(shape, np.int64)], -1),
                np.stack([_bcast_to(c, shape), np.zeros(shape)], -1),
            )
            for bb, i, c in a.terms
        ]
        terms += [
            (
                bb,
                np.stack([np.zeros(shape, np.int64), _bcast_to(i, shape)], -1),
                np.stack([np.zeros(shape), _bcast_to(c, shape)], -1),
            )
            for bb, i, c in b.terms
        ]
        return FV(np.stack([a.c, b.c], -1), np.stack([a.lin, b.lin], -1), terms, np.stack([a.tags, b.tags], -1))
    if isinstance(a, IV):
        return IV(np.stack([a.v, b.v], -1), np.stack([a.tags, b.tags], -1), np.stack([a.unk, b.unk], -1))
    if isinstance(a, PV):
        return PV(
            np.stack([np.broadcast_to(a.t, a.off.shape), np.broadcast_to(b.t, b.off.shape)], -1),
            np.stack([a.off, b.off], -1),
            np.stack([a.tags, b.tags], -1),
            a.esize,
            a.pointee,
        )
    raise InterpError("join of unsupported values", op)


def _split(interp, op, ins, env):
    x = ins[0]
    return [_map_value(x, lambda a: a[..., 0].copy()), _map_value(x, lambda a: a[..., 1].copy())]


def _cat(interp, op, ins, env):
    a, b = ins
    return _map_concat(a, b)


def _map_concat(a, b):
    if isinstance(a, IV) and isinstance(b, IV):
        return IV(np.concatenate([a.v, b.v]), np.concatenate([a.tags, b.tags]), np.concatenate([a.unk, b.unk]))
    if isinstance(a, FV) and isinstance(b, FV):
        sa, sb = a.c.shape, b.c.shape
        terms = [
            (
                bb,
                np.concatenate([_bcast_to(i, sa), np.zeros(sb, np.int64)]),
                np.concatenate([_bcast_to(c, sa), np.zeros(sb)]),
            )
            for bb, i, c in a.terms
        ]
        terms += [
            (
                bb,
                np.concatenate([np.zeros(sa, np.int64), _bcast_to(i, sb)]),
                np.concatenate([np.zeros(sa), _bcast_to(c, sb)]),
            )
            for bb, i, c in b.terms
        ]
        return FV(np.concatenate([a.c, b.c]), np.concatenate([a.lin, b.lin]), terms, np.concatenate([a.tags, b.tags]))
    raise InterpError("cat of unsupported values")


# --------------------------------------------------------------------------- integer ops


def _ints(interp, op, ins):
    for x in ins:
        if not isinstance(x, IV):
            raise InterpError(f"{op.name} on a non-integer value", op)
    return ins


def _int_binop(fn):
    def h(interp, op, ins, env):
        a, b = _ints(interp, op, ins)
        t = op.result.type
        bits = _bits(t)
        unsigned = op.name.endswith("ui") and not op.name.endswith("divsi")
        av, bv = a.v.astype(np.int64), b.v.astype(np.int64)
        with np.errstate(all="ignore"):
            exact, bad = fn(av, bv, bits)
        unk = a.unk | b.unk | bad
        res = _wrap(exact, bits, unsigned)
        if bits == 1 and op.name in ("arith.andi", "arith.ori"):
            # a known false (and) / true (or) decides the lane, whatever the other side: `d < D & (m > -inf)`
            # with m data is false past the head dim
            dom = op.name == "arith.ori"
            known = [~x.unk & ((v & 1).astype(bool) == dom) for x, v in ((a, av), (b, bv))]
            decided = np.broadcast_to(known[0], unk.shape) | np.broadcast_to(known[1], unk.shape)
            unk = unk & ~decided
            res = np.where(decided, dom, res)
        if bits == 32 and op.name in ("arith.muli", "arith.addi", "arith.subi", "arith.shli"):
            over = (res.astype(np.int64) != exact) & ~unk
            if over.any():
                interp.trace.overflow.append((op, interp.pid))
        return IV(res, a.tags | b.tags, unk)

    return h


def _divsi(a, b, bits):
    bad = b == 0
    bb = np.where(bad, 1, b)
    q = np.floor_divide(a, bb)
    r = a - q * bb
    q = np.where((r != 0) & ((a < 0) != (bb < 0)), q + 1, q)
    return q, bad


def _remsi(a, b, bits):
    q, bad = _divsi(a, b, bits)
    bb = np.where(bad, 1, b)
    return a - q * bb, bad


def _floordiv(a, b, bits):
    bad = b == 0
    return np.floor_divide(a, np.where(bad, 1, b)), bad


def _ceildiv(a, b, bits):
    bad = b == 0
    return -np.floor_divide(-a, np.where(bad, 1, b)), bad


def _udiv(a, b, bits):
    m = (1 << bits) - 1 if bits < 64 else -1
    au, bu = (a & m, b & m) if bits < 64 else (a, b)
    bad = bu == 0
    return np.floor_divide(au, np.where(bad, 1, bu)), bad


def _urem(a, b, bits):
    m = (1 << bits) - 1 if bits < 64 else -1
    au, bu = (a & m, b & m) if bits < 64 else (a, b)
    bad = bu == 0
    return np.mod(au, np.where(bad, 1, bu)), bad


def _ok(fn):
    return lambda a, b, bits: (fn(a, b, bits), np.zeros(np.broadcast(a, b).shape, dtype=bool))


def _shrui(a, b, bits):
    m = (1 << bits) - 1 if bits < 64 else None
    au = a & m if m is not None else a
    return np.right_shift(au, np.clip(b, 0, 63))


_INT_BINOPS = {
    "arith.addi": _ok(lambda a, b, n: a + b),
    "arith.subi": _ok(lambda a, b, n: a - b),
    "arith.muli": _ok(lambda a, b, n: a * b),
    "arith.divsi": _divsi,
    "arith.remsi": _remsi,
    "arith.divui": _udiv,
    "arith.remui": _urem,
    "arith.floordivsi": _floordiv,
    "arith.ceildivsi": _ceildiv,
    "arith.andi": _ok(lambda a, b, n: a & b),
    "arith.ori": _ok(lambda a, b, n: a | b),
    "arith.xori": _ok(lambda a, b, n: a ^ b),
    "arith.shli": _ok(lambda a, b, n: np.left_shift(a, np.clip(b, 0, 63))),
    "arith.shrsi": _ok(lambda a, b, n: np.right_shift(a, np.clip(b, 0, 63))),
    "arith.shrui": _ok(_shrui),
    "arith.maxsi": _ok(lambda a, b, n: np.maximum(a, b)),
    "arith.minsi": _ok(lambda a, b, n: np.minimum(a, b)),
    "arith.maxui": _ok(lambda a, b, n: np.maximum(a, b)),
    "arith.minui": _ok(lambda a, b, n: np.minimum(a, b)),
}

_CMP = {
    "eq": np.equal,
    "ne": np.not_equal,
    "slt": np.less,
    "sle": np.less_equal,
    "sgt": np.greater,
    "sge": np.greater_equal,
    "ult": np.less,
    "ule": np.less_equal,
    "ugt": np.greater,
    "uge": np.greater_equal,
}


def _cmpi(interp, op, ins, env):
    a, b = _ints(interp, op, ins)
    pred = op.attrs.get("predicate", "eq")
    av, bv = a.v.astype(np.int64), b.v.astype(np.int64)
    if pred.startswith("u"):
        bits = _bits(op.operands[0].type)
        if bits < 64:
            av, bv = av & ((1 << bits) - 1), bv & ((1 << bits) - 1)
    return IV(_CMP[pred](av, bv), a.tags | b.tags, a.unk | b.unk)


def _int_cast(interp, op, ins, env):
    a = ins[0]
    if isinstance(a, FV):
        raise InterpError(f"{op.name} on a float", op)
    if not isinstance(a, IV):
        raise InterpError(f"{op.name} on a pointer", op)
    t = op.result.type
    src_bits = _bits(op.operands[0].type)
    v = a.v.astype(np.int64)
    if op.name == "arith.extui" and src_bits < 64:
        v = v & ((1 << src_bits) - 1) if src_bits > 1 else v & 1
    v = _wrap(v, _bits(t))
    return IV(v, a.tags, a.unk)


# --------------------------------------------------------------------------- float ops


def _fv(x, shape=None) -> FV:
    return _as_fv(x, shape)


def _merge_shape(a: FV, b: FV):
    shape = np.broadcast_shapes(a.c.shape, b.c.shape)
    return _as_fv(a, shape), _as_fv(b, shape), shape


def _limit_terms(f: FV) -> FV:
    if len(f.terms) <= MAX_TERMS:
        return f
    merged: dict = {}
    for b, i, c in f.terms:
        key = (b, i.tobytes())
        if key in merged:
            merged[key] = (b, i, merged[key][2] + c)
        else:
            merged[key] = (b, i, c)
    terms = list(merged.values())
    if len(terms) <= MAX_TERMS:
        return FV(f.c, f.lin, terms, f.tags)
    # too many atoms per lane: opaque where any coefficient is non-zero
    nz = np.zeros(f.c.shape, dtype=bool)
    for _, _, c in terms:
        nz |= c != 0
    return FV(f.c, f.lin & ~nz, [], f.tags)


def _addf(interp, op, ins, env, sign=1.0):
    a, b, shape = _merge_shape(_fv(ins[0]), _fv(ins[1]))
    terms = list(a.terms) + [(bb, i, sign * c) for bb, i, c in b.terms]
    with np.errstate(all="ignore"):
        c = a.c + sign * b.c
    lin = a.lin & b.lin
    tags = a.tags | b.tags
    # an infinite constant absorbs any finite value: -inf - m is -inf (unless m may be garbage)
    ka, kb = a.known(), b.known()
    inv_a, inv_b = (a.tags & INV_MASK) != 0, (b.tags & INV_MASK) != 0
    ia = ka & np.isinf(a.c) & ~inv_b & ~(kb & np.isinf(b.c))
    ib = kb & np.isinf(b.c) & ~inv_a & ~(ka & np.isinf(a.c))
    absorb = ia | ib
    if absorb.any():
        c = np.where(ia, a.c, np.where(ib, sign * b.c, c))
        lin = lin | absorb
        terms = [(bb, i, np.where(absorb, 0.0, cf)) for bb, i, cf in terms]
        tags = np.where(absorb, tags & np.uint64(POS) | np.where(ia, a.tags, b.tags), tags)
    return _limit_terms(FV(c, lin, terms, tags))


def _subf(interp, op, ins, env):
    return _addf(interp, op, ins, env, -1.0)


def _scale(f: FV, k: np.ndarray) -> FV:
    return FV(f.c * k, f.lin.copy(), [(b, i, c * k) for b, i, c in f.terms], f.tags)


def _mulf(interp, op, ins, env):
    a, b, shape = _merge_shape(_fv(ins[0]), _fv(ins[1]))
    ka, kb = a.known(), b.known()
    inv_a = (a.tags & INV_MASK) != 0
    inv_b = (b.tags & INV_MASK) != 0
    with np.errstate(all="ignore"):
        sa = _scale(b, np.where(ka, a.c, 0.0))  # a known: a.c * b
        sb = _scale(a, np.where(kb & ~ka, b.c, 0.0))
    terms = [(bb, i, np.where(ka, c, 0.0)) for bb, i, c in sa.terms] + [
        (bb, i, np.where(kb & ~ka, c, 0.0)) for bb, i, c in sb.terms
    ]
    with np.errstate(all="ignore"):
        c = np.where(ka, sa.c, np.where(kb, sb.c, 0.0))
    lin = (ka & b.lin) | (kb & a.lin)
    tags = a.tags | b.tags
    # 0 * x: a known zero, unless x may be garbage (0 * NaN)
    zero = (ka & (a.c == 0) & ~inv_b) | (kb & (b.c == 0) & ~inv_a)
    lin = lin | zero
    c = np.where(zero, 0.0, c)
    terms = [(bb, i, np.where(zero, 0.0, cf)) for bb, i, cf in terms]
    tags = np.where(zero, tags & ~SRC_MASK & ~INV_MASK, tags)
    # 0 * garbage stays garbage
    lin = lin & ~((ka & (a.c == 0) & inv_b) | (kb & (b.c == 0) & inv_a))
    return _limit_terms(FV(c, lin, terms, tags))


def _divf(interp, op, ins, env):
    a, b, shape = _merge_shape(_fv(ins[0]), _fv(ins[1]))
    kb = b.known()
    with np.errstate(all="ignore"):
        inv = np.where(kb & (b.c != 0), 1.0 / np.where(b.c == 0, 1.0, b.c), 0.0)
    s = _scale(a, inv)
    lin = a.lin & kb & (b.c != 0)
    ka = a.known()
    with np.errstate(all="ignore"):
        kk = ka & kb
        c = np.where(kk, np.divide(a.c, b.c), s.c)
    lin = lin | kk
    return FV(c, lin, [(bb, i, np.where(lin & ~kk, cf, 0.0)) for bb, i, cf in s.terms], a.tags | b.tags)


def _negf(interp, op, ins, env):
    a = _fv(ins[0])
    return _scale(a, np.full(a.c.shape, -1.0))


def _unary(fn):
    def h(interp, op, ins, env):
        a = _fv(ins[0])
        k = a.known()
        with np.errstate(all="ignore"):
            c = np.where(k, fn(np.where(k, a.c, 0.0)), 0.0)
        res = FV(c, k.copy(), [], a.tags.copy())
        if op.name in ("math.exp", "math.exp2") or "exp" in op.attrs.get("symbol", ""):
            interp.trace.exps.append(ExpEvent(op, interp.pid, a, res))
        return res

    return h


def _minmax(fn, ident):
    def h(interp, op, ins, env):
        a, b, shape = _merge_shape(_fv(ins[0]), _fv(ins[1]))
        ka, kb = a.known(), b.known()
        with np.errstate(all="ignore"):
            c = fn(a.c, b.c)
        both = ka & kb
        # max(x, -inf) is x: the identity passes the other operand through
        a_id = ka & (a.c == ident)
        b_id = kb & (b.c == ident) & ~a_id
        c = np.where(both, c, np.where(a_id, b.c, np.where(b_id, a.c, 0.0)))
        lin = both | (a_id & b.lin) | (b_id & a.lin)
        terms = [(bb, i, np.where(a_id & ~both, cf, 0.0)) for bb, i, cf in b.terms] + [
            (bb, i, np.where(b_id & ~both, cf, 0.0)) for bb, i, cf in a.terms
        ]
        tags = np.where(
            a_id,
            b.tags | (a.tags & np.uint64(POS)),
            np.where(b_id, a.tags | (b.tags & np.uint64(POS)), a.tags | b.tags),
        )
        return FV(c, lin, terms, tags)

    return h


def _select(interp, op, ins, env):
    cnd, a, b = ins
    if not isinstance(cnd, IV):
        raise InterpError("select on a non-boolean condition", op)
    if isinstance(a, PV) or isinstance(b, PV):
        if not (isinstance(a, PV) and isinstance(b, PV)):
            raise InterpError("select between a pointer and a non-pointer", op)
        shape = np.broadcast_shapes(a.off.shape, b.off.shape, cnd.v.shape)
        cv = np.broadcast_to(cnd.v.astype(bool), shape)
        if np.broadcast_to(cnd.unk, shape).any():
            raise InterpError("select between pointers on an unknown condition", op)
        return PV(
            np.where(cv, np.broadcast_to(a.t, shape), np.broadcast_to(b.t, shape)),
            np.where(cv, a.off, b.off),
            np.where(cv, a.tags, b.tags) | cnd.tags,
            a.esize,
            a.pointee,
        )
    if isinstance(a, IV) and isinstance(b, IV):
        shape = np.broadcast_shapes(a.v.shape, b.v.shape, cnd.v.shape)
        cv = np.broadcast_to(cnd.v.astype(bool), shape)
        cu = np.broadcast_to(cnd.unk, shape)
        v = np.where(cv, a.v, b.v)
        unk = np.where(cv, a.unk, b.unk) | (cu & (np.broadcast_to(a.v, shape) != np.broadcast_to(b.v, shape)))
        return IV(v, np.where(cv, a.tags, b.tags) | np.where(cu, a.tags | b.tags, np.uint64(0)), unk)
    a, b = _fv(a), _fv(b)
    shape = np.broadcast_shapes(a.c.shape, b.c.shape, cnd.v.shape)
    a, b = _as_fv(a, shape), _as_fv(b, shape)
    cv = np.broadcast_to(cnd.v.astype(bool), shape)
    cu = np.broadcast_to(cnd.unk, shape)
    c = np.where(cv, a.c, b.c)
    lin = np.where(cv, a.lin, b.lin) & ~cu
    terms = [(bb, i, np.where(cv & ~cu, cf, 0.0)) for bb, i, cf in a.terms] + [
        (bb, i, np.where(~cv & ~cu, cf, 0.0)) for bb, i, cf in b.terms
    ]
    tags = np.where(cu, a.tags | b.tags, np.where(cv, a.tags, b.tags))
    tags = tags | np.where(cu, cnd.tags, np.uint64(0)).astype(np.uint64)
    return _limit_terms(FV(c, lin, terms, tags))


def _cmpf(interp, op, ins, env):
    a, b, shape = _merge_shape(_fv(ins[0]), _fv(ins[1]))
    pred = op.attrs.get("predicate", "oeq")
    fns = {
        "oeq": np.equal,
        "ueq": np.equal,
        "one": np.not_equal,
        "une": np.not_equal,
        "olt": np.less,
        "ult": np.less,
        "ole": np.less_equal,
        "ule": np.less_equal,
        "ogt": np.greater,
        "ugt": np.greater,
        "oge": np.greater_equal,
        "uge": np.greater_equal,
        "ord": lambda x, y: ~(np.isnan(x) | np.isnan(y)),
        "uno": lambda x, y: np.isnan(x) | np.isnan(y),
    }
    k = a.known() & b.known()
    with np.errstate(all="ignore"):
        v = fns.get(pred, np.equal)(a.c, b.c)
    return IV(np.where(k, v, False), (a.tags | b.tags) & ~np.uint64(POS), ~k)


def _fcast(interp, op, ins, env):
    a = ins[0]
    if isinstance(a, FV):
        if op.result.type.elem in ("f16", "bf16"):
            k = a.known()
            c = np.where(k, a.c.astype(np.float16).astype(np.float64) if op.result.type.elem == "f16" else a.c, a.c)
            return FV(c, a.lin, a.terms, a.tags)
        return a
    raise InterpError(f"{op.name} of a non-float", op)


def _itof(interp, op, ins, env):
    a = ins[0]
    if not isinstance(a, IV):
        raise InterpError(f"{op.name} of a non-integer", op)
    v = a.v.astype(np.int64)
    if op.name == "arith.uitofp":
        bits = _bits(op.operands[0].type)
        if 1 < bits < 64:
            v = v & ((1 << bits) - 1)
    c = v.astype(np.float64)
    if op.result.type.elem == "f16":
        c = c.astype(np.float16).astype(np.float64)
    elif op.result.type.elem == "f32":
        c = c.astype(np.float32).astype(np.float64)
    return FV(c, ~a.unk, [], a.tags.copy())


def _ftoi(interp, op, ins, env):
    a = _fv(ins[0])
    k = a.known()
    with np.errstate(all="ignore"):
        v = np.where(k, np.trunc(np.nan_to_num(a.c)), 0).astype(np.int64)
    return IV(_wrap(v, _bits(op.result.type)), a.tags & ~np.uint64(POS), ~k)


def _fma(interp, op, ins, env):
    prod = _mulf(interp, op, ins[:2], env)
    return _addf(interp, op, [prod, ins[2]], env)


def _clampf(interp, op, ins, env):
    lo = _minmax(np.maximum, -np.inf)(interp, op, [ins[0], ins[1]], env)
    return _minmax(np.minimum, np.inf)(interp, op, [lo, ins[2]], env)


_EXTERN = {
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "log2": np.log2,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "fabs": np.abs,
    "floor": np.floor,
    "ceil": np.ceil,
    "log10": np.log10,
    "exp10": lambda x: 10.0**x,
    "erf": np.vectorize(math.erf),
    "round": np.round,
    "trunc": np.trunc,
    "rint": np.rint,
}


def _extern(interp, op, ins, env):
    sym = op.attrs.get("symbol", "").strip('"')
    base = (
        sym.replace("__nv_", "").rstrip("f")
        if sym.endswith("f") and sym not in ("__nv_erf",)
        else sym.replace("__nv_", "")
    )
    base = {
        "expf": "exp",
        "exp2f": "exp2",
        "powf": "pow",
        "fast_powf": "pow",
        "fast_expf": "exp",
        "fast_exp2f": "exp2",
        "fast_logf": "log",
        "fast_log2f": "log2",
        "fast_sinf": "sin",
        "fast_cosf": "cos",
    }.get(sym.replace("__nv_", ""), base)
    if base in ("pow", "fmax", "fmin", "fmod", "atan2", "hypot") and len(ins) == 2:
        fn = {
            "pow": np.power,
            "fmax": np.fmax,
            "fmin": np.fmin,
            "fmod": np.fmod,
            "atan2": np.arctan2,
            "hypot": np.hypot,
        }[base]
        a, b, shape = _merge_shape(_fv(ins[0]), _fv(ins[1]))
        k = a.known() & b.known()
        with np.errstate(all="ignore"):
            c = np.where(k, fn(a.c, b.c), 0.0)
        return FV(c, k, [], a.tags | b.tags)
    if base == "fma" and len(ins) == 3:
        return _fma(interp, op, ins, env)
    fn = _EXTERN.get(base)
    if fn is None or len(ins) != 1:
        # an unknown library function: opaque result, provenance kept
        tags = np.uint64(0)
        shape = op.result.type.shape
        for x in ins:
            if isinstance(x, (FV, IV)):
                tags = tags | np.broadcast_to(x.tags, shape)
        if op.result.type.is_float:
            return FV.opaque(shape, tags)
        return IV(np.zeros(shape, dtype=np.int64), np.broadcast_to(tags, shape).copy(), np.ones(shape, dtype=bool))
    return _unary(fn)(interp, op, ins, env)  # exps are recorded through their symbol


# --------------------------------------------------------------------------- reductions and dot


def combiner(op: Op) -> str | None:
    """The combining operation of a tt.reduce / tt.scan region ('addf', 'maxnumf', ...), if simple."""
    if not op.regions or not op.regions[0]:
        return None
    ops = [o for o in op.regions[0][0].ops if o.name not in ("tt.reduce.return", "tt.scan.return")]
    if len(ops) == 1 and len(op.operands) == 1:
        return ops[0].name.split(".", 1)[1]
    return None


def _reduce_tags(tags: np.ndarray, axis: int, drop: np.ndarray | None = None) -> np.ndarray:
    """OR over an axis; the POS label survives only if it is the same on every lane of the axis."""
    t = tags if drop is None else np.where(drop, tags & np.uint64(POS), tags)
    out = np.bitwise_or.reduce(t, axis=axis)
    pos = (t & np.uint64(POS)) != 0
    uniform = pos.all(axis=axis) | (~pos).all(axis=axis)
    return np.where(uniform, out, out & ~np.uint64(POS))


_RED_FN = {
    "addf": (np.sum, 0.0),
    "mulf": (np.prod, 1.0),
    "maxnumf": (np.max, -np.inf),
    "maximumf": (np.max, -np.inf),
    "minnumf": (np.min, np.inf),
    "minimumf": (np.min, np.inf),
    "addi": (np.sum, 0),
    "muli": (np.prod, 1),
    "maxsi": (np.max, None),
    "minsi": (np.min, None),
    "maxui": (np.max, None),
    "minui": (np.min, None),
    "andi": (np.bitwise_and.reduce, None),
    "ori": (np.bitwise_or.reduce, None),
    "xori": (np.bitwise_xor.reduce, None),
}


def _reduce(interp, op, ins, env):
    axis = attr_int(op, "axis", 0)
    comb = combiner(op)
    if comb is None or comb not in _RED_FN:
        # argmax-style or custom combiners: opaque results with the inputs' provenance
        outs = []
        for r in op.results:
            shape = r.type.shape
            tags = np.uint64(0)
            for x in ins:
                tags = tags | _reduce_tags(np.broadcast_to(x.tags, x.c.shape if isinstance(x, FV) else x.v.shape), axis)
            if r.type.is_float:
                outs.append(FV.opaque(shape, tags))
            else:
                outs.append(
                    IV(np.zeros(shape, dtype=np.int64), np.broadcast_to(tags, shape).copy(), np.ones(shape, dtype=bool))
                )
        return outs
    fn, ident = _RED_FN[comb]
    x = ins[0]
    if comb == "addf":
        _record_sum(interp, op, 0, x)
    if isinstance(x, IV):
        v = x.v.astype(np.int64) if x.v.dtype != bool else x.v
        return IV(np.asarray(fn(v, axis=axis)), _reduce_tags(x.tags, axis), np.any(x.unk, axis=axis))
    x = _fv(x)
    k = x.known()
    with np.errstate(all="ignore"):
        c = np.asarray(fn(np.where(k, x.c, ident if ident is not None else 0.0), axis=axis), dtype=np.float64)
    allk = np.all(k, axis=axis)
    drop = k & (x.c == ident) if ident is not None else None
    tags = _reduce_tags(x.tags, axis, drop)
    if comb in ("addf",) and interp.linear and x.terms and x.c.shape[axis] <= 2:
        # a sum of two lanes (e.g. a pairwise rotation written as a reduction): keep it affine
        pass
    return FV(np.where(allk, c, 0.0), allk, [], tags)


def _record_sum(interp, op, k, x):
    if isinstance(x, FV):
        pos = (x.tags & np.uint64(POS)) != 0
        if pos.any() and not pos.all():
            interp.trace.sums.append(SumEvent(op, interp.pid, op.operands[k], x))


def _dot(interp, op, ins, env):
    a, b = _fv(ins[0]), _fv(ins[1])
    _record_sum(interp, op, 0, a)
    c = _fv(ins[2]) if len(ins) > 2 else FV.const(0.0, op.result.type.shape)
    if a.c.ndim != 2 or b.c.ndim != 2:
        raise InterpError("batched tt.dot is not supported", op)
    ka, kb = a.known(), b.known()
    shape = op.result.type.shape
    at, bt = a.tags, b.tags
    present = int(
        np.bitwise_or.reduce(at.reshape(-1), initial=np.uint64(0))
        | np.bitwise_or.reduce(bt.reshape(-1), initial=np.uint64(0))
    )
    live_a = (~(ka & (a.c == 0))).astype(np.int64)  # a[i, k] is not a known zero
    live_b = (~(kb & (b.c == 0))).astype(np.int64)
    out_tags = np.zeros(shape, dtype=np.uint64)
    for bit in range(64):
        if not (present >> bit) & 1:
            continue
        m = np.uint64(1 << bit)
        ha, hb = (at & m) != 0, (bt & m) != 0
        if m == POS:
            # the label follows the non-contracted axes only when it is uniform along k
            hit = ha.all(axis=1)[:, None] | hb.all(axis=0)[None, :]
        elif m & INV_MASK:
            # garbage anywhere along k reaches the lane (0 * NaN is NaN)
            hit = ha.any(axis=1)[:, None] | hb.any(axis=0)[None, :]
        else:
            # provenance: products with a known-zero factor contribute nothing
            hit = ((ha.astype(np.int64) * live_a) @ live_b > 0) | (live_a @ (hb.astype(np.int64) * live_b) > 0)
        out_tags |= np.where(hit, m, np.uint64(0))
    allk = ka.all(axis=1)[:, None] & kb.all(axis=0)[None, :]
    with np.errstate(all="ignore"):
        val = np.where(allk, np.where(ka, a.c, 0) @ np.where(kb, b.c, 0), 0.0)
    res = FV(val, allk, [], out_tags)
    return _addf(interp, op, [res, c], env)


# --------------------------------------------------------------------------- control flow


def _for(interp, op, ins, env):
    lb, ub, step = ins[:3]
    init = ins[3:]
    for x in (lb, ub, step):
        if not isinstance(x, IV) or x.unk.any():
            raise InterpError("loop bounds depend on values the analysis does not know", op)
    lo, hi, st = int(lb.v), int(ub.v), int(step.v)
    if st <= 0:
        raise InterpError("loop with a non-positive step", op)
    body = op.regions[0][0]
    carried = list(init)
    tag = lb.tags | ub.tags | step.tags | np.uint64(IVBIT)
    k = 0
    for i in range(lo, hi, st):
        interp.iters.append(k)
        ivv = IV(np.array(i, dtype=np.int64), np.array(tag, dtype=np.uint64), np.zeros((), dtype=bool))
        term = interp._run_block(body, env, [ivv] + carried)
        interp.iters.pop()
        if term is None and not carried:
            k += 1
            continue  # a loop without carried values prints no scf.yield
        if term is None or term.kind != "yield":
            raise InterpError("loop body without scf.yield", op)
        carried = term.values
        k += 1
    return carried


def _yield(interp, op, ins, env):
    return _Terminator("yield", ins)


def _condition(interp, op, ins, env):
    return _Terminator("condition", ins)


def _return(interp, op, ins, env):
    return _Terminator("return", ins)


def _br(interp, op, ins, env):
    targets = op.attrs.get("targets", [])
    if op.name == "cf.br":
        label, n = targets[0]
        return _Terminator("branch", (label, list(ins[:n])))
    cnd = ins[0]
    if not isinstance(cnd, IV) or cnd.unk.any():
        raise InterpError("a branch depends on values the analysis does not know", op)
    (l1, n1), (l2, n2) = targets[0], targets[1]
    rest = ins[1:]
    if bool(cnd.v):
        return _Terminator("branch", (l1, list(rest[:n1])))
    return _Terminator("branch", (l2, list(rest[n1 : n1 + n2])))


def _if(interp, op, ins, env):
    cnd = ins[0]
    if not isinstance(cnd, IV) or cnd.unk.any():
        raise InterpError("a branch depends on values the analysis does not know", op)
    taken = bool(cnd.v)
    region = op.regions[0] if taken else (op.regions[1] if len(op.regions) > 1 else None)
    if region is None or not region or not region[0].ops:
        return [None] * len(op.results) if op.results else None
    term = interp._run_block(region[0], env, [])
    if term is not None and term.kind == "return":
        return term
    return term.values if term is not None else None


def _while(interp, op, ins, env):
    before, after = op.regions[0][0], op.regions[1][0]
    vals = list(ins)
    for _ in range(100_000):
        term = interp._run_block(before, env, vals)
        if term is None or term.kind != "condition":
            raise InterpError("scf.while without scf.condition", op)
        cnd, rest = term.values[0], term.values[1:]
        if not isinstance(cnd, IV) or cnd.unk.any():
            raise InterpError("a while loop depends on values the analysis does not know", op)
        if not bool(cnd.v):
            return rest
        term = interp._run_block(after, env, rest)
        vals = term.values
    raise InterpError("while loop did not terminate within the analysis budget", op)


def _call(interp, op, ins, env):
    import re

    m = re.search(r"@([\w$.\-]+)", op.text)
    fn = interp.module.functions.get(m.group(1)) if m else None
    if fn is None:
        raise InterpError("call to a function that is not in the module", op)
    sub = {}
    term = interp._run_function(fn, sub, ins)
    return term.values if term is not None else []


# --------------------------------------------------------------------------- leaves


def _constant(interp, op, ins, env):
    t = op.result.type
    v = parse_constant(op)
    if v is None:
        raise InterpError("non-uniform dense constant", op)
    if t.is_float:
        return FV.const(v, t.shape)
    if t.elem == "i1":
        return IV.const(bool(v), t.shape, bool)
    return IV.const(int(v), t.shape)


def _pid(interp, op, ins, env):
    ax = attr_int(op, "axis", 0)
    return IV(np.array(interp.pid[ax], dtype=np.int64), np.array(PID[ax], dtype=np.uint64), np.zeros((), bool))


def _nprog(interp, op, ins, env):
    ax = attr_int(op, "axis", 0)
    return IV.const(interp.launch.grid[ax])


def _make_range(interp, op, ins, env):
    s, e = attr_int(op, "start", 0), attr_int(op, "end", 0)
    n = e - s
    return IV(np.arange(s, e, dtype=np.int64), _u64((n,)), np.zeros((n,), dtype=bool))


def _addptr(interp, op, ins, env):
    p, o = ins
    if not isinstance(p, PV) or not isinstance(o, IV):
        raise InterpError("pointer arithmetic on values the analysis cannot follow", op)
    if o.unk.any():
        # an offset loaded from memory the kernels computed: cannot follow
        raise InterpError("a pointer offset depends on values the analysis does not know", op)
    shape = np.broadcast_shapes(p.off.shape, o.v.shape)
    return PV(
        np.broadcast_to(p.t, shape).copy(),
        p.off + o.v.astype(np.int64) * p.esize,
        np.broadcast_to(p.tags, shape) | np.broadcast_to(o.tags, shape),
        p.esize,
        p.pointee,
    )


def _bitcast(interp, op, ins, env):
    a = ins[0]
    rt = op.result.type
    if isinstance(a, PV) and rt.is_ptr:
        return PV(a.t, a.off, a.tags, _ELSIZE.get(rt.pointee, a.esize), rt.pointee)
    if isinstance(a, FV) and rt.is_float:
        return a
    if isinstance(a, IV) and rt.is_int:
        return a
    shape = rt.shape
    tags = np.broadcast_to(getattr(a, "tags", np.uint64(0)), shape).copy()
    if rt.is_float:
        return FV.opaque(shape, tags)
    return IV(np.zeros(shape, dtype=np.int64), tags, np.ones(shape, dtype=bool))


def _load(interp, op, ins, env):
    return interp.load(op, ins)


def _store(interp, op, ins, env):
    return interp.store(op, ins)


def _atomic(interp, op, ins, env):
    # treated as a load and a store of an opaque value
    ptr = ins[0]
    if not isinstance(ptr, PV):
        raise InterpError("atomic through a non-pointer", op)
    shape = ptr.off.shape
    mask_in = [ins[-1]] if len(ins) > 2 and isinstance(ins[-1], IV) else []
    old = interp.load(op, [ptr] + mask_in)
    val = ins[1] if len(ins) > 1 else old
    interp.store(op, [ptr, val] + mask_in)
    if op.result.type.is_float:
        return FV.opaque(shape, np.broadcast_to(getattr(val, "tags", np.uint64(0)), shape))
    return IV(np.zeros(shape, dtype=np.int64), _u64(shape), np.ones(shape, dtype=bool))


def _scan(interp, op, ins, env):
    axis = attr_int(op, "axis", 0)
    comb = combiner(op)
    x = ins[0]
    if isinstance(x, IV) and comb == "addi":
        return IV(np.cumsum(x.v, axis=axis), x.tags, np.logical_or.accumulate(x.unk, axis=axis))
    x = _fv(x)
    shape = x.c.shape
    tags = np.bitwise_or.accumulate(x.tags, axis=axis)
    return FV.opaque(shape, tags)


def _fv_or_iv_unary(fn_f):
    def h(interp, op, ins, env):
        if isinstance(ins[0], IV):
            a = ins[0]
            return IV(np.abs(a.v), a.tags, a.unk)
        return _unary(fn_f)(interp, op, ins, env)

    return h


_HANDLERS = {
    "arith.constant": _constant,
    "tt.get_program_id": _pid,
    "tt.get_num_programs": _nprog,
    "tt.make_range": _make_range,
    "tt.splat": _splat,
    "tt.broadcast": _broadcast,
    "tt.expand_dims": _expand_dims,
    "tt.reshape": _reshape,
    "tt.trans": _trans,
    "tt.join": _join,
    "tt.split": _split,
    "tt.cat": _cat,
    "ttg.convert_layout": lambda i, op, ins, env: ins[0],
    "tt.addptr": _addptr,
    "tt.load": _load,
    "tt.store": _store,
    "tt.atomic_rmw": _atomic,
    "tt.atomic_cas": _atomic,
    "tt.dot": _dot,
    "tt.reduce": _reduce,
    "tt.scan": _scan,
    "scf.for": _for,
    "scf.yield": _yield,
    "scf.if": _if,
    "scf.while": _while,
    "scf.condition": _condition,
    "tt.return": _return,
    "cf.br": _br,
    "cf.cond_br": _br,
    "tt.call": _call,
    "arith.cmpi": _cmpi,
    "arith.cmpf": _cmpf,
    "arith.select": _select,
    "arith.extsi": _int_cast,
    "arith.extui": _int_cast,
    "arith.trunci": _int_cast,
    "arith.index_cast": _int_cast,
    "arith.index_castui": _int_cast,
    "arith.addf": _addf,
    "arith.subf": _subf,
    "arith.mulf": _mulf,
    "arith.divf": _divf,
    "tt.precise_divf": _divf,
    "arith.negf": _negf,
    "arith.maxnumf": _minmax(np.fmax, -np.inf),
    "arith.maximumf": _minmax(np.maximum, -np.inf),
    "arith.minnumf": _minmax(np.fmin, np.inf),
    "arith.minimumf": _minmax(np.minimum, np.inf),
    "arith.extf": _fcast,
    "arith.truncf": _fcast,
    "tt.fp_to_fp": _fcast,
    "arith.sitofp": _itof,
    "arith.uitofp": _itof,
    "arith.fptosi": _ftoi,
    "arith.fptoui": _ftoi,
    "arith.bitcast": _bitcast,
    "tt.bitcast": _bitcast,
    "math.exp": _unary(np.exp),
    "math.exp2": _unary(np.exp2),
    "math.log": _unary(np.log),
    "math.log2": _unary(np.log2),
    "math.sqrt": _unary(np.sqrt),
    "tt.precise_sqrt": _unary(np.sqrt),
    "math.rsqrt": _unary(lambda x: 1.0 / np.sqrt(x)),
    "math.sin": _unary(np.sin),
    "math.cos": _unary(np.cos),
    "math.tanh": _unary(np.tanh),
    "math.absf": _unary(np.abs),
    "math.absi": _fv_or_iv_unary(np.abs),
    "math.floor": _unary(np.floor),
    "math.ceil": _unary(np.ceil),
    "math.erf": _unary(np.vectorize(math.erf)),
    "math.fma": _fma,
    "tt.clampf": _clampf,
    "tt.extern_elementwise": _extern,
    "tt.mulhiui": _int_binop(
        lambda a, b, n: (((a & 0xFFFFFFFF) * (b & 0xFFFFFFFF)) >> 32, np.zeros(np.broadcast(a, b).shape, dtype=bool))
    ),
}
for _name, _fn in _INT_BINOPS.items():
    _HANDLERS[_name] = _int_binop(_fn)

_NOOPS = {"tt.assert", "tt.print", "gpu.barrier", "tt.debug_barrier", "tt.reduce.return", "tt.scan.return"}
