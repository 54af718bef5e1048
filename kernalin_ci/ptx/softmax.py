"""Softmax properties, read from the float dataflow graph of the executed kernel (no solver needed).

Every exponential in the PTX is `ex2.approx(x)`. Its argument is put in linear form over atoms (a masked
score `selp(mask, s, -inf)`, a max, a loop-carried value, a product q_i * k_i of two loaded elements);
kernel float parameters (the scale) count as constants with their launch values. A masked value
`selp(mask, s, c)` is one atom per mask and linear forms of s and c: the compiler may compute the same
score twice in two layouts, summing q_i * k_i in another order (float rounding is not modelled).
- max subtracted (`softmax-no-max`): the argument is c * (R - M) with M a max (a `max.f32` tree, through
  shuffles and shared memory, or a running max carried by a loop) one of whose operands is R itself, so
  that R - M <= 0; an M over the same scores scaled differently is `scale`.
- scale (`scale`): the q·k products reach the exponent with the factor scale * log2(e).
- rescale (`online-rescale`): in a loop that carries a running max, every carried accumulation of
  exponentials is multiplied by an `ex2` of (old max - new max) before anything is added to it. In a kernel
  without loops (a combine over a constant number of splits, unrolled: SGLang's stage 2), the same of every
  sum that adds exponentials of a new max M = max(x, P), P an earlier running max, to an accumulation whose
  exponentials all took P or an earlier max.
- normalised (`softmax-no-normalize`): a stored output computed from exponentials is divided by a sum of
  exponentials (`div`, or a product by `rcp`).
"""

from __future__ import annotations

import math

from kernalin_ci.ptx import shared
from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.context import Context, Result
from kernalin_ci.ptx.executor import PtxTrace
from kernalin_ci.ptx.state import lane_of

LOG2E = 1.0 / math.log(2.0)
Form = dict  # monomial (tuple of atoms) -> coefficient; () is the constant


def as_float(x: T.Term) -> T.Term:
    if x.sort == "f":
        return x
    if x.op == "fbitsof":
        return x.args[0]
    return T.fbits(x, x.width)


def _phi(t: T.Term) -> T.Term | None:
    return t.args[0] if t.op == "fbits" and t.args[0].op == "phi" else None


class FloatGraph:
    def __init__(self, trace: PtxTrace):
        self.trace = trace
        self.forms: dict[int, Form] = {}
        self.has_exp: dict[int, bool] = {}
        self.has_shared: dict[int, bool] = {}
        self.selects: dict[tuple, T.Term] = {}  # a masked value's canonical term, by its condition and sums
        self.sums: dict[int, tuple] = {}

    def update(self, phi_atom: T.Term) -> list[T.Term]:
        """The values a loop-carried float takes at the back edge (one per path)."""
        lid, reg, lane = _phi(phi_atom).args
        out = []
        for upd in self.trace.loops[lid].updates:
            v = upd.get(reg)
            if v is not None:
                out.append(as_float(lane_of(v, max(lane, 0))))
        return out

    def form(self, t: T.Term) -> Form:
        f = self.forms.get(id(t))
        if f is None:
            f = self._form(t)
            self.forms[id(t)] = f
        return f

    def _form(self, t: T.Term) -> Form:
        op, a = t.op, t.args
        if op == "fconst":
            return {(): a[0]}
        if op == "fparam":
            return {(): a[1]}
        if op == "fadd":
            return _add(self.form(a[0]), self.form(a[1]), 1.0)
        if op == "fsub":
            return _add(self.form(a[0]), self.form(a[1]), -1.0)
        if op == "fneg":
            return {m: -c for m, c in self.form(a[0]).items()}
        if op == "fmul":
            return _mul(self.form(a[0]), self.form(a[1]), t)
        if op == "ffma":
            return _add(_mul(self.form(a[0]), self.form(a[1]), t), self.form(a[2]), 1.0)
        if op == "fcvt" and t.width >= 32:
            return self.form(a[0])
        if op == "fite":  # one atom per condition and branch sums: a sum reassociated is the same score
            key = (id(a[0]), self.sum_key(a[1]), self.sum_key(a[2]))
            return {(self.selects.setdefault(key, t),): 1.0}
        return {(t,): 1.0}

    def sum_key(self, t: T.Term) -> tuple:
        """t as a sum, up to the order of its terms: the sorted summands of its fadd/ffma tree (a product
        x * y as the pair of its factors), a product by a constant as the constant and the sum's key."""
        k = self.sums.get(id(t))
        if k is None:
            k = self._sum_key(t)
            self.sums[id(t)] = k
        return k

    def _sum_key(self, t: T.Term) -> tuple:
        op, a = t.op, t.args
        if op == "fadd":
            return tuple(sorted(self.sum_key(a[0]) + self.sum_key(a[1]), key=repr))
        if op == "ffma":
            return tuple(sorted(self.sum_key(a[2]) + self._product(a[0], a[1]), key=repr))
        if op == "fmul":
            for x, c in ((a[0], a[1]), (a[1], a[0])):
                if c.op == "fconst" and c.args[0] == 0:
                    return ()
                if c.op in ("fconst", "fparam"):
                    return (("scaled", id(c), self.sum_key(x)),)
            return self._product(a[0], a[1])
        if op == "fconst" and a[0] == 0:
            return ()
        return (id(t),)

    @staticmethod
    def _product(x: T.Term, y: T.Term) -> tuple:
        """x * y as one summand; none when a factor is the constant 0 (a padded lane's product)."""
        if any(f.op == "fconst" and f.args[0] == 0 for f in (x, y)):
            return ()
        return (("*", *sorted((id(x), id(y)))),)

    def exps(self, roots: list[T.Term]) -> list[T.Term]:
        seen: set[int] = set()
        out = []
        stack = list(roots)
        while stack:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            if x.op == "ex2":
                out.append(x)
            if _phi(x) is not None:
                stack.extend(self.update(x))
            stack.extend(y for y in x.args if isinstance(y, T.Term))
        return out

    def reach(self, t: T.Term) -> list[T.Term]:
        """Every term t is computed from, through loop-carried values' updates."""
        seen: dict[int, T.Term] = {}
        stack = [t]
        while stack:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen[id(x)] = x
            if _phi(x) is not None:
                stack.extend(self.update(x))
            stack.extend(y for y in x.args if isinstance(y, T.Term))
        return list(seen.values())

    def involves_exp(self, t: T.Term) -> bool:
        """Whether an ex2 is reachable from t."""
        return self._reaches(t, lambda x: x.op == "ex2", self.has_exp)

    def reads_unresolved_shared(self, t: T.Term) -> bool:
        """Whether t reads shared memory the executor could not resolve (an epoch's unknown content)."""
        return self._reaches(t, lambda x: x.op == "fresh" and x.args[0] == shared.WHAT, self.has_shared)

    def _reaches(self, t: T.Term, hit, known_of: dict[int, bool]) -> bool:
        """Whether a term `hit` accepts is reachable from t, a loop's phi reaching its updates."""
        return T.reaches(t, hit, known_of, lambda x: self.update(x) if _phi(x) is not None else ())

    def max_operands(self, t: T.Term, seen: set | None = None) -> list[T.Term]:
        """The values a max takes the maximum of (through max trees and running maxima)."""
        seen = set() if seen is None else seen
        if id(t) in seen:
            return []
        seen.add(id(t))
        if t.op == "fmax":
            return [x for y in t.args for x in [y, *self.max_operands(y, seen)]]
        if t.op == "fite":
            return self.max_operands(t.args[1], seen) + self.max_operands(t.args[2], seen)
        if _phi(t) is not None:
            return [x for u in self.update(t) for x in [u, *self.max_operands(u, seen)]]
        if t.op == "fmul":  # max(x) * c == max(x * c) for a positive constant c (the scale)
            for x, c in ((t.args[0], t.args[1]), (t.args[1], t.args[0])):
                k = self.form(c)
                if set(k) == {()} and k[()] > 0:
                    return [T.fop("fmul", y, c) for y in self.max_operands(x, seen)]
        return []


def _add(f: Form, g: Form, k: float) -> Form:
    out = dict(f)
    for m, c in g.items():
        out[m] = out.get(m, 0.0) + k * c
    return {m: c for m, c in out.items() if c != 0.0}


def _mul(f: Form, g: Form, t: T.Term) -> Form:
    out: Form = {}
    for m1, c1 in f.items():
        for m2, c2 in g.items():
            m = tuple(sorted(m1 + m2, key=lambda x: x.serial))
            if len(m) > 2:
                return {(t,): 1.0}
            out[m] = out.get(m, 0.0) + c1 * c2
    return out


def _close(a: float, b: float, rel: float = 1e-4) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _proportional(f: Form, g: Form) -> float | None:
    """k with f == k * g (same monomials), else None."""
    if set(f) != set(g) or not f:
        return None
    m0 = next(iter(f))
    if g[m0] == 0:
        return None
    k = f[m0] / g[m0]
    return k if all(_close(f[m], k * g[m]) for m in f) else None


def check(trace: PtxTrace, ctx: Context) -> list[Result]:
    g = FloatGraph(trace)
    out_name = ctx.contract.output
    stores = [a for a in trace.accesses if a.kind == "st" and a.tensor in ctx.facts.tensors]
    roots = [as_float(a.value) for a in stores]
    exps = g.exps(roots)
    if not exps:
        return []
    results = [_max_subtracted(g, exps, ctx)]
    if results[0].status == "proved":
        results += _scale_followed(g, exps, ctx)
    results += _rescaled(g, trace, ctx) if trace.loops else _rescaled_unrolled(g, roots, ctx)
    outs = [a for a in stores if a.tensor == out_name]
    if outs:
        results.append(_normalised(g, outs, ctx))
    return results


def _score_exp(g: FloatGraph, e: T.Term) -> tuple[str, object]:
    """("ok", None), ("no-max", None), ("scale", k) or ("skip", None) for one exponential."""
    if not any(T.below(e, op) for op in ("load", "fresh", "phi", "select")):
        return "skip", None  # of the launch's constants and parameters (a RoPE frequency expf(-2i/r ln base))
    f = _without_reduction(g, g.form(e.args[0]))
    if set(f) <= {()}:
        return "skip", None
    if f.get(()) == -math.inf and all(math.isfinite(c) for m, c in f.items() if m != ()):
        return "skip", None  # exp(-inf - m) = 0: a running sum's first rescale (vLLM's combine: e_max starts at -inf)
    for m, c in f.items():
        if len(m) != 1 or c >= 0:
            continue
        rest = _add(f, {m: c}, -1.0)  # f without -c * M
        rest.pop((), None)
        if not rest:
            continue
        scaled = {k: v / -c for k, v in rest.items()}
        for leaf in g.max_operands(m[0]):
            k = _proportional(scaled, {x: y for x, y in g.form(leaf).items() if x != ()})
            if k is not None and _close(k, 1.0, 1e-3):
                return "ok", None
            if k is not None and k > 0:
                return "scale", k
    return "no-max", None


def _without_reduction(g: FloatGraph, f: Form) -> Form:
    """f without the integer part of an exponential's range reduction (CUDA's expf is ex2(x log2(e) - n) * 2^n,
    n = round(x log2(e)) computed through `cvt.sat` and a rounding fma): a term of degree 1 whose atom rounds
    (`cvt.sat`, `cvt.rni`) a multiple of the rest of the exponent adds no score and no max."""
    for m in [m for m in f if len(m) == 1]:
        rest = {x: c for x, c in f.items() if x != m and x != ()}
        if not rest:
            continue
        roundings = (*T.below(m[0], "fsat"), *T.below(m[0], "frnd"))  # memoised per term: scores recur
        for x in roundings:  # the rounding of a multiple of the rest: the reduction's integer part
            if _proportional(_nonconst(g.form(x.args[0])), rest) is not None:
                return _without_reduction(g, {x: c for x, c in f.items() if x != m})
    return f


def _nonconst(f: Form) -> Form:
    return {m: c for m, c in f.items() if m != ()}


def _shared_content(g: FloatGraph, t: T.Term) -> bool:
    """t reads shared memory the executor could not resolve (an epoch's unknown content, shared.py)."""
    return g.reads_unresolved_shared(t)


def _max_subtracted(g: FloatGraph, exps: list[T.Term], ctx: Context) -> Result:
    what = "every exponential is exp(s - m) with m a max over s"
    for e in exps:
        verdict, k = _score_exp(g, e)
        if (
            verdict == "no-max"
            and _shared_content(g, e)
            and any(x.op == "fmax" for v in g.trace.shared_stored for x in g.reach(as_float(v)))
        ):  # an unresolved shared value may be one stored with a max in it: not a violation we can tell
            cause = "the exponent reads shared memory the engine does not resolve, and a max was stored there"
            return Result(what, "not-proved", ctx.domain, cause=cause)
        if verdict == "no-max":
            return Result(what, "violated", ctx.domain, "softmax-no-max", cause="an exponent with no max subtracted")
        if verdict == "scale":
            cause = f"the max is taken over the scores scaled by another factor ({k:.4g}x)"
            return Result(what, "violated", ctx.domain, "scale", cause=cause)
    scale = _scale(g, exps, ctx)
    return scale or Result(what, "proved", ctx.domain)


def _scale_followed(g: FloatGraph, exps: list[T.Term], ctx: Context) -> list[Result]:
    """The scale is checked on the q.k products that reach an exponent; where none does because the scores
    pass through shared memory the engine does not resolve, the scale is not proved (never a pass)."""
    if not ctx.contract.scale:
        return []
    forms = [_without_reduction(g, g.form(e.args[0])) for e in exps]
    if any(len(m) == 2 for f in forms for m in f) or not any(_shared_content(g, e) for e in exps):
        return []
    cause = "the scores reach the exponentials through shared memory the engine does not resolve"
    return [Result("the scale multiplies q.k once", "not-proved", ctx.domain, cause=cause)]


def _scale(g: FloatGraph, exps: list[T.Term], ctx: Context) -> Result | None:
    want = ctx.contract.scale * LOG2E
    if not want:
        return None
    for e in exps:
        for m, c in g.form(e.args[0]).items():
            if len(m) == 2 and c > 0 and not _close(c, want, 2e-3):
                cause = f"q.k reaches the exponent times {c:.6g}, not scale * log2(e) = {want:.6g}"
                return Result("the scale multiplies q.k once", "violated", ctx.domain, "scale", cause=cause)
            if len(m) == 1 and c > 0 and m[0].op == "fite":
                for mm, cc in g.form(m[0].args[1]).items():
                    if len(mm) == 2 and not _close(c * cc, want, 2e-3):
                        cause = f"q.k reaches the exponent times {c * cc:.6g}, not scale * log2(e) = {want:.6g}"
                        return Result("the scale multiplies q.k once", "violated", ctx.domain, "scale", cause=cause)
    return None


def _rescaled(g: FloatGraph, trace: PtxTrace, ctx: Context) -> list[Result]:
    out = []
    for lp in trace.loops.values():
        phis = {reg: phi for reg, (_, phi) in lp.phis.items()}
        running = []
        for phi in phis.values():
            atom = T.fbits(lane_of(phi, 0), 32) if lane_of(phi, 0).sort == "bv" else None
            if atom is None:
                continue
            if any(u.op == "fmax" and atom in g.max_operands(u) for u in _updates(g, atom)):
                running.append(atom)
        if not running:
            continue
        what = "every accumulation of exponentials is rescaled when the running max changes"
        bad = None
        for reg, phi in phis.items():
            for lane in range(trace.lanes if not isinstance(phi, T.Term) else 1):
                atom = T.fbits(lane_of(phi, lane), 32)
                if atom in running:
                    continue
                for u in g.update(atom):
                    if not g.involves_exp(u) or not _uses(u, atom):
                        continue
                    if not _only_rescaled(u, atom, running):
                        bad = reg
        out.append(
            Result(what, "violated", ctx.domain, "online-rescale", cause=f"{bad} is not rescaled")
            if bad
            else Result(what, "proved", ctx.domain)
        )
    return out


def _rescaled_unrolled(g: FloatGraph, roots: list[T.Term], ctx: Context) -> list[Result]:
    """The rescale rule over straight-line code: each sum (`fadd`, `ffma`) whose newest exponentials take a
    max M = max(x, P), P itself a running max, and one of whose operands accumulates only exponentials of P
    or earlier maxima: that operand must be multiplied by an ex2 of M (as `_only_rescaled` asks in a loop)."""
    maxes: dict[int, frozenset] = {}  # a term's exponentials' max atoms

    def max_atom(e: T.Term) -> T.Term | None:
        f = _without_reduction(g, g.form(e.args[0]))
        atoms = [m[0] for m, c in f.items() if len(m) == 1 and c < 0 and m[0].op == "fmax"]
        return atoms[0] if len(atoms) == 1 else None

    def maxes_of(t: T.Term) -> frozenset:
        stack = [(t, False)]
        while stack:  # arguments before the terms made of them
            x, ready = stack.pop()
            if id(x) in maxes:
                continue
            args = [a for a in x.args if isinstance(a, T.Term)]
            if not ready:
                stack.append((x, True))
                stack.extend((a, False) for a in args if id(a) not in maxes)
                continue
            got = frozenset().union(*(maxes[id(a)] for a in args))
            if x.op == "ex2" and (m := max_atom(x)) is not None:
                got |= {m}
            maxes[id(x)] = got
        return maxes[id(t)]

    what = "every accumulation of exponentials is rescaled when the running max changes"
    seen: set[int] = set()  # one walk over every store's value: a sum they share is checked once
    sums = [x for r in roots for x in T.walk(r, seen) if x.op in ("fadd", "ffma")]
    checked = bad = False
    for x in sums:
        ms = maxes_of(x)
        below = {id(y) for m in ms for y in _maxes_below(m.args)}
        newest = [m for m in ms if id(m) not in below]
        if len(newest) != 1:
            continue
        older = {id(y) for y in _maxes_below(newest[0].args)}
        for o in x.args:
            mo = maxes_of(o)
            if not mo or not all(id(m) in older for m in mo):
                continue
            checked = True
            if not _only_rescaled(x, o, [newest[0]]):
                bad = True
    if bad:
        return [Result(what, "violated", ctx.domain, "online-rescale", cause="an accumulation is not rescaled")]
    return [Result(what, "proved", ctx.domain)] if checked else []


def _maxes_below(terms: tuple) -> list[T.Term]:
    """The maxima the terms are or choose between (`fmax`, through `fite` branches and `fmax` operands)."""
    out, seen, stack = [], set(), [t for t in terms if isinstance(t, T.Term)]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.op == "fmax":
            out.append(x)
            stack.extend(x.args)
        elif x.op == "fite":
            stack.extend(x.args[1:])
    return out


def _updates(g: FloatGraph, atom: T.Term) -> list[T.Term]:
    """The values a carried float takes at the back edge, each path's choice apart (`fite` of a path that
    keeps the value as it was, such as lanes that skip the update, is its other branch)."""
    out, stack = [], list(g.update(atom))
    while stack:
        u = stack.pop()
        if u.op == "fite":
            stack.extend(x for x in u.args[1:] if x is not atom)
        else:
            out.append(u)
    return out


def _uses(t: T.Term, atom: T.Term) -> bool:
    return any(x is atom for x in T.walk(t))


def _rescale_factor(x: T.Term, running: list[T.Term]) -> bool:
    """x is an ex2 of the running max; or expf's ex2(...) * 2^n (the power of two built in the exponent
    field, `shl n, 23`); or a choice between such a factor and 0 (`m == -inf ? 0 : exp(m - m_new)`)."""
    while x.op == "fcvt":
        x = x.args[0]
    if x.op == "fite":
        return all(_is_zero(y) or _rescale_factor(y, running) for y in x.args[1:])
    if x.op == "fmul":
        a, b = x.args
        return any(_rescale_factor(p, running) and _power_of_two(q) for p, q in ((a, b), (b, a)))
    return x.op == "ex2" and any(_uses(x, m) for m in running)


def _is_zero(x: T.Term) -> bool:
    return x.op == "fconst" and x.args[0] == 0.0


def _power_of_two(x: T.Term) -> bool:
    """2^n as expf builds it: the bits of n shifted into the exponent field of a float32 (`n << 23`, `n * 2^23`)."""
    if x.op != "fbits" or x.args[0].op not in ("shl", "mul"):
        return False
    n = x.args[0].args[1]
    return T.is_const(n) and T.value(n) == (23 if x.args[0].op == "shl" else 1 << 23)


def _only_rescaled(t: T.Term, atom: T.Term, running: list[T.Term]) -> bool:
    """Every occurrence of atom in t is a factor of a product with an ex2 of the running max."""
    seen: set[int] = set()
    stack = [t]
    while stack:
        x = stack.pop()
        if id(x) in seen or x is atom:
            continue
        seen.add(id(x))
        if x.op == "fite":  # a path that keeps the accumulator as it was adds nothing to it
            stack.extend(y for y in x.args[1:] if y is not atom)
            continue
        if x.op in ("fmul", "ffma") and atom in x.args[:2]:
            other = x.args[1] if x.args[0] is atom else x.args[0]
            if not _rescale_factor(other, running):
                return False
            stack.extend(x.args[2:])
            continue
        if any(y is atom for y in x.args):
            return False
        stack.extend(y for y in x.args if isinstance(y, T.Term))
    return True


def _normalised(g: FloatGraph, stores: list, ctx: Context) -> Result:
    what = "the output is divided by a sum of the exponentials"
    for a in stores:
        f = as_float(a.value)
        if not g.involves_exp(f):
            continue
        if not _divides_by_exp_sum(g, f):
            return Result(what, "violated", ctx.domain, "softmax-no-normalize", a.instr, lane=a.lane)
    return Result(what, "proved", ctx.domain)


def _divides_by_exp_sum(g: FloatGraph, f: T.Term) -> bool:
    for x in T.walk(f):
        if x.op == "fdiv" and g.involves_exp(x.args[1]):
            return True
        if x.op == "rcp" and g.involves_exp(x.args[0]):
            return True
    return False
