"""What values of the IR graph are in attention, recognised without data: a max (`max_like`), a bound on
the scores and their factor (`upper_bound`, `bound_ratio`, `score_factor`), the exps and their kinds
(`Exps`, `exps_of`), a sum of exps (`is_exp_sum`), a division (`division`). attention_graph.py's checks
and attention_memory.py read them."""

from __future__ import annotations

import math

from kernalin_ci.verify.structural.common import op_of
from kernalin_ci.verify.structural.dataflow import (
    LF,
    MAX_KINDS,
    KernelView,
    carried,
    for_result,
    guarded,
    is_exp,
    lf_equal,
    lf_ratio,
    loop_yield,
    peel,
    reduce_kind,
    unguard,
    updates,
)
from kernalin_ci.verify.structural.ir import Value

# --------------------------------------------------------------------------- helpers


def max_like(v: Value, depth: int = 0) -> bool:
    """A max over something: a max reduction, maxnumf, a running max carried by a loop (updated under an `if`
    or not), a max with a constant in place of -inf (`where(m > -inf, m, 0)`)."""
    v = peel(v)
    if depth > 8:
        return False
    op = v.owner
    if op is not None:
        if reduce_kind(op) in MAX_KINDS or op.name in ("arith.maxnumf", "arith.maximumf"):
            return True
        ups = updates(v)
        if ups is not None:
            return bool(ups) and all(max_like(u, depth + 1) for u in ups)
        if op.name == "arith.select":
            a, b = (peel(o) for o in op.operands[1:])
            for x, k in ((a, b), (b, a)):
                if k.owner is not None and k.owner.name == "arith.constant" and max_like(x, depth + 1):
                    return True
            return False
        fr = for_result(v)
        if fr is not None:
            y = loop_yield(*fr)
            return y is not None and max_like(y, depth + 1)
        return False
    c = carried(v)
    if c is not None:
        y = loop_yield(*c)
        return y is not None and max_like(y, depth + 1)
    return False


def _select_peels(g, x: Value, depth=0):
    yield x
    x = peel(x)
    op = x.owner
    if op is not None and op.name == "arith.select" and depth < 4:
        for a, b in ((op.operands[1], op.operands[2]), (op.operands[2], op.operands[1])):
            k = g.const(peel(b))
            if k is not None and k == -math.inf:
                yield from _select_peels(g, a, depth + 1)


def upper_bound(g, m: Value, target: LF, depth: int = 0) -> bool:
    """Is m >= every lane of `target` by construction?"""
    if depth > 12:
        return False
    m = peel(m)
    lm = g.lf(m)
    if lf_equal(lm, target) and math.isclose(lm.const, target.const, abs_tol=1e-9):
        return True
    if lm.const == 0 and len(lm.atoms) == 1:
        ((r, k),) = lm.atoms.items()
        if r is not m and k > 0:
            return upper_bound(g, r, target.scaled(1.0 / k), depth + 1)
    op = m.owner
    if op is not None and reduce_kind(op) in MAX_KINDS:
        return any(g.lf_equiv(g.lf(x), target) for x in _select_peels(g, op.operands[0]))
    if op is not None and op.name in ("arith.maxnumf", "arith.maximumf"):
        return any(upper_bound(g, o, target, depth + 1) for o in op.operands)
    ups = updates(m)
    if ups is not None:
        return bool(ups) and all(upper_bound(g, u, target, depth + 1) for u in ups)
    x = guarded(g, m)
    if x is not None:
        return upper_bound(g, x, target, depth + 1)
    fr = for_result(m)
    if fr is not None:
        y = loop_yield(*fr)
        return y is not None and upper_bound(g, y, target, depth + 1)
    return False


def bound_ratio(g, m: Value, target: LF, depth: int = 0) -> float | None:
    """When m is a max over the same scores with another coefficient: target / scores-of-m."""
    if depth > 12:
        return None
    m = peel(m)
    lm = g.lf(m)
    if lm.const == 0 and len(lm.atoms) == 1:
        ((r, k),) = lm.atoms.items()
        if r is not m and k > 0:
            x = bound_ratio(g, r, target.scaled(1.0 / k), depth + 1)
            return x
    op = m.owner
    if op is not None and reduce_kind(op) in MAX_KINDS:
        for x in _select_peels(g, op.operands[0]):
            k = lf_ratio(target, g.lf(x))
            if k is not None:
                return k
        return None
    if op is not None and op.name in ("arith.maxnumf", "arith.maximumf"):
        for o in op.operands:
            k = bound_ratio(g, o, target, depth + 1)
            if k is not None:
                return k
    for x in (updates(m) or []) + [guarded(g, m)]:
        k = bound_ratio(g, x, target, depth + 1) if x is not None else None
        if k is not None:
            return k
    fr = for_result(m)
    if fr is not None:
        y = loop_yield(*fr)
        return bound_ratio(g, y, target, depth + 1) if y is not None else None
    return None


def score_factor(view: KernelView, v: Value, depth: int = 0):
    """(factor, tensors): v == factor * <q, k> with loads of `tensors`; (None, ...) when not recognised."""
    g = view.graph
    v = peel(v)
    op = v.owner
    if op is None or depth > 24:
        return None, set()
    n = op.name
    ups = updates(v)
    if ups is not None:
        # scores masked under an `if` (only the tiles that need it): every branch must scale them alike
        got = {(f, frozenset(ts)) for f, ts in (score_factor(view, u, depth + 1) for u in ups)}
        if len(got) == 1:
            f, ts = got.pop()
            return f, set(ts)
        return None, set()
    if n == "tt.load" and op in view.sources:
        # scores an earlier kernel computed and stored: their factor there
        got = {(f, frozenset(ts)) for f, ts in (score_factor(pv, val, depth + 1) for pv, val in view.stored(op))}
        if len(got) == 1:
            f, ts = got.pop()
            return f, set(ts)
        return None, set()
    if n == "tt.load":
        t = view.loads.get(op)
        return (1.0, {t}) if t else (None, set())
    if n == "arith.select":
        for a, b in ((op.operands[1], op.operands[2]), (op.operands[2], op.operands[1])):
            if g.const(peel(b)) is not None:
                return score_factor(view, a, depth + 1)
        return None, set()
    if n == "arith.mulf":
        a, b = op.operands
        kb, ka = g.const(peel(b)), g.const(peel(a))
        if kb is not None:
            f, ts = score_factor(view, a, depth + 1)
            return (f * kb if f is not None else None), ts
        if ka is not None:
            f, ts = score_factor(view, b, depth + 1)
            return (f * ka if f is not None else None), ts
        fa, ta = score_factor(view, a, depth + 1)
        fb, tb = score_factor(view, b, depth + 1)
        return (fa * fb if fa is not None and fb is not None else None), ta | tb
    if n in ("arith.divf", "tt.precise_divf"):
        kb = g.const(peel(op.operands[1]))
        if kb:
            f, ts = score_factor(view, op.operands[0], depth + 1)
            return (f / kb if f is not None else None), ts
        return None, set()
    if n == "tt.dot":
        if len(op.operands) > 2 and g.const(peel(op.operands[2])) not in (0.0, None):
            return None, set()
        fa, ta = score_factor(view, op.operands[0], depth + 1)
        fb, tb = score_factor(view, op.operands[1], depth + 1)
        return (fa * fb if fa is not None and fb is not None else None), ta | tb
    if reduce_kind(op) == "addf":
        return score_factor(view, op.operands[0], depth + 1)
    if rotated_in_step(view):
        # a fused decode step scores a rotated q (x cos - y sin, halves of the head dim kept apart): the
        # rotation keeps the norm, so its cos/sin coefficients count as 1 and the halves' partial scores,
        # alike in factor, add up to the score (RoPE's checks judge the rotation itself)
        if n in ("math.cos", "math.sin"):
            return 1.0, set()
        if n in ("arith.addf", "arith.subf"):
            fa, ta = score_factor(view, op.operands[0], depth + 1)
            fb, tb = score_factor(view, op.operands[1], depth + 1)
            if fa is not None and fb is not None and math.isclose(fa, fb, rel_tol=1e-6):
                return fa, ta | tb
    return None, set()


def dims(cap):
    q = cap.kwargs["q"]
    kc = cap.kwargs["k_cache"]
    Hq = q.shape[1]
    Hkv = kc.shape[2] if op_of(cap).paged_cache else kc.shape[1]
    return q.shape[0], Hq, Hkv, q.shape[2]


def rotated_in_step(view) -> bool:
    """The op rotates q and k in the step it attends in (decode_step): its scores are of rotated q and k."""
    op = op_of(view.capture)
    return op is not None and op.rotates


# --------------------------------------------------------------------------- the exps


def exps_of(view: KernelView) -> Exps:
    if "exps" not in view.cache:
        view.cache["exps"] = Exps(view)
    return view.cache["exps"]


class Exps:
    """The exps of one kernel that depend on the keys (here or through an earlier kernel's stores), each
    classified: 'score' (exp of scores, those of this kernel or scores an earlier kernel stored), 'rescale'
    (exp of a running max minus its update), 'combine' (exp of a statistic an earlier kernel stored: a
    log-sum-exp or a max of a partial softmax)."""

    def __init__(self, view: KernelView):
        self.view = view
        self.items = []  # (op, kind, lf)
        g = view.graph
        for op in view.ops():
            if not is_exp(op):
                continue
            arg = op.operands[0]
            if not view.reads(arg, "k_cache"):
                continue
            lf = g.lf(arg)
            pos = lf.positive()
            if pos.atoms and any(_loaded_statistic(view, a) for a in pos.atoms):
                kind = "combine"
            elif pos.atoms and all(max_like(a) for a in pos.atoms):
                kind = "rescale"
            else:
                kind = "score"
            self.items.append((op, kind, lf))

    def of(self, kind):
        return [(op, lf) for op, k, lf in self.items if k == kind]


def _loaded_statistic(view: KernelView, v: Value) -> bool:
    """v is loaded from memory in which earlier kernels stored softmax statistics (a max, a log-sum-exp, a sum
    of exponentials), not scores."""
    op = unguard(view.graph, v).owner
    if op is None or op.name != "tt.load" or op not in view.sources:
        return False
    return all(_statistic(pv, val) for pv, val in view.stored(op))


def _statistic(view: KernelView, v: Value) -> bool:
    if max_like(v) or is_exp_sum(view, v, exp_results(exps_of(view))):
        return True
    atoms = view.graph.lf(v).atoms
    return any(
        peel(a).owner is not None
        and peel(a).owner.name in ("math.log", "math.log2")
        or max_like(a)
        or _loaded_statistic(view, a)
        for a in atoms
    )


def exp_results(exps: Exps, kind="score") -> set:
    return {op.result for op, _ in exps.of(kind)}


def is_exp_sum(view: KernelView, v: Value, ps: set, depth: int = 0) -> bool:
    """v is a sum of exponentials: reduce_sum over an exp result, or a running sum of those."""
    if depth > 10:
        return False
    v = peel(v)
    op = v.owner
    g = view.graph
    if op is None:
        c = carried(v)
        if c is not None:
            y = loop_yield(*c)
            return y is not None and is_exp_sum(view, y, ps, depth + 1)
        return False
    ups = updates(v)
    if ups is not None:
        return bool(ups) and all(is_exp_sum(view, u, ps, depth + 1) for u in ups)
    if op.name == "arith.select":
        return any(is_exp_sum(view, o, ps, depth + 1) for o in op.operands[1:] if g.const(peel(o)) is None)
    if reduce_kind(op) == "addf":
        x = peel(op.operands[0])
        return x in ps or is_exp_sum(view, x, ps, depth + 1)
    if op.name in ("arith.addf",):
        return any(is_exp_sum(view, o, ps, depth + 1) for o in op.operands)
    if op.name == "arith.mulf":
        return any(is_exp_sum(view, o, ps, depth + 1) for o in op.operands)
    fr = for_result(v)
    if fr is not None:
        y = loop_yield(*fr)
        return y is not None and is_exp_sum(view, y, ps, depth + 1)
    if op.name in ("math.exp", "math.exp2") and peel(v) in ps:
        return True
    return False


def contains(g, v: Value, targets: set, depth=0) -> bool:
    v = unguard(g, v)
    if v in targets:
        return True
    if depth > 6 or v.owner is None:
        return False
    op = v.owner
    if op.name in ("arith.mulf", "arith.addf", "tt.dot") or reduce_kind(op) == "addf":
        return any(contains(g, o, targets, depth + 1) for o in op.operands)
    return False


def division(view: KernelView, v: Value, depth=0):
    """(numerator, denominator) when v is x / d or x * (1 / d); else None."""
    g = view.graph
    v = peel(v)
    op = v.owner
    if op is None or depth > 8:
        return None
    if op.name in ("arith.divf", "tt.precise_divf"):
        return op.operands[0], op.operands[1]
    if op.name == "arith.mulf":
        for a, b in ((op.operands[0], op.operands[1]), (op.operands[1], op.operands[0])):
            bo = peel(b).owner
            if bo is not None and bo.name in ("arith.divf", "tt.precise_divf") and g.const(peel(bo.operands[0])) == 1.0:
                return a, bo.operands[1]
        for a, b in ((op.operands[0], op.operands[1]), (op.operands[1], op.operands[0])):
            if g.const(peel(b)) is not None:  # (acc / l) * v_scale: a dequantisation factor of V
                return division(view, a, depth + 1)
    if op.name == "arith.select":
        for o in op.operands[1:]:
            if g.const(peel(o)) is None:
                return division(view, o, depth + 1)
    return None
