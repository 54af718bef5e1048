"""Shared-memory races between the threads of one block (GPUVerify-style, over the executor's trace).

The executor runs a block's lanes in lockstep; each shared-memory access it records (`PtxTrace.shared`: ld/st,
cp.async, ldmatrix/stmatrix) carries its lane, guard, byte address and size, how many block barriers
(`bar.sync`/`barrier.sync`, not `bar.warp.sync`) the block had passed (its epoch) and the loops it is in.
Two accesses may run concurrently when no barrier separates them on any path:
- the same epoch: in each loop both are in, the same iteration when the loop passes a barrier per iteration,
  any two iterations when it passes none (a loop without a barrier is one barrier interval);
- across a loop's back edge: an access after the body's last barrier at iteration k and one before its first
  barrier at iteration k + 1.
A pair of such accesses by different lanes, at least one a write, is a race when the solver finds lanes
a != b, iterations and inputs of the domain where both execute and their byte ranges overlap: `shared-race`,
with the two lanes, the address and both source lines. Iteration-dependent unknowns (loop-carried values, data
read from memory) of the other iteration are renamed apart (more models: a proof stays a proof). What this
does not see: a barrier under a branch that not every thread takes (counted as if all did), the asynchrony
of cp.async before its wait (its write is placed at its issue), shared-memory atomics (never a race with each
other, not recorded) and warp-synchronous code that relies on lockstep within a warp without `__syncwarp`
(not modelled either way: its lanes' accesses are compared as any others').
"""

from __future__ import annotations

from collections.abc import Callable

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.context import Context, Result, lanes_as_one
from kernalin_ci.ptx.executor import Loop, PtxAccess, PtxTrace
from kernalin_ci.ptx.pointers import base_plus_constant
from kernalin_ci.ptx.solver import SolverAnswer

MAX_QUERIES = 200  # beyond: not proved
RLIMIT = 2_000_000  # the solver's resource count per query (solver.RLIMIT / 10)
Group = list[PtxAccess]  # the lanes' records of one execution of one instruction
Plan = tuple[tuple[int, str], ...]  # per loop both accesses are in: how the other's iteration relates


def _groups(trace: PtxTrace) -> list[list[PtxAccess]]:
    """The per-lane records of one execution of one instruction (one state's)."""
    out: dict[tuple[object, ...], Group] = {}
    for a in trace.shared:
        out.setdefault((a.instr.index, a.epoch, a.loops, id(a.cond), a.order), []).append(a)
    return list(out.values())


def _values(t: T.Term) -> set[int] | None:
    """The barrier counts a `sync` term may take (an if-then-else of counts per merged path); None: unknown."""
    if T.is_const(t):
        return {T.value(t)}
    if t.op == "ite":
        a, b = _values(t.args[1]), _values(t.args[2])
        return a | b if a is not None and b is not None else None
    if t.op == "add" and T.is_const(t.args[1]):
        a = _values(t.args[0])
        return {v + T.value(t.args[1]) for v in a} if a is not None else None
    return None


def _meet(a: set[int] | None, b: set[int] | None) -> bool:
    return a is None or b is None or bool(a & b)


def _sync(a: PtxAccess) -> T.Term:
    return a.sync if a.sync is not None else T.const(a.epoch, 32)


def _barrier(lp: Loop) -> bool:
    """Every iteration of lp passes a block barrier (on every path)."""
    ins = _values(lp.barriers_in) if lp.barriers_in is not None else None
    outs = [_values(t) for t in lp.barriers_out]
    if ins is None or not outs or any(o is None for o in outs):
        return False
    return min(min(o) for o in outs if o) > max(ins)


def _schedules(x: PtxAccess, y: PtxAccess, loops: dict[int, Loop]) -> list[Plan]:
    """How y's iterations relate to x's when the two may run between the same two barriers: per loop both
    are in, "same", "any", "next" (y one iteration after x) or "prev"; one plan per way (none: never
    concurrent). The barrier counts' equality is the query's (`_epochs`)."""
    common = [i for i, j in zip(x.loops, y.loops) if i == j]
    out: list[Plan] = []
    vx, vy = _values(_sync(x)), _values(_sync(y))
    if _meet(vx, vy):
        out.append(tuple((i, "same" if _barrier(loops[i]) else "any") for i in common))
    for n, i in enumerate(common):
        lp = loops[i]
        if not _barrier(lp):
            continue
        outs: set[int] = set().union(*(_values(t) or set() for t in lp.barriers_out))
        ins = _values(lp.barriers_in) if lp.barriers_in is not None else None
        for how, late, early in (("next", vx, vy), ("prev", vy, vx)):
            if _meet(late, outs) and _meet(early, ins):
                outer = tuple((j, "same" if _barrier(loops[j]) else "any") for j in common[:n])
                out.append(outer + ((i, how),) + tuple((j, "any") for j in common[n + 1 :]))
    return out


def _epochs(plan: Plan, loops: dict[int, Loop]) -> T.Term:
    """The barrier counts the plan needs: equal, or the write's and the other's either side of a back edge."""
    ea, eb = T.sym("__epoch_a", 32), T.sym("__epoch_b", 32)
    for i, how in plan:
        if how in ("next", "prev"):
            late, early = (ea, eb) if how == "next" else (eb, ea)
            lp = loops[i]
            if lp.barriers_in is None:
                return T.FALSE
            at_end = T.or_(*(T.cmp("eq", late, t) for t in lp.barriers_out))
            return T.and_(at_end, T.cmp("eq", early, lp.barriers_in))
    return T.cmp("eq", ea, eb)


class _Renaming:
    """y's iteration of each loop as the plan says: a new iteration symbol ("any": renamed apart, its own
    constraint), k + 1 ("next"), k - 1 ("prev"), or x's ("same"); y's loop-carried and memory unknowns renamed
    apart where its iteration may differ."""

    def __init__(self, ctx: Context, plan: Plan, x_loops: tuple[int, ...], y_loops: tuple[int, ...]):
        self.table: dict[T.Term, T.Term] = {}
        self.seen: set[int] = set()
        self.memo: dict[T.Term, T.Term] = {}
        self.frame: list[T.Term] = []
        self.moved: set[int] = set()
        loops, ways = ctx.trace.loops, dict(plan)
        for i in y_loops:  # outermost first: a loop inside one whose iteration differs is renamed apart too
            how = ways.get(i, "any" if self.moved else "same")  # a loop only y is in: x's terms never name it
            if how == "same":
                continue
            lp = loops[i]
            self.moved.add(i)
            if how in ("next", "prev"):
                self.table[lp.k] = T.bv("add", lp.k, T.const(1 if how == "next" else -1, 64))
                if how == "prev":
                    self.frame.append(T.not_(T.cmp("eq", lp.k, T.const(0, 64))))
            else:
                self.table[lp.k] = self._new(ctx, lp.k)
        for i in x_loops:  # a loop only x is in, without a barrier: where y's terms name its iteration (y runs
            # after it: its last), x may be at any other
            if i not in y_loops and not _barrier(loops[i]):
                self.moved.add(i)
                self.table[loops[i].k] = self._new(ctx, loops[i].k)
        for i in self.moved:
            self.frame.append(self(ctx.trace.resolve(loops[i].constraint)))

    @staticmethod
    def _new(ctx: Context, k: T.Term) -> T.Term:
        k2 = T.sym(f"__{k.args[0]}_{T.next_id()}", 64)
        ctx.bounds[k2.args[0]] = ctx.bounds[k.args[0]]
        return k2

    def __call__(self, t: T.Term) -> T.Term:
        if not self.moved:
            return t
        for x in T.walk(t, self.seen):  # each term once over every call: the table only grows, so a term
            # substituted earlier had every unknown below it renamed already (the memo stays right)
            if x not in self.table and (x.op == "phi" and x.args[0] in self.moved or x.op in ("fresh", "load")):
                self.table[x] = T.mk("fresh", ("other iteration", T.next_id()), x.sort, x.width)
        return T.substitute(t, self.table, self.memo)


def _side(ctx: Context, groups: list[Group], who: str, rename: Callable[[T.Term], T.Term]) -> T.Term:
    """Some lane (`__lane_<who>`) executes one of the groups' accesses (instruction `__instr_<who>`) at
    `__addr_<who>`, `__size_<who>` bytes."""
    lane, addr, size = T.sym(f"__lane_{who}", 32), T.sym(f"__addr_{who}", 64), T.sym(f"__size_{who}", 64)
    return lanes_as_one(
        [
            T.and_(
                T.cmp("eq", lane, T.const(a.lane, 32)),
                T.cmp("eq", size, T.const(a.size, 64)),
                T.cmp("eq", T.sym(f"__instr_{who}", 32), T.const(a.instr.index, 32)),
                T.cmp("eq", T.sym(f"__epoch_{who}", 32), rename(_sync(a))),
                rename(ctx.path(a)),
                T.cmp("eq", addr, rename(T.zext(a.offset, 64) if a.offset.width < 64 else a.offset)),
            )
            for g in groups
            for a in g
        ]
    )


def _where(a: PtxAccess) -> str:
    return f"{a.instr.file}:{a.instr.line}" if a.instr.line else f"PTX instruction {a.instr.index}"


def check(trace: PtxTrace, ctx: Context) -> list[Result]:
    """One query per write and way its partners may run beside it: some access of theirs, by another lane, at
    an overlapping byte."""
    what = "shared memory: no two threads touch the same bytes between barriers (one writing)"
    groups = _groups(trace)
    span = {id(g[0]): _span(ctx, g) for g in groups}
    bytes_of: dict = {}
    fixed: dict[int, list[Group]] = {}  # a shared byte -> the groups at constant addresses touching it
    moving: list[Group] = []  # the other groups
    for g in groups:
        at = _lanes_at(g, bytes_of)
        if at is not None and T.is_const(at[0]):
            for b in at[1]:
                fixed.setdefault(b, []).append(g)
        else:
            moving.append(g)
    queries: dict[tuple[int, Plan, tuple[int, ...]], tuple[Group, Plan, list[Group]]] = {}
    plans: dict[tuple, list[Plan]] = {}  # by both sides' loops and barrier counts
    for gx in groups:
        if gx[0].kind != "st":
            continue
        (lx, hx) = span[id(gx[0])]
        at = _lanes_at(gx, bytes_of)
        if at is not None and T.is_const(at[0]):  # partners: the groups touching one of its bytes, and the rest
            near = {id(g[0]): g for b in at[1] for g in fixed.get(b, ())}
            partners = [*near.values(), *moving]
        else:
            partners = groups
        for gy in partners:
            (ly, hy) = span[id(gy[0])]
            if hx + gx[0].size <= ly or hy + gy[0].size <= lx:
                continue  # byte ranges that never meet (different arrays)
            if gy is gx:
                continue  # one instruction's lanes: not compared
            if not _may_overlap(gx, gy, bytes_of, False):
                continue  # constant addresses no two threads share: under every plan
            x, y = gx[0], gy[0]
            key = (x.loops, _sync(x), y.loops, _sync(y))
            if key not in plans:
                plans[key] = _schedules(x, y, trace.loops)
            for plan in plans[key]:
                if not _may_overlap(gx, gy, bytes_of, _unrenamed(plan, gx, gy)):
                    continue  # addresses no two threads share (constants, or one base both sides read alike)
                queries.setdefault((id(gx[0]), plan, gy[0].loops), (gx, plan, []))[2].append(gy)
    if len(queries) > MAX_QUERIES:
        return [Result(what, "not-proved", ctx.domain, cause=f"{len(queries)} queries about shared accesses")]
    unsure = ""
    sides: dict[tuple, T.Term] = {}  # a side's formula, built (and translated) once for every query it is in
    for gx, plan, gys in queries.values():
        if "any" in dict(plan).values():
            # both in one loop without a barrier, at any two iterations: the engine bounds a loop's iterations
            # more loosely than the lanes' own exits (a witness may be an iteration that never runs), and the
            # addresses of such loops (`e / D`, `e % D`) are seldom decided: not asked
            unsure = unsure or f"accesses in one loop without a barrier, for the write at {_where(gx[0])}"
            continue
        ans = _ask(ctx, gx, gys, plan, sides)
        if ans.status == "sat" and not ans.approximated:
            # the witness again at the first iteration of each loop without a barrier: the engine bounds such a
            # loop's iterations more loosely than its lanes' exits (a loop unrolled with a remainder), so a
            # witness at a later iteration may be one that never runs
            first = _ask(ctx, gx, gys, plan, sides, first=True)
            if first.status == "sat" and not first.approximated and _plain(gx, gys, first):
                return [_violation(ctx, what, gx, gys, plan, first)]
            if first.status == "sat" and not first.approximated:
                # a barrier count chosen by a merged path's condition, which may name a loop's iteration that
                # means "the last" on one side and "any" on the other: not a witness
                unsure = unsure or f"a witness through paths with different barrier counts, at {_where(gx[0])}"
                continue
            ans = first if first.status != "unsat" else ans
            unsure = unsure or f"a witness only past the first iteration of a loop, for the write at {_where(gx[0])}"
            continue
        if (ans.status not in ("unsat", "sat") or ans.approximated) and not unsure:
            cause = f"operations not modelled exactly ({', '.join(ans.approximated)})" if ans.approximated else ""
            cause = cause or f"the solver gave up ({ans.cause or 'unknown'})"
            unsure = f"{cause} for the write at {_where(gx[0])}"
    if unsure:
        return [Result(what, "not-proved", ctx.domain, cause=unsure)]
    return [Result(what, "proved", ctx.domain)] if groups else []


def _ask(ctx: Context, gx: Group, gys: list[Group], plan: Plan, sides: dict, first: bool = False) -> SolverAnswer:
    ren = _Renaming(ctx, plan, gx[0].loops, gys[0][0].loops)
    la, lb = T.sym("__lane_a", 32), T.sym("__lane_b", 32)
    a_key, b_key = ("a", id(gx[0])), ("b", *(id(g[0]) for g in gys))
    if a_key not in sides:
        sides[a_key] = _side(ctx, [gx], "a", lambda t: t)
    if ren.moved:  # renamed apart: this plan's own
        b_side = _side(ctx, gys, "b", ren)
    else:
        if b_key not in sides:
            sides[b_key] = _side(ctx, gys, "b", ren)
        b_side = sides[b_key]
    cond = T.and_(
        sides[a_key],
        b_side,
        T.not_(T.cmp("eq", la, lb)),
        # lanes writing through one instruction store the same value where a layout replicates it over lanes
        # and warps (Triton's reductions): not compared
        T.not_(T.cmp("eq", T.sym("__instr_a", 32), T.sym("__instr_b", 32))),
        _overlap(),
        _epochs(plan, ctx.trace.loops),
    )
    extra = list(ren.frame)
    if first:
        loops = ctx.trace.loops
        for i in gx[0].loops:
            if not _barrier(loops[i]):
                extra.append(T.cmp("eq", loops[i].k, T.const(0, 64)))
        for i in gys[0][0].loops:
            k = ren.table.get(loops[i].k, loops[i].k)
            if not _barrier(loops[i]) and k.op == "sym":
                extra.append(T.cmp("eq", k, T.const(0, 64)))
    q = ctx.query()
    q.solver.set("rlimit", RLIMIT)  # a tenth of a property query's: many small queries, each given up sooner
    q.add(cond, *extra)
    return ctx.finish(q)


def _overlap() -> T.Term:
    a, b = T.sym("__addr_a", 64), T.sym("__addr_b", 64)
    sa, sb = T.sym("__size_a", 64), T.sym("__size_b", 64)
    return T.and_(T.cmp("ult", a, T.bv("add", b, sb)), T.cmp("ult", b, T.bv("add", a, sa)))


def _plain(gx: Group, gys: list[Group], ans: SolverAnswer) -> bool:
    """The witness's two accesses have barrier counts that no path condition chooses."""
    m = ans.model
    ys = [a for g in gys for a in g if a.instr.index == m.get("__instr_b")]
    return all(T.is_const(_sync(a)) for a in (gx[0], *ys))


def _when(plan: Plan) -> str:
    ways = dict(plan).values()
    return " one iteration later" if "next" in ways else " one iteration earlier" if "prev" in ways else ""


def _lanes_at(group: Group, memo: dict) -> tuple[T.Term, dict[int, set[int]]] | None:
    """(U, each byte offset from U the group's lanes touch -> those lanes) when every lane's address is one
    term U plus a constant of its own (U the constant 0: constant addresses); else None."""
    key = id(group[0])
    if key not in memo:
        base, out = None, {}
        for a in group:
            u, c = base_plus_constant(a.offset)
            if base is not None and u is not base:
                out = None
                break
            base = u
            for b in range(c, c + a.size):
                out.setdefault(b, set()).add(a.lane)
        memo[key] = (base, out) if out is not None else None
    return memo[key]


def _unrenamed(plan: Plan, gx: Group, gy: Group) -> bool:
    """The partner's terms are the write's own under this plan (the same iterations of the same loops)."""
    return gx[0].loops == gy[0].loops and all(how == "same" for _, how in plan)


def _may_overlap(gx: Group, gy: Group, memo: dict, same_terms: bool) -> bool:
    """Some byte two different threads of gx and gy may both touch. False only when every address of both
    is U + a constant of its lane, with one U for both that takes one value for both (a constant, or any term
    where the partner's terms are the write's own), and no byte is touched by two threads: then the pair
    needs no query, whatever the paths and barriers."""
    x, y = _lanes_at(gx, memo), _lanes_at(gy, memo)
    if x is None or y is None or x[0] is not y[0] or not (T.is_const(x[0]) or same_terms):
        return True
    bx, by = x[1], y[1]
    return any(len(bx[b] | lanes) > 1 for b, lanes in by.items() if b in bx)


def _span(ctx: Context, group: list[PtxAccess]) -> tuple[int, int]:
    los, his = zip(*(ctx.intervals.span(a.offset) for a in group))
    return min(los), max(his)


def _violation(ctx: Context, what: str, gx: Group, gys: list[Group], plan: Plan, ans: SolverAnswer) -> Result:
    m = ans.model
    a, b, addr = m.get("__lane_a"), m.get("__lane_b"), m.get("__addr_a")
    x = next((r for r in gx if r.lane == a), gx[0])
    y = next((r for g in gys for r in g if r.instr.index == m.get("__instr_b")), gys[0][0])
    kinds = {"ld": "reads", "st": "writes"}
    cause = (
        f"thread {a} writes shared byte {addr} at {_where(x)} while thread {b} {kinds[y.kind]} "
        f"shared byte {m.get('__addr_b')} at {_where(y)}{_when(plan)}: no barrier between"
    )
    cex = {k: v for k, v in ctx.readable(m).items() if not k.startswith("k")} | {"__threads": f"{a},{b}"}
    return Result(what, "violated", ctx.domain, "shared-race", x.instr, cause=cause, lane=a, counterexample=cex)
