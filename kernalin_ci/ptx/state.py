"""The executor's state along one path: registers, path condition, lanes' activity, memories; merging two.

Split from executor.py (docs/structural.md, "The PTX engine"); a register holds one term for every lane or a tuple
of one term per lane (`Val`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.semantics import as_bits, as_float, fit
from kernalin_ci.ptx.shared import SharedMemory, merge_split
from kernalin_ci.ptx.shared import merge as merge_shared
from kernalin_ci.ptx.syntax import Instr

Val = T.Term | tuple  # one term for all lanes, or one per lane


@dataclass
class State:
    index: int
    regs: dict
    cond: tuple
    active: tuple  # per lane: bool term
    smem: SharedMemory
    local: list  # per lane: {address: term} or None (havocked)
    loops: tuple = ()
    order: int = 0
    reconverge: tuple = ()  # (instruction index, lanes' activity, shared memory): where lanes split by a branch
    #                         meet again, and the shared memory at the split
    barriers: int = 0  # bar.sync passed (the fewest of the paths merged here)
    sync: T.Term | None = None  # bar.sync passed, per path merged here (an if-then-else); None: `barriers`

    def sync_term(self) -> T.Term:
        """The barriers passed, as a term (32 bits): which path came here chooses among merged counts."""
        return self.sync if self.sync is not None else T.const(self.barriers, 32)


def lane_of(v: Val, lane: int) -> T.Term:
    return v if isinstance(v, T.Term) else v[lane]


def pack(vals: list) -> Val:
    first = vals[0]
    if all(v is first for v in vals):
        return first
    return tuple(vals)


def dests(ins: Instr) -> list[str]:
    if ins.opcode in ("st", "bra", "bar", "barrier", "ret", "exit", "membar", "fence") or not ins.operands:
        return []
    if ins.opcode == "cp":
        return []
    d = ins.operands[0]
    if isinstance(d, tuple):
        return [x for x in d if x.startswith("%")]
    if isinstance(d, str) and d.startswith("%"):
        return [x for x in d.split("|")]
    return []


def reg_width(r: str) -> int:
    if r.startswith("%rd"):
        return 64
    if r.startswith("%rs"):
        return 16
    if r.startswith("%p"):
        return 1
    return 32


def lanes(v: Val, n: int, fn) -> Val:
    if isinstance(v, T.Term):
        return fn(v)
    return pack([fn(x) for x in v])


def ite(c: T.Term, a: T.Term, b: T.Term) -> T.Term:
    if a.sort == "f" or b.sort == "f":
        w = a.width if a.sort == "f" else b.width
        return T.fite(c, as_float(a, w), as_float(b, w))
    if a.sort == "bool" or b.sort == "bool":
        if a.sort != b.sort:
            return T.ite(c, as_bits(a, 1), as_bits(b, 1))
        return T.or_(T.and_(c, a), T.and_(T.not_(c), b)) if a is not b else a
    if a.width != b.width:
        b = fit(b, a.width)
    return T.ite(c, a, b)


def clone(s: State) -> State:
    return State(
        s.index,
        dict(s.regs),
        s.cond,
        s.active,
        s.smem,
        [dict(x) if x is not None else None for x in s.local],
        s.loops,
        s.order,
        s.reconverge,
        s.barriers,
        s.sync,
    )


def work_inside(work: list, s: State) -> bool:
    """Whether another state may still reach s's reconvergence point (it carries the same divergence)."""
    mark = s.reconverge[-1]
    return any(mark in w.reconverge for w in work)


def merge(a: State, b: State, lanes: int) -> State:
    """Two states at the same instruction as one: values chosen by which path each lane came by."""
    n = 0
    while n < min(len(a.cond), len(b.cond)) and a.cond[n] is b.cond[n]:
        n += 1
    ca, cb = T.and_(*a.cond[n:]), T.and_(*b.cond[n:])
    sel = [T.and_(ca, a.active[i]) for i in range(lanes)]
    regs = {}
    for r in [*a.regs, *(r for r in b.regs if r not in a.regs)]:  # in a fixed order (names hash per process)
        x, y = a.regs.get(r), b.regs.get(r)
        if x is None or y is None or x is y:
            regs[r] = x if y is None else y if x is None else x
            continue
        regs[r] = pack([ite(sel[i], lane_of(x, i), lane_of(y, i)) for i in range(lanes)])
    # a lane active on both paths is active under the merged path condition (ca or cb): every use of the
    # activity is under it
    active = tuple(
        a.active[i] if a.active[i] is b.active[i] else T.or_(T.and_(ca, a.active[i]), T.and_(cb, b.active[i]))
        for i in range(lanes)
    )
    split = a.reconverge[-1] if a.reconverge and b.reconverge and a.reconverge[-1] is b.reconverge[-1] else None
    if split is not None and ca is T.TRUE and cb is T.TRUE:  # lanes split by a branch: both sides ran
        smem = merge_split(a.smem, b.smem, split[2])
    else:
        smem = merge_shared(a.smem, b.smem, ca)
    local = [None if x is None or y is None or x != y else x for x, y in zip(a.local, b.local)]
    cond = a.cond[:n] + ((T.or_(ca, cb),) if T.or_(ca, cb) is not T.TRUE else ())
    rec = a.reconverge if len(a.reconverge) <= len(b.reconverge) else b.reconverge
    order, barriers = max(a.order, b.order), min(a.barriers, b.barriers)
    sync = None if a.sync is b.sync and a.barriers == b.barriers else T.ite(ca, a.sync_term(), b.sync_term())
    return State(a.index, regs, cond, active, smem, local, a.loops, order, rec, barriers, sync)
