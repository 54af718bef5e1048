"""Addresses that choose their tensor at run time: CUDA C++ code such as `void* base = head < Hq ? q : k`
compiles to a select between two pointer parameters, then an offset. The executor records such an access as one
access per choice, each under its condition (`pointer_cases`), so each is one pointer parameter plus an offset,
which `split_base` reads as (tensor, byte offset). `base_plus_constant` reads an offset as U + c, the form the memory
and race properties group lanes by."""

from __future__ import annotations

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.semantics import Unsupported


def is_pointer(x: T.Term) -> bool:
    return x.op == "sym" and x.args[0].startswith(("ptr:", "global:"))


def summands(a: T.Term) -> list[T.Term]:
    """The terms of an address's sum (nested adds flattened)."""
    atoms, stack = [], [a]
    while stack:
        x = stack.pop()
        if x.op == "add":
            stack.extend(x.args)
        else:
            atoms.append(x)
    return atoms


def pointer_cases(a: T.Term) -> list[tuple[T.Term, T.Term]]:
    """An address as (condition, address) cases: a term of its sum that selects between pointers
    (`base = c ? q : k`, CUDA C++ code choosing its tensor) gives one case per choice, the condition
    substituted in it; any other address is the one case (TRUE, a)."""
    for x in summands(a):
        if x.op == "ite" and any(is_pointer(y) for y in T.walk(x)):
            c = x.args[0]
            out = []
            for cond, value in ((c, T.TRUE), (T.not_(c), T.FALSE)):
                chosen = T.substitute(a, {c: value})
                out += [(T.and_(cond, c2), y) for c2, y in pointer_cases(chosen)]
            return out
    return [(T.TRUE, a)]


def split_base(a: T.Term) -> tuple[str, T.Term]:
    """An address as (tensor, byte offset): the one pointer symbol of its sum, and the rest."""
    atoms = summands(a)
    bases = [x for x in atoms if is_pointer(x)]
    if len(bases) != 1:
        raise Unsupported("an address that is not one pointer parameter plus an offset")
    rest = [x for x in atoms if x is not bases[0]]
    for x in rest:
        if any(is_pointer(y) for y in T.below(x, "sym")):
            raise Unsupported("an address computed from a pointer in a way the engine does not follow")
    off = T.const(0, 64)
    for x in rest:
        off = T.bv("add", off, x)
    name = bases[0].args[0]
    return (name[4:] if name.startswith("ptr:") else name), off


def base_plus_constant(off: T.Term) -> tuple[T.Term, int]:
    """off as U + c, c a signed constant (a lane 4 bytes below U has c = -4), through an if-then-else whose
    arms share c (a pipeline's buffer choice `k > 1 ? tile : tile + k * size`); a constant is 0 + c."""
    if off.op == "ite":
        (ua, ca), (ub, cb) = base_plus_constant(off.args[1]), base_plus_constant(off.args[2])
        if ca == cb:
            return T.ite(off.args[0], ua, ub), ca
        return off, 0
    if off.op == "add" and T.is_const(off.args[1]):
        return off.args[0], T.signed(T.value(off.args[1]), off.width)
    if T.is_const(off):
        return T.const(0, off.width), T.signed(T.value(off), off.width)
    return off, 0
