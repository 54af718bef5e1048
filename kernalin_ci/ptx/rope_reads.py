"""RoPE's reads, proved for every token, head and position of the domain.

Each rotated output element out[t, h, i] is a function of input elements; every input element its value
is computed from (the data loads among its leaves, through sin/cos, products and sums) must be
x[t, h, j] of the same token and head (`stride`), with j = i or j the partner of i in the configured
pairing (neox: i +/- r/2, gptj: i xor 1) for i < r (`rope-pairing`), and j = i for the dims i >= r that
pass through (`rope-passthrough`). What the angle is (position, frequency) is not checked here.
"""

from __future__ import annotations

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.context import Context, Result, decode, lanes_as_one
from kernalin_ci.ptx.executor import PtxTrace
from kernalin_ci.ptx.softmax import as_float


def _leaves(t: T.Term, tensor: str) -> list[T.Term]:
    return [x for x in T.walk(t) if x.op == "load" and x.args[0] == tensor]


def _partner_ok(style: str, r: int, i: T.Term, j: T.Term) -> T.Term:
    c = lambda v: T.const(v, 64)  # noqa: E731
    same = T.cmp("eq", j, i)
    if style == "gptj":
        even = T.cmp("eq", T.bv("urem", i, c(2)), c(0))
        pair = T.or_(
            T.and_(even, T.cmp("eq", j, T.bv("add", i, c(1)))),
            T.and_(T.not_(even), T.cmp("eq", j, T.bv("add", i, c(-1)))),
        )
    else:
        half = r // 2
        pair = T.or_(
            T.and_(T.cmp("ult", i, c(half)), T.cmp("eq", j, T.bv("add", i, c(half)))),
            T.and_(T.cmp("ule", c(half), i), T.cmp("eq", j, T.bv("add", i, c(-half)))),
        )
    return T.or_(same, pair)


def not_tokens_heads_dim(dst_name: str, dst, src_name: str, src) -> str | None:
    """Why a rotation's tensors cannot be read as [tokens, heads, dim] (an entry's own layout: a padded [B, S, H, D]
    copy), or None. Both RoPE analyses then say *not proved* with it."""
    if len(dst.shape) == 3 and len(src.shape) == 3:
        return None
    return f"{dst_name} or {src_name} is not a [tokens, heads, dim] tensor (shapes {dst.shape}, {src.shape})"


def rope_reads(trace: PtxTrace, ctx: Context) -> list[Result]:
    c = ctx.contract
    out: list[Result] = []
    for dst_name, src_name in c.rotations.items():
        dst, src = ctx.facts.tensors.get(dst_name), ctx.facts.tensors.get(src_name)
        stores = [a for a in trace.accesses if a.kind == "st" and a.tensor == dst_name]
        if dst is None or src is None or not stores:
            continue
        cause = not_tokens_heads_dim(dst_name, dst, src_name, src)
        if cause:
            for what in (f"{dst_name} reads {src_name} of its own token and head", f"{dst_name} rotates pairs"):
                out.append(Result(what, "not-proved", ctx.domain, cause=cause))
            continue
        by_instr: dict[int, list] = {}
        for a in stores:
            by_instr.setdefault(a.instr.index, []).append(a)
        for group in by_instr.values():
            ins = group[0].instr
            rows, pairs, passes = [], [], []
            for a in group:
                leaves = _leaves(as_float(a.value), src_name)
                if not leaves:
                    continue
                (t, h, i), ok = decode(ctx, dst, a.offset, "out", shared=True)
                base = T.and_(ctx.path(a), ok, ctx.lane_is(a))
                for n, leaf in enumerate(leaves):
                    (t2, h2, j), ok2 = decode(ctx, src, leaf.args[1], f"in{n}", shared=True)
                    at = T.and_(base, ok2)
                    rows.append(T.and_(at, T.not_(T.and_(T.cmp("eq", t, t2), T.cmp("eq", h, h2)))))
                    rot = T.cmp("ult", i, T.const(c.rotary_dim, 64))
                    pairs.append(T.and_(at, rot, T.not_(_partner_ok(c.style, c.rotary_dim, i, j))))
                    passes.append(T.and_(at, T.not_(rot), T.not_(T.cmp("eq", i, j))))
            for what, formulas, cls in (
                (f"{dst_name} reads {src_name} of its own token and head", rows, "stride"),
                (f"{dst_name} rotates pairs of the {c.style} style", pairs, "rope-pairing"),
                (f"{dst_name} passes dims >= {c.rotary_dim} through", passes, "rope-passthrough"),
            ):
                if formulas:
                    out.append(ctx.result(what, ctx.ask(lanes_as_one(formulas)), cls, ins, group))
    return out
