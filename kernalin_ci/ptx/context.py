"""What every property query shares: the domain's constraints, the contract's, and the verdict's form.

A query is built from terms of the trace plus the frame: each shape symbol in its range, each block index
below its grid size, each loop's iteration constraint, and for every index-tensor element the query
mentions the contract's bounds on it (kv_lens in [1, capacity], block-table entries valid blocks, slots
valid or -1 and pairwise distinct, positions below max_position, and the decode step's relations between
them). `Result` is a property's verdict: proved (with the domain it holds for), violated (with a concrete
counterexample: symbol values, index values, the lane), or not proved (with the cause).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernalin_ci.ptx import atomics, solver
from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.executor import PtxAccess, PtxTrace, expr_term
from kernalin_ci.ptx.facts import Expr, LaunchFacts, TensorFacts
from kernalin_ci.ptx.syntax import Instr

# The values each template symbol (`__h<n>`, `__r<n>`, see lanes_as_one) takes: bounds for the solver's
# intervals (the symbols are constrained to those values anyway).
_HOLE_BOUNDS: dict[str, tuple[int, int]] = {}


@dataclass
class Contract:
    """The op's facts the properties check against (names of the launch's tensors; empty when absent)."""

    op: str
    caches: dict[str, str] = field(default_factory=dict)  # cache tensor -> the input it copies (kv_append)
    slots: str = ""  # slot_mapping
    block_size: int = 0
    query: str = ""  # attention: q, the caches it reads, kv_lens, the block table ("" when contiguous)
    kcache: str = ""
    vcache: str = ""
    lens: str = ""
    table: str = ""
    group: int = 1  # query heads per KV head
    output: str = ""  # the attention output tensor
    rotations: dict[str, str] = field(default_factory=dict)  # rope: rotated output -> the input it rotates
    rotary_dim: int = 0
    style: str = "neox"
    positions: str = ""  # rope: the positions tensor
    base: float = 10000.0  # rope: theta_j = base^(-2j/rotary_dim)
    angle_skip: str = ""  # rope: why the angle's position and frequency are not checked (scaled tables)
    scale: float = 0.0  # the softmax scale of the call
    new_key: str = ""  # a fused decode step: the new token's key and value (k, v) stored into the caches
    new_value: str = ""


@dataclass
class Result:
    name: str
    status: str  # "proved" | "violated" | "not-proved"
    domain: str
    bug_class: str | None = None
    where: Instr | None = None
    cause: str = ""
    lane: int | None = None
    counterexample: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "property": self.name,
            "status": self.status,
            "domain": self.domain,
            "bug_class": self.bug_class,
            "line": self.where.line if self.where else None,
            "file": self.where.file if self.where else None,
            "cause": self.cause,
            "lane": self.lane,
            "counterexample": self.counterexample,
        }


class Context:
    def __init__(self, facts: LaunchFacts, contract: Contract, trace: PtxTrace, symbols: dict[str, T.Term]):
        self.facts = facts
        self.contract = contract
        self.trace = trace
        self.symbols = symbols
        self.domain = facts.domain_text()
        self._resolved: dict[int, T.Term] = {}
        self._frame: list[T.Term] | None = None
        self._translator: solver.Translator | None = None
        _HOLE_BOUNDS.clear()  # the template symbols of an earlier analysis (its terms are gone: terms.reset)
        self.bounds = self._bounds()
        self.coord_bounds: dict[str, tuple[int, int]] = {}  # decode's coordinate symbols, below their sizes
        self.select_bounds = self._select_bounds()
        for lp in trace.loops.values():
            self.bounds[lp.k.args[0]] = (0, self._iterations(lp) - 1)
        self.intervals = solver.Intervals(self.bounds, self.select_bounds)

    def _bounds(self) -> dict[str, tuple[int, int]]:
        """The declared range of every symbol the frame bounds, for the solver's intervals: the shape
        symbols, each block index below its grid size's largest value, each loop iteration below 2^40
        (the frame constrains them so; the intervals only spare wrap witnesses)."""
        out = _tightened({s.name: (s.lo, s.hi) for s in self.facts.symbols.values()}, self.facts)
        highest = {name: hi for name, (_, hi) in out.items()}
        for x, g in zip("xyz", self.facts.grid):
            if all(c >= 0 for _, c in g.terms) and g.symbols <= set(highest):
                out[f"ctaid.{x}"] = (0, max(g.at(highest) - 1, 0))
        for lp in self.trace.loops.values():
            out[lp.k.args[0]] = (0, (1 << 40) - 1)
        for name in self.facts.tensors:  # a tensor's address is never null (CUDA C++ `p == nullptr` tests)
            out[f"ptr:{name}"] = (1 << 16, (1 << 48) - 1)
        initial = {n: t.initial for n, t in self.facts.tensors.items()}
        self.take_ranges = atomics.take_ranges(self.trace.takes, self.trace.accesses, initial)
        return out | self.take_ranges

    def _select_bounds(self) -> dict[str, tuple[int, int]]:
        """The contract's range of each index tensor's values over the whole domain (a kv_len is in
        [1, 131072]), for the solver's intervals: a value known non-negative needs no sign case split. The
        same bounds `index_constraints` puts on every element a query reads; none for a tensor whose
        values may be negative (a padding slot)."""
        sym = {name: self.bounds[name] for name in self.facts.symbols}
        out = {}
        for name, t in self.facts.tensors.items():
            if t.value_range is None or t.allow_negative_one:
                continue
            lo, hi = (_extremes(e, sym) for e in t.value_range)
            if lo is not None and hi is not None and lo[0] >= 0:
                out[name] = (lo[0], hi[1])
        return out

    def _iterations(self, lp) -> int:
        """A bound on a loop's iterations, proved from the frame (its latch condition against the index
        values' and shapes' ranges: a loop up to kv_len runs at most capacity / step times): the smallest
        2^m of a few candidates that k provably stays below, else 2^40. A few small checks per loop, on
        one solver (the loop's frame asserted once); the solver's intervals then see k's real range (no
        wrap witness for k * step in 32 bits). A counterexample to a bound (an iteration k = v that runs)
        refutes every bound up to v at once."""
        q = self._loop_query(lp)
        reached = [0]  # the highest iteration a counterexample showed running

        def below(bound: int) -> bool:
            ans = q.check([T.cmp("ule", T.const(bound, 64), lp.k)])
            if ans.status == "unsat":
                return True
            reached[0] = max(reached[0], ans.model.get(lp.k.args[0], bound))
            return False

        cands = (8, 12, 16, 20, 24, 32)
        lo, hi = 0, len(cands)  # the answer's index: cands[hi], or 2^40 when hi == len(cands)
        while lo < hi:
            mid = (lo + hi) // 2
            if below(1 << cands[mid]):
                hi = mid
            else:
                lo = max(mid + 1, next((i for i, c in enumerate(cands) if 1 << c > reached[0]), len(cands)))
        if hi == len(cands):
            return 1 << 40
        # then the least bound itself, by bisection below that power of two (a dozen more small queries):
        # k * 64 < kv_len <= 131072 gives k < 2048, and the intervals see k * 64 below the cache's length
        low, high = (1 << cands[hi - 1]) if hi else 1, 1 << cands[hi]
        if high > 1 << 16:
            return high
        while low < high:
            low = max(low, reached[0] + 1)
            if low >= high:
                break
            mid = (low + high) // 2
            if below(mid):
                high = mid
            else:
                low = mid + 1
        return high

    def _loop_query(self, lp) -> solver.Query:
        """The frame of this loop and of the loops its constraints name (fewer constraints: a bound proved
        without the others holds with them), with the index facts."""
        lanes = len(lp.lane_constraint) == self.trace.lanes  # lanes leaving at different iterations
        own = [lanes_as_one(list(lp.lane_constraint.values()))] if lanes else []  # k runs while one does
        q = solver.Query(translator=self.translator())
        q.add(*self.frame(self._related(lp, own)))
        q.add(*own)
        self._index_facts(q)
        return q

    def _related(self, lp, terms: list[T.Term]) -> list:
        """lp and every loop whose iteration its constraint (or `terms`) mentions, transitively."""
        return self._loops_of([lp.k, *terms])

    def _loops_of(self, terms: list[T.Term]) -> list:
        """Every loop whose iteration `terms` mention, and those their constraints mention, transitively."""
        by_k = {other.k.args[0]: other for other in self.trace.loops.values()}
        out: list = []
        todo = list(terms)
        while todo:
            for x in T.below(todo.pop(), "sym"):
                other = by_k.get(x.args[0])
                if other is not None and other not in out:
                    out.append(other)
                    todo.append(self.trace.resolve(other.constraint))
        return out

    # ------------------------------------------------------------ terms

    def expr(self, e: Expr) -> T.Term:
        return expr_term(e, self.symbols, 64)

    def path(self, a: PtxAccess) -> T.Term:
        c = self._resolved.get(id(a.cond))
        if c is None:
            c = self.trace.resolve(T.and_(*a.cond))
            self._resolved[id(a.cond)] = c
        g = self._resolved.get(id(a.guard))
        if g is None:
            g = self.trace.resolve(a.guard) if T.below(a.guard, "lanecont") else a.guard
            self._resolved[id(a.guard)] = g
        return T.and_(c, g)

    def lane_is(self, a: PtxAccess) -> T.Term:
        """Names the lane in a counterexample (a disjunct per lane)."""
        return T.cmp("eq", T.sym("__lane", 32), T.const(a.lane, 32))

    def program_vars(self, trace: PtxTrace) -> list[T.Term]:
        return [self.symbols[f"ctaid.{x}"] for x in "xyz"] + [lp.k for lp in trace.loops.values()]

    def program_frame(self, trace: PtxTrace, loops: list | None = None) -> list[T.Term]:
        out = []
        for x, g in zip("xyz", self.facts.grid):
            cta = T.zext(self.symbols[f"ctaid.{x}"], 64)
            out.append(T.cmp("ult", cta, self.expr(g)))
        for lp in trace.loops.values() if loops is None else loops:
            out.append(self.trace.resolve(lp.constraint))
        return out

    def frame(self, loops: list | None = None) -> list[T.Term]:
        """The domain's constraints (every loop's, or those of `loops`); the whole frame is computed once."""
        if loops is None and self._frame is not None:
            return self._frame
        out = []
        for s in self.facts.symbols.values():
            v = self.symbols[s.name]
            out += [T.cmp("ule", T.const(s.lo, 64), v), T.cmp("ule", v, T.const(s.hi, 64))]
        for t in self.facts.tensors.values():
            if t.extent.constant is None:
                out.append(T.cmp("ule", self.expr(t.extent), T.const(t.max_elements, 64)))
        out += self.program_frame(self.trace, loops)
        for t in self.trace.takes.values():  # a counter's takes hand out init, init + 1, ... (atomics.py)
            lo, hi = self.take_ranges.get(str(t.term.args[0]), (None, None))
            if lo is not None:
                w = t.term.width
                out += [T.cmp("ule", T.const(lo, w), t.term), T.cmp("ule", t.term, T.const(hi, w))]
        if loops is None:
            self._frame = out
        return out

    # ------------------------------------------------------------ queries

    def translator(self) -> solver.Translator:
        """The translation to z3 the context's queries share (each term translated once), while the
        symbols' bounds stay those it was made with: a bound that changes (a loop's iteration bound, once
        proved; a shared coordinate's, widened) starts a new one."""
        mine = self.bounds | self.coord_bounds  # (a template symbol's bounds never change)
        tr = self._translator
        if tr is None or any(tr.intervals.bounds.get(k, v) != v for k, v in mine.items()):
            tr = self._translator = solver.Translator(mine | _HOLE_BOUNDS, self.select_bounds)
        else:
            tr.intervals.bounds.update(mine | _HOLE_BOUNDS)
        return tr

    def query(self) -> solver.Query:
        q = solver.Query(translator=self.translator())
        q.add(*self.frame())
        return q

    def ask(self, cond: T.Term, extra: list | None = None) -> solver.SolverAnswer:
        """Can cond (and extra) hold in the domain? First with only the constraints of the loops cond
        mentions: `unsat` there is a proof (the other loops' constraints only narrow the models further),
        and the solver is spared every unrelated loop. Otherwise the whole frame decides."""
        loops = self._loops_of([cond, *(extra or [])])
        if len(loops) < len(self.trace.loops):
            q = solver.Query(translator=self.translator())
            q.add(*self.frame(loops), cond, *(extra or []))
            ans = self.finish(q)
            if ans.status == "unsat":
                return ans
        q = self.query()
        q.add(cond, *(extra or []))
        ans = self.finish(q)
        if ans.status == "sat" and not ans.approximated:
            # a counterexample at the capture call's sizes, where there is one: the dynamic checker then
            # replays it as that call with the counterexample's index values (one more query, on a bug only)
            at = [
                T.cmp("eq", self.symbols[s.name], T.const(s.captured, 64))
                for s in self.facts.symbols.values()
                if s.lo < s.hi and s.lo <= s.captured <= s.hi  # a symbol held at one value stays there
            ]
            q = self.query()
            q.add(cond, *(extra or []), *at)
            small = self.finish(q) if at else ans
            if small.status == "sat" and not small.approximated:
                return small
        return ans

    def finish(self, q: solver.Query) -> solver.SolverAnswer:
        """Add the contract's constraints on every index element the query mentions, then decide."""
        self._index_facts(q)
        return q.check()

    def _index_facts(self, q: solver.Query) -> None:
        """The contract's constraints on every index element the query mentions."""
        done: set[int] = set()
        slots_seen: list[T.Term] = []
        while True:
            new = [t for t in q.selects() if id(t) not in done]
            if not new:
                break
            for t in new:
                done.add(id(t))
                for c in self.index_constraints(t, slots_seen):
                    q.add(c)

    def index_constraints(self, t: T.Term, slots_seen: list[T.Term]) -> list[T.Term]:
        """The contract's bounds on one index element. They hold for every read, in bounds or not: each
        index read is proved in bounds by its own property, so the others may assume it (a read out of
        bounds is reported there)."""
        name, off = t.args
        info = self.facts.tensors.get(name)
        if info is None or info.value_range is None:
            return []
        v = T.sext(t, 64)
        lo, hi = (self.expr(x) for x in info.value_range)
        ok = T.and_(T.cmp("sle", lo, v), T.cmp("sle", v, hi))
        if info.allow_negative_one:
            ok = T.or_(ok, T.cmp("eq", v, T.const(-1, 64)))
        out = [ok]
        if name in self.facts.distinct:
            for other in slots_seen:
                if other.args[0] == name:
                    ov = T.sext(other, 64)
                    differ = T.not_(T.cmp("eq", off, other.args[1]))
                    out.append(T.or_(T.not_(differ), T.cmp("slt", v, T.const(0, 64)), T.not_(T.cmp("eq", v, ov))))
            slots_seen.append(t)
        return out

    # ------------------------------------------------------------ verdicts

    def result(
        self, what: str, ans: solver.SolverAnswer, cls: str, ins: Instr | None, group: list[PtxAccess], *_
    ) -> Result:
        if ans.status == "unsat":
            return Result(what, "proved", self.domain, where=ins)
        if ans.status == "sat" and ans.approximated:
            cause = f"a counterexample through operations not modelled exactly ({', '.join(ans.approximated)})"
            return Result(what, "not-proved", self.domain, where=ins, cause=cause)
        if ans.status == "sat":
            return Result(
                what, "violated", self.domain, cls, ins, lane=_lane(ans, group), counterexample=self.readable(ans.model)
            )
        return Result(
            what, "not-proved", self.domain, where=ins, cause=f"the solver gave up ({ans.cause or 'unknown'})"
        )

    def readable(self, model: dict[str, int]) -> dict:
        """Symbol values, and index values by element ("block_tables[1, 3]": 5)."""
        out: dict = {}
        for k, v in model.items():
            if k.startswith("select:"):
                name, off = k[7:].split("@")
                info = self.facts.tensors.get(name)
                if info is None:
                    continue
                out[f"{name}[{_coords(info, int(off) // info.elsize, model, self.facts)}]"] = v
            elif k.startswith(("ctaid.",)) or k in self.facts.symbols or k.startswith("k"):
                out[k] = T.signed(v, 64) if k in self.facts.symbols else v
        return out


def _tightened(sym: dict[str, tuple[int, int]], facts: LaunchFacts) -> dict[str, tuple[int, int]]:
    """The symbols' ranges narrowed by the frame's tensor sizes (each tensor's extent at most its
    max_elements): B * 12582912 <= 2^31 keeps B <= 170. Every query holds the frame, so the narrower
    ranges bound the same models."""
    out = dict(sym)
    for t in facts.tensors.values():
        if t.extent.constant is not None or any(c < 0 for _, c in t.extent.terms):
            continue
        if any(out[s][0] < 0 for m, _ in t.extent.terms for s in m if s in out):
            continue
        if any(s not in out for m, _ in t.extent.terms for s in m):
            continue
        top = _extremes(t.extent, out)
        if top is None or top[1] >= 1 << 64:  # the frame's 64-bit size wraps: no bound from it
            continue
        mins = []
        for m, c in t.extent.terms:
            for s in m:
                c *= out[s][0]
            mins.append(c)
        for i, (m, c) in enumerate(t.extent.terms):
            if len(m) == 0 or len(set(m)) != len(m):
                continue
            rest = t.max_elements - (sum(mins) - mins[i])
            for s in m:
                k = c
                for s2 in m:
                    if s2 != s:
                        k *= out[s2][0]
                lo, hi = out[s]
                if k > 0:
                    out[s] = (lo, max(lo, min(hi, rest // k)))
    return out


def _extremes(e: Expr, sym: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    """The least and the largest value of e over the symbols' box (None when a symbol may be negative)."""
    lo = hi = 0
    for m, c in e.terms:
        if any(s not in sym or sym[s][0] < 0 for s in m):
            return None
        a = b = c
        for s in m:
            a, b = a * sym[s][0], b * sym[s][1]
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


def _lane(ans: solver.SolverAnswer, group: list[PtxAccess]) -> int | None:
    return ans.model.get("__lane") if group else None


def _coords(info: TensorFacts, elem: int, model: dict, facts: LaunchFacts) -> str:
    values = {s: model.get(s, facts.symbols[s].captured) for s in facts.symbols}
    strides = [st.at(values) for st in info.strides]
    order = sorted(range(len(strides)), key=lambda d: -strides[d])
    idx = [0] * len(strides)
    rest = elem
    for d in order:
        s = max(strides[d], 1)
        idx[d], rest = divmod(rest, s)
    return ", ".join(str(i) for i in idx)


def decode(ctx: Context, info: TensorFacts, off: T.Term, tag: str, shared: bool = False) -> tuple[list[T.Term], T.Term]:
    """Coordinates of the element at byte offset `off` of a tensor, and the constraint tying them to the
    offset (each below its dimension; strides as the tensor has them). shared: the same symbols for every
    call with this tag (per-lane alternatives of one disjunction).

    The coordinates are read off the offset's linear form where they can be (`_direct`): the offset is
    sum(e_d * stride_d) with each e_d a term; where the intervals show every inner e_d below its dimension,
    the coordinates are the e_d themselves (the decomposition of an in-bounds offset is unique). Elsewhere
    they are symbols, with the lemma "if every inner e_d is below its dimension, the coordinates are the
    e_d" added: the same set of models, and the solver need not find the decomposition itself."""
    sizes = [ctx.expr(x) for x in info.shape]
    direct = _direct(ctx, info, off)
    if direct is not None and not direct[1]:
        e = direct[0]
        conds = [T.cmp("ult", x, size) for x, size in zip(e, sizes)]
        return e, T.and_(*conds)
    n = 0 if shared else T.next_id()
    coords = [T.sym(f"{tag}_{n}_{d}", 64) for d in range(len(info.shape))]
    sym = {s.name: (s.lo, s.hi) for s in ctx.facts.symbols.values()}
    flat = T.const(0, 64)
    conds = []
    for c, size, stride, dim in zip(coords, sizes, info.strides, info.shape):
        flat = T.bv("add", flat, T.bv("mul", c, ctx.expr(stride)))
        conds.append(T.cmp("ult", c, size))
        top = _extremes(dim, sym)
        if top is not None and top[1] >= 1:  # implied by the constraint; spares the flat sum's wrap witnesses
            # (a shared symbol may name coordinates of several tensors: the widest range holds them all)
            seen = ctx.coord_bounds.get(c.args[0], (0, 0))[1]
            ctx.coord_bounds[c.args[0]] = (0, max(seen, top[1] - 1))
    conds.append(T.cmp("eq", off, T.bv("mul", flat, T.const(info.elsize, 64))))
    if direct is not None:
        e, inner = direct
        conds.append(T.or_(T.not_(T.and_(*inner)), T.and_(*(T.cmp("eq", c, x) for c, x in zip(coords, e)))))
    return coords, T.and_(*conds)


def linear_offset(ctx: Context, off: T.Term) -> tuple[dict[T.Term, int], int]:
    """An offset as an exact integer sum `sum(c * atom) + c0` (see _linear), after the intervals' rewrites."""
    return _linear(ctx.intervals.simplify(off), ctx.intervals)


def _linear(t: T.Term, iv: solver.Intervals) -> tuple[dict[T.Term, int], int]:
    """t's value as an integer sum `sum(c * atom) + c0` that holds exactly (no operation on the way
    wraps, by the intervals): through additions, products by constants and sign/zero extensions of
    non-negative values; any other term is an atom."""
    w = t.width
    if t.op == "const":
        return {}, T.value(t)
    if t.op == "add" and iv.span(t.args[0])[1] + iv.span(t.args[1])[1] < 1 << w:
        (a, ca), (b, cb) = _linear(t.args[0], iv), _linear(t.args[1], iv)
        out = dict(a)
        for x, c in b.items():
            out[x] = out.get(x, 0) + c
        return out, ca + cb
    if t.op == "mul" and T.is_const(t.args[1]) and iv.span(t.args[0])[1] * T.value(t.args[1]) < 1 << w:
        a, ca = _linear(t.args[0], iv)
        k = T.value(t.args[1])
        return {x: c * k for x, c in a.items()}, ca * k
    if t.op == "zext" or t.op == "sext" and iv.nonneg(t.args[0]):
        return _linear(t.args[0], iv)
    return {t: 1}, 0


def _direct(ctx: Context, info: TensorFacts, off: T.Term) -> tuple[list[T.Term], list[T.Term]] | None:
    """The offset as coordinates read off its linear form: e_d (64-bit terms, sum(e_d * stride_d) *
    elsize equal to the offset as integers), and the conditions `e_d < size_d` of the inner dimensions
    the intervals do not show. None where the strides are not constants of a mixed radix (each stride
    above the largest offset the dimensions inside it reach: then the decomposition of an offset into
    coordinates below their sizes is unique) or a term of the form does not fall on one dimension."""
    sym = {s.name: (s.lo, s.hi) for s in ctx.facts.symbols.values()}
    strides = [st.constant for st in info.strides]
    if any(st is None or st <= 0 for st in strides):
        return None
    order = sorted(range(len(strides)), key=lambda d: -strides[d])
    tops = [_extremes(x, sym) for x in info.shape]
    inside = 0  # the largest element offset the dimensions inside the current one reach
    for d in reversed(order):
        if strides[d] <= inside:
            return None
        top = tops[d]
        if top is None:
            return None
        inside += strides[d] * (top[1] - 1)
    if (inside + 1) * info.elsize >= 1 << 64:  # the offsets of the tensor's elements do not wrap
        return None
    iv = ctx.intervals
    atoms, c0 = _linear(iv.simplify(off), iv)
    per: list[list[tuple[T.Term, int]]] = [[] for _ in strides]
    for x, c in atoms.items():
        d = next((d for d in order if c > 0 and c % (strides[d] * info.elsize) == 0), None)
        if d is None:
            return None
        per[d].append((x, c // (strides[d] * info.elsize)))
    if c0 < 0 or c0 % info.elsize:
        return None
    rest, consts = c0 // info.elsize, [0] * len(strides)
    for d in order:
        consts[d], rest = divmod(rest, strides[d])
    if rest:
        return None
    e, inner = [], []
    for d in range(len(strides)):
        hi = consts[d] + sum(c * iv.span(x)[1] for x, c in per[d])
        if hi >= 1 << 64:
            return None
        x = T.const(consts[d], 64)
        for a, c in per[d]:
            x = T.bv("add", x, T.bv("mul", T.zext(a, 64), T.const(c, 64)))
        e.append(x)
        size = info.shape[d].constant
        if d != order[0] and (size is None or hi > size - 1):
            inner.append(T.cmp("ult", x, T.const(tops[d][1], 64)))
    return e, inner


def lanes_as_one(formulas: list[T.Term]) -> T.Term:
    """Or(formulas), said as few templates: per-lane formulas that differ only in constants become one
    formula with those constants as symbols (`__h<n>`), plus the finite choice of their per-lane values.
    The same set of models; the solver then reasons about the shared structure once, not once per lane."""
    groups: dict[object, list[T.Term]] = {}
    for f in formulas:
        if f is T.FALSE:
            continue
        groups.setdefault(_shape(f, T.SHAPES), []).append(f)
    out = []
    for members in groups.values():
        if len(members) == 1:
            out.append(members[0])
            continue
        holes: list[tuple[T.Term, list[int]]] = []
        template = _antiunify(members, holes, {})
        choices = sorted({tuple(v[i] for _, v in holes) for i in range(len(members))})
        out.append(T.and_(template, _pick(holes, choices)))
    return T.or_(*out)


def _pick(holes: list, rows: list[tuple], runs: bool = True) -> T.Term:
    """The holes take one row of values: runs of rows in arithmetic progression (the lanes of a tile)
    are one index r each (h = base + step * r, 0 <= r < n), the rest one disjunct per row."""
    runs: list[list[tuple]] = []
    for row in rows:
        run = runs[-1] if runs else None
        if run and (len(run) < 2 or _diff(run[-1], row) == _diff(run[-2], run[-1])):
            run.append(row)
        else:
            runs.append([row])
    out = []
    for run in runs:
        if len(run) < 3 or not runs:
            out += [T.and_(*(T.cmp("eq", h, T.const(x, h.width)) for (h, _), x in zip(holes, row))) for row in run]
            continue
        r = T.sym(f"__r{T.next_id()}", 64)
        _HOLE_BOUNDS[r.args[0]] = (0, len(run) - 1)
        step = _diff(run[0], run[1])
        eqs = [T.cmp("ult", r, T.const(len(run), 64))]
        for (h, _), base, d in zip(holes, run[0], step):
            rw = T.extract(r, 0, h.width) if h.width < 64 else r
            eqs.append(T.cmp("eq", h, T.bv("add", T.const(base, h.width), T.bv("mul", rw, T.const(d, h.width)))))
        out.append(T.and_(*eqs))
    return T.or_(*out)


def _diff(a: tuple, b: tuple) -> tuple:
    return tuple(y - x for x, y in zip(a, b))


def _shape(t: T.Term, memo: dict) -> object:
    r = memo.get(id(t))
    if r is None:
        if t.op == "const":
            r = ("C", t.width)
        else:
            r = (t.op, t.width, tuple(_shape(a, memo) if isinstance(a, T.Term) else a for a in t.args))
        memo[id(t)] = hash(r)
        r = hash(r)
    return r


def _antiunify(ts: list[T.Term], holes: list, memo: dict) -> T.Term:
    first = ts[0]
    if all(t is first for t in ts):
        return first
    key = tuple(id(t) for t in ts)
    if key in memo:
        return memo[key]
    if first.op == "const":
        h = T.sym(f"__h{T.next_id()}", first.width)
        holes.append((h, [T.value(t) for t in ts]))
        _HOLE_BOUNDS[h.args[0]] = (min(holes[-1][1]), max(holes[-1][1]))
        r = h
    else:
        args = []
        for i, a in enumerate(first.args):
            if isinstance(a, T.Term):
                args.append(_antiunify([t.args[i] for t in ts], holes, memo))
            else:
                args.append(a)
        r = T.mk(first.op, tuple(args), first.sort, first.width)
    memo[key] = r
    return r
