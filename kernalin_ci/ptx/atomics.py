"""Global atomics (`atom.global.add`, `red.global.add` on integers) and the work queue they make.

A take (`atomicAdd(counter, n)`) returns the counter's value before its own addition: a symbol
`take:<tensor>#<id>` constrained only by what is true. Where the counter's initial content is known (a
tensor the entry filled with zeros) and every addition to it is of 1, the values handed out are init,
init + 1, ... (one per take, in some order), so a take is in [init, init + 2^30 - 1]: the domain holds
fewer than 2^30 takes of one counter in a launch (a persistent kernel takes B + G times). Otherwise the
value is any value of its width. The atomic's write is recorded as a store to the counter's tensor (its
bounds are checked like any store). Any other atomic (exch, cas, min, max, a float add, shared memory)
leaves the kernel *not analysed*.

A persistent loop takes its next item at the end of each iteration (nvcc rotates `for (;;) { take; if
(item >= B) return; work(item); }` into a prologue take and a loop whose body starts at the work): a
register carrying the take into the loop is, at iteration k, the same function of that iteration's own
take (`take:<tensor>#L<loop>`) as at the entry, under the same entry condition (`item < B`). The executor
renames them at the header and checks at the back edge that the next take is computed the same way and
tested by the same condition; any other loop over a take is not followed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernalin_ci.ptx import terms as T

MAX_TAKES = 1 << 30  # the domain: fewer takes of one counter in a launch
INT_TYPES = ("u32", "s32", "u64", "s64", "b32", "b64")


@dataclass
class Take:
    """One symbolic take: the value an atomic addition returned (or a loop iteration's own take)."""

    term: T.Term  # the 32/64-bit symbol
    tensor: str
    instr: int  # the atom instruction's index
    increment: T.Term  # what it adds
    lane: int


@dataclass
class Queue:
    """A loop carrying a take: per register, its value at the entry (over the entry's take) and at the
    loop's iteration (over the iteration's take); the entry's conditions on that take, renamed."""

    entry_take: T.Term
    loop_take: T.Term
    regs: dict = field(default_factory=dict)  # reg -> init Val (over entry_take)
    conds: tuple = ()  # the entry's path conjuncts that test entry_take, renamed to loop_take


def is_take(t: T.Term) -> bool:
    return t.op == "sym" and str(t.args[0]).startswith("take:")


def takes_in(t: T.Term) -> list[T.Term]:
    return [x for x in T.below(t, "sym") if is_take(x)]


def take_symbol(tensor: str, ident: str, width: int) -> T.Term:
    return T.sym(f"take:{tensor}#{ident}", width)


def check_op(mods: tuple, opcode: str) -> str:
    """The type of a supported atomic (an integer add to global memory), else raise ValueError(why)."""
    if "add" not in mods:
        op = next((m for m in mods if m in ("exch", "cas", "min", "max", "inc", "dec", "and", "or", "xor")), "?")
        raise ValueError(f"{opcode}.{op}")
    if "shared" in mods:
        raise ValueError(f"{opcode} on shared memory")
    ty = next((m for m in mods if m in INT_TYPES or m.startswith("f") or m.startswith("bf")), "")
    if ty not in INT_TYPES:
        raise ValueError(f"{opcode}.add.{ty or '?'} (only integer additions are modelled)")
    return ty


def renamed_conds(cond: tuple, old: T.Term, new: T.Term) -> tuple:
    return tuple(T.substitute(c, {old: new}) for c in cond if old in T.below(c, "sym"))


def check_latch(q: Queue, updates: list[dict], latch_conds: list, takes: dict[int, Take]) -> str | None:
    """Why the loop's next take is not the entry's, renamed (None when it is): each back edge carries
    every queue register as the same function of one take of the same atom instruction, tested by the
    same condition as at the entry."""
    entry = takes_of(q.entry_take, takes)
    for up, cond in zip(updates, latch_conds):
        nxt = {x for r in q.regs for x in takes_in(_term(up.get(r)))}
        if len(nxt) != 1:
            return "the next item is not one take"
        t1 = nxt.pop()
        if entry is None or takes_of(t1, takes) is None or takes_of(t1, takes).instr != entry.instr:
            return "the next item is taken by another instruction"
        for r, init in q.regs.items():
            if T.substitute(_term(up.get(r)), {t1: q.entry_take}) is not _term(init):
                return f"the next item ({r}) is computed otherwise than the first"
        want = T.and_(*(T.substitute(c, {q.loop_take: t1}) for c in q.conds))
        if T.and_(cond) is not want:
            return "the loop goes on under another condition than its entry"
    return None


def takes_of(t: T.Term, takes: dict[int, Take]) -> Take | None:
    return takes.get(id(t))


def _term(v) -> T.Term:
    if v is None or not isinstance(v, T.Term):
        return T.FALSE
    return v


def take_ranges(takes: dict[int, Take], accesses: list, initial: dict[str, int | None]) -> dict[str, tuple[int, int]]:
    """Each take's range (by symbol name) where the counter hands out init, init + 1, ...: its initial
    content known and every write to it an atomic addition of 1. Fewer than MAX_TAKES takes (the domain)."""
    counting = {}
    for tensor, init in initial.items():
        if init is None:
            continue
        writes = [a for a in accesses if a.kind == "st" and a.tensor == tensor]
        ones = [t for t in takes.values() if t.tensor == tensor]
        if all(a.instr.opcode in ("atom", "red") for a in writes) and all(
            T.is_const(t.increment) and T.value(t.increment) == 1 for t in ones
        ):
            counting[tensor] = init
    return {
        str(t.term.args[0]): (counting[t.tensor], counting[t.tensor] + MAX_TAKES - 1)
        for t in takes.values()
        if t.tensor in counting and 0 <= counting[t.tensor] < 1 << 30
    }
