"""The arithmetic of PTX instructions on terms, one lane at a time (no memory, no control flow).

`alu(ins, args)` computes the destination value(s) of an arithmetic, logic, comparison, conversion or
float instruction from its source operands (terms already read by the executor). Integer semantics are
exact bit-vector semantics (wrap-around, signedness from the type); float instructions build float terms
(structural, see terms.py). An instruction this module does not know raises Unsupported.
"""

from __future__ import annotations

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.terms import Term

TYPES = {"b8", "u8", "s8", "b16", "u16", "s16", "f16", "bf16", "b32", "u32", "s32", "f32", "b64", "u64", "s64", "f64"}
TYPES |= {"pred", "f16x2", "bf16x2"}


class Unsupported(Exception):
    """An instruction or pattern the engine does not model (the kernel is then not analysed)."""


def types_of(mods: tuple[str, ...]) -> list[str]:
    return [m for m in mods if m in TYPES]


def _w(t: str) -> int:
    return {"bf16": 16, "f16": 16, "pred": 1, "f16x2": 32, "bf16x2": 32}.get(t) or int(t[1:])


def fit(v: Term, w: int) -> Term:
    """A register read at another width than it holds (PTX allows a wider register for a narrower type)."""
    if v.sort == "bool" or v.width == w:
        return v
    return T.zext(v, w) if v.width < w else T.extract(v, 0, w)


def as_float(v: Term, w: int) -> Term:
    if v.sort == "f":
        return v
    return T.fbits(fit(v, w), w)


def as_bits(v: Term, w: int) -> Term:
    if v.sort == "f":
        return fit(T.bits(v), w)
    if v.sort == "bool":
        return T.bool_to_bv(v, w)
    return fit(v, w)


_CMP = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "lo": "lt", "ls": "le"}
_CMP |= {"hi": "gt", "hs": "ge"}


def compare(op: str, ty: str, a: Term, b: Term) -> Term:
    if ty[0] == "f":
        w = _w(ty)
        return T.mk("fcmp", (op, as_float(a, w), as_float(b, w)), "bool", 1)
    w = _w(ty)
    a, b = as_bits(a, w), as_bits(b, w)
    base = _CMP.get(op)
    if base is None:
        raise Unsupported(f"comparison {op}")
    if base in ("eq", "ne"):
        return T.cmp(base, a, b)
    sign = "s" if ty[0] == "s" and op not in ("lo", "ls", "hi", "hs") else "u"
    return T.cmp(sign + base[:1] + ("t" if base[1] == "t" else "e"), a, b)


def _int2(op: str, ty: str, a: Term, b: Term) -> Term:
    w = _w(ty)
    return T.bv(op, as_bits(a, w), as_bits(b, w))


def alu(ins, args: list[Term]) -> Term | list[Term]:
    """The destination value of `ins` (a syntax.Instr) given its source operand values."""
    op, mods = ins.opcode, ins.mods
    tys = types_of(mods)
    ty = tys[-1] if tys else "b32"
    fl = ty[0] == "f" and ty != "f16x2"
    if fl and op in _FLOAT:
        return _FLOAT[op](mods, ty, args)
    w = _w(ty) if ty != "pred" else 1
    if op == "add":
        return _int2("add", ty, args[0], args[1])
    if op == "sub":
        return _int2("sub", ty, args[0], args[1])
    if op in ("mul", "mad"):
        if "wide" in mods:
            ext = T.sext if ty[0] == "s" else T.zext
            p = T.bv("mul", ext(as_bits(args[0], w), 2 * w), ext(as_bits(args[1], w), 2 * w))
            return T.bv("add", p, as_bits(args[2], 2 * w)) if op == "mad" else p
        if "hi" in mods:
            ext = T.sext if ty[0] == "s" else T.zext
            full = T.bv("mul", ext(as_bits(args[0], w), 2 * w), ext(as_bits(args[1], w), 2 * w))
            p = T.extract(full, w, w)
        else:
            p = _int2("mul", ty, args[0], args[1])
        return T.bv("add", p, as_bits(args[2], w)) if op == "mad" else p
    if op in ("div", "rem"):
        kind = ("s" if ty[0] == "s" else "u") + ("div" if op == "div" else "rem")
        return _int2(kind, ty, args[0], args[1])
    if op in ("and", "or", "xor"):
        if ty == "pred":
            a, b = args[0], args[1]
            if op == "and":
                return T.and_(a, b)
            if op == "or":
                return T.or_(a, b)
            return T.or_(T.and_(a, T.not_(b)), T.and_(T.not_(a), b))
        return _int2(op, ty, args[0], args[1])
    if op == "not":
        return T.not_(args[0]) if ty == "pred" else T.bnot(as_bits(args[0], w))
    if op == "neg":
        return T.bv("sub", T.const(0, w), as_bits(args[0], w))
    if op == "abs":
        a = as_bits(args[0], w)
        return T.ite(T.cmp("slt", a, T.const(0, w)), T.bv("sub", T.const(0, w), a), a)
    if op in ("min", "max"):
        kind = ("s" if ty[0] == "s" else "u") + op
        return _int2(kind, ty, args[0], args[1])
    if op == "shl":
        return T.bv("shl", as_bits(args[0], w), fit(as_bits(args[1], 32), w))
    if op == "shr":
        return T.bv("ashr" if ty[0] == "s" else "lshr", as_bits(args[0], w), fit(as_bits(args[1], 32), w))
    if op == "bfe":
        return _bfe(ty, args)
    if op == "selp":
        return T.ite(args[2], as_bits(args[0], w), as_bits(args[1], w))
    if op == "setp":
        c = compare(mods[0], ty, args[0], args[1])
        if len(args) > 2:  # setp.cmp.and / .or with a third predicate
            comb = mods[1] if len(mods) > 2 else "and"
            c = T.and_(c, args[2]) if comb == "and" else T.or_(c, args[2])
        return c
    if op == "cvt":
        return _cvt(mods, args[0])
    if op == "shf":
        return _shf(mods, args)
    if op == "prmt" and len(args) == 3 and T.is_const(args[2]):
        return _prmt(args)
    if op in ("popc", "clz", "brev", "bfind", "madc", "addc", "subc", "mul24", "mad24", "sad", "bfi", "prmt"):
        return T.fresh(op, w if op not in ("popc", "clz", "bfind") else 32)
    raise Unsupported(f"instruction {'.'.join((op, *mods))}")


def _bfe(ty: str, args: list[Term]) -> Term:
    w = _w(ty)
    a = as_bits(args[0], w)
    pos, ln = args[1], args[2]
    if not (T.is_const(pos) and T.is_const(ln)):
        raise Unsupported("bfe with a variable field")
    p, n = T.value(pos) & 0xFF, T.value(ln) & 0xFF
    n = min(n, w - p) if p < w else 0
    if n <= 0:
        return T.const(0, w)
    field = T.extract(a, p, n)
    return T.sext(field, w) if ty[0] == "s" else T.zext(field, w)


def _shf(mods: tuple[str, ...], args: list[Term]) -> Term:
    a, b, n = (as_bits(x, 32) for x in args)
    if not T.is_const(n):
        return T.fresh("shf", 32)
    k = T.value(n) & (31 if "wrap" in mods else 0xFFFFFFFF)
    k = min(k, 32)
    both = T.concat([a, b])  # a low, b high
    if "l" in mods:
        return T.extract(both, 32 - k, 32) if k else b
    return T.extract(both, k, 32) if k < 32 else b


def _prmt(args: list[Term]) -> Term:
    a, b = as_bits(args[0], 32), as_bits(args[1], 32)
    sel = T.value(args[2])
    src = [T.extract(a, 8 * i, 8) for i in range(4)] + [T.extract(b, 8 * i, 8) for i in range(4)]
    out = []
    for i in range(4):
        s = (sel >> (4 * i)) & 0xF
        if s & 8:
            return T.fresh("prmt", 32)
        out.append(src[s & 7])
    return T.concat(out)


def _cvt(mods: tuple[str, ...], a: Term) -> Term:
    tys = types_of(mods)
    dst, src = tys[0], tys[1]
    wd, ws = _w(dst), _w(src)
    if dst[0] == "f" and src[0] == "f":
        x = as_float(a, ws)
        if wd == ws:
            rnd = next((m for m in mods if m in ("rni", "rzi", "rmi", "rpi")), None)
            x = T.mk("frnd", (x, rnd), "f", wd) if rnd else x
            return T.mk("fsat", (x,), "f", wd) if "sat" in mods else x  # clamped to [0, 1] (NaN: 0)
        if x.op == "fconst":
            return _round_const(x.args[0], dst)
        return T.mk("fcvt", (x, dst), "f", wd)
    if dst[0] == "f":
        v = as_bits(a, ws)
        if T.is_const(v):
            n = T.signed(T.value(v), ws) if src[0] == "s" else T.value(v)
            return _round_const(float(n), dst)
        return T.mk("i2f", (v, src), "f", wd)
    if src[0] == "f":
        rnd = next((m for m in mods if m in ("rni", "rzi", "rmi", "rpi")), "rzi")  # the integer rounding
        return T.mk("f2i", (as_float(a, ws), dst, rnd), "bv", wd)
    v = as_bits(a, ws)
    if wd <= ws:
        return T.extract(v, 0, wd)
    return T.sext(v, wd) if src[0] == "s" else T.zext(v, wd)


# ------------------------------------------------------------------ floats


def _f(args: list[Term], w: int) -> list[Term]:
    return [as_float(a, w) for a in args]


def _fl(name: str, n: int):
    def run(mods, ty, args):
        w = _w(ty)
        return T.fop(name, *_f(args[:n], w), w=w)

    return run


def _fdiv(mods, ty, args):
    w = _w(ty)
    a, b = _f(args[:2], w)
    return T.fop("fdiv", a, b, w=w)


def _round_const(x: float, dst: str) -> Term:
    import numpy as np

    if dst == "f16":
        return T.fconst(float(np.float16(x)), 16)
    if dst == "bf16":
        b = T.bits_of_float(x, 32) & 0xFFFF0000
        return T.fconst(T.float_of_bits(b, 32), 16)
    return T.fconst(x, _w(dst))


_FLOAT = {
    "add": _fl("fadd", 2),
    "sub": _fl("fsub", 2),
    "mul": _fl("fmul", 2),
    "fma": _fl("ffma", 3),
    "mad": _fl("ffma", 3),
    "div": _fdiv,
    "max": _fl("fmax", 2),
    "min": _fl("fmin", 2),
    "neg": _fl("fneg", 1),
    "abs": _fl("fabs", 1),
    "ex2": _fl("ex2", 1),
    "lg2": _fl("lg2", 1),
    "rcp": _fl("rcp", 1),
    "sqrt": _fl("sqrt", 1),
    "rsqrt": _fl("rsqrt", 1),
    "sin": _fl("sin", 1),
    "cos": _fl("cos", 1),
    "tanh": _fl("tanh", 1),
    "copysign": _fl("copysign", 2),
    "selp": lambda mods, ty, args: T.fite(args[2], *_f(args[:2], _w(ty))),
    "setp": lambda mods, ty, args: compare(mods[0], ty, args[0], args[1]),
    "testp": lambda mods, ty, args: T.mk("ftest", (mods[0], as_float(args[0], _w(ty))), "bool", 1),
    "cvt": lambda mods, ty, args: _cvt(mods, args[0]),
}
