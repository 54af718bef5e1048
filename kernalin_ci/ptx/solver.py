"""The SMT front: bit-vector and boolean terms to z3 (as exact integer arithmetic), a query's verdict.

z3 (the `z3-solver` package, an optional extra: `pip install 'kernalin-ci[ptx]'`) decides each query;
without it every property is "not analysed (no solver)". Translation (Translator): `sym` -> an integer;
`select(tensor, offset)` -> an uninterpreted function of the tensor applied to the offset (every read of
one element is the same value); `load`, `phi`, `fresh`, float bits and float comparisons -> an unknown of
their sort, one per distinct term. A query is "can these conditions all hold?": `unsat` is a proof that
they cannot, `sat` comes with a model (the counterexample), `unknown` (the time limit) is never a proof.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from kernalin_ci.ptx import terms as T

# Per query, the solver's work is bounded by a resource count (deterministic, whatever the machine's load)
# and, as a backstop, by wall time: past either, the property is not proved (never a pass).
RLIMIT = 20_000_000
TIMEOUT_MS = 60_000


def available() -> bool:
    try:
        import z3  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class SolverAnswer:
    status: str  # "unsat" (proved: the conditions never hold), "sat" (a counterexample), "unknown"
    model: dict[str, int] = field(default_factory=dict)  # symbol name -> value; "select:tensor@offset" -> value
    cause: str = ""
    approximated: tuple[str, ...] = ()  # operations not modelled exactly: a "sat" is then no counterexample


class Intervals:
    """Inclusive bounds on each bit-vector term's unsigned value (sound, not tight), from the symbols'
    declared ranges (`bounds`), the contract's range of each index tensor's values (`select_bounds`) and the
    operations. Shared by the translation (no wrap witness where none can wrap) and the query builders (an
    offset's linear form, context.decode)."""

    def __init__(
        self,
        bounds: dict[str, tuple[int, int]] | None = None,
        select_bounds: dict[str, tuple[int, int]] | None = None,
    ):
        self.bounds = bounds or {}
        self.select_bounds = select_bounds or {}
        self.spans: dict[int, tuple[int, int]] = {}
        self.simple: dict[int, T.Term] = {}
        self.ones_memo: dict[int, int] = {}

    def span(self, t: T.Term) -> tuple[int, int]:
        """Inclusive bounds on a bit-vector term's unsigned value (sound, not tight)."""
        r = self.spans.get(id(t))
        if r is None:
            r = self._span(t)
            self.spans[id(t)] = r
        return r

    def _span(self, t: T.Term) -> tuple[int, int]:
        op, a, w = t.op, t.args, t.width
        full = (0, (1 << w) - 1)
        if t.sort != "bv":
            return full
        if op == "const":
            return (a[0], a[0])
        if op == "sym":
            lo, hi = self.bounds.get(a[0], full)
            return (max(lo, 0), min(hi, full[1]))
        if op == "ite":
            (l1, h1), (l2, h2) = self.span(a[1]), self.span(a[2])
            return (min(l1, l2), max(h1, h2))
        if op == "extract":
            lo, hi = self.span(a[0])
            lo, hi = lo >> a[1], hi >> a[1]
            return (lo, hi) if hi <= full[1] else full
        if op == "select":
            lo, hi = self.select_bounds.get(a[0], full)
            return (max(lo, 0), min(hi, full[1]))
        if op in ("zext", "add", "sub", "mul", "udiv", "urem", "lshr", "shl", "and", "sext", "umin", "umax") or (
            op in ("ashr", "sdiv", "srem", "smin", "smax") and self.nonneg(*a)
        ):
            x = [self.span(y) if isinstance(y, T.Term) else None for y in a]
        else:
            return full
        if op == "zext":
            return x[0]
        if op == "sext":
            return x[0] if x[0][1] < (1 << (a[0].width - 1)) else full
        if op == "add":
            r = (x[0][0] + x[1][0], x[0][1] + x[1][1])
        elif op == "sub":
            r = (x[0][0] - x[1][1], x[0][1] - x[1][0])
        elif op == "mul":
            r = (x[0][0] * x[1][0], x[0][1] * x[1][1])
        elif op in ("udiv", "lshr", "sdiv", "ashr") and T.is_const(a[1]):
            c = T.value(a[1]) if op in ("udiv", "sdiv") else 1 << min(T.value(a[1]), w)
            r = (x[0][0] // c, x[0][1] // c) if c > 0 else full
        elif op == "shl" and T.is_const(a[1]) and T.value(a[1]) < w:
            r = (x[0][0] << T.value(a[1]), x[0][1] << T.value(a[1]))
        elif op in ("urem", "srem") and T.is_const(a[1]) and T.value(a[1]) > 0:
            r = (0, min(T.value(a[1]) - 1, x[0][1])) if x[0][1] >= T.value(a[1]) else x[0]
        elif op in ("urem", "srem"):  # by a runtime value: below it (or x itself, where it is 0)
            r = (0, x[0][1]) if x[1][0] == 0 else (0, min(x[0][1], x[1][1] - 1))
        elif op in ("udiv", "sdiv"):
            r = (0, x[0][1])
        elif op == "and":
            r = (0, min(x[0][1], x[1][1]))
        elif op in ("umin", "smin"):
            r = (min(x[0][0], x[1][0]), min(x[0][1], x[1][1]))
        elif op in ("umax", "smax"):
            r = (max(x[0][0], x[1][0]), max(x[0][1], x[1][1]))
        else:
            return full
        return r if 0 <= r[0] and r[1] <= full[1] else full

    def ones(self, t: T.Term) -> int:
        """The bits of a bit-vector term that can be 1 anywhere in the domain (sound, not tight): those below
        its span's top, less the low bits a shift or a product by a constant clears, less what a mask clears."""
        r = self.ones_memo.get(id(t))
        if r is not None:
            return r
        op, a = t.op, t.args
        r = (1 << max(self.span(t)[1], 0).bit_length()) - 1
        if op == "const":
            r &= a[0]
        elif op == "shl" and T.is_const(a[1]) and T.value(a[1]) < t.width:
            r &= self.ones(a[0]) << T.value(a[1])
        elif op == "lshr" and T.is_const(a[1]):
            r &= self.ones(a[0]) >> T.value(a[1])
        elif op == "and":
            r &= self.ones(a[0]) & self.ones(a[1])
        elif op == "or":
            r &= self.ones(a[0]) | self.ones(a[1])
        elif op == "mul" and T.is_const(a[1]) and T.value(a[1]):
            low = self._low_zeros(a[0]) + (T.value(a[1]) & -T.value(a[1])).bit_length() - 1
            r &= ~((1 << low) - 1)
        elif op == "zext":
            r &= self.ones(a[0])
        self.ones_memo[id(t)] = r
        return r

    def _low_zeros(self, t: T.Term) -> int:
        ones = self.ones(t)
        return (ones & -ones).bit_length() - 1 if ones else t.width

    def nonneg(self, *ts) -> bool:
        """Every bit-vector operand is below 2^(w-1): its signed and unsigned values are the same, so a
        signed operation on it is the unsigned one (no case split on the sign)."""
        return all(self.span(t)[1] < 1 << (t.width - 1) for t in ts if isinstance(t, T.Term))

    def simplify(self, t: T.Term) -> T.Term:
        """t rewritten by what the intervals show, the same value everywhere in the domain: a term of one
        value is that constant (`x >> 31` of a non-negative x), signed operations on non-negative operands
        are the unsigned ones (`sext`, `ashr`, `sdiv`, `srem`, `slt`, ...), `x - (x & -2^k)` is
        `x & (2^k - 1)` and `x - (x / c) * c` is `x % c` (the remainder of a division by a runtime size nvcc
        spells so: a head dim's `e % D`). Compilers' signed-division idioms become plain divisions and remainders."""
        memo = self.simple

        def go(x: T.Term) -> T.Term:
            r = memo.get(id(x))
            if r is None:
                r = self._rewrite(x, tuple(go(a) if isinstance(a, T.Term) else a for a in x.args))
                memo[id(x)] = r
            return r

        return go(t)

    def _rewrite(self, t: T.Term, args: tuple) -> T.Term:
        if any(x is not y for x, y in zip(args, t.args)):
            t = T.rebuild(t, args)
        op, a = t.op, t.args
        if t.sort == "bv" and op not in ("const", "sym", "select"):  # leaves stay (a model names them)
            lo, hi = self.span(t)
            if lo == hi:
                return T.const(lo, t.width)
        unsigned = {"sdiv": "udiv", "srem": "urem", "ashr": "lshr", "smin": "umin", "smax": "umax"}
        if op in unsigned and self.nonneg(*a):
            return T.bv(unsigned[op], a[0], a[1])
        if op in ("slt", "sle") and self.nonneg(*a):
            return T.cmp("u" + op[1:], a[0], a[1])
        if op == "sext" and self.nonneg(a[0]):
            return T.zext(a[0], t.width)
        if op == "sub" and a[1].op == "and" and a[1].args[0] is a[0] and T.is_const(a[1].args[1]):
            low = ~T.value(a[1].args[1]) & T.mask(t.width)  # x - (x & ~m) == x & m
            if (low + 1) & low == 0:
                return T.bv("and", a[0], T.const(low, t.width))
        if op == "sub" and a[1].op == "mul" and T.is_const(a[1].args[1]):  # x - (x / c) * c == x % c
            q, c = a[1].args
            if q.op == "udiv" and q.args[0] is a[0] and q.args[1] is c and T.value(c) > 0:
                return T.bv("urem", a[0], c)
        return t


_UNKNOWN = ("load", "phi", "fresh", "fbitsof", "f2i", "fcmp", "ftest", "loopinv")  # unknowns of their sort


class Translator:
    """Terms to z3 over the integers: a bit-vector term of width w is its unsigned value in [0, 2^w), each
    operation exact modulo 2^w through a bounded integer witness (`a + b - 2^w * o`, o in {0, 1}). Address
    arithmetic (sums, products by constants, divisions by constants) is then linear integer arithmetic,
    which the solver decides far faster than bit-blasted multiplications.

    Every term also gets an interval of its value (`span`), from the symbols' declared ranges (`bounds`)
    and the operations: an operation whose result provably stays in [0, 2^w) needs no wrap witness, and a
    witness' range is only the wraps that can happen. Fewer witnesses, fewer case splits for the solver."""

    def __init__(
        self,
        bounds: dict[str, tuple[int, int]] | None = None,
        select_bounds: dict[str, tuple[int, int]] | None = None,
    ):
        import z3

        self.intervals = Intervals(bounds, select_bounds)
        self.span = self.intervals.span
        self.nonneg = self.intervals.nonneg
        self.z3 = z3
        # a z3 context of its own: z3's global one grows with every query of the process (the same kernel
        # took 8 s first and 13 to 16 s after one analysis in the same process); it goes with the translator
        self.ctx = z3.Context()
        self.memo: dict[int, Any] = {}
        self.divs: dict[tuple, Any] = {}  # (dividend's z3 id, divisor) -> the quotient's witness
        self.funcs: dict[tuple, Any] = {}
        self.unknowns: dict[int, Any] = {}
        self.selects: list[tuple[T.Term, Any]] = []  # every select term met, for the contract's constraints
        self.syms: dict[str, Any] = {}
        self.side: list = []  # the bounds of the witnesses the term being translated introduces or reuses
        self.own: dict[int, list] = {}  # id(term) -> those bounds (a query asserts those of its terms)
        self.shared_side: dict[object, list] = {}  # a witness shared by several terms -> its bounds
        self.n = 0
        self.approximated: dict[int, str] = {}  # id(term) -> its operation, translated as an unknown (a model
        # may then be spurious)

    def __call__(self, t: T.Term):
        key = id(t)
        r = self.memo.get(key)
        if r is None:
            outer, self.side = self.side, []
            r = self._tr(t)
            self.own[key], self.side = self.side, outer
            self.memo[key] = r
        return r

    def reached(self, ts: list[T.Term], skip: set[int] | frozenset = frozenset()) -> list[T.Term]:
        """The terms translating ts translates, each once (not below those in `skip`): the arguments of a
        leaf, an unknown or a term of one value are never translated."""
        out, seen, stack = [], set(skip), list(ts)
        while stack:
            t = stack.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            out.append(t)
            if t.op == "sym" or t.sort == "f" or t.op in _UNKNOWN:
                continue
            if t.sort == "bv" and t.op not in ("const", "select") and self.span(t)[0] == self.span(t)[1]:
                continue
            stack.extend(a for a in t.args if isinstance(a, T.Term))
        return out

    def _int(self, what: str, lo: int, hi: int):
        self.n += 1
        v = self.z3.Int(f"{what}{self.n}", self.ctx)
        self.side += (v >= lo, v < hi)
        return v

    def _unknown(self, t: T.Term):
        z3 = self.z3
        v = self.unknowns.get(id(t))
        if v is None:
            if t.sort == "bool":
                v = z3.Bool(f"u{len(self.unknowns)}_{t.op}", self.ctx)
            else:
                v = self._int(f"u_{t.op}_", 0, 1 << t.width)
            self.unknowns[id(t)] = v
        return v

    def _wrap(self, x, t: T.Term, lo: int, hi: int):
        """x (the exact result of t's operation, in [lo, hi]) modulo 2^w."""
        w = t.width
        return self._mod(x, w, lo >> w, (hi >> w) + 1)

    def _mod(self, x, w: int, lo: int, hi: int):
        """x modulo 2^w, knowing lo <= x // 2^w < hi."""
        if lo == 0 and hi == 1:
            return x
        o = self._int("o", lo, hi)
        r = x - (1 << w) * o
        self.side += (r >= 0, r < (1 << w))
        return r

    def signed(self, x, w: int):
        return self.z3.If(x >= (1 << (w - 1)), x - (1 << w), x)

    def _tr(self, t: T.Term):
        z3 = self.z3
        op, a, w = t.op, t.args, t.width
        if op == "const":
            return z3.IntVal(a[0], self.ctx)
        if op == "true":
            return z3.BoolVal(True, self.ctx)
        if op == "false":
            return z3.BoolVal(False, self.ctx)
        if op == "sym":
            v = self.syms.get(a[0])
            if v is None:
                v = z3.Int(a[0], self.ctx)
                self.syms[a[0]] = v
                lo, hi = self.span(t)
                self.shared_side[a[0]] = [v >= lo, v <= hi]
            self.side += self.shared_side[a[0]]  # (one symbol of two widths: the first one's bounds)
            return v
        if op == "select":
            f = self.funcs.get((a[0], w))
            if f is None:
                f = z3.Function(f"sel_{a[0]}", z3.IntSort(self.ctx), z3.IntSort(self.ctx))
                self.funcs[(a[0], w)] = f
            self.selects.append((t, None))
            v = f(self(a[1]))
            lo, hi = self.span(t)
            self.side += (v >= lo, v <= hi)
            return v
        if t.sort == "f" or op in _UNKNOWN:
            return self._unknown(t)
        if t.sort == "bv":
            lo, hi = self.span(t)
            if lo == hi:  # one value over the whole domain (`x >> 31` of a non-negative x)
                return z3.IntVal(lo, self.ctx)
        x = [self(y) if isinstance(y, T.Term) else y for y in a]
        if t.sort == "bool":
            if op == "and":
                return z3.And(*x)
            if op == "or":
                return z3.Or(*x)
            if op == "not":
                return z3.Not(x[0])
            if op == "eq":
                return x[0] == x[1]
            if op == "ult":
                return x[0] < x[1]
            if op == "ule":
                return x[0] <= x[1]
            if op in ("slt", "sle") and self.nonneg(a[0], a[1]):
                return x[0] < x[1] if op == "slt" else x[0] <= x[1]
            if op == "slt":
                return self.signed(x[0], a[0].width) < self.signed(x[1], a[1].width)
            if op == "sle":
                return self.signed(x[0], a[0].width) <= self.signed(x[1], a[1].width)
            if op == "ite":
                return z3.If(x[0], x[1], x[2])
            self.approximated[id(t)] = op
            return self._unknown(t)
        if op in ("add", "sub", "mul"):
            (l0, h0), (l1, h1) = self.span(a[0]), self.span(a[1])
            if op == "add":
                return self._wrap(x[0] + x[1], t, l0 + l1, h0 + h1)
            if op == "sub":
                return self._wrap(x[0] - x[1], t, l0 - h1, h0 - l1)
            if T.is_const(a[1]):
                return self._wrap(x[0] * T.value(a[1]), t, l0 * l1, h0 * h1)
            return self._wrap(x[0] * x[1], t, l0 * l1, h0 * h1)
        if op == "ite":
            return z3.If(x[0], x[1], x[2])
        if op == "zext" or op == "concat" and len(x) == 1:
            return x[0]
        if op == "sext":
            iw = a[0].width
            if self.nonneg(a[0]):
                return x[0]
            return z3.If(x[0] >= (1 << (iw - 1)), x[0] + ((1 << w) - (1 << iw)), x[0])
        if op == "extract":
            lo = a[1]
            v = x[0]
            if lo:
                v = self._div(v, 1 << lo, a[0].width - lo)
            if a[0].width - lo <= w or self.span(a[0])[1] >> lo < (1 << w):
                return v
            return self._mod(v, w, 0, 1 << max(a[0].width - lo - w, 0))
        if op == "concat":
            total, pos = 0, 0
            for part, v in zip(a, x):
                total = total + v * (1 << pos)
                pos += part.width
            return total
        if op in ("udiv", "urem") and T.is_const(a[1]) and T.value(a[1]) > 0:
            c = T.value(a[1])
            q = self._div(x[0], c, w)
            return q if op == "udiv" else x[0] - c * q
        if op in ("lshr", "shl") and T.is_const(a[1]):
            c = T.value(a[1])
            if c >= w:
                return z3.IntVal(0, self.ctx)
            if op == "lshr":
                return self._div(x[0], 1 << c, w - c)
            lo, hi = self.span(a[0])
            return self._wrap(x[0] * (1 << c), t, lo << c, hi << c)
        mask = T.value(a[1]) if op == "and" and T.is_const(a[1]) else None
        if mask is not None:  # bits above x's highest possible bit are free: x & 0x3ff..f0 is x & ~15 there
            top = max(self.span(a[0])[1], 0).bit_length()
            low = mask & ((1 << top) - 1)
            mask = low if (low + 1) & low == 0 else low | (T.mask(w) & ~((1 << top) - 1))
        if mask is not None and (mask + 1) & mask == 0:
            m = mask + 1
            return x[0] - m * self._div(x[0], m, w)
        if mask is not None:
            hi_mask = (~mask) & T.mask(w)  # x & ~(m - 1) for m a power of two: m * floor(x / m)
            if (hi_mask + 1) & hi_mask == 0:
                m = hi_mask + 1
                return m * self._div(x[0], m, w)
        if op in ("sdiv", "srem", "ashr", "smin", "smax") and self.nonneg(*a):
            op = {"sdiv": "udiv", "srem": "urem", "ashr": "lshr", "smin": "umin", "smax": "umax"}[op]
        if op in ("udiv", "urem") and T.is_const(a[1]) and T.value(a[1]) > 0:
            c = T.value(a[1])
            q = self._div(x[0], c, w)
            return q if op == "udiv" else x[0] - c * q
        if op == "lshr" and T.is_const(a[1]):
            c = T.value(a[1])
            return z3.IntVal(0, self.ctx) if c >= w else self._div(x[0], 1 << c, w - c)
        if op in ("udiv", "urem", "sdiv", "srem") and not T.is_const(
            a[1]
        ):  # by a runtime value (`pos % seq_len`): bounds, exact below it
            return self._by_symbol(t, op, x[0], x[1])
        if op == "or" and not self.intervals.ones(a[0]) & self.intervals.ones(a[1]):
            return x[0] + x[1]  # no bit can be 1 in both: the sum, no carry (Intervals.ones)
        if op in ("umin", "umax", "smin", "smax"):
            if op[0] == "u":
                less = x[0] < x[1]
            else:
                less = self.signed(x[0], w) < self.signed(x[1], w)
            return z3.If(less, x[0], x[1]) if op.endswith("min") else z3.If(less, x[1], x[0])
        if op in ("sdiv", "srem") and T.is_const(a[1]) and 0 < T.signed(T.value(a[1]), w):
            c = T.signed(T.value(a[1]), w)
            sv = self.signed(x[0], w)
            q = self._int("q", -(1 << w), 1 << w)  # truncating division
            r = sv - c * q
            self.side.append(z3.If(sv >= 0, z3.And(r >= 0, r < c), z3.And(r <= 0, r > -c)))
            res = q if op == "sdiv" else r
            return z3.If(res >= 0, res, res + (1 << w))
        if op == "ashr" and T.is_const(a[1]):
            c = min(T.value(a[1]), w - 1)
            sv = self.signed(x[0], w)
            q = self._int("q", -(1 << w), 1 << w)
            self.side.append(z3.And(q * (1 << c) <= sv, sv < q * (1 << c) + (1 << c)))
            return z3.If(q >= 0, q, q + (1 << w))
        self.approximated[id(t)] = op
        return self._unknown(t)

    def _by_symbol(self, t: T.Term, op: str, x, y):
        """x / y or x % y (signed: truncating) for a divisor known only at run time (`pos % seq_len`): the
        result's bounds (a remainder of x's sign, below y and x in size; a quotient at most x in size), and x
        itself (or 0) where 0 <= x < y; no more, so the term is approximated (a model of it is no
        counterexample). PTX leaves a division by 0 undefined: here x % 0 is x, as terms.py."""
        z3, w = self.z3, t.width
        self.approximated[id(t)] = t.op
        if op in ("udiv", "urem"):  # (a signed one of non-negative operands included)
            v = self._int(op[1], 0, 1 << w)
            if op == "urem":
                self.side.append(z3.If(y == 0, v == x, z3.And(v < y, v <= x, z3.Implies(x < y, v == x))))
            else:
                self.side.append(z3.And(v <= x, z3.Implies(x < y, v == 0)))
            return v
        x, y = self.signed(x, w), self.signed(y, w)
        v = self._int(op[1], -(1 << w), 1 << w)
        size = z3.If(x >= 0, z3.And(v >= 0, v <= x), z3.And(v <= 0, v >= x))
        small = z3.And(x >= 0, x < y)
        if op == "srem":
            below = z3.If(v >= 0, v, -v) < z3.If(y >= 0, y, -y)
            self.side.append(z3.If(y == 0, v == x, z3.And(size, below, z3.Implies(small, v == x))))
        else:
            self.side.append(z3.And(z3.If(x >= 0, v >= 0, v <= 0), z3.If(v >= 0, v, -v) <= z3.If(x >= 0, x, -x)))
            self.side.append(z3.Implies(small, v == 0))
        return z3.If(v >= 0, v, v + (1 << w))

    def _div(self, x, c: int, w: int):
        """floor(x / c) for 0 <= x (a witness q with q * c <= x < (q + 1) * c), one per dividend and divisor
        (z3's terms are shared by structure: `x / 16` and `x % 16`, or a signed division and the unsigned one
        it became, use the same witness, so x == 16 * (x / 16) + x % 16 holds without a search)."""
        key = (x.get_id(), c)
        q = self.divs.get(key)
        if q is None:
            outer, self.side = self.side, []
            q = self._int("d", 0, 1 << w)
            self.side += (q * c <= x, x < q * c + c)
            self.shared_side[key], self.side = self.side, outer
            self.divs[key] = q
        self.side += self.shared_side[key]
        return q


class Query:
    """Conditions over one translator; `check()` gives an SolverAnswer. The translator may be shared by
    several queries (its translations memoised): each asserts the witnesses' bounds of its own terms."""

    def __init__(
        self,
        bounds: dict[str, tuple[int, int]] | None = None,
        select_bounds: dict[str, tuple[int, int]] | None = None,
        translator: Translator | None = None,
    ):
        import z3

        self.z3 = z3
        self.tr = translator or Translator(bounds, select_bounds)
        self.solver = z3.Solver(ctx=self.tr.ctx)
        self.solver.set("timeout", TIMEOUT_MS)
        self.solver.set("rlimit", RLIMIT)
        self.terms: list[T.Term] = []  # what add asserted
        self.sided: set[int] = set()  # the terms whose witnesses' bounds are asserted

    def add(self, *conds: T.Term | Any) -> None:
        for c in conds:
            if isinstance(c, T.Term):
                self.terms.append(c)
                self.solver.add(self.tr(c))
            else:
                self.solver.add(c)
        self._flush([c for c in conds if isinstance(c, T.Term)])

    def _flush(self, terms: list[T.Term]) -> None:
        """Assert the bounds of the witnesses below terms (each once)."""
        side = []
        for t in self.tr.reached(terms, self.sided):
            self.sided.add(id(t))
            side += self.tr.own.get(id(t), ())
        if side:
            self.solver.add(*side)

    def selects(self) -> list[T.Term]:
        """The index elements the query's terms read."""
        return [t for t in self.tr.reached(self.terms) if t.op == "select"]

    def check(self, extra: list | None = None) -> SolverAnswer:
        """Can the assertions and `extra` all hold? `extra` is dropped after the check (its witnesses'
        bounds stay: definitions, true whatever is asked), so one query answers several checks on the same
        assertions, the solver keeping what it learnt between them."""
        z3 = self.z3
        conds = [self.tr(c) if isinstance(c, T.Term) else c for c in extra or []]
        self._flush([c for c in extra or [] if isinstance(c, T.Term)])
        self.solver.push()
        self.solver.add(*conds)
        r = self.solver.check()
        if os.environ.get("KERNALIN_PTX_STATS"):
            st = self.solver.statistics()
            print("query", r, dict(zip(st.keys(), [st.get_key_value(k) for k in st.keys()])).get("rlimit count"))
        try:
            if r == z3.unsat:
                return SolverAnswer("unsat")
            if r == z3.sat:
                about = self.tr.reached([*self.terms, *(c for c in extra or [] if isinstance(c, T.Term))])
                ops = {self.tr.approximated[id(t)] for t in about if id(t) in self.tr.approximated}
                return SolverAnswer("sat", self._model(self.solver.model(), about), approximated=tuple(sorted(ops)))
            return SolverAnswer("unknown", cause=str(self.solver.reason_unknown()))
        finally:
            self.solver.pop()

    def _model(self, m, about: list[T.Term]) -> dict[str, int]:
        """The values of the symbols and index elements among `about` (the terms the query translated)."""
        names = {t.args[0] for t in about if t.op == "sym"}
        mine = {id(t) for t in about if t.op == "select"}
        out: dict[str, int] = {}
        for name, v in self.tr.syms.items():
            if name not in names:
                continue
            val = m.eval(v, model_completion=True)
            out[name] = val.as_long()
        seen = set()
        for t, _ in self.tr.selects:
            if id(t) in seen or id(t) not in mine:
                continue
            seen.add(id(t))
            off = m.eval(self.tr(t.args[1]), model_completion=True).as_long()
            val = m.eval(self.tr(t), model_completion=True).as_long()
            out[f"select:{t.args[0]}@{T.signed(off, 64)}"] = T.signed(val, t.width)
        return out
