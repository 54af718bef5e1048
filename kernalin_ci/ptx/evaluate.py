"""Concrete evaluation of terms: the value a term takes when some of its atoms are given values.

`evaluate(t, given)` computes t with `given` (term -> int, float or bool) for its atoms, in the PTX
arithmetic of each node: integers modulo their width, floats rounded to their width after every
operation (float32 through numpy; `ex2`, `lg2`, `rcp`, `sqrt`, `rsqrt` exactly rounded, where PTX's
approximate forms may differ by an ulp or two). If-then-else and the connectives are lazy: a branch not
taken, or a conjunct after a false one, is never evaluated, so a term whose untaken paths hold loop atoms
or unknown data still has a value. An atom without a value raises `Unknown`.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from kernalin_ci.ptx import terms as T


class Unknown(Exception):
    """The term needs an atom that has no value."""


_F = {16: np.float16, 32: np.float32, 64: np.float64}


def _round(x: float, w: int, kind: str = "") -> float:
    if kind == "bf16":
        b = struct.unpack("<I", struct.pack("<f", np.float32(x)))[0]
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return struct.unpack("<f", struct.pack("<I", b))[0]
    with np.errstate(all="ignore"):
        return float(_F[w](x))


def _fcmp(op: str, a: float, b: float) -> bool:
    unordered = math.isnan(a) or math.isnan(b)
    if op == "num":
        return not unordered
    if op == "nan":
        return unordered
    unordered_true = len(op) == 3 and op.endswith("u")  # equ, neu, ltu, ...: true on a NaN
    if unordered:
        return unordered_true
    base = op[:2]
    return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[base]


def _f2i(x: float, dst: str, rnd: str) -> int:
    w = int(dst[1:])
    if math.isnan(x):
        return 0
    r = {"rni": round, "rzi": math.trunc, "rmi": math.floor, "rpi": math.ceil}[rnd]
    lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if dst[0] == "s" else (0, (1 << w) - 1)
    n = lo if x == -math.inf else hi if x == math.inf else int(r(x))  # round(): ties to even
    return min(max(n, lo), hi) & T.mask(w)


class Evaluator:
    def __init__(self, given: dict):
        self.memo: dict[int, object] = {id(k): v for k, v in given.items()}

    def __call__(self, t: T.Term):
        v = self.memo.get(id(t))
        if v is None:
            v = self._eval(t)
            self.memo[id(t)] = v
        return v

    def _eval(self, t: T.Term):  # noqa: C901 - one case per operation
        op, a, w = t.op, t.args, t.width
        if op == "const":
            return a[0]
        if op in ("true", "false"):
            return op == "true"
        if op == "fconst":
            return a[0]
        if op == "fparam":
            return _round(a[1], w)
        if op in ("ite", "fite"):
            c = self(a[0])
            return self(a[1]) if c else self(a[2])
        if op == "and" and t.sort == "bool":
            return self._connective(a, False)
        if op == "or" and t.sort == "bool":
            return self._connective(a, True)
        if op == "not":
            return not self(a[0])
        if op in ("eq", "ult", "ule", "slt", "sle"):
            x, y = self(a[0]), self(a[1])
            if op[0] == "s":
                x, y = T.signed(x, a[0].width), T.signed(y, a[1].width)
            return {"eq": x == y, "ult": x < y, "ule": x <= y, "slt": x < y, "sle": x <= y}[op]
        if op in T._FOLD:
            return T._FOLD[op](self(a[0]), self(a[1]), w) & T.mask(w)
        if op == "extract":
            return (self(a[0]) >> a[1]) & T.mask(w)
        if op == "zext":
            return self(a[0])
        if op == "sext":
            return T.signed(self(a[0]), a[0].width) & T.mask(w)
        if op == "concat":
            v, pos = 0, 0
            for p in a:
                v |= self(p) << pos
                pos += p.width
            return v
        if op == "fbits":
            return T.float_of_bits(self(a[0]), w)
        if op == "fbitsof":
            return T.bits_of_float(self(a[0]), w)
        if op == "i2f":
            n = self(a[0])
            n = T.signed(n, a[0].width) if a[1][0] == "s" else n
            return _round(float(n), w)
        if op == "f2i":
            return _f2i(self(a[0]), a[1], a[2] if len(a) > 2 else "rzi")
        if op == "fcvt":
            return _round(self(a[0]), w, a[1])
        if op == "frnd":
            x = self(a[0])
            if not math.isfinite(x):
                return x
            return float({"rni": round, "rzi": math.trunc, "rmi": math.floor, "rpi": math.ceil}[a[1]](x))
        if op == "fsat":
            x = self(a[0])
            return 0.0 if math.isnan(x) else min(max(x, 0.0), 1.0)
        if op == "fcmp":
            return _fcmp(a[0], self(a[1]), self(a[2]))
        if op == "ftest":
            x = self(a[1])
            return {
                "finite": math.isfinite(x),
                "infinite": math.isinf(x),
                "number": not math.isnan(x),
                "notanumber": math.isnan(x),
                "normal": math.isfinite(x) and abs(x) >= 2.0**-126,
                "subnormal": x != 0 and abs(x) < 2.0**-126,
            }[a[0]]
        if t.sort == "f" and op in _FLOAT:
            with np.errstate(all="ignore"):
                return _round(_FLOAT[op](*(self(x) for x in a)), w)
        raise Unknown(op)

    def _connective(self, args: tuple, stop: bool) -> bool:
        """and (stop at a False) / or (stop at a True), a conjunct without a value deciding nothing."""
        unknown = False
        for x in args:
            try:
                if self(x) == stop:
                    return stop
            except Unknown:
                unknown = True
        if unknown:
            raise Unknown("a connective")
        return not stop


def _div(a: float, b: float) -> float:
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


_FLOAT = {
    "fadd": lambda a, b: a + b,
    "fsub": lambda a, b: a - b,
    "fmul": lambda a, b: a * b,
    "fdiv": _div,
    "ffma": lambda a, b, c: a * b + c,  # in float64, rounded once
    "fneg": lambda a: -a,
    "fabs": abs,
    "fmax": lambda a, b: b if math.isnan(a) else a if math.isnan(b) else max(a, b),
    "fmin": lambda a, b: b if math.isnan(a) else a if math.isnan(b) else min(a, b),
    "ex2": lambda a: 2.0**a if a < 1024 else math.inf,
    "lg2": lambda a: math.log2(a) if a > 0 else (-math.inf if a == 0 else math.nan),
    "rcp": lambda a: _div(1.0, a),
    "sqrt": lambda a: math.sqrt(a) if a >= 0 else math.nan,
    "rsqrt": lambda a: 1 / math.sqrt(a) if a > 0 else (math.inf if a == 0 else math.nan),
    "copysign": lambda a, b: math.copysign(b, a),
}


def evaluate(t: T.Term, given: dict):
    """t's value with the atoms of `given` set (raises Unknown when it needs another atom)."""
    return Evaluator(given)(t)
