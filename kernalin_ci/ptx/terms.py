"""Symbolic terms: the values of the executor, interned, with light simplification.

Three sorts: `bv` (a bit-vector of `width` bits: integers, addresses, raw loaded bits), `bool` (predicates)
and `f` (floats of `width` bits, kept structural: the SMT front never reasons about float arithmetic, the
dataflow properties read the graph). Terms are hash-consed: equal terms are the same object, so `is`
compares them and properties can use them as dictionary keys.

Leaves: `const` (an integer), `sym` (a named symbol: a block index, a shape symbol, a kernel parameter),
`select` (an element of an index tensor: `select(tensor, byte offset)`, the same function for every read),
`load` (raw bits of a data tensor at a byte offset), `fresh` (an unknown: a havocked register, a float
compared as an integer), `fbits` (the float whose bits are a bv term), `fparam` (a float kernel parameter),
`phi` (a float loop-carried value at the start of an iteration). The SMT front (solver.py) turns the
bv/bool part into z3; `fcmp`, float bits and `load` become uninterpreted there.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

_TABLE: dict[tuple, Term] = {}
_IDS = [0]  # serial numbers of one analysis (fresh terms, symbol names, shared-memory epochs)


class Term:
    __slots__ = ("op", "args", "sort", "width", "serial", "__weakref__")

    op: str
    args: tuple
    sort: str
    width: int
    serial: int  # the order of its making in this analysis: what orders terms, never their address

    def __repr__(self) -> str:
        return show(self)

    def __hash__(self) -> int:
        # equal terms are the same object; hashing by the serial, not the address, makes a set of terms
        # iterate in the same order in every run
        return self.serial


def mk(op: str, args: tuple, sort: str, width: int) -> Term:
    key = (op, args, sort, width)
    t = _TABLE.get(key)
    if t is None:
        t = Term()
        t.op, t.args, t.sort, t.width, t.serial = op, args, sort, width, len(_TABLE)
        _TABLE[key] = t
    return t


def reset() -> None:
    """Forget every interned term (between analyses: the table only grows)."""
    _TABLE.clear()
    _BELOW.clear()
    SHAPES.clear()
    _IDS[0] = 0  # names restart too: an analysis asks the solver the same queries whatever ran before it


def next_id() -> int:
    """A number not given before in this analysis (from 1)."""
    _IDS[0] += 1
    return _IDS[0]


def mask(w: int) -> int:
    return (1 << w) - 1


def signed(v: int, w: int) -> int:
    v &= mask(w)
    return v - (1 << w) if v >> (w - 1) else v


# ------------------------------------------------------------------ leaves


def const(v: int, w: int) -> Term:
    return mk("const", (v & mask(w),), "bv", w)


def sym(name: str, w: int) -> Term:
    return mk("sym", (name,), "bv", w)


def fresh(what: str, w: int, sort: str = "bv") -> Term:
    return mk("fresh", (what, next_id()), sort, w)


TRUE = mk("true", (), "bool", 1)
FALSE = mk("false", (), "bool", 1)


def boolean(b: bool) -> Term:
    return TRUE if b else FALSE


def is_const(t: Term) -> bool:
    return t.op == "const"


def value(t: Term) -> int:
    return t.args[0]


def fconst(x: float, w: int = 32) -> Term:
    if w == 32:
        x = struct.unpack("<f", struct.pack("<f", x))[0]
    return mk("fconst", (x,), "f", w)


def float_of_bits(bits: int, w: int) -> float:
    if w == 32:
        return struct.unpack("<f", struct.pack("<I", bits & mask(32)))[0]
    if w == 64:
        return struct.unpack("<d", struct.pack("<Q", bits & mask(64)))[0]
    if w == 16:
        import numpy as np

        return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])
    raise ValueError(w)


def bits_of_float(x: float, w: int) -> int:
    if w == 32:
        return struct.unpack("<I", struct.pack("<f", x))[0]
    if w == 64:
        return struct.unpack("<Q", struct.pack("<d", x))[0]
    import numpy as np

    return int(np.array([x], dtype=np.float16).view(np.uint16)[0])


# ------------------------------------------------------------------ bit-vectors

_FOLD: dict[str, Callable[[int, int, int], int]] = {
    "add": lambda a, b, w: a + b,
    "sub": lambda a, b, w: a - b,
    "mul": lambda a, b, w: a * b,
    "and": lambda a, b, w: a & b,
    "or": lambda a, b, w: a | b,
    "xor": lambda a, b, w: a ^ b,
    "shl": lambda a, b, w: a << b if b < w else 0,
    "lshr": lambda a, b, w: a >> b if b < w else 0,
    "ashr": lambda a, b, w: signed(a, w) >> min(b, w - 1),
    "udiv": lambda a, b, w: a // b if b else mask(w),
    "urem": lambda a, b, w: a % b if b else a,
    "sdiv": lambda a, b, w: _sdiv(signed(a, w), signed(b, w)),
    "srem": lambda a, b, w: _srem(signed(a, w), signed(b, w)),
    "umin": lambda a, b, w: min(a, b),
    "umax": lambda a, b, w: max(a, b),
    "smin": lambda a, b, w: min(signed(a, w), signed(b, w)),
    "smax": lambda a, b, w: max(signed(a, w), signed(b, w)),
}
COMMUTATIVE = {"add", "mul", "and", "or", "xor", "umin", "umax", "smin", "smax"}


def _sdiv(a: int, b: int) -> int:
    if b == 0:
        return -1
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _srem(a: int, b: int) -> int:
    return a - b * _sdiv(a, b) if b else a


def _sum(a: Term, b: Term) -> Term:
    """a + b as a canonical sum: its non-constant terms in a fixed order, then the constant."""
    w = a.width
    atoms: list[Term] = []
    c = 0
    for x in (a, b):
        stack = [x]
        while stack:
            y = stack.pop()
            if y.op == "add":
                stack.extend(y.args)
            elif y.op == "const":
                c += y.args[0]
            else:
                atoms.append(y)
    atoms.sort(key=lambda t: t.serial)  # a sum's order: the same in every run (the solver's time depends on it)
    if not atoms:
        return const(c, w)
    out = atoms[0]
    for y in atoms[1:]:
        out = mk("add", (out, y), "bv", w)
    return mk("add", (out, const(c, w)), "bv", w) if c & mask(w) else out


def bv(op: str, a: Term, b: Term) -> Term:
    w = a.width
    if a.op == "ite" and is_const(b) and _small_ite(a):
        return ite(a.args[0], bv(op, a.args[1], b), bv(op, a.args[2], b))
    if is_const(a) and is_const(b):
        return const(_FOLD[op](value(a), value(b), w), w)
    if op in COMMUTATIVE and is_const(a):
        a, b = b, a
    if is_const(b):
        c = value(b)
        if c == 0 and op in ("add", "sub", "or", "xor", "shl", "lshr", "ashr"):
            return a
        if c == 0 and op in ("mul", "and"):
            return b
        if c == 1 and op in ("mul", "udiv", "sdiv"):
            return a
        if c == mask(w) and op == "and":
            return a
        if op == "or" and a.op == "mul" and is_const(a.args[1]) and c < (value(a.args[1]) & -value(a.args[1])):
            return bv("add", a, b)  # (x * 2^k m) | c == x * 2^k m + c when c < 2^k: the low bits are zero
        if op == "and" and a.op == "or" and is_const(a.args[1]) and value(a.args[1]) & c == 0:
            return bv("and", a.args[0], b)  # (x | k) & m == x & m when k & m == 0
        if op == "sub":
            return bv("add", a, const(-c, w))
        if op == "add" and a.op == "add" and is_const(a.args[1]):
            return bv("add", a.args[0], const(value(a.args[1]) + c, w))
        if op == "shl" and c < w:
            return bv("mul", a, const(1 << c, w))
        if op == "mul" and a.op == "mul" and is_const(a.args[1]):
            return bv("mul", a.args[0], const(value(a.args[1]) * c, w))
    if op == "sub" and a is b:
        return const(0, w)
    if op == "add":
        return _sum(a, b)
    return mk(op, (a, b), "bv", w)


def _small_ite(t: Term) -> bool:
    return is_const(t.args[1]) or is_const(t.args[2])


def bnot(a: Term) -> Term:
    return bv("xor", a, const(-1, a.width))


def extract(a: Term, lo: int, w: int) -> Term:
    """Bits lo..lo+w-1 of a (a narrower bv)."""
    if lo == 0 and w == a.width:
        return a
    if is_const(a):
        return const(value(a) >> lo, w)
    if a.op == "ite":
        return ite(a.args[0], extract(a.args[1], lo, w), extract(a.args[2], lo, w))
    if a.op == "load" and lo % 8 == 0 and w % 8 == 0:
        tensor, off, _ = a.args
        return load(tensor, bv("add", off, const(lo // 8, off.width)), w)
    if a.op == "concat":  # (hi, lo) parts
        parts = a.args  # low part first
        pos = 0
        for p in parts:
            if pos <= lo and lo + w <= pos + p.width:
                return extract(p, lo - pos, w)
            pos += p.width
    if a.op in ("zext", "sext") and lo + w <= a.args[0].width:
        return extract(a.args[0], lo, w)
    if a.op == "extract":
        return extract(a.args[0], a.args[1] + lo, w)
    return mk("extract", (a, lo), "bv", w)


def concat(parts: list[Term]) -> Term:
    """Low part first (PTX `mov.b32 %r, {%lo, %hi}`)."""
    if all(is_const(p) for p in parts):
        v, pos = 0, 0
        for p in parts:
            v |= value(p) << pos
            pos += p.width
        return const(v, pos)
    return mk("concat", tuple(parts), "bv", sum(p.width for p in parts))


def zext(a: Term, w: int) -> Term:
    if w == a.width:
        return a
    if w < a.width:
        return extract(a, 0, w)
    if is_const(a):
        return const(value(a), w)
    return mk("zext", (a,), "bv", w)


def sext(a: Term, w: int) -> Term:
    if w == a.width:
        return a
    if w < a.width:
        return extract(a, 0, w)
    if is_const(a):
        return const(signed(value(a), a.width), w)
    return mk("sext", (a,), "bv", w)


def load(tensor: str, offset: Term, w: int) -> Term:
    return mk("load", (tensor, offset, w), "bv", w)


def select(tensor: str, offset: Term, w: int) -> Term:
    return mk("select", (tensor, offset), "bv", w)


def ite(c: Term, a: Term, b: Term) -> Term:
    if c is TRUE or a is b:
        return a
    if c is FALSE:
        return b
    if c.op == "not":
        return ite(c.args[0], b, a)
    return mk("ite", (c, a, b), a.sort, a.width)


# ------------------------------------------------------------------ booleans


def cmp(op: str, a: Term, b: Term) -> Term:
    """op: eq ne ult ule ugt uge slt sle sgt sge."""
    flip = {"ugt": "ult", "uge": "ule", "sgt": "slt", "sge": "sle"}
    if op in flip:
        return cmp(flip[op], b, a)
    if op == "ne":
        return not_(cmp("eq", a, b))
    if is_const(a) and is_const(b):
        x, y = value(a), value(b)
        if op[0] == "s":
            x, y = signed(x, a.width), signed(y, b.width)
        return boolean({"eq": x == y, "ult": x < y, "ule": x <= y, "slt": x < y, "sle": x <= y}[op])
    if a is b:
        return boolean(op in ("eq", "ule", "sle"))
    return mk(op, (a, b), "bool", 1)


def not_(a: Term) -> Term:
    if a is TRUE:
        return FALSE
    if a is FALSE:
        return TRUE
    if a.op == "not":
        return a.args[0]
    return mk("not", (a,), "bool", 1)


def and_(*xs: Term) -> Term:
    out: list[Term] = []
    for x in xs:
        if x is FALSE:
            return FALSE
        if x is TRUE:
            continue
        for y in x.args if x.op == "and" else (x,):
            if y not in out:
                out.append(y)
    if not out:
        return TRUE
    if len(out) == 1:
        return out[0]
    negated = [y.args[0] for y in out if y.op == "not"]
    if negated and not {id(y) for y in negated}.isdisjoint(id(y) for y in out):
        return FALSE  # x and not x
    return mk("and", tuple(out), "bool", 1)


def or_(*xs: Term) -> Term:
    out: list[Term] = []
    for x in xs:
        if x is TRUE:
            return TRUE
        if x is FALSE:
            continue
        for y in x.args if x.op == "or" else (x,):
            if y not in out:
                out.append(y)
    if not out:
        return FALSE
    if 1 < len(out) <= 8:
        out = _rejoin(out)
        if any(x is TRUE for x in out):
            return TRUE
    if len(out) == 1:
        return out[0]
    return mk("or", tuple(out), "bool", 1)


def _rejoin(out: list[Term]) -> list[Term]:
    """Paths of one split meeting again: (A and p) or (A and not p) is A, repeated while two disjuncts
    differ in one complementary conjunct (three paths of a two-level split, (p) or (not p and q) or
    (not p and not q), are TRUE)."""
    while True:
        sets = [set(x.args) if x.op == "and" else {x} for x in out]
        for i in range(len(out)):
            for j in range(i + 1, len(out)):
                da, db = sets[i] - sets[j], sets[j] - sets[i]
                if len(da) == 1 and len(db) == 1 and not_(next(iter(da))) is next(iter(db)):
                    keep = and_(*(y for y in (out[i].args if out[i].op == "and" else (out[i],)) if y in sets[j]))
                    rest = [x for n, x in enumerate(out) if n not in (i, j)]
                    out = [keep, *(x for x in rest if x is not keep)]
                    break
            else:
                continue
            break
        else:
            return out
        if len(out) == 1 or keep is TRUE:
            return out


def bool_to_bv(p: Term, w: int) -> Term:
    return ite(p, const(1, w), const(0, w))


# ------------------------------------------------------------------ floats


FCOMMUTATIVE = {"fadd", "fmul", "fmax", "fmin"}


def fop(op: str, *args: Term, w: int = 32) -> Term:
    """A float operation; constants fold (in float32 where w == 32, through numpy). The operands of a
    commutative operation are put in a fixed order, so that the lanes of a butterfly reduction, which
    combine the same values in mirrored order, hold the same term."""
    if op in FCOMMUTATIVE | {"ffma"} and len(args) >= 2 and args[1].serial < args[0].serial:
        args = (args[1], args[0], *args[2:])
    if all(a.op == "fconst" for a in args) and op in _FFOLD:
        import numpy as np

        t = np.float32 if w == 32 else np.float64
        with np.errstate(all="ignore"):
            r = _FFOLD[op](*(t(a.args[0]) for a in args))
        return fconst(float(t(r)), w)
    return mk(op, args, "f", w)


def _fma(a, b, c):
    import numpy as np

    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


_FFOLD: dict[str, Callable] = {
    "fadd": lambda a, b: a + b,
    "fsub": lambda a, b: a - b,
    "fmul": lambda a, b: a * b,
    "fdiv": lambda a, b: a / b,
    "ffma": _fma,
    "fneg": lambda a: -a,
    "fmax": lambda a, b: max(a, b),
    "fmin": lambda a, b: min(a, b),
    "ex2": lambda a: 2.0**a,
    "rcp": lambda a: 1.0 / a,
}


def fbits(b: Term, w: int) -> Term:
    """The float whose bits are b (a constant folds to its value)."""
    if is_const(b):
        return fconst(float_of_bits(value(b), w), w)
    if b.op == "fbitsof":
        return b.args[0]
    if b.op == "ite":
        return fite(b.args[0], fbits(b.args[1], w), fbits(b.args[2], w))
    return mk("fbits", (b,), "f", w)


def bits(f: Term) -> Term:
    """The bits of a float term (a bv of its width)."""
    if f.op == "fconst":
        return const(bits_of_float(f.args[0], f.width), f.width)
    if f.op == "fbits":
        return f.args[0]
    return mk("fbitsof", (f,), "bv", f.width)


def fite(c: Term, a: Term, b: Term) -> Term:
    if c is TRUE or a is b:
        return a
    if c is FALSE:
        return b
    if c.op == "not":
        return fite(c.args[0], b, a)
    return mk("fite", (c, a, b), "f", a.width)


# ------------------------------------------------------------------ traversal


def walk(t: Term, seen: set | None = None):
    """Every term below t (t included), each once."""
    seen = set() if seen is None else seen
    stack = [t]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        stack.extend(a for a in x.args if isinstance(a, Term))


def reaches(
    t: Term, hit: Callable[[Term], bool], known: dict[int, bool], more: Callable[[Term], Iterable[Term]] | None = None
) -> bool:
    """Whether a term `hit` accepts is below t (t included; `more(x)`: terms that count as below x besides its
    arguments). The walk stops at the first such term or at one already known to reach one; when none is
    reachable, none is from any term the walk met either: `known` keeps both answers for the next calls with
    the same `hit` and `more`."""
    r = known.get(id(t))
    if r is not None:
        return r
    seen: set[int] = set()
    stack = [t]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        k = known.get(id(x))
        if k is False:
            continue
        if k or hit(x):
            known[id(t)] = True
            return True
        if more is not None:
            stack.extend(more(x))
        stack.extend(a for a in x.args if isinstance(a, Term))
    for i in seen:
        known[i] = False
    return False


_BELOW: dict[tuple[str, int], tuple[Term, ...]] = {}
SHAPES: dict[int, int] = {}  # id(term) -> the hash of its structure with constants blanked (context._shape)


def below(t: Term, op: str) -> tuple[Term, ...]:
    """The distinct terms of operation `op` below t (t included), a term before its arguments, arguments
    left to right. Memoised per term (until `reset`): the lanes' offsets, which share most of their
    subterms, are walked once between them."""
    stack: list[tuple[Term, bool]] = [(t, False)]
    while stack:
        x, ready = stack.pop()
        if (op, id(x)) in _BELOW:
            continue
        kids = [a for a in x.args if isinstance(a, Term)]
        if not ready:
            stack.append((x, True))
            stack.extend((a, False) for a in kids if (op, id(a)) not in _BELOW)
            continue
        out = [x] if x.op == op else []
        seen = {id(y) for y in out}
        for a in kids:
            for y in _BELOW[(op, id(a))]:
                if id(y) not in seen:
                    seen.add(id(y))
                    out.append(y)
        _BELOW[(op, id(x))] = tuple(out)
    return _BELOW[(op, id(t))]


def substitute(t: Term, table: dict, memo: dict | None = None) -> Term:
    """t with every term of `table` (by identity) replaced, rebuilt through the simplifying constructors."""
    memo = {} if memo is None else memo
    return _subst(t, table, memo)


def _subst(t: Term, table: dict, memo: dict) -> Term:
    if t in table:
        return table[t]
    if t in memo:
        return memo[t]
    if not any(isinstance(a, Term) for a in t.args):
        memo[t] = t
        return t
    args = tuple(_subst(a, table, memo) if isinstance(a, Term) else a for a in t.args)
    r = t if all(x is y for x, y in zip(args, t.args)) else rebuild(t, args)
    memo[t] = r
    return r


def rebuild(t: Term, args: tuple) -> Term:
    op = t.op
    if t.sort == "bool" and op in ("and", "or"):
        return and_(*args) if op == "and" else or_(*args)
    if op in _FOLD:
        return bv(op, args[0], args[1])
    if op in ("eq", "ult", "ule", "slt", "sle"):
        return cmp(op, args[0], args[1])
    if op == "and":
        return and_(*args)
    if op == "or":
        return or_(*args)
    if op == "not":
        return not_(args[0])
    if op == "ite":
        return ite(*args)
    if op == "fite":
        return fite(*args)
    if op == "extract":
        return extract(args[0], args[1], t.width)
    if op == "zext":
        return zext(args[0], t.width)
    if op == "sext":
        return sext(args[0], t.width)
    if op == "concat":
        return concat(list(args))
    if op == "load":
        return load(args[0], args[1], args[2])
    if op == "fbits":
        return fbits(args[0], t.width)
    if t.sort == "f" and op in _FFOLD:
        return fop(op, *args, w=t.width)
    return mk(op, args, t.sort, t.width)


def show(t: Term, depth: int = 6) -> str:
    if t.op == "const":
        return str(signed(t.args[0], t.width)) if t.width > 1 else str(t.args[0])
    if t.op == "sym":
        return t.args[0]
    if t.op in ("true", "false"):
        return t.op
    if t.op == "fconst":
        return repr(t.args[0])
    if depth == 0:
        return "..."
    inner = ", ".join(show(a, depth - 1) if isinstance(a, Term) else str(a) for a in t.args)
    return f"{t.op}({inner})"
