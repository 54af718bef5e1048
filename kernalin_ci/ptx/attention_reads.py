"""Attention's K/V reads, proved for every program, lane, kv_len and block table of the domain.

For every load of the K or V cache that executes, against the q row the program reads (its first lane's):
- the cache row belongs to q's sequence and to KV head h // group of q's head h (`stride`, `gqa-mapping`);
- paged: the block is read through the block table, from the row of q's sequence (`paged-index`);
- the position is below that sequence's kv_len: a K read past it is `kv-mask`, a V read `unmasked-load`
  (0 * garbage is NaN).
Positions: `j` of a contiguous cache [B, Hkv, S, D]; `column * block_size + slot` of a paged cache
[blocks, block_size, Hkv, D], column being the block-table entry the block came from.
"""

from __future__ import annotations

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.context import Context, Result, decode, lanes_as_one
from kernalin_ci.ptx.executor import PtxTrace


def _table_reads(t: T.Term, table: str) -> list[T.Term]:
    return [x for x in T.below(t, "select") if x.args[0] == table]


def kv_reads(trace: PtxTrace, ctx: Context) -> list[Result]:
    c = ctx.contract
    f = ctx.facts
    q_loads = [a for a in trace.accesses if a.kind == "ld" and a.tensor == c.query]
    out: list[Result] = []
    if not any(a.kind == "ld" and a.tensor in (c.kcache, c.vcache) for a in trace.accesses):
        return out  # a kernel that reads no cache (a split-KV combine)
    if not q_loads:
        return [Result("K/V reads of the query's sequence and head", "not-proved", ctx.domain, cause="no load of q")]
    # the program's query row: the first lane's first q load (a program serving several query heads
    # serves one KV head's group, so any of its rows names the same sequence and KV head)
    q_info = f.tensors[c.query]
    q0 = min(q_loads, key=lambda a: (a.lane, a.order))
    (qb, qh, _), q_ok = decode(ctx, q_info, q0.offset, "q", shared=True)
    q_any = T.and_(ctx.path(q0), q_ok)
    lens = f.tensors[c.lens]
    for cache, cls_past in ((c.kcache, "kv-mask"), (c.vcache, "unmasked-load")):
        info = f.tensors.get(cache)
        loads = [a for a in trace.accesses if a.kind == "ld" and a.tensor == cache]
        if info is None or not loads:
            continue
        ins = loads[0].instr
        if c.table:
            missing = [a for a in loads if not _table_reads(a.offset, c.table)]
            if (
                missing
                and ctx.ask(lanes_as_one([T.and_(ctx.path(a), ctx.lane_is(a)) for a in missing])).status == "unsat"
            ):
                # loads on a path the domain excludes (CUDA C++'s `block_tables == nullptr` branch: a tensor's
                # address is never null) never run
                gone = {id(a) for a in missing}
                loads, missing = [a for a in loads if id(a) not in gone], []
            if missing:
                via = sorted({x.args[0] for x in T.walk(missing[0].offset) if x.op in ("load", "select")} - {cache})
                cause = "the block is not a block-table entry" + (f" (it is read from {', '.join(via)})" if via else "")
                out.append(
                    Result(
                        f"{cache} read through the block table",
                        "violated",
                        ctx.domain,
                        "paged-index",
                        missing[0].instr,
                        cause=cause,
                        lane=missing[0].lane,
                    )
                )
                continue
        rows, heads, past = [], [], []
        table = f.tensors.get(c.table) if c.table else None
        for a in loads:
            if c.table:
                blk, slot, g, _ = (coords := decode(ctx, info, a.offset, "kv", shared=True))[0]
                sel = _table_reads(a.offset, c.table)[0]
                (row, col), t_ok = decode(ctx, table, sel.args[1], "bt", shared=True)
                where = T.and_(ctx.path(a), coords[1], t_ok, T.cmp("eq", blk, T.sext(sel, 64)))
                pos = T.bv("add", T.bv("mul", col, T.const(c.block_size, 64)), slot)
            else:
                (row, g, pos, _), ok = decode(ctx, info, a.offset, "kv", shared=True)
                where = T.and_(ctx.path(a), ok)
            kv_len = T.sext(T.select(c.lens, T.bv("mul", row, T.const(lens.elsize, 64)), 8 * lens.elsize), 64)
            lane = ctx.lane_is(a)
            rows.append(T.and_(where, lane, T.not_(T.cmp("eq", row, qb))))
            grp = T.bv("udiv", qh, T.const(c.group, 64))
            heads.append(T.and_(where, lane, T.cmp("eq", row, qb), T.not_(T.cmp("eq", g, grp))))
            past.append(T.and_(where, lane, T.cmp("sle", kv_len, pos)))
        checks = (
            (f"{cache} rows of the query's sequence", rows, "stride"),
            (f"{cache} head h // {c.group} for query head h", heads, "gqa-mapping"),
            (f"{cache} read only below kv_len", past, cls_past),
        )
        for what, formulas, cls in checks:
            ans = ctx.ask(T.and_(q_any, lanes_as_one(formulas)))
            out.append(ctx.result(what, ans, cls, ins, loads))
    return out
