"""Structural checks of attention read from the IR graph (no data): the softmax (`softmax-no-max`,
`scale`, `online-rescale`, `softmax-no-normalize`) and the split-KV combine (`split-combine`). The
checks are listed in attention.py's docstring; attention.analyze runs them."""

from __future__ import annotations

import math

from kernalin_ci.verify.structural.attention_values import (
    Exps,
    bound_ratio,
    contains,
    division,
    exp_results,
    exps_of,
    is_exp_sum,
    max_like,
    rotated_in_step,
    score_factor,
    upper_bound,
)
from kernalin_ci.verify.structural.common import StructuralFindings, kname
from kernalin_ci.verify.structural.dataflow import (
    LF,
    LOG2E,
    KernelView,
    alternatives,
    carried,
    exp_base2,
    loop_arg,
    loop_yield,
    peel,
    reduce_kind,
    unguard,
    updates,
)
from kernalin_ci.verify.structural.ir import IROp, Value


def check_exps(view: KernelView, exps: Exps, rep: StructuralFindings, scale: float) -> None:
    g = view.graph
    name = kname(view)
    for op, lf in exps.of("score"):
        pos, neg = lf.positive(), lf.negative()
        drift = _drifting_factor(view, op.operands[0])
        if drift is not None:
            rep.finding(
                "structural:softmax-scale",
                "scale",
                f"{name}: the factor applied to the scores ({drift.name}) is updated on every loop "
                f"iteration, so each tile of keys is scaled differently",
                _yield_def(drift) or op,
                view,
            )
            continue
        if not neg.atoms:
            rep.finding(
                "structural:softmax-max",
                "softmax-no-max",
                f"{name}: exp of the scores with nothing subtracted (no max): exp(s) overflows once a score passes ~88",
                op,
                view,
            )
            continue
        if len(neg.atoms) != 1:
            rep.gap(
                "softmax max subtraction",
                "structural:softmax-max",
                f"{name}: could not verify the max subtraction: the exp argument subtracts {len(neg.atoms)} terms",
                op,
                view,
            )
            continue
        ((m, k),) = neg.atoms.items()
        target = pos.scaled(1.0 / k)
        if upper_bound(g, m, target):
            _check_scale(view, op, pos, rep, scale)
            continue
        ratio = bound_ratio(g, m, pos)
        if ratio is not None and not math.isclose(ratio, k, rel_tol=1e-4):
            rep.finding(
                "structural:softmax-scale",
                "scale",
                f"{name}: the exp subtracts the max of the scores scaled by {pos_coef(pos) / ratio:.6g} "
                f"from scores scaled by {pos_coef(pos) / k:.6g}: the scale is applied after the max "
                f"(or only on one side)",
                op,
                view,
            )
            continue
        if max_like(m):
            guard = peel(m).owner if peel(m).owner is not None and peel(m).owner.name == "arith.select" else None
            rep.finding(
                "structural:softmax-max",
                "softmax-no-max",
                f"{name}: the exp subtracts a max that does not include these scores (it is not an "
                f"upper bound of them{'; the guard replacing -inf tests another value' if guard else ''}), "
                f"so exp(s - m) can overflow",
                guard or op,
                view,
            )
        else:
            rep.gap(
                "softmax max subtraction",
                "structural:softmax-max",
                f"{name}: could not verify that the value subtracted in exp is the max of the scores",
                op,
                view,
            )
    bases = {exp_base2(op) for op, _ in exps.of("score")}
    for op, lf in exps.of("rescale"):
        pos, neg = lf.positive(), lf.negative()
        ok = len(neg.atoms) == 1 and len(pos.atoms) == 1
        if ok:
            ((m_new, k),) = neg.atoms.items()
            ok = upper_bound(g, m_new, pos.scaled(1.0 / k))
        if not ok:
            rep.finding(
                "structural:online-rescale",
                "online-rescale",
                f"{name}: the rescale factor is not exp(m_old - m_new) (old running max minus the new one)",
                op,
                view,
            )
        elif bases and exp_base2(op) not in bases:
            rep.finding(
                "structural:online-rescale",
                "online-rescale",
                f"{name}: the rescale factor uses {'exp2' if exp_base2(op) else 'exp'} but the scores use "
                f"{'exp2' if True in bases else 'exp'}",
                op,
                view,
            )


def _drifting_factor(view: KernelView, v: Value) -> Value | None:
    """A loop-carried scalar, computed without data, that multiplies the scores and changes every iteration."""
    g = view.graph
    stack, seen = [v], 0
    while stack and seen < 200:
        x = peel(stack.pop())
        seen += 1
        op = x.owner
        if op is None:
            continue
        if op.name in ("arith.mulf", "arith.divf"):
            for o in op.operands:
                c = carried(peel(o))
                if c is not None:
                    y = loop_yield(*c)
                    if (
                        y is not None
                        and peel(y) is not peel(o)
                        and not g.reaches(y, lambda q: q.name in ("tt.load", "tt.reduce", "tt.dot"))
                    ):
                        return peel(o)
            stack.extend(op.operands)
        elif op.name in ("arith.addf", "arith.subf", "arith.select", "arith.negf"):
            stack.extend(op.operands)
    return None


def _yield_def(arg: Value) -> IROp | None:
    c = carried(arg)
    if c is None:
        return None
    y = loop_yield(*c)
    return peel(y).owner if y is not None else None


def _additive_mask(g, v: Value) -> bool:
    """`where(mask, 0, -inf)` added to the scores: a select between two constants."""
    op = peel(v).owner
    return op is not None and op.name == "arith.select" and all(g.const(peel(o)) is not None for o in op.operands[1:])


def pos_coef(pos: LF) -> float:
    return next(iter(pos.atoms.values())) if pos.atoms else 1.0


def _check_scale(view: KernelView, op: IROp, pos: LF, rep: StructuralFindings, scale: float) -> None:
    name = kname(view)
    terms = {a: c for a, c in pos.atoms.items() if not _additive_mask(view.graph, a)}
    if len(terms) != 1:
        rep.gap(
            "softmax scale",
            "structural:softmax-scale",
            f"{name}: could not verify the scale: the exp argument adds {len(terms)} score terms",
            op,
            view,
        )
        return
    ((s, c),) = terms.items()
    f, tensors = score_factor(view, s)
    # decode_step: keys an earlier launch rotated and stored are followed back to k
    keys = ({"k_cache"}, {"k"}) if rotated_in_step(view) else ({"k_cache"},)
    if f is None or not any({"q"} | ks <= tensors for ks in keys):
        rep.gap(
            "softmax scale",
            "structural:softmax-scale",
            f"{name}: could not verify the scale: the scores are not recognised as a product of q and k",
            op,
            view,
        )
        return
    total = c * f
    base2 = exp_base2(op)
    want = scale * (LOG2E if base2 else 1.0)
    if math.isclose(total, want, rel_tol=2e-3):
        return
    fn = "exp2" if base2 else "exp"
    if math.isclose(total, 1.0, rel_tol=2e-3) or math.isclose(total, LOG2E, rel_tol=2e-3):
        why = "the scale is missing"
    elif math.isclose(total, want * scale, rel_tol=2e-3):
        why = "the scale is applied twice"
    elif base2 and math.isclose(total, scale, rel_tol=2e-3):
        why = "exp2 is used without folding log2(e) into the scale"
    elif not base2 and math.isclose(total, scale * LOG2E, rel_tol=2e-3):
        why = "log2(e) is folded into the scale but exp (not exp2) is used"
    else:
        why = f"the scores are multiplied by {total:.6g}, expected {want:.6g}"
    sites = _factor_sites(view, s)
    where = sites[-1] if sites else (op, view)
    rep.finding(
        "structural:softmax-scale", "scale", f"{name}: {fn} of q.k * {total:.6g} with scale {scale:.6g}: {why}", *where
    )


def _factor_sites(view: KernelView, v: Value, depth: int = 0) -> list:
    """(op, view) of the ops that multiply q, k or their product by a constant factor, outermost first; into
    the kernel that computed scores this one loads."""
    g = view.graph
    v = peel(v)
    op = v.owner
    if op is None or depth > 24:
        return []
    if op.name in ("arith.mulf", "arith.divf", "tt.precise_divf"):
        consts = [o for o in op.operands if g.const(peel(o)) is not None]
        rest = [o for o in op.operands if g.const(peel(o)) is None]
        here = [(op, view)] if consts else []
        return here + [x for o in rest for x in _factor_sites(view, o, depth + 1)]
    if op.name in ("arith.select", "tt.dot") or reduce_kind(op) == "addf":
        return [x for o in op.operands for x in _factor_sites(view, o, depth + 1)]
    if op.name == "tt.load" and op in view.sources:
        return [x for pv, val in view.stored(op) for x in _factor_sites(pv, val, depth + 1)]
    ups = updates(v)
    if ups:
        return _factor_sites(view, ups[0], depth + 1)
    return []


# --------------------------------------------------------------------------- rescale and normalisation


def check_rescale(view: KernelView, exps: Exps, rep: StructuralFindings) -> None:
    """Every accumulation of exponentials (of scores, or combine weights) in a loop with a running max is
    rescaled by exp(m_old - m_new); an update guarded by an `if` in the loop is checked in its branch."""
    ps = exp_results(exps) | exp_results(exps, "combine")
    alphas = exp_results(exps, "rescale")
    for loop in [op for op in view.ops() if op.name == "scf.for"]:
        body = loop.regions[0][0]
        nargs = len(body.args) - 1
        maxes = [j for j in range(nargs) if _is_running_max(loop, j)]
        if not maxes:
            continue
        for j in range(nargs):
            if j in maxes:
                continue
            arg = loop_arg(loop, j)
            y = loop_yield(loop, j)
            if y is None or not arg.type.is_float:
                continue
            for u in alternatives(y):
                _check_accumulation(view, arg, u, ps, alphas, rep)


def _check_accumulation(view: KernelView, arg: Value, y: Value, ps: set, alphas: set, rep: StructuralFindings) -> None:
    """One update y of the carried accumulator arg: fresh exponentials added to arg * exp(m_old - m_new)."""
    g = view.graph
    name = kname(view)
    yo = peel(y).owner
    if yo is None:
        return
    if yo.name == "tt.dot":
        old, new = yo.operands[2], yo
        fresh = contains(g, yo.operands[0], ps) or contains(g, yo.operands[1], ps)
    elif yo.name == "arith.addf":
        a, b = yo.operands
        if _depends_on_arg(a, arg):
            old, new = a, b
        elif _depends_on_arg(b, arg):
            old, new = b, a
        else:
            return
        fresh = contains(g, new, ps)
    else:
        return
    if not fresh:
        return
    what = "output accumulator" if _has_v(view, y) else "running sum"
    if peel(old) is arg:
        rep.finding(
            "structural:online-rescale",
            "online-rescale",
            f"{name}: the {what} ({arg.name}) is not rescaled by exp(m_old - m_new) when the running max grows",
            yo,
            view,
        )
        return
    oo = peel(old).owner
    ok = (
        oo is not None
        and oo.name == "arith.mulf"
        and any(peel(o) is arg for o in oo.operands)
        and any(unguard(g, o) in alphas for o in oo.operands)
    )
    if not ok:
        rep.finding(
            "structural:online-rescale",
            "online-rescale",
            f"{name}: the {what} ({arg.name}) is rescaled by something other than exp(m_old - m_new)",
            oo or yo,
            view,
        )


def _has_v(view: KernelView, v: Value) -> bool:
    return view.reads(v, "v_cache")


def _depends_on_arg(v: Value, arg: Value, depth=0) -> bool:
    v = peel(v)
    if v is arg:
        return True
    if depth > 6 or v.owner is None:
        return False
    return any(_depends_on_arg(o, arg, depth + 1) for o in v.owner.operands)


def _is_running_max(loop: IROp, j: int) -> bool:
    y = loop_yield(loop, j)
    if y is None:
        return False
    arg = loop_arg(loop, j)
    ups = alternatives(y)
    return bool(ups) and all(
        yo is not None and yo.name in ("arith.maxnumf", "arith.maximumf") and any(peel(o) is arg for o in yo.operands)
        for yo in (peel(u).owner for u in ups)
    )


def check_normalize(view: KernelView, exps: Exps, rep: StructuralFindings, out_tensors: set) -> list:
    """The output (or a partial output) is divided by the sum of the exponentials. Returns the partials stored
    unnormalised for a later kernel to reduce (split-K): their normalisation is checked there, by
    `check_partials`."""
    ps = exp_results(exps)
    if not ps:
        return []
    name = kname(view)
    partials = []
    for op in view.ops():
        if op.name != "tt.store" or view.stores.get(op) not in out_tensors:
            continue
        val = op.operands[1]
        if not view.reads(val, "v_cache"):
            continue  # not the attention output (an lse, a max)
        d = division(view, val)
        if d is None and op in view.consumers:
            partials.append((view, op))
            continue
        if d is None:
            rep.finding(
                "structural:softmax-normalize",
                "softmax-no-normalize",
                f"{name}: the output is stored without dividing by the sum of the exponentials (1/l)",
                op,
                view,
            )
            continue
        _, den = d
        if not is_exp_sum(view, den, ps):
            rep.finding(
                "structural:softmax-normalize",
                "softmax-no-normalize",
                f"{name}: the output is divided by something that is not the sum of the exponentials",
                peel(val).owner or op,
                view,
            )
    return partials


def _from_store(view: KernelView, v: Value, source: tuple) -> bool:
    """Does v depend on a load of memory that the store `source` (view, op) of an earlier kernel wrote?"""
    return view.graph.reaches(v, lambda o: o.name == "tt.load" and source in view.sources.get(o, []))


def check_partials(views: list, partials: list, rep: StructuralFindings, out_name: str | None) -> None:
    """Split-K: a kernel stores its unnormalised accumulator with the max and the sum of its exponentials, and a
    later kernel reduces the partials. The output it stores must be divided by the partials' sums."""
    for pview, sop in partials:
        ps = exp_results(exps_of(pview))
        sums = [
            (pview, st)
            for st in pview.ops()
            if st.name == "tt.store" and st in pview.consumers and is_exp_sum(pview, st.operands[1], ps)
        ]
        lse = any(
            st.name == "tt.store"
            and any(
                peel(a).owner is not None and peel(a).owner.name in ("math.log", "math.log2")
                for a in pview.graph.lf(st.operands[1]).atoms
            )
            for st in pview.ops()
        )
        outs = [
            (cv, st)
            for cv in views
            for st in cv.ops()
            if st.name == "tt.store" and cv.stores.get(st) == out_name and _from_store(cv, st.operands[1], (pview, sop))
        ]
        if not outs:
            rep.finding(
                "structural:softmax-normalize",
                "softmax-no-normalize",
                f"{kname(pview)}: the output is stored without dividing by the sum of the exponentials (1/l)",
                sop,
                pview,
            )
        for cv, st in outs:
            d = division(cv, st.operands[1])
            if d is None:
                rep.finding(
                    "structural:softmax-normalize",
                    "softmax-no-normalize",
                    f"{kname(cv)}: the output sums partial accumulators that {kname(pview)} stored "
                    f"unnormalised, and is not divided by their sums of exponentials",
                    st,
                    cv,
                )
            elif not any(_from_store(cv, d[1], src) for src in sums):
                where = (sop, pview) if lse else (peel(st.operands[1]).owner or st, cv)
                rep.finding(
                    "structural:softmax-normalize",
                    "softmax-no-normalize",
                    f"{kname(pview)} stores its accumulator unnormalised, and {kname(cv)} divides the "
                    f"combined output by something other than the partials' sums of exponentials",
                    *where,
                )


# --------------------------------------------------------------------------- split-KV combine


def check_combine(view: KernelView, exps: Exps, rep: StructuralFindings, out_tensors: set, partials: list) -> None:
    """Combine weights exp(stat_i - max stat); the combined output divided by the sum of the weights (a missing
    division over unnormalised partials is `check_partials`' finding)."""
    g = view.graph
    name = kname(view)
    weights = set()
    for op, lf in exps.of("combine"):
        pos, neg = lf.positive(), lf.negative()
        if not neg.atoms:  # a softmax over the partials' statistics without its max: not wrong weights
            rep.finding(
                "structural:split-combine",
                "softmax-no-max",
                f"{name}: partials weighted by exp of their stored statistic (lse_i or m_i) without "
                f"subtracting its max: the weights overflow",
                op,
                view,
            )
            continue
        if len(neg.atoms) == 1:
            ((m, k),) = neg.atoms.items()
            if upper_bound(g, m, pos.scaled(1.0 / k)):
                weights.add(op.result)
                continue
        rep.finding(
            "structural:split-combine",
            "split-combine",
            f"{name}: the combine weights are not exp(lse_i - max lse)",
            op,
            view,
        )
    if not weights:
        return
    for op in view.ops():
        if op.name != "tt.store" or view.stores.get(op) not in out_tensors:
            continue
        val = op.operands[1]
        d = division(view, val)
        if d is None and any(_from_store(view, val, src) for src in partials):
            continue
        if d is None or not is_exp_sum(view, d[1], weights):
            rep.finding(
                "structural:split-combine",
                "split-combine",
                f"{name}: the combined output is not divided by the sum of the combine weights",
                op,
                view,
            )


def check_lse_stores(view: KernelView, exps: Exps, rep: StructuralFindings) -> None:
    """A partial kernel that stores a log-sum-exp must store m + log(l) (the max it subtracted plus log sum)."""
    g = view.graph
    ps = exp_results(exps)
    name = kname(view)
    for op in view.ops():
        if op.name != "tt.store" or not (view.stores.get(op) or "").startswith("scratch"):
            continue
        val = op.operands[1]
        if view.reads(val, "v_cache") or not view.reads(val, "k_cache"):
            continue
        lf = g.lf(val)
        logs = [a for a in lf.atoms if peel(a).owner is not None and peel(a).owner.name in ("math.log", "math.log2")]
        if not logs:
            continue  # a max or a sum stored on its own: the combine must account for it
        maxes = [a for a in lf.atoms if max_like(a)]
        if not maxes:
            rep.finding(
                "structural:split-combine",
                "split-combine",
                f"{name}: the stored log-sum-exp is log(l) without the max m that was subtracted "
                f"(lse must be m + log(l))",
                op,
                view,
            )
    del ps
