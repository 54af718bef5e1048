"""The abstract interpreter of TTIR and its memory: runs every program of one captured launch over
its grid (`Interp.run` -> `LaunchTrace`), binds the capture's tensors to pointer arguments, and keeps
the shadow memory that loads read and stores write (one launch's writes are seen by the next).
The value types are abstract_values.py's; each TTIR op is run by its handler in op_handlers.py."""

from __future__ import annotations

import numpy as np

from kernalin_ci.verify.structural.abstract_values import (
    _ELSIZE,
    _NP_INT,
    _ROUND,
    MAX_STEPS,
    MAX_TENSORS,
    POS,
    Access,
    FloatValue,
    InterpError,
    IntValue,
    LaunchTrace,
    PointerValue,
    _as_fv,
    _bcast_to,
    _mask,
    _round,
    _span,
    _Terminator,
    _u64,
    inv_bit,
    src_bit,
)
from kernalin_ci.verify.structural.ir import Function, IROp, Module, Type, Value
from kernalin_ci.verify.structural.op_handlers import _HANDLERS, _NOOPS


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
        self.trace = LaunchTrace()
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
    def run(self, programs=None) -> LaunchTrace:
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
        for a in rt:
            if self.launch.signature.get(a.name, "").startswith("tensordesc"):
                raise InterpError(
                    f"argument {a.name} is a tensor descriptor (TMA): its loads and stores are not followed"
                )
        if len(rt) != len(fn.args):
            raise InterpError(f"the kernel's IR has {len(fn.args)} arguments, the launch {len(rt)}")
        env = {}
        for a, v in zip(rt, fn.args):
            env[v] = self._arg_value(a, v.type)
        return env

    def _arg_value(self, a, t: Type):
        if a.kind == "pointer":
            ti = self.index[a.tensor]
            return PointerValue(
                np.array(ti, dtype=np.int16),
                np.array(a.byte_offset, dtype=np.int64),
                _u64(()),
                _ELSIZE.get(t.pointee, 4),
                t.pointee,
            )
        if a.kind in ("int", "bool"):
            return IntValue(
                np.array(int(a.value), dtype=np.int64 if a.kind == "int" else bool), _u64(()), np.zeros((), dtype=bool)
            )
        if a.kind == "float":
            return FloatValue.const(a.value)
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

    def _exec(self, op: IROp, env):
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
            if isinstance(v, FloatValue) and r.type.elem in _ROUND:
                v = _round(v, r.type.elem)
            elif isinstance(v, IntValue) and v.tags.size:
                # the provenance of every integer value, over all programs (width checks need it)
                self.trace.int_tags[r] = self.trace.int_tags.get(r, 0) | int(np.bitwise_or.reduce(v.tags.reshape(-1)))
            env[r] = v
            if self.record:
                self.trace.values[r] = v
        return None

    def _missing(self, v: Value, op: IROp):
        raise InterpError(f"value {v.name} used before it is defined", op)

    # ------------------------------------------------------------------ loads and stores
    def load(self, op: IROp, ins):
        ptr = ins[0]
        if not isinstance(ptr, PointerValue):
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
            return IntValue(np.zeros(shape, dtype=np.int64), _u64(shape, src_bit(t)), np.ones(shape, dtype=bool))
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
        return IntValue(v, tags, unk)

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
        return FloatValue(c, lin, terms, tags)

    def store(self, op: IROp, ins):
        ptr, val = ins[0], ins[1]
        if not isinstance(ptr, PointerValue):
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
        if isinstance(val, FloatValue):
            val = FloatValue(
                _bcast_to(val.c, shape),
                _bcast_to(val.lin, shape),
                [(b, _bcast_to(i, shape), _bcast_to(cf, shape)) for b, i, cf in val.terms],
                _bcast_to(val.tags, shape),
            )
        elif isinstance(val, IntValue):
            val = IntValue(_bcast_to(val.v, shape), _bcast_to(val.tags, shape), _bcast_to(val.unk, shape))
        acc = Access("store", op, self.pid, tidx, elem, ptr.off, mask.copy(), inb, val, tuple(self.iters))
        self.trace.accesses.append(acc)
        sh = self._shadow(t)
        w = mask & inb
        e = elem[w]
        if e.size:
            e = np.clip(e, 0, sh["written"].size - 1)
            np.add.at(sh["written"], e, 1)
            if isinstance(val, FloatValue):
                sh["tags"][e] = val.tags[w]
                kn = val.known()[w]
                sh["known"][e] = kn
                sh["c"][e] = np.where(kn, val.c[w], 0.0)
            else:
                sh["tags"][e] = val.tags[w]
                sh["known"][e] = False
        return None
