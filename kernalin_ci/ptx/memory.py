"""Memory properties, proved over every access the executor recorded, for every value of the domain.

- `bounds`: every global load and store that executes stays inside its tensor (`unmasked-load` for a load,
  `stray-write` for a store).
- `cache_stores`: a KV cache store writes, bit for bit, the element of `key`/`value` of the token whose
  slot it lands in, at that token's head and dim; never for a padding token (slot -1); an address right in
  64-bit arithmetic but not in the kernel's is `offset-overflow` (`kv-source`, `kv-padding`, `kv-slot`).

Each property is one or a few SMT queries: "is there a lane, a program, a shape of the domain and index
values allowed by the contract where the access does what it must not?" `unsat` proves the property;
`sat` gives the counterexample.
"""

from __future__ import annotations

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.context import Context, Result, decode, lanes_as_one
from kernalin_ci.ptx.executor import PtxAccess, PtxTrace
from kernalin_ci.ptx.pointers import base_plus_constant


def bounds(trace: PtxTrace, ctx: Context) -> list[Result]:
    out = []
    by_instr: dict[tuple, list[PtxAccess]] = {}
    for a in trace.accesses:
        if a.tensor.startswith("global:"):
            continue
        by_instr.setdefault((a.kind, a.instr.index, a.tensor), []).append(a)
    for (kind, _, tensor), group in sorted(by_instr.items(), key=lambda kv: kv[0][1]):
        info = ctx.facts.tensors.get(tensor)
        ins = group[0].instr
        what = f"{'load from' if kind == 'ld' else 'store to'} {tensor} in bounds"
        if info is None:
            out.append(
                Result(what, "not-proved", ctx.domain, cause=f"{tensor} is not a tensor of the launch", where=ins)
            )
            continue
        limit = T.bv("mul", ctx.expr(info.extent), T.const(info.elsize, 64))
        bad = []
        classes: dict[tuple, list[tuple[PtxAccess, int]]] = {}
        for a in _distinct(group):
            u, c = base_plus_constant(a.offset)
            classes.setdefault((id(u), id(a.guard), a.cond), []).append((a, c))
        for members in classes.values():
            # lanes at U + c: the lowest and the highest c bound them all
            (lo_a, lo), (hi_a, hi) = min(members, key=lambda m: m[1]), max(members, key=lambda m: m[1])
            u = base_plus_constant(lo_a.offset)[0]
            first = T.bv("add", u, T.const(lo, 64))
            end = T.bv("add", u, T.const(hi + hi_a.size, 64))
            bad.append(T.and_(ctx.path(lo_a), T.cmp("slt", first, T.const(0, 64)), ctx.lane_is(lo_a)))
            bad.append(T.and_(ctx.path(hi_a), T.cmp("ult", limit, end), ctx.lane_is(hi_a)))
        bad_any = lanes_as_one(bad)
        ans = ctx.ask(bad_any)
        cls = "unmasked-load" if kind == "ld" else "stray-write"
        if ans.status == "sat" and ctx.ask(bad_any, extra=small_tensors(ctx)).status == "unsat":
            cls = "offset-overflow"  # only past 2^31 elements: 32-bit offset arithmetic wraps
        out.append(ctx.result(what, ans, cls, ins, group, lambda a: a.offset, tensor))
    return out


def small_tensors(ctx: Context) -> list[T.Term]:
    """Every tensor under 2^31 elements: what a violation that needs more is due to (a 32-bit offset)."""
    return [T.cmp("ult", ctx.expr(t.extent), T.const(1 << 31, 64)) for t in ctx.facts.tensors.values()]


def _distinct(group: list[PtxAccess]) -> list[PtxAccess]:
    seen: dict[tuple, PtxAccess] = {}
    for a in group:
        seen.setdefault((id(a.guard), id(a.offset), a.cond), a)
    return list(seen.values())


def source_element(value: T.Term) -> tuple[str, T.Term] | None:
    """The (tensor, byte offset) a stored value was loaded from, when it is a plain copy."""
    if value.op == "ite":
        for side in value.args[1:]:
            if not T.is_const(side):
                return source_element(side)
        return None
    if value.op == "load":
        return value.args[0], value.args[1]
    if value.op == "fbitsof" and value.args[0].op == "fbits":
        return source_element(value.args[0].args[0])
    return None


def cache_stores(trace: PtxTrace, ctx: Context) -> list[Result]:
    """KV append's contract on every store into a cache (contract.caches: cache -> source tensor)."""
    c = ctx.contract
    out = []
    stores = [a for a in trace.accesses if a.kind == "st" and a.tensor in c.caches]
    groups: dict[tuple, list[PtxAccess]] = {}
    for a in stores:
        groups.setdefault((a.instr.index, a.tensor), []).append(a)
    for (_, cache), group in sorted(groups.items()):
        ins = group[0].instr
        src_name = c.caches[cache]
        what = f"store to {cache} writes {src_name} of the token owning the slot"
        wrong = [a for a in group if (s := source_element(a.value)) is None or s[0] != src_name]
        if wrong:
            a = wrong[0]
            s = source_element(a.value)
            cause = f"stores {s[0]}" if s else "stores a value that is not a copy of an input element"
            out.append(Result(what, "violated", ctx.domain, "kv-source", ins, cause=cause, lane=a.lane))
            continue
        src = ctx.facts.tensors[src_name]
        dst = ctx.facts.tensors[cache]
        padded, wrong_slot = [], []
        for a in _distinct(group):
            (t, h, d), src_ok = decode(ctx, src, source_element(a.value)[1], "src", shared=True)
            slot = T.select(c.slots, T.bv("mul", t, T.const(ctx.facts.tensors[c.slots].elsize, 64)), 64)
            slot = T.sext(slot, 64) if slot.width < 64 else slot
            (blk, sl, hc, dc), dst_ok = decode(ctx, dst, a.offset, "dst", shared=True)
            base = T.and_(ctx.path(a), src_ok, ctx.lane_is(a))
            padded.append(T.and_(base, T.cmp("slt", slot, T.const(0, 64))))
            right = T.and_(
                T.cmp("eq", T.bv("add", T.bv("mul", blk, T.const(c.block_size, 64)), sl), slot),
                T.cmp("eq", hc, h),
                T.cmp("eq", dc, d),
            )
            wrong_slot.append(T.and_(base, dst_ok, T.cmp("sle", T.const(0, 64), slot), T.not_(right)))
        padded, wrong_slot = lanes_as_one(padded), lanes_as_one(wrong_slot)
        ans = ctx.ask(padded)
        if ans.status != "unsat":
            out.append(ctx.result(f"no store to {cache} for a padding token", ans, "kv-padding", ins, group))
            continue
        ans = ctx.ask(wrong_slot)
        if ans.status == "sat":
            small = ctx.ask(wrong_slot, extra=small_tensors(ctx))
            cls = "offset-overflow" if small.status == "unsat" else "kv-slot"
        else:
            cls = "kv-slot"
        out.append(ctx.result(what, ans, cls, ins, group))
    return out
