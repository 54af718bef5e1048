"""Loop summaries' helpers (executor.py): which registers are induction variables, and what the back edge's
test says about every iteration up to k."""

from __future__ import annotations

from typing import Any

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.semantics import types_of
from kernalin_ci.ptx.syntax import Instr


def _lane(v: Any, lane: int) -> T.Term:
    return v if isinstance(v, T.Term) else v[lane]


def induction_step(reg: str, writes: list[Instr], written: dict, inner_targets: list) -> str | None:
    """The step operand when reg is updated once per iteration as reg = reg + step (step invariant)."""
    if len(writes) != 1:
        return None
    ins = writes[0]
    if ins.opcode == "mov":  # Triton's pipelined loops: `x = reg + step; ...; mov reg, x` at the latch
        ins = _moved_from(ins, written, inner_targets)
        if ins is None:
            return None
    if ins.opcode != "add" or ins.guard is not None or any(t[0] == "f" for t in types_of(ins.mods)):
        return None
    if any(b < ins.index < t for b, t in inner_targets):
        return None  # conditional: under a branch inside the body
    a, b = ins.operands[1], ins.operands[2]
    step = b if a == reg else a if b == reg else None
    if step is None:
        return _chained(reg, ins, written, inner_targets)
    if isinstance(step, str) and step in written:
        return None
    return step


def _moved_from(mov: Instr, written: dict, inner_targets: list) -> Instr | None:
    """The one unconditional write of the register a plain `mov` copies, made earlier in the body."""
    src = mov.operands[1]
    if mov.guard is not None or not isinstance(src, str) or not src.startswith("%"):
        return None
    ws = written.get(src, [])
    if len(ws) != 1 or ws[0].index >= mov.index or ws[0].guard is not None:
        return None
    if any(b < i < t for b, t in inner_targets for i in (mov.index, ws[0].index)):
        return None
    return ws[0]


def _chained(reg: str, ins: Instr, written: dict, inner_targets: list) -> str | None:
    """The total step, as an immediate, when reg's one update is a chain of additions of constants starting
    from reg (an unrolled loop: `x1 = reg + 128; x2 = x1 + 128; ...; reg = x3 + 128`), each link written once
    in the body, unconditionally, before the next."""
    total, cur, at = 0, ins, ins.index
    for _ in range(16):
        a, b = cur.operands[1], cur.operands[2]
        if not isinstance(b, str) or b.startswith("%"):
            a, b = b, a
        if not isinstance(b, str) or b.startswith("%") or not isinstance(a, str):
            return None
        try:
            total += int(b, 0)
        except ValueError:
            return None
        if a == reg:
            return str(total)
        ws = written.get(a, [])
        if len(ws) != 1:
            return None
        cur = ws[0]
        if cur.opcode != "add" or cur.guard is not None or cur.index >= at or cur.mods != ins.mods:
            return None
        if any(bb < cur.index < t for bb, t in inner_targets):
            return None
        at = cur.index
    return None


def until_equal(c: T.Term, lp: Any, lane: int) -> T.Term:
    """A back edge taken while a counter differs from a constant (`x != c`, x = init + k * step with step
    +-1, not wrapping: the compilers' counted loops) as the condition that held at every iteration up to k:
    x never met c on the way, i.e. it is still on init's side of c (x > c going down, x < c going up), or it
    started past c. The back edge's test at k - 1 alone would let k run past the counter's stop."""
    if c.op != "not" or c.args[0].op != "eq":
        return c
    a, b = c.args[0].args
    for x, stop in ((a, b), (b, a)):
        if not T.is_const(stop):
            continue
        for reg, (init, step) in lp.ivs.items():
            st = _lane(step, lane)
            if reg not in lp.iv_terms or not T.is_const(st) or st.width != x.width:
                continue
            iv, i0 = _lane(lp.iv_terms[reg], lane), _lane(init, lane)
            if x is T.bv("add", iv, st):  # the counter after its update (the usual latch)
                iv, i0 = x, T.bv("add", i0, st)
            if x is not iv:
                continue
            if T.signed(T.value(st), st.width) == -1:
                return T.or_(T.cmp("slt", stop, x), T.cmp("slt", i0, stop))
            if T.value(st) == 1:
                return T.or_(T.cmp("slt", x, stop), T.cmp("slt", stop, i0))
    return c
