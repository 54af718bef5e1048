"""The symbolic executor: every thread of one block, in lockstep, over symbolic data.

Model (docs/structural.md, "The PTX engine"):
- The lanes of one block are enumerated (`%tid.x` is a constant per lane: a complete case split over the
  block's threads); the block indices `%ctaid.*` are symbols bounded by the grid, so one run covers every
  program of the launch. PtxKernel parameters are terms from the launch facts; a pointer is a base symbol
  `ptr:<tensor>` plus its byte offset.
- A register holds one term (the same in every lane: computed once) or a tuple of terms, one per lane.
- Loads: an index tensor's element is `select(tensor, offset)` (the same symbol for every read of that
  element); a data tensor's element is `load(tensor, offset, bits)`. Every global load and store is
  recorded (`PtxAccess`) with its lane, guard (the instruction predicate, the lane's activity and the path
  condition) and address; the properties are proved over these records.
- Branches: a condition that is the same in every lane forks the path condition; one that differs between
  lanes splits the lanes' activity masks. States meeting at an instruction are merged (if-then-else of
  their values), so the paths do not multiply.
- Loops (a backward branch): the body is executed once, for a symbolic iteration `k`: induction variables
  (`r = r + step`, step invariant) are `init + k * step`, every other loop-carried register is a `phi` atom
  of the iteration; the latch condition at iteration k - 1 constrains k (`loopinv`), loop counters do not
  wrap. The exit continues with the body's final values and the negated latch condition.
- Shared memory (shared.py): the entries stored (at constant or symbolic addresses) over an epoch's unknown
  content; warp shuffles read the source lane's register; `ldmatrix`/`stmatrix` move 8x8 tiles between lanes
  and addresses exactly (smem.py); barriers order nothing in lockstep, but each access records how many the
  block passed (`epoch`; per merged path: `sync`), and each shared access is recorded (`shared`: races.py).
  Local memory: per lane, concrete addresses or havoc.
- Lanes split by a branch are active again at its immediate post-dominator (`cfg.py`), when no
  path between returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernalin_ci.ptx import atomics, mma
from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.cfg import post_dominators
from kernalin_ci.ptx.facts import LaunchFacts
from kernalin_ci.ptx.loops import induction_step, until_equal
from kernalin_ci.ptx.pointers import pointer_cases, split_base
from kernalin_ci.ptx.semantics import Unsupported, alu, as_bits, fit, types_of
from kernalin_ci.ptx.shared import SharedMemory
from kernalin_ci.ptx.shared import layout as shared_layout
from kernalin_ci.ptx.smem import matrix_load, matrix_store, read_map, write_map
from kernalin_ci.ptx.state import State, Val, clone, dests, ite, lane_of, lanes, merge, pack, reg_width, work_inside
from kernalin_ci.ptx.syntax import Instr, Mem, PtxKernel

MAX_STATES = 64
MAX_STEPS = 200_000
NO_ALU = {"mov", "ld", "st", "bra", "ret", "exit", "bar", "barrier", "shfl", "cp", "membar", "fence", "cvta"}


@dataclass
class PtxAccess:
    kind: str  # "ld" | "st"
    instr: Instr
    lane: int
    guard: T.Term  # bool: executes (predicate and lane activity), within the path condition `cond`
    cond: tuple  # the path condition's conjuncts
    tensor: str  # the tensor addressed (`global:NAME` for a module table)
    offset: T.Term  # byte offset from the tensor's element 0 (64-bit)
    size: int  # bytes
    value: T.Term  # loaded term, or stored bits
    order: int  # program order of the access within its lane
    epoch: int = 0  # barriers (bar.sync) the block passed before the access
    loops: tuple = ()  # ids of the loops the access is in, outermost first
    sync: T.Term | None = None  # shared accesses: the barriers passed as a term (per merged path)


@dataclass(eq=False)
class Loop:
    id: int
    header: int
    latch: int
    k: T.Term
    ivs: dict  # reg -> (init Val, step Val)
    phis: dict  # reg -> (init Val, phi Val)
    latch_conds: list = field(default_factory=list)  # the back edge's condition, per path reaching the latch
    updates: list = field(default_factory=list)  # {reg: Val at the latch}, per path
    no_wrap: list = field(default_factory=list)  # bool terms: counters without overflow
    constraint: T.Term = T.TRUE
    lane_conds: list = field(default_factory=list)  # a back edge that differs between lanes: per lane
    lane_constraint: dict = field(default_factory=dict)  # lane -> the lane is still iterating at k
    iv_terms: dict = field(default_factory=dict)  # reg -> Val: the induction variable at iteration k
    queue: atomics.Queue | None = None  # a persistent loop: the registers carrying its take (atomics.py)
    barriers_in: T.Term | None = None  # barriers the block had passed at the loop's header (a term)
    barriers_out: list = field(default_factory=list)  # ... at each back edge


@dataclass
class PtxTrace:
    kernel: PtxKernel
    lanes: int
    accesses: list[PtxAccess]
    loops: dict[int, Loop]
    ends: list[tuple]  # the path conditions of the states that returned
    symbols: dict[str, T.Term]  # name -> term of the launch's symbols (ctaid, shape symbols)
    instrs_run: int = 0
    results: dict = field(default_factory=dict)  # per instruction index: Val of its destination (dataflow)
    shared_stored: list = field(default_factory=list)  # every value stored to shared memory (bits)
    takes: dict = field(default_factory=dict)  # id(take symbol) -> atomics.Take
    shared: list = field(default_factory=list)  # every shared-memory access (tensor "shared": offset = address)

    _resolved: tuple[dict, dict] | None = field(default=None, repr=False)  # resolve's table and memo

    def resolve(self, t: T.Term) -> T.Term:
        """t with every `loopinv` atom replaced by its loop's constraint, and every `lanecont` atom by
        its lane's (a loop whose lanes leave at different iterations). The loops are final once the trace
        exists: the table and the substitution's memo are built once and shared by every call."""
        if self._resolved is None:
            table = {T.mk("loopinv", (i,), "bool", 1): lp.constraint for i, lp in self.loops.items()}
            for i, lp in self.loops.items():
                for lane in range(self.lanes):
                    table[T.mk("lanecont", (i, lane), "bool", 1)] = lp.lane_constraint.get(lane, T.TRUE)
            self._resolved = (table, {})
        return T.substitute(t, *self._resolved)


class Executor:
    def __init__(self, kernel: PtxKernel, facts: LaunchFacts, symbols: dict[str, T.Term]):
        self.k = kernel
        self.facts = facts
        self.n = facts.block_threads or kernel.threads or 128  # the launch's block, else what the PTX says
        self.symbols = symbols
        self.accesses: list[PtxAccess] = []
        self.loops: dict[int, Loop] = {}
        self.ends: list[tuple] = []
        self.steps = 0
        self.results: dict[int, Val] = {}
        self.shared_stored: list[T.Term] = []
        self.shared: list[PtxAccess] = []
        self.shared_base = shared_layout(kernel.globals)
        self.back_edges = self._back_edges()
        self.ipdom = post_dominators(kernel)
        self.ended_in: list[int] = []  # how many states had ended when each divergence began
        self.params = self._param_terms()
        self.takes: dict[int, atomics.Take] = {}
        self.lanes_left = False  # some lanes returned while others went on: a barrier no longer means all

    # ---------------------------------------------------------------- setup

    def _back_edges(self) -> dict[int, int]:
        """Loop header index -> index of its last backward branch."""
        out: dict[int, int] = {}
        for ins in self.k.instrs:
            if ins.opcode == "bra":
                target = self.k.labels.get(ins.operands[0])
                if target is None:
                    raise Unsupported(f"branch to unknown label {ins.operands[0]}")
                if target <= ins.index:
                    out[target] = max(out.get(target, -1), ins.index)
        return out

    def _param_terms(self) -> dict[str, T.Term]:
        out: dict[str, T.Term] = {}
        for i, p in enumerate(self.k.params):
            f = self.facts.params[i] if i < len(self.facts.params) else None
            w = 8 * p.size if p.size in (1, 2, 4, 8) else 64
            if f is not None and f.kind == "pointer" and f.tensor:
                base = T.sym(f"ptr:{f.tensor}", 64)
                out[p.name] = T.bv("add", base, expr_term(f.byte_offset, self.symbols, 64))
            elif f is not None and f.kind == "int" and f.value is not None:
                out[p.name] = fit(expr_term(f.value, self.symbols, max(w, 64)), w)
            elif f is not None and f.kind == "float" and isinstance(f.value, float):
                ft = T.mk("fparam", (f.name or p.name, f.value), "f", w)
                out[p.name] = T.bits(ft)
            else:
                out[p.name] = T.sym(f"param:{p.name}", w)
        return out

    # ---------------------------------------------------------------- run

    def run(self) -> PtxTrace:
        lanes = self.n
        start = State(0, {}, (), tuple([T.TRUE] * lanes), SharedMemory.unknown(), [{} for _ in range(lanes)])
        work: list[State] = [start]
        while work:
            work.sort(key=lambda s: s.index)
            s = work.pop(0)
            same = [w for w in work if w.index == s.index and w.loops == s.loops]
            for w in same:
                work.remove(w)
                s = merge(s, w, lanes)
            if s.reconverge and s.reconverge[-1][0] == s.index and not work_inside(work, s):
                s.active = s.reconverge[-1][1]  # every lane split at the branch is here again
                s.reconverge = s.reconverge[:-1]
            work.extend(self._go(s))
            if len(work) > MAX_STATES:
                raise Unsupported("too many paths")
        trace = PtxTrace(self.k, lanes, self.accesses, self.loops, self.ends, self.symbols, self.steps, self.results)
        trace.shared_stored = self.shared_stored
        trace.takes = self.takes
        trace.shared = self.shared
        return trace

    def _go(self, s: State) -> list[State]:
        """Run s until it forks, meets a join point (a label) or ends."""
        instrs = self.k.instrs
        labelled = set(self.k.labels.values())
        first = True
        while True:
            if s.index >= len(instrs):
                self.ends.append(s.cond)
                return []
            if s.index in labelled and not first:
                return [s]  # a join point: let other states arrive first
            first = False
            if s.index in self.back_edges and not any(lp.header == s.index for lp in s.loops):
                self._enter_loop(s)
            ins = instrs[s.index]
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise Unsupported("the kernel is too long to follow")
            if ins.opcode in ("ret", "exit") and ins.guard is None:
                self.ends.append(s.cond)
                self.lanes_left = self.lanes_left or any(a is not T.TRUE for a in s.active)
                return []
            if ins.opcode == "bra":
                return self._branch(s, ins)
            self._exec(s, ins)
            s.index += 1

    # ---------------------------------------------------------------- control flow

    def _guard(self, s: State, ins: Instr) -> Val:
        """Per lane: the instruction executes (its predicate and the lane's activity)."""
        if ins.guard is None:
            return pack(list(s.active))
        p = s.regs.get(ins.guard[0], T.FALSE)
        vals = []
        for lane in range(self.n):
            g = lane_of(p, lane)
            vals.append(T.and_(s.active[lane], T.not_(g) if ins.guard[1] else g))
        return pack(vals)

    def _branch(self, s: State, ins: Instr) -> list[State]:
        target = self._past_header(s, self.k.labels[ins.operands[0]])
        back = target <= ins.index
        if ins.guard is None:
            taken: Val = T.TRUE
        else:
            p = s.regs.get(ins.guard[0], T.FALSE)
            taken = T.not_(p) if ins.guard[1] and isinstance(p, T.Term) else p
            if not isinstance(p, T.Term):
                taken = pack([T.not_(x) if ins.guard[1] else x for x in p])
        loop = next((lp for lp in reversed(s.loops) if lp.header == target), None) if back else None
        if back and loop is None and target not in self.back_edges:
            raise Unsupported("a backward branch into a loop not entered at its header")
        # from outside the loop to its header (its latch, or the rest of its first iteration, run once before
        # it: a rotated loop, or one entered past its header): a forward branch
        if back and loop is not None:
            loop.barriers_out.append(s.sync_term())
            if not isinstance(taken, T.Term) and ins.index < loop.latch:
                # some lanes go on to the next iteration before the latch (`if (tid < n) { ... }` ending at the
                # back edge): inactive for the rest of this one; k is left unconstrained (their iteration k + 1)
                loop.latch_conds.append(T.TRUE)
                loop.updates.append({r: s.regs.get(r) for r in (*loop.phis, *loop.ivs, *_queue_regs(loop))})
                s.active = tuple(T.and_(act, T.not_(lane_of(taken, i))) for i, act in enumerate(s.active))
                s.index += 1
                return [s] if any(v is not T.FALSE for v in s.active) else []
            if not isinstance(taken, T.Term):
                # lanes leave at different iterations (libdevice's argument reduction): the iteration k
                # is left unconstrained and each lane's exit keeps it active where its own test fails
                loop.latch_conds.append(T.TRUE)
                loop.lane_conds.append(taken)
                loop.updates.append({r: s.regs.get(r) for r in (*loop.phis, *loop.ivs, *_queue_regs(loop))})
                s.active = tuple(T.and_(act, T.not_(lane_of(taken, i))) for i, act in enumerate(s.active))
                s.loops = tuple(lp for lp in s.loops if lp is not loop)
                s.index += 1
                return [s] if any(v is not T.FALSE for v in s.active) else []
            loop.latch_conds.append(taken)
            loop.updates.append({r: s.regs.get(r) for r in (*loop.phis, *loop.ivs, *_queue_regs(loop))})
            if taken is T.TRUE:
                return []
            s.cond = s.cond + (T.not_(taken),)
            s.loops = tuple(lp for lp in s.loops if lp is not loop)
            s.index += 1
            return [s]
        if isinstance(taken, T.Term):  # the same in every lane: the path forks
            out = []
            for cond, index in ((taken, target), (T.not_(taken), ins.index + 1)):
                if cond is T.FALSE:
                    continue
                t = clone(s)
                t.cond = s.cond + ((cond,) if cond is not T.TRUE else ())
                t.index = index
                out.append(t)
            return out
        # lanes diverge: split their activity; where the branch's paths meet again (its immediate
        # post-dominator) the lanes are those of the branch again, unless one of them returns on the way
        join = self.ipdom.get(ins.index)
        if join is not None and not s.loops or join is not None and all(join <= lp.latch for lp in s.loops):
            s.reconverge = s.reconverge + ((join, s.active, s.smem),)
        a = clone(s)
        a.active = tuple(T.and_(act, lane_of(taken, i)) for i, act in enumerate(s.active))
        a.index = target
        b = clone(s)
        b.active = tuple(T.and_(act, T.not_(lane_of(taken, i))) for i, act in enumerate(s.active))
        b.index = ins.index + 1
        return [x for x in (a, b) if any(v is not T.FALSE for v in x.active)]

    def _past_header(self, s: State, target: int) -> int:
        """A branch from outside a loop to just past its header's barrier (nvcc's `for (;;) { __syncthreads();
        ... }` entered below the barrier) enters at the header: only an unpredicated barrier is skipped."""
        for header, latch in self.back_edges.items():
            if header < target <= latch and not any(lp.header == header for lp in s.loops):
                if all(i.opcode in ("bar", "barrier") and i.guard is None for i in self.k.instrs[header:target]):
                    return header
        return target

    def _enter_loop(self, s: State) -> None:
        header, latch = s.index, self.back_edges[s.index]
        body = self.k.instrs[header : latch + 1]
        lid = len(self.loops)
        k = T.sym(f"k{lid}", 64)
        written: dict[str, list[Instr]] = {}
        for ins in body:
            for d in dests(ins):
                written.setdefault(d, []).append(ins)
        inner_targets = [
            (ins.index, self.k.labels[ins.operands[0]])
            for ins in body
            if ins.opcode == "bra" and header < self.k.labels[ins.operands[0]] <= latch
        ]
        loop = Loop(lid, header, latch, k, {}, {}, barriers_in=s.sync_term())
        loop.queue = self._queue(s, lid, written)
        for reg, ws in written.items():
            init = s.regs.get(reg)
            if init is None or loop.queue is not None and reg in loop.queue.regs:
                continue
            step = induction_step(reg, ws, written, inner_targets)
            if step is not None:
                sv = self._operand(s, step, ws[0])
                loop.ivs[reg] = (init, sv)
                w = lane_of(init, 0).width
                kk = T.extract(k, 0, w) if w < 64 else k
                s.regs[reg] = pack(
                    [T.bv("add", lane_of(init, i), T.bv("mul", kk, lane_of(sv, i))) for i in range(self.n)]
                )
                loop.iv_terms[reg] = s.regs[reg]
            else:
                w = lane_of(init, 0)
                sort, width = ("bool", 1) if w.sort == "bool" else ("bv", w.width if w.sort == "bv" else w.width)
                phi = pack(
                    [
                        T.mk("phi", (lid, reg, i if not isinstance(init, T.Term) else -1), sort, width)
                        for i in range(self.n)
                    ]
                )
                loop.phis[reg] = (init, phi)
                s.regs[reg] = phi
        s.smem = SharedMemory.unknown()
        s.local = [None] * self.n
        s.loops = s.loops + (loop,)
        s.cond = s.cond + (T.mk("loopinv", (lid,), "bool", 1),)
        self.loops[lid] = loop

    def finish_loops(self) -> None:
        """Each loop's constraint on its iteration k: k == 0, or the back edge was taken at k - 1."""
        for lp in self.loops.values():
            k = lp.k
            prev = {k: T.bv("add", k, T.const(-1, 64))}
            if lp.queue is not None:
                why = atomics.check_latch(lp.queue, lp.updates, lp.latch_conds, self.takes)
                if why:
                    raise Unsupported(f"a loop over a work queue: {why}")
            conds = []
            for c in lp.latch_conds:
                if any(x.op in ("phi", "fresh") or atomics.is_take(x) for x in T.walk(c)):
                    conds = [T.TRUE]
                    break
                conds.append(T.substitute(until_equal(c, lp, 0), prev))
            wrap = []
            for init, step in lp.ivs.values():
                i0, s0 = lane_of(init, 0), lane_of(step, 0)  # per-lane counters of a uniform loop: lane 0's
                uniform = isinstance(init, T.Term) and isinstance(step, T.Term) or not lp.lane_conds
                if uniform and i0.width == 32 and i0.sort == "bv" and s0.sort == "bv":
                    wide = T.bv("add", T.sext(i0, 64), T.bv("mul", k, T.sext(s0, 64)))
                    narrow = T.bv("add", i0, T.bv("mul", T.extract(k, 0, 32), s0))
                    wrap.append(T.cmp("eq", wide, T.sext(narrow, 64)))
            lp.no_wrap = wrap
            first = T.cmp("eq", k, T.const(0, 64))
            for lane in range(self.n):  # a lane iterates at k when its own back edge was taken at k - 1
                taken = [lane_of(c, lane) for c in lp.lane_conds]
                if taken and not any(x.op in ("phi", "fresh") for c in taken for x in T.walk(c)):
                    own_wrap = []
                    for init, step in lp.ivs.values():
                        i0, s0 = lane_of(init, lane), lane_of(step, lane)
                        if not isinstance(init, T.Term) and i0.sort == "bv" and i0.width == 32:
                            wide = T.bv("add", T.sext(i0, 64), T.bv("mul", k, T.sext(s0, 64)))
                            narrow = T.bv("add", i0, T.bv("mul", T.extract(k, 0, 32), s0))
                            own_wrap.append(T.cmp("eq", wide, T.sext(narrow, 64)))
                    cont = T.or_(first, *(T.substitute(until_equal(c, lp, lane), prev) for c in taken))
                    lp.lane_constraint[lane] = T.and_(cont, *own_wrap)
            bounded = T.cmp("ult", k, T.const(1 << 40, 64))  # no loop runs 2^40 times
            lp.constraint = T.and_(T.or_(first, T.or_(*conds) if conds else T.FALSE), bounded, *wrap)

    def _queue(self, s: State, lid: int, written: dict) -> atomics.Queue | None:
        """A loop entered with registers computed from one take (atomics.py): they become the same function
        of the iteration's own take, under the entry's conditions on it."""
        carried = {r: s.regs[r] for r in written if isinstance(s.regs.get(r), T.Term) and atomics.takes_in(s.regs[r])}
        found = {x for v in carried.values() for x in atomics.takes_in(v)}
        if not found:
            return None
        if len(found) > 1:
            raise Unsupported("a loop entered with values of two takes of a work queue")
        t0 = found.pop()
        first = self.takes[id(t0)]
        tl = atomics.take_symbol(first.tensor, f"L{lid}", t0.width)
        self.takes[id(tl)] = atomics.Take(tl, first.tensor, first.instr, first.increment, first.lane)
        q = atomics.Queue(t0, tl, carried, atomics.renamed_conds(s.cond, t0, tl))
        for r, v in carried.items():
            s.regs[r] = T.substitute(v, {t0: tl})
        s.cond = s.cond + q.conds
        return q

    def _atom(self, s: State, ins: Instr) -> None:
        """atom.global.add / red.global.add on integers (atomics.py): each lane's take is a symbol, its
        write a store to the counter's tensor."""
        try:
            ty = atomics.check_op(ins.mods, ins.opcode)
        except ValueError as e:
            raise Unsupported(f"instruction {e}") from None
        w = int(ty[1:])
        red = ins.opcode == "red"
        m, src = (ins.operands[0], ins.operands[1]) if red else (ins.operands[1], ins.operands[2])
        addr, inc, guard = self._address(s, m, ins), self._operand(s, src, ins), self._guard(s, ins)
        s.order += 1
        vals = []
        for lane in range(self.n):
            g = lane_of(guard, lane)
            if g is T.FALSE:
                vals.append(T.const(0, w))
                continue
            tensor, off = split_base(lane_of(addr, lane))
            t = atomics.take_symbol(tensor, f"{len(self.takes)}", w)
            self.takes[id(t)] = atomics.Take(t, tensor, ins.index, as_bits(lane_of(inc, lane), w), lane)
            g = T.and_(g, *(T.mk("lanecont", (lp.id, lane), "bool", 1) for lp in s.loops))
            new = T.bv("add", t, as_bits(lane_of(inc, lane), w))
            self.accesses.append(PtxAccess("st", ins, lane, g, s.cond, tensor, off, w // 8, new, s.order, s.barriers))
            vals.append(t)
        if not red:
            self._set(s, ins, ins.operands[0], pack(vals))
            self.results[ins.index] = s.regs[ins.operands[0]]

    # ---------------------------------------------------------------- instructions

    def _operand(self, s: State, tok, ins: Instr) -> Val:
        if isinstance(tok, str):
            if tok.startswith("%"):
                if tok in s.regs:
                    return s.regs[tok]
                special = self._special(tok)
                if special is not None:
                    return special
                return T.fresh(f"undefined {tok}", reg_width(tok))
            return self._immediate(tok, ins)
        raise Unsupported(f"operand {tok!r}")

    def _special(self, tok: str) -> Val | None:
        if tok == "%tid.x":
            return tuple(T.const(i, 32) for i in range(self.n))
        if tok in ("%tid.y", "%tid.z"):
            return T.const(0, 32)
        if tok == "%laneid":
            return tuple(T.const(i % 32, 32) for i in range(self.n))
        if tok.startswith("%ctaid."):
            return self.symbols[tok[1:]]
        if tok.startswith("%nctaid."):
            return fit(expr_term(self.facts.grid["xyz".index(tok[-1])], self.symbols, 64), 32)
        if tok == "%ntid.x":
            return T.const(self.n, 32)
        if tok in ("%ntid.y", "%ntid.z"):
            return T.const(1, 32)
        return None

    def _immediate(self, tok: str, ins: Instr) -> T.Term:
        tys = types_of(ins.mods)
        w = 64 if tys and tys[-1][1:] == "64" else 32
        if tys and tys[-1][1:] == "16":
            w = 16
        if tok.startswith(("0f", "0F")):
            return T.const(int(tok[2:], 16), 32)
        if tok.startswith(("0d", "0D")):
            return T.const(int(tok[2:], 16), 64)
        try:
            return T.const(int(tok, 0), w)
        except ValueError:
            pass
        if tok in self.k.globals:
            g = self.k.globals[tok]
            if g.space == "shared":
                return T.const(self.shared_base[tok], w)
            return T.const(0, w) if g.space == "local" else T.sym(f"global:{tok}", 64)
        if tok in self.params:
            return self.params[tok]
        raise Unsupported(f"operand {tok!r}")

    def _set(self, s: State, ins: Instr, reg: str, v: Val) -> None:
        if ins.guard is not None or not all(a is T.TRUE for a in s.active):
            g = self._guard(s, ins)
            old = s.regs.get(reg)
            if old is not None:
                v = pack([ite(lane_of(g, i), lane_of(v, i), lane_of(old, i)) for i in range(self.n)])
        s.regs[reg] = v

    def _exec(self, s: State, ins: Instr) -> None:
        op = ins.opcode
        if op in ("bar", "barrier") and ins.guard is None and not {"warp", "arrive"} & set(ins.mods):
            s.barriers += 1  # orders memory between the block's threads (step order: a write, then reads)
            s.sync = T.bv("add", s.sync, T.const(1, 32)) if s.sync is not None else None
            if not self.lanes_left and not s.reconverge:  # every thread of the block arrives at a barrier
                s.active = tuple([T.TRUE] * self.n)
            return
        if op in ("bar", "barrier", "membar", "fence") or (
            op == "cp" and "async" in ins.mods and "shared" not in ins.mods
        ):
            return
        if op in ("ret", "exit"):
            raise Unsupported("a predicated return")
        if op == "mov" or op == "cvta":  # cvta.to.global: a generic address to a global one, the same here
            return self._mov(s, ins)
        if op == "ld":
            return self._ld(s, ins)
        if op == "st":
            return self._st(s, ins)
        if op == "cp":
            return self._cp_async(s, ins)
        if op == "shfl":
            return self._shfl(s, ins)
        if op in ("ldmatrix", "stmatrix"):
            return self._matrix(s, ins)
        if op in ("atom", "red"):
            return self._atom(s, ins)
        if op == "mma":
            return self._mma(s, ins)
        if op in ("wgmma", "call", "vote", "match", "tex"):
            raise Unsupported(f"instruction {op}")
        outs = ins.operands[0]
        srcs = [self._operand(s, t, ins) for t in ins.operands[1:]]
        if "|" in str(outs):
            raise Unsupported("setp with two destinations")
        if all(isinstance(v, T.Term) for v in srcs):
            r: Val = alu(ins, srcs)
        else:
            r = pack([alu(ins, [lane_of(v, i) for v in srcs]) for i in range(self.n)])
        self._set(s, ins, outs, r)
        self.results[ins.index] = s.regs[outs]

    def _mov(self, s: State, ins: Instr) -> None:
        d, src = ins.operands[0], ins.operands[1]
        if isinstance(d, tuple):  # unpack: mov.b32 {%lo, %hi}, %r
            v = self._operand(s, src, ins)
            parts = [(reg_width(r), r) for r in d]
            pos = 0
            for w, r in parts:
                self._set(s, ins, r, lanes(v, self.n, lambda x, p=pos, w=w: T.extract(as_bits(x, x.width), p, w)))
                pos += w
            return
        if isinstance(src, tuple):  # pack: mov.b32 %r, {%lo, %hi}
            vals = [self._operand(s, r, ins) for r in src]
            v = pack(
                [T.concat([as_bits(lane_of(x, i), reg_width(r)) for x, r in zip(vals, src)]) for i in range(self.n)]
            )
        else:
            v = self._operand(s, src, ins)
            if "pred" in ins.mods:  # mov.pred %p, -1: an immediate predicate is true where it is not 0
                v = lanes(v, self.n, lambda x: T.not_(T.cmp("eq", x, T.const(0, x.width))) if x.sort == "bv" else x)
        self._set(s, ins, d, v)
        self.results[ins.index] = s.regs[d]

    def _address(self, s: State, m: Mem, ins: Instr) -> Val:
        if m.base.startswith("%"):
            base = self._operand(s, m.base, ins)
        else:
            base = self._immediate(m.base, ins)
        return lanes(base, self.n, lambda b: T.bv("add", b, T.const(m.offset, b.width)))

    def _space(self, ins: Instr) -> str:
        for sp in ("global", "shared", "local", "param", "const"):
            if sp in ins.mods:
                return sp
        return "global"

    def _ld(self, s: State, ins: Instr) -> None:
        space = self._space(ins)
        d, m = ins.operands[0], ins.operands[1]
        regs = list(d) if isinstance(d, tuple) else [d]
        tys = types_of(ins.mods)
        w = int(tys[-1][1:]) if tys and tys[-1] not in ("f16", "bf16") else 16
        if space == "param":
            v = self.params.get(m.base)
            if v is None:
                raise Unsupported(f"parameter {m.base}")
            self._set(s, ins, regs[0], fit(v, w) if v.sort == "bv" else v)
            return
        addr = self._address(s, m, ins)
        guard = self._guard(s, ins)
        for j, reg in enumerate(regs):
            vals = []
            for lane in range(self.n):
                a = T.bv("add", lane_of(addr, lane), T.const(j * w // 8, lane_of(addr, lane).width))
                g = lane_of(guard, lane)
                if space == "shared":
                    v = s.smem.read(a, w) if g is not T.FALSE else T.const(0, w)
                    self._note_shared(s, "ld", ins, lane, g, a, w // 8, v)
                elif space == "local":
                    v = read_map(s.local[lane], a, w) if s.local[lane] is not None else T.fresh("local", w)
                else:
                    v = self._global_load(s, ins, lane, g, a, w)
                vals.append(v)
            self._set(s, ins, reg, pack(vals))

    def _global_load(self, s: State, ins: Instr, lane: int, g: T.Term, a: T.Term, w: int) -> T.Term:
        if g is T.FALSE:  # the lane does not run it (or not with this choice): its address may be no pointer
            return T.const(0, w)
        cases = pointer_cases(a)
        if len(cases) > 1:  # a pointer chosen by a select: one load per choice, under its condition
            v = self._global_load(s, ins, lane, T.and_(g, cases[-1][0]), cases[-1][1], w)
            for c, x in reversed(cases[:-1]):
                v = T.ite(c, self._global_load(s, ins, lane, T.and_(g, c), x, w), v)
            return v
        tensor, off = split_base(a)
        if tensor.startswith("global:"):
            return T.fresh(f"table {tensor[7:]}", w)  # a library constant table (libdevice): not checked
        info = self.facts.tensors.get(tensor)
        if info is not None and info.index:
            v = T.select(tensor, off, 8 * info.elsize)
            v = fit(v, w) if info.elsize * 8 != w else v
        else:
            v = T.load(tensor, off, w)
        if g is not T.FALSE:
            s.order += 1
            g = T.and_(g, *(T.mk("lanecont", (lp.id, lane), "bool", 1) for lp in s.loops))
            self.accesses.append(PtxAccess("ld", ins, lane, g, s.cond, tensor, off, w // 8, v, s.order, s.barriers))
        return v

    def _st(self, s: State, ins: Instr) -> None:
        space = self._space(ins)
        m, src = ins.operands[0], ins.operands[1]
        regs = list(src) if isinstance(src, tuple) else [src]
        tys = types_of(ins.mods)
        w = int(tys[-1][1:]) if tys and tys[-1] not in ("f16", "bf16") else 16
        addr = self._address(s, m, ins)
        guard = self._guard(s, ins)
        if space == "global":
            s.order += 1
        batch = []  # shared memory: the instruction's stores, as one
        for j, reg in enumerate(regs):
            v = self._operand(s, reg, ins)
            for lane in range(self.n):
                g = lane_of(guard, lane)
                if g is T.FALSE:
                    continue
                a = T.bv("add", lane_of(addr, lane), T.const(j * w // 8, lane_of(addr, lane).width))
                x = as_bits(lane_of(v, lane), w)
                if space == "shared":
                    batch.append((a, x, g))
                    self._note_shared(s, "st", ins, lane, g, a, w // 8, x)
                elif space == "local":
                    if s.local[lane] is not None and T.is_const(a):
                        write_map(s.local[lane], a, x, g, w)
                    else:
                        s.local[lane] = None
                else:
                    g = T.and_(g, *(T.mk("lanecont", (lp.id, lane), "bool", 1) for lp in s.loops))
                    for c, choice in pointer_cases(a):  # one store per pointer a select may choose
                        if T.and_(g, c) is not T.FALSE:
                            tensor, off = split_base(choice)
                            acc = PtxAccess(
                                "st", ins, lane, T.and_(g, c), s.cond, tensor, off, w // 8, x, s.order, s.barriers
                            )
                            self.accesses.append(acc)
        if batch:
            s.smem = s.smem.store(batch)
            self.shared_stored += [x for _, x, _ in batch]

    def _note_shared(self, s: State, kind: str, ins: Instr, lane: int, g: T.Term, a: T.Term, size: int, v) -> None:
        """Record one lane's shared-memory access (races.py): its barrier count and its loops."""
        if g is T.FALSE:
            return
        g = T.and_(g, *(T.mk("lanecont", (lp.id, lane), "bool", 1) for lp in s.loops))
        loops = tuple(lp.id for lp in s.loops)
        args = (kind, ins, lane, g, s.cond, "shared", a, size, v, s.order, s.barriers, loops, s.sync_term())
        self.shared.append(PtxAccess(*args))

    def _cp_async(self, s: State, ins: Instr) -> None:
        """cp.async.*.shared.global [smem], [gmem], bytes(, src-bytes): a global load into shared memory."""
        dst, src, size = ins.operands[0], ins.operands[1], int(ins.operands[2], 0)
        srcsize = self._operand(s, ins.operands[3], ins) if len(ins.operands) > 3 else None
        daddr, gaddr = self._address(s, dst, ins), self._address(s, src, ins)
        guard = self._guard(s, ins)
        batch = []
        for lane in range(self.n):
            g = lane_of(guard, lane)
            self._note_shared(s, "st", ins, lane, g, lane_of(daddr, lane), size, T.fresh("cp.async", 8 * size))
            if srcsize is not None:
                g = T.and_(g, T.not_(T.cmp("eq", as_bits(lane_of(srcsize, lane), 32), T.const(0, 32))))
            for j in range(0, size, 4):
                a = T.bv("add", lane_of(gaddr, lane), T.const(j, 64))
                v = self._global_load(s, ins, lane, g, a, 32) if g is not T.FALSE else T.const(0, 32)
                da = T.bv("add", lane_of(daddr, lane), T.const(j, 32))
                batch.append((da, T.ite(g, v, T.const(0, 32)), T.TRUE))
        s.smem = s.smem.store(batch)
        self.shared_stored += [x for _, x, _ in batch]

    def _matrix(self, s: State, ins: Instr) -> None:
        """ldmatrix / stmatrix .m8n8 (smem.py). `.sync.aligned`: the whole warp executes it, so every lane's
        row address is read, as a shuffle reads its source lane."""
        mods = set(ins.mods)
        if "m8n8" not in mods or "b16" not in mods or "shared" not in mods:
            raise Unsupported(f"{ins.opcode}.{'.'.join(ins.mods)}")
        tiles = next((int(m[1:]) for m in ins.mods if m in ("x1", "x2", "x4")), 1)
        load = ins.opcode == "ldmatrix"
        m, regs = (ins.operands[1], ins.operands[0]) if load else (ins.operands[0], ins.operands[1])
        regs = list(regs) if isinstance(regs, tuple) else [regs]
        if len(regs) != tiles or self.n % 32:
            raise Unsupported(f"{ins.opcode} with {len(regs)} registers for {tiles} tiles")
        addr = self._address(s, m, ins)
        addrs = [lane_of(addr, lane) for lane in range(self.n)]
        guard = self._guard(s, ins)
        for lane in range(self.n):  # lane 8 i + r gives row r of tile i: its 16 bytes are its access
            if lane % 32 < 8 * tiles:
                self._note_shared(s, "ld" if load else "st", ins, lane, lane_of(guard, lane), addrs[lane], 16, T.TRUE)
        if load:
            for reg, vals in zip(regs, matrix_load(s.smem, addrs, tiles, "trans" in mods)):
                self._set(s, ins, reg, pack(vals))
            return
        values = [[as_bits(lane_of(self._operand(s, r, ins), lane), 32) for lane in range(self.n)] for r in regs]
        batch = matrix_store(addrs, values, [lane_of(guard, lane) for lane in range(self.n)], "trans" in mods)
        s.smem = s.smem.store(batch)
        self.shared_stored += [x for _, x, _ in batch]

    def _mma(self, s: State, ins: Instr) -> None:
        """mma.sync.aligned (mma.py): the whole warp executes it; each lane's D from the warp's fragments."""
        d, a, b, c = ins.operands
        if not all(isinstance(x, tuple) for x in (d, a, b, c)):
            raise Unsupported("mma without register vectors")
        regs = [[[lane_of(self._operand(s, r, ins), lane) for lane in range(self.n)] for r in x] for x in (a, b, c)]
        for reg, vals in zip(d, mma.block_product(mma.shape_of(tuple(ins.mods)), *regs)):
            self._set(s, ins, reg, pack(vals))

    def _shfl(self, s: State, ins: Instr) -> None:
        mode = ins.mods[1] if ins.mods[0] == "sync" else ins.mods[0]
        d = ins.operands[0]
        dreg = d.split("|")[0]
        a = self._operand(s, ins.operands[1], ins)
        b = self._operand(s, ins.operands[2], ins)
        c = self._operand(s, ins.operands[3], ins)
        vals = []
        for lane in range(self.n):
            bl, cl = lane_of(b, lane), lane_of(c, lane)
            if not (T.is_const(bl) and T.is_const(cl)):
                raise Unsupported("a shuffle with a lane that is not known")
            bv_, cv = T.value(bl) & 31, T.value(cl)
            seg_mask = (cv >> 8) & 31
            max_lane = (lane % 32 & seg_mask) | (cv & 31 & ~seg_mask)
            base = lane - lane % 32
            li = lane % 32
            if mode == "bfly":
                j = li ^ bv_
                ok = j <= max_lane
            elif mode == "idx":
                j = bv_
                ok = j <= max_lane
            elif mode == "down":
                j = li + bv_
                ok = j <= max_lane
            elif mode == "up":
                j = li - bv_
                ok = j >= (li & seg_mask)
            else:
                raise Unsupported(f"shfl.{mode}")
            vals.append(lane_of(a, base + j) if ok and base + j < self.n else lane_of(a, lane))
        self._set(s, ins, dreg, pack(vals))


def expr_term(e, symbols: dict[str, T.Term], w: int) -> T.Term:
    """A facts.Expr as a bit-vector term of width w over the shape symbols."""
    out = T.const(0, w)
    for mono, c in e.terms:
        p = T.const(c, w)
        for name in mono:
            p = T.bv("mul", p, fit(symbols[name], w))
        out = T.bv("add", out, p)
    return out


def _queue_regs(loop: Loop) -> tuple:
    return tuple(loop.queue.regs) if loop.queue is not None else ()


def execute(kernel: PtxKernel, facts: LaunchFacts, symbols: dict[str, T.Term]) -> PtxTrace:
    ex = Executor(kernel, facts, symbols)
    trace = ex.run()
    ex.finish_loops()
    return trace
