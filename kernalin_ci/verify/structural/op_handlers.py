"""The handlers of the abstract interpreter (interpreter.py): one function per TTIR op, from its
input values to its result, on the value types of abstract_values.py (integers exact, floats
abstract). `_HANDLERS` maps op names to them; an op with no handler raises InterpError."""

from __future__ import annotations

import numpy as np

from kernalin_ci.verify.structural.abstract_values import (
    _ELSIZE,
    INV_MASK,
    IVBIT,
    PID,
    POS,
    FloatValue,
    InterpError,
    IntValue,
    PointerValue,
    SumEvent,
    _bcast_to,
    _map_value,
    _Terminator,
    _u64,
)
from kernalin_ci.verify.structural.arith_handlers import ARITH_HANDLERS, _addf, _fv
from kernalin_ci.verify.structural.ir import IROp, attr_int, parse_constant


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
    if isinstance(a, FloatValue):
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
        return FloatValue(np.stack([a.c, b.c], -1), np.stack([a.lin, b.lin], -1), terms, np.stack([a.tags, b.tags], -1))
    if isinstance(a, IntValue):
        return IntValue(np.stack([a.v, b.v], -1), np.stack([a.tags, b.tags], -1), np.stack([a.unk, b.unk], -1))
    if isinstance(a, PointerValue):
        return PointerValue(
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
    if isinstance(a, IntValue) and isinstance(b, IntValue):
        return IntValue(np.concatenate([a.v, b.v]), np.concatenate([a.tags, b.tags]), np.concatenate([a.unk, b.unk]))
    if isinstance(a, FloatValue) and isinstance(b, FloatValue):
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
        return FloatValue(
            np.concatenate([a.c, b.c]), np.concatenate([a.lin, b.lin]), terms, np.concatenate([a.tags, b.tags])
        )
    raise InterpError("cat of unsupported values")


# --------------------------------------------------------------------------- reductions and dot


def combiner(op: IROp) -> str | None:
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
                tags = tags | _reduce_tags(
                    np.broadcast_to(x.tags, x.c.shape if isinstance(x, FloatValue) else x.v.shape), axis
                )
            if r.type.is_float:
                outs.append(FloatValue.opaque(shape, tags))
            else:
                outs.append(
                    IntValue(
                        np.zeros(shape, dtype=np.int64), np.broadcast_to(tags, shape).copy(), np.ones(shape, dtype=bool)
                    )
                )
        return outs
    fn, ident = _RED_FN[comb]
    x = ins[0]
    if comb == "addf":
        _record_sum(interp, op, 0, x)
    if isinstance(x, IntValue):
        v = x.v.astype(np.int64) if x.v.dtype != bool else x.v
        return IntValue(np.asarray(fn(v, axis=axis)), _reduce_tags(x.tags, axis), np.any(x.unk, axis=axis))
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
    return FloatValue(np.where(allk, c, 0.0), allk, [], tags)


def _record_sum(interp, op, k, x):
    if isinstance(x, FloatValue):
        pos = (x.tags & np.uint64(POS)) != 0
        if pos.any() and not pos.all():
            interp.trace.sums.append(SumEvent(op, interp.pid, op.operands[k], x))


def _dot(interp, op, ins, env):
    a, b = _fv(ins[0]), _fv(ins[1])
    _record_sum(interp, op, 0, a)
    c = _fv(ins[2]) if len(ins) > 2 else FloatValue.const(0.0, op.result.type.shape)
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
    res = FloatValue(val, allk, [], out_tags)
    return _addf(interp, op, [res, c], env)


# --------------------------------------------------------------------------- control flow


def _for(interp, op, ins, env):
    lb, ub, step = ins[:3]
    init = ins[3:]
    for x in (lb, ub, step):
        if not isinstance(x, IntValue) or x.unk.any():
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
        ivv = IntValue(np.array(i, dtype=np.int64), np.array(tag, dtype=np.uint64), np.zeros((), dtype=bool))
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
    if not isinstance(cnd, IntValue) or cnd.unk.any():
        raise InterpError("a branch depends on values the analysis does not know", op)
    (l1, n1), (l2, n2) = targets[0], targets[1]
    rest = ins[1:]
    if bool(cnd.v):
        return _Terminator("branch", (l1, list(rest[:n1])))
    return _Terminator("branch", (l2, list(rest[n1 : n1 + n2])))


def _if(interp, op, ins, env):
    cnd = ins[0]
    if not isinstance(cnd, IntValue) or cnd.unk.any():
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
        if not isinstance(cnd, IntValue) or cnd.unk.any():
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
        return FloatValue.const(v, t.shape)
    if t.elem == "i1":
        return IntValue.const(bool(v), t.shape, bool)
    return IntValue.const(int(v), t.shape)


def _pid(interp, op, ins, env):
    ax = attr_int(op, "axis", 0)
    return IntValue(np.array(interp.pid[ax], dtype=np.int64), np.array(PID[ax], dtype=np.uint64), np.zeros((), bool))


def _nprog(interp, op, ins, env):
    ax = attr_int(op, "axis", 0)
    return IntValue.const(interp.launch.grid[ax])


def _make_range(interp, op, ins, env):
    s, e = attr_int(op, "start", 0), attr_int(op, "end", 0)
    n = e - s
    return IntValue(np.arange(s, e, dtype=np.int64), _u64((n,)), np.zeros((n,), dtype=bool))


def _addptr(interp, op, ins, env):
    p, o = ins
    if not isinstance(p, PointerValue) or not isinstance(o, IntValue):
        raise InterpError("pointer arithmetic on values the analysis cannot follow", op)
    if o.unk.any():
        # an offset loaded from memory the kernels computed: cannot follow
        raise InterpError("a pointer offset depends on values the analysis does not know", op)
    shape = np.broadcast_shapes(p.off.shape, o.v.shape)
    return PointerValue(
        np.broadcast_to(p.t, shape).copy(),
        p.off + o.v.astype(np.int64) * p.esize,
        np.broadcast_to(p.tags, shape) | np.broadcast_to(o.tags, shape),
        p.esize,
        p.pointee,
    )


def _bitcast(interp, op, ins, env):
    a = ins[0]
    rt = op.result.type
    if isinstance(a, PointerValue) and rt.is_ptr:
        return PointerValue(a.t, a.off, a.tags, _ELSIZE.get(rt.pointee, a.esize), rt.pointee)
    if isinstance(a, FloatValue) and rt.is_float:
        return a
    if isinstance(a, IntValue) and rt.is_int:
        return a
    shape = rt.shape
    tags = np.broadcast_to(getattr(a, "tags", np.uint64(0)), shape).copy()
    if rt.is_float:
        return FloatValue.opaque(shape, tags)
    return IntValue(np.zeros(shape, dtype=np.int64), tags, np.ones(shape, dtype=bool))


def _load(interp, op, ins, env):
    return interp.load(op, ins)


def _store(interp, op, ins, env):
    return interp.store(op, ins)


def _atomic(interp, op, ins, env):
    # treated as a load and a store of an opaque value
    ptr = ins[0]
    if not isinstance(ptr, PointerValue):
        raise InterpError("atomic through a non-pointer", op)
    shape = ptr.off.shape
    mask_in = [ins[-1]] if len(ins) > 2 and isinstance(ins[-1], IntValue) else []
    old = interp.load(op, [ptr] + mask_in)
    val = ins[1] if len(ins) > 1 else old
    interp.store(op, [ptr, val] + mask_in)
    if op.result.type.is_float:
        return FloatValue.opaque(shape, np.broadcast_to(getattr(val, "tags", np.uint64(0)), shape))
    return IntValue(np.zeros(shape, dtype=np.int64), _u64(shape), np.ones(shape, dtype=bool))


def _scan(interp, op, ins, env):
    axis = attr_int(op, "axis", 0)
    comb = combiner(op)
    x = ins[0]
    if isinstance(x, IntValue) and comb == "addi":
        return IntValue(np.cumsum(x.v, axis=axis), x.tags, np.logical_or.accumulate(x.unk, axis=axis))
    x = _fv(x)
    shape = x.c.shape
    tags = np.bitwise_or.accumulate(x.tags, axis=axis)
    return FloatValue.opaque(shape, tags)


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
    "arith.bitcast": _bitcast,
    "tt.bitcast": _bitcast,
    **ARITH_HANDLERS,
}

# llvm.intr.assume (tl.assume) only tells the compiler a fact: ignoring it loses no value the analysis follows
_NOOPS = {
    "tt.assert",
    "tt.print",
    "gpu.barrier",
    "tt.debug_barrier",
    "tt.reduce.return",
    "tt.scan.return",
    "llvm.intr.assume",
}
