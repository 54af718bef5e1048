"""A fused decode step's own properties (rotate, append, attend in one kernel), for every program and index
values of the domain.

- `new_slots`: every store into a cache writes the element of the token owning the slot, at the head and
  dim it lands in: some k (K cache) or v (V cache) element the stored value is computed from is
  `x[t, h, d]` with the store at slot_mapping[t], head h, dim d (`stray-write`: a lane holding no such
  element, a padded tile spilling into the next head or slot); the K cache holds a function of k that is
  not k itself (`kv-unrotated`: the key stored before its rotation); the V cache holds v itself, bit for bit
  through conversions (`rope-value` when v is transformed, a rotation; `kv-source` when the value is not v).
- `step_order`: a cache read in the kernel that can read the new token's position (kv_len - 1 of the
  program's sequence: its slot, by the contract's slot = block_tables[b, p // bs] * bs + p % bs) comes after
  every store of that cache in the kernel, with a barrier between them (other threads wrote the slot).
- `new_token_twice`: a score taken from the new key in registers (an exponent reaching a load of k) while the
  cache reads can also read the new token's position (`new-token-twice`).

What the rotated key's value is (its angles, signs, pairing) is not checked here: only that it is not k
itself and depends on the positions. The properties need no arithmetic of an mma: addresses, program order,
barriers and which inputs a value reads.
"""

from __future__ import annotations

from kernalin_ci.ptx import atomics
from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.context import Context, Result, decode, lanes_as_one
from kernalin_ci.ptx.evaluate import Unknown, evaluate
from kernalin_ci.ptx.executor import PtxAccess, PtxTrace
from kernalin_ci.ptx.softmax import FloatGraph, as_float


def _loads(t: T.Term, tensor: str) -> list[T.Term]:
    return [x for x in T.below(t, "load") if x.args[0] == tensor]


def _copy_of(t: T.Term) -> T.Term | None:
    """The load a stored value copies (through conversions and a masked lane's constant), else None."""
    while True:
        if t.op in ("ite", "fite"):
            sides = [x for x in t.args[1:] if not (T.is_const(x) or x.op == "fconst")]
            if len(sides) != 1:
                return None
            t = sides[0]
        elif t.op in ("fbitsof", "fbits", "fcvt", "zext", "extract"):
            t = t.args[0]
        elif t.op == "load":
            return t
        else:
            return None


def check(trace: PtxTrace, ctx: Context) -> list[Result]:
    c = ctx.contract
    stores = {n: [a for a in trace.accesses if a.kind == "st" and a.tensor == n] for n in (c.kcache, c.vcache)}
    out = new_slots(stores, ctx)
    out += step_order(trace, stores, ctx)
    out += new_token_twice(trace, ctx)
    out += queue_coverage(trace, ctx)
    return out


def new_slots(stores: dict[str, list[PtxAccess]], ctx: Context) -> list[Result]:
    c = ctx.contract
    out = []
    for cache, src_name in ((c.kcache, c.new_key), (c.vcache, c.new_value)):
        src, dst = ctx.facts.tensors.get(src_name), ctx.facts.tensors.get(cache)
        if src is None or dst is None or not stores[cache]:
            continue
        groups: dict[int, list[PtxAccess]] = {}
        for a in stores[cache]:
            groups.setdefault(a.instr.index, []).append(a)
        for group in groups.values():
            ins = group[0].instr
            what = f"store to {cache} writes {src_name} of the token owning the slot, at its head and dim"
            wrong = []
            for a in group:
                base = T.and_(ctx.path(a), ctx.lane_is(a))
                (blk, sl, hc, dc), dst_ok = decode(ctx, dst, a.offset, "dst", shared=True)
                right: list[T.Term] = []
                for x in _loads(a.value, src_name):
                    (t, h, d), src_ok = decode(ctx, src, x.args[1], f"src{len(right)}", shared=True)
                    slots = ctx.facts.tensors[c.slots]
                    slot = T.select(c.slots, T.bv("mul", t, T.const(slots.elsize, 64)), 8 * slots.elsize)
                    slot = T.sext(slot, 64) if slot.width < 64 else slot
                    at = T.bv("add", T.bv("mul", blk, T.const(c.block_size, 64)), sl)
                    right.append(T.and_(src_ok, T.cmp("eq", at, slot), T.cmp("eq", hc, h), T.cmp("eq", dc, d)))
                wrong.append(T.and_(base, dst_ok, T.not_(T.or_(*right)) if right else T.TRUE))
            out.append(ctx.result(what, ctx.ask(lanes_as_one(wrong)), "stray-write", ins, group))
            out.append(_value(cache, src_name, group, ctx))
    return out


def _value(cache: str, src_name: str, group: list[PtxAccess], ctx: Context) -> Result:
    c = ctx.contract
    ins = group[0].instr
    live = [a for a in group if a.guard is not T.FALSE and _loads(a.value, src_name)]
    is_key = cache == c.kcache
    what = (
        f"{cache} holds the rotated {src_name}, not {src_name} itself" if is_key else f"{cache} holds {src_name} itself"
    )
    if not live:  # no lane stores a value read from the input: the slot property says where it lands
        return Result(what, "not-proved", ctx.domain, where=ins, cause=f"no stored value reads {src_name}")
    if is_key:
        for a in live:
            x = _copy_of(a.value)
            if x is not None and x.args[0] == src_name:
                cause = f"the stored value is {src_name} itself (the key stored before its rotation)"
                return Result(what, "violated", ctx.domain, "kv-unrotated", ins, cause=cause, lane=a.lane)
        reads = {x.args[0] for a in live for x in T.below(a.value, "select")}
        if c.positions and c.positions not in reads:
            cause = f"the stored key does not depend on {c.positions}"
            return Result(what, "violated", ctx.domain, "kv-unrotated", ins, cause=cause, lane=live[0].lane)
        return Result(what, "proved", ctx.domain, where=ins)
    for a in live:
        x = _copy_of(a.value)
        if x is None or x.args[0] != src_name:
            cause = f"the stored value is computed from {src_name} (a rotation or another transform), not a copy"
            return Result(what, "violated", ctx.domain, "rope-value", ins, cause=cause, lane=a.lane)
    return Result(what, "proved", ctx.domain, where=ins)


def _reads_new_position(trace: PtxTrace, loads: list[PtxAccess], ctx: Context) -> T.Term:
    """Some of these cache loads reads position kv_len - 1 of the program's sequence (the new token)."""
    c = ctx.contract
    f = ctx.facts
    q_loads = [a for a in trace.accesses if a.kind == "ld" and a.tensor == c.query]
    if not q_loads:
        return T.FALSE
    q0 = min(q_loads, key=lambda a: (a.lane, a.order))
    (qb, _, _), q_ok = decode(ctx, f.tensors[c.query], q0.offset, "q", shared=True)
    lens = f.tensors[c.lens]
    kv_len = T.sext(T.select(c.lens, T.bv("mul", qb, T.const(lens.elsize, 64)), 8 * lens.elsize), 64)
    last = T.bv("add", kv_len, T.const(-1, 64))
    hits = []
    for a in loads:
        info = f.tensors[a.tensor]
        if c.table:
            sels = [x for x in T.below(a.offset, "select") if x.args[0] == c.table]
            if not sels:
                continue
            (blk, slot, _, _), ok = decode(ctx, info, a.offset, "kv", shared=True)
            (row, col), t_ok = decode(ctx, f.tensors[c.table], sels[0].args[1], "bt", shared=True)
            pos = T.bv("add", T.bv("mul", col, T.const(c.block_size, 64)), slot)
            where = T.and_(ok, t_ok, T.cmp("eq", blk, T.sext(sels[0], 64)))
        else:
            (row, _, pos, _), where = decode(ctx, info, a.offset, "kv", shared=True)
        hits.append(T.and_(ctx.path(a), where, ctx.lane_is(a), T.cmp("eq", row, qb), T.cmp("eq", pos, last)))
    return T.and_(ctx.path(q0), q_ok, lanes_as_one(hits))


def step_order(trace: PtxTrace, stores: dict[str, list[PtxAccess]], ctx: Context) -> list[Result]:
    out = []
    for cache, written in stores.items():
        if not written:
            continue  # the slot is written by another launch, earlier (launches run in order)
        loads = [a for a in trace.accesses if a.kind == "ld" and a.tensor == cache]
        early = [a for a in loads if any(not (s.order < a.order and s.epoch < a.epoch) for s in written)]
        what = f"every read of the new token's slot of {cache} comes after its write"
        if not early:
            out.append(Result(what, "proved", ctx.domain, where=written[0].instr))
            continue
        ans = ctx.ask(_reads_new_position(trace, early, ctx))
        res = ctx.result(what, ans, "step-order", early[0].instr, early)
        if res.status == "violated":
            res.cause = "a read of the new token's position before the store of the step (or with no barrier between)"
        out.append(res)
    return out


def new_token_twice(trace: PtxTrace, ctx: Context) -> list[Result]:
    c = ctx.contract
    g = FloatGraph(trace)
    roots = [as_float(a.value) for a in trace.accesses if a.kind == "st" and a.tensor == c.output]
    known: dict[int, bool] = {}
    if not any(T.reaches(e, lambda x: x.op == "load" and x.args[0] == c.new_key, known) for e in g.exps(roots)):
        return []  # no score of the new key from registers
    what = "the new token enters the softmax once"
    loads = [a for a in trace.accesses if a.kind == "ld" and a.tensor == c.kcache]
    ans = ctx.ask(_reads_new_position(trace, loads, ctx)) if loads else None
    if ans is None:
        return [Result(what, "proved", ctx.domain)]
    res = ctx.result(what, ans, "new-token-twice", loads[0].instr, loads)
    if res.status == "violated":
        res.cause = "a score of the new key from registers, and the cache reads cover its position too"
    return [res]


def queue_coverage(trace: PtxTrace, ctx: Context) -> list[Result]:
    """A persistent kernel (a loop over a work queue, atomics.py): every sequence in [0, B) is the q row of
    some take the loop runs (`kv-coverage`). The counter hands out init, init + 1, ... and every block
    takes until its take fails the loop's entry test, so when that test, once failed, fails for every
    later value, the takes run are exactly those from init below the first failing one. The item must be
    the take plus a constant d (proved); a sequence s is then processed iff s - d >= init passes the test."""
    c = ctx.contract
    info = ctx.facts.tensors.get(c.query)
    out: list[Result] = []
    for lp in trace.loops.values():
        qu = lp.queue
        if qu is None or info is None:
            continue
        tl = qu.loop_take
        what = f"every sequence in [0, {info.shape[0]}) is processed by a take of the work queue"
        loads = [a for a in trace.accesses if a.kind == "ld" and a.tensor == c.query and tl in T.below(a.offset, "sym")]
        rng = ctx.take_ranges.get(str(tl.args[0]))
        if not loads or rng is None:
            cause = "no q row is read from the queue's item" if not loads else "the counter's start is not known"
            out.append(Result(what, "not-proved", ctx.domain, cause=cause))
            continue
        q0 = min(loads, key=lambda a: (a.lane, a.order))
        coords, row_ok = decode(ctx, info, q0.offset, "cov", shared=True)
        row = coords[0]
        enter = T.and_(*qu.conds)
        v64 = T.sext(tl, 64)
        d = _offset(ctx, row, T.and_(ctx.path(q0), row_ok), tl, rng[0])
        if d is None:
            out.append(Result(what, "not-proved", ctx.domain, cause="the q row is no function of the take alone"))
            continue
        affine = ctx.ask(T.and_(ctx.path(q0), row_ok, T.not_(T.cmp("eq", row, T.bv("add", v64, T.const(d, 64))))))
        nxt = T.bv("add", tl, T.const(1, tl.width))
        later = ctx.ask(
            T.and_(T.not_(enter), T.substitute(enter, {tl: nxt}), T.cmp("ult", tl, T.const(rng[1], tl.width)))
        )
        if affine.status != "unsat" or later.status != "unsat":
            cause = "the q row is not the take plus a constant"
            if affine.status == "unsat":
                cause = "a take that fails the loop's test may be followed by one that passes it"
            out.append(Result(what, "not-proved", ctx.domain, where=q0.instr, cause=cause))
            continue
        s = T.sym("cov:sequence", 64)
        v = T.bv("add", s, T.const(-d, 64))
        runs = T.and_(
            T.cmp("sle", T.const(rng[0], 64), v),
            T.cmp("sle", v, T.const(rng[1], 64)),
            T.substitute(enter, {tl: T.extract(v, 0, tl.width) if tl.width < 64 else v}),
        )
        rows = ctx.expr(info.shape[0])
        ans = ctx.ask(T.and_(T.cmp("sle", T.const(0, 64), s), T.cmp("slt", s, rows), T.not_(runs)))
        res = ctx.result(what, ans, "kv-coverage", q0.instr, [q0])
        if res.status == "violated":
            seq = T.signed(ans.model.get("cov:sequence", 0), 64)
            res.counterexample["sequence"] = seq
            res.cause = (
                f"sequence {seq} is never processed: no take of the counter {_counter(tl, trace)} runs with the"
                f" value {seq - d} the kernel turns into it"
            )
        out.append(res)
    return out


def _offset(ctx: Context, row: T.Term, where: T.Term, tl: T.Term, init: int) -> int | None:
    """d with row == take + d, read off one value (checked for every take by the caller): by evaluation, or
    where the row is a coordinate symbol, from one model."""
    try:
        return T.signed(evaluate(row, {tl: init}), 64) - init
    except Unknown:
        pass
    if row.op != "sym":
        return None
    ans = ctx.ask(where)
    if ans.status != "sat" or row.args[0] not in ans.model or tl.args[0] not in ans.model:
        return None
    return T.signed(ans.model[row.args[0]], 64) - T.signed(ans.model[tl.args[0]], tl.width)


def _counter(tl: T.Term, trace: PtxTrace) -> str:
    t = atomics.takes_of(tl, trace.takes)
    return t.tensor if t is not None else "?"
