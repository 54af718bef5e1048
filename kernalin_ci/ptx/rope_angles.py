"""RoPE's rotation: signs, the angle's position, its frequency and its precision, from the float graph.

Each rotated element out[t, h, i] (i < rotary_dim) must be x[i] cos a -/+ x[p] sin a, p the partner of
i: minus for the first of a pair (neox i < r/2, gptj i even), plus for the second, and
a = positions[t] * base^(-2j/r), j the pair's frequency index (neox i mod r/2, gptj i // 2).
- The stored value, taken under the store's own path (a tensor chosen by `c ? q : k` loads q where the
  store is to q), is put in linear form over the loaded x elements (masked loads count as the element;
  the store's guard carries the mask); each element's coefficient must be +/- one factor.
- A factor f is sin a or cos a when it is `sin.approx`/`cos.approx` of a, or when, a being the operand of
  the range reduction round(a * 2/pi) of libdevice's or CUDA's sinf/cosf/sincosf, f with a replaced by a
  symbol evaluates (evaluate.py) to sin or cos of it at the 14 ANGLES; or it is an element of a
  [rows, rotary_dim] table holding [cos | sin] (one tensor for both), or of a separate cos or sin table
  (the facts' `TrigTable`: which one is which, recognised on the capture call's data). A factor that is
  none of these leaves the rotation *not proved*, never a finding.
- Each element's dim (of the output and of x) is proved a constant of its thread (InnerDims: from the
  offset's linear form, else one query per distinct lane-independent offset part), so the rest is read per
  element: a wrong sign, frequency or precision found there holds in every program that stores the
  element. A store whose element depends on a loop of at most ITERATIONS iterations (a CUDA thread
  striding over (head, pair) by blockDim: its dim changes between iterations) is read once per
  iteration, the iteration substituted; a finding of an iteration stands when the solver shows it runs.
- Signs (`rope-sign`): x[i] carries +cos a, its partner -sin a for the first of a pair, +sin a for the
  second. An element rotated with another partner is rope_reads.py's (`rope-pairing`), not checked here.
- Precision (`precision`): a is formed at float32 or wider; a table is as wide as x.
- Position (`rope-position`): a's only integer-to-float factor, or the table row's position element, is
  positions[t'] with t' == t (solver); an angle whose integer is not from positions is a finding, a table
  row without one (a table per token, gathered by the caller) is not proved.
- Frequency (`rope-frequency`): a's other factors evaluate to base^(-2j/r) for the element's j, or the
  table column is j (mod r/2), or a separate table's column holds frequency j. Table row (`stride`): the
  row decoded from the offset is the position (a separate table by token: the element's own token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.context import Context, Result, decode, lanes_as_one, linear_offset
from kernalin_ci.ptx.evaluate import Evaluator, Unknown, evaluate
from kernalin_ci.ptx.executor import PtxAccess, PtxTrace
from kernalin_ci.ptx.rope_reads import not_tokens_heads_dim
from kernalin_ci.ptx.softmax import as_float

TWO_OVER_PI = 0.6366197466850281  # libdevice's sinf/cosf reduce a by the quadrant round(a * 2/pi)
# angles at which a coefficient must be sin or cos (float32 values; below 105615, where libdevice switches to
# Payne-Hanek reduction, and past every quadrant boundary of the first turns)
ANGLES = tuple(
    float(np.float32(x))
    for x in (0, 0.5, 1, 1.5707964, 2, 3.1415927, 4, 5.5, 17.25, 100.1, 1234.5, 4097.3, 30001.7, 99999.9)
)
TOL = 2e-6
ITERATIONS = 64  # a store's element that depends on a loop of at most this many iterations: one instance each

Linear = dict  # x leaf -> list of (sign, factors tuple)


def _is_leaf(t: T.Term, src: str) -> bool:
    return t.op == "load" and t.args[0] == src


def _strip(t: T.Term) -> T.Term:
    """An input element as used: its float, widened (fcvt), masked to 0 off the tile (fite(m, x, 0))."""
    while True:
        if t.op == "fite" and t.args[2].op == "fconst" and t.args[2].args[0] == 0.0:
            t = t.args[1]
        elif t.op == "fcvt":
            t = t.args[0]
        elif t.op == "fbits":
            t = t.args[0]
        else:
            return t


def _has_src(t: T.Term, src: str, memo: dict) -> bool:
    r = memo.get(id(t))
    if r is None:
        r = _is_leaf(t, src) or any(isinstance(a, T.Term) and _has_src(a, src, memo) for a in t.args)
        memo[id(t)] = r
    return r


def linear(v: T.Term, src: str, memo: dict) -> Linear | None:
    """v as sum of sign * (product of x-free factors) * x_leaf; None when it is not of that form."""
    s = _strip(v)
    if _is_leaf(s, src):
        return {s: [(1, ())]}
    if not _has_src(v, src, memo):
        return {} if v.op == "fconst" and v.args[0] == 0.0 else None
    op, a = v.op, v.args
    if op == "fcvt":
        return linear(a[0], src, memo)
    if op == "fneg":
        f = linear(a[0], src, memo)
        return None if f is None else {k: [(-s_, fs) for s_, fs in m] for k, m in f.items()}
    if op in ("fadd", "fsub"):
        f, g = linear(a[0], src, memo), linear(a[1], src, memo)
        if f is None or g is None:
            return None
        out = {k: list(m) for k, m in f.items()}
        for k, m in g.items():
            out.setdefault(k, []).extend((-s_ if op == "fsub" else s_, fs) for s_, fs in m)
        return out
    if op == "fmul":
        return _scaled(a[0], a[1], src, memo)
    if op == "ffma":
        f, g = _scaled(a[0], a[1], src, memo), linear(a[2], src, memo)
        if f is None or g is None:
            return None
        out = {k: list(m) for k, m in f.items()}
        for k, m in g.items():
            out.setdefault(k, []).extend(m)
        return out
    return None


def _scaled(x: T.Term, y: T.Term, src: str, memo: dict) -> Linear | None:
    if _has_src(x, src, memo) and _has_src(y, src, memo):
        return None
    if _has_src(y, src, memo):
        x, y = y, x
    f = linear(x, src, memo)
    if f is None:
        return None
    sign = 1
    while y.op == "fneg":
        y, sign = y.args[0], -sign
    return {k: [(sign * s_, (*fs, y)) for s_, fs in m] for k, m in f.items()}


def trig_arg(f: T.Term) -> T.Term | None:
    """The angle a of libdevice's reduction round(a * 2/pi) inside f, when there is exactly one."""
    found = set()
    for x in T.walk(f):
        if x.op == "fmul":
            c = [y for y in x.args if y.op == "fconst" and abs(y.args[0] - TWO_OVER_PI) < 1e-7]
            if c:
                found.add(next((y for y in x.args if y is not c[0]), c[0]))
    return next(iter(found)) if len(found) == 1 else None


def recognise(f: T.Term, env: dict[str, int], cache: dict) -> tuple[str, T.Term] | None:
    """("sin" | "cos", a) when f, as a function of the operand a of its range reduction, evaluates to
    sin a or cos a at every angle of ANGLES; else None. f with a replaced by one symbol is the same term for
    the lanes and iterations that share their code, so it is evaluated once. Any other atom f reads (in
    lockstep, a loop's exit may test other lanes' angles) is set as at program 0: every index element (the
    positions) 1, every other loaded element 0.5, block indices and shape symbols from `env`."""
    if id(f) in cache:
        return cache[id(f)]
    if f.op in ("sin", "cos"):  # sin.approx / cos.approx (CUDA's __sinf, __cosf)
        return f.op, f.args[0]
    a = trig_arg(f)
    out = None
    if a is not None and a.width == 32:
        angle = T.mk("sym", ("__angle",), "f", 32)  # a's place in f, for evaluating f at ANGLES
        g = T.substitute(f, {a: angle})
        if id(g) not in cache:
            given = {x: _sample_value(x, env) for x in T.walk(g) if x.op in ("select", "sym", "load")}
            given = {x: v for x, v in given.items() if v is not None}
            got = []
            try:
                for x in ANGLES:
                    got.append((x, float(Evaluator({**given, angle: x})(g))))
            except (Unknown, KeyError, ValueError, OverflowError):
                got = []
            fits = [n for n, fn in (("sin", math.sin), ("cos", math.cos)) if all(abs(y - fn(x)) <= TOL for x, y in got)]
            cache[id(g)] = fits[0] if got and fits else None
        out = (cache[id(g)], a) if cache[id(g)] else None
    cache[id(f)] = out
    return out


def _sample_value(x: T.Term, env: dict[str, int]) -> int | None:
    if x.op == "select":
        return 1
    if x.op == "load":
        return T.bits_of_float(0.5, x.width) if x.width in (16, 32, 64) else None
    return env.get(x.args[0])


def _sample(ctx: Context) -> dict[str, int]:
    """Block indices and shape symbols at program 0 of the captured sizes (for recognising sin/cos)."""
    return {f"ctaid.{x}": 0 for x in "xyz"} | {n: s.captured for n, s in ctx.facts.symbols.items()}


def _factors(a: T.Term) -> list[T.Term]:
    if a.op == "fmul":
        return _factors(a.args[0]) + _factors(a.args[1])
    return [a]


def _integer_of(f: T.Term) -> T.Term | None:
    while f.op == "fcvt":
        f = f.args[0]
    if f.op != "i2f":
        return None
    p = f.args[0]
    while p.op in ("sext", "zext", "extract"):
        p = p.args[0]
    return p


def _narrow(a: T.Term) -> str | None:
    for x in T.walk(a):
        if x.op == "fcvt" and x.args[1] in ("f16", "bf16"):
            return x.args[1]
    return None


class InnerDims:
    """The last coordinate of an element from its byte offset X + c, proved once per X: when X is a
    multiple of the row pitch M (the second-to-last stride, every outer stride a multiple of it, the last
    stride 1), the element's dim is (c mod M) / elsize in every program. One solver query per distinct X
    (and path: `under`, the access's path condition, where X is a multiple of M only on it: LMDeploy's
    `(head_id - BLOCK_QH) * stride` for the K heads, negative on the Q side)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.proved: dict[tuple[int, int], bool] = {}

    def __call__(self, info, off: T.Term, under: T.Term = T.TRUE) -> int | None:
        st, shape = info.strides, info.shape
        if len(st) < 2:
            return None
        last, pitch, dim = _const(st[-1]), _const(st[-2]), _const(shape[-1])
        if last != 1 or pitch is None or dim is None or not 0 < dim <= pitch:
            return None
        if any(c % pitch for e in st[:-2] for _, c in e.terms):
            return None
        m = pitch * info.elsize
        atoms, c0 = linear_offset(self.ctx, off)
        if all(k % m == 0 for k in atoms.values()):  # X = sum(k * atom), k multiples of the pitch: exact
            i = (c0 % m) // info.elsize
            return i if c0 % info.elsize == 0 and i < dim else None
        if off.op == "add" and T.is_const(off.args[1]):
            x, c = off.args[0], T.signed(T.value(off.args[1]), off.width)
        elif T.is_const(off):
            x, c = T.const(0, off.width), T.signed(T.value(off), off.width)
        else:
            x, c = off, 0
        key = (id(x), m, under.serial)
        if key not in self.proved:
            rest = T.bv("urem", x, T.const(m, x.width))
            self.proved[key] = (
                T.is_const(x)
                or self.ctx.ask(T.and_(under, T.not_(T.cmp("eq", rest, T.const(0, x.width))))).status == "unsat"
            )
        if not self.proved[key] or (c % m) % info.elsize:
            return None
        i = (c % m) // info.elsize
        return i if i < dim else None


def _const(e) -> int | None:
    return e.at({}) if all(not m for m, _ in e.terms) else None


def _sample(ctx: Context) -> dict[str, int]:
    """Block indices and shape symbols at program 0 of the captured sizes (for recognising sin/cos)."""
    return {f"ctaid.{x}": 0 for x in "xyz"} | {n: s.captured for n, s in ctx.facts.symbols.items()}


def _partner(style: str, r: int, i: int) -> int:
    if style == "gptj":
        return i ^ 1
    return i + r // 2 if i < r // 2 else i - r // 2


def _first(style: str, r: int, i: int) -> bool:
    return i % 2 == 0 if style == "gptj" else i < r // 2


@dataclass
class _Group:
    """What the stores of one instruction showed: violations found, formulas to prove, why not proved."""

    why: str = ""  # why the signs (and everything after them) are not proved
    why_angle: str = ""  # why the angle's frequency is not proved
    signs: list[Result] = field(default_factory=list)
    freqs: list[Result] = field(default_factory=list)
    findings: list[Result] = field(default_factory=list)
    rows: list[T.Term] = field(default_factory=list)  # the angle's (or table row's) position: another token's
    pitch: list[T.Term] = field(default_factory=list)  # a table read at a row other than its position
    token_rows: list[T.Term] = field(default_factory=list)  # a per-token cos or sin table read at another token's row
    n_signs: int = 0
    n_freqs: int = 0

    def cannot(self, why: str) -> None:
        self.why = self.why or why


class RopeAngles:
    def __init__(self, trace: PtxTrace, ctx: Context):
        self.ctx, self.c = ctx, ctx.contract
        self.pos_info = ctx.facts.tensors.get(self.c.positions) if self.c.positions else None
        self.cache: dict = {}
        self.env = _sample(ctx)
        self.env = _sample(ctx)
        self.inner = InnerDims(ctx)
        self.r, self.half = self.c.rotary_dim, self.c.rotary_dim // 2
        self.trace = trace

    def run(self) -> list[Result]:
        out: list[Result] = []
        for dst_name, src_name in self.c.rotations.items():
            dst, src = self.ctx.facts.tensors.get(dst_name), self.ctx.facts.tensors.get(src_name)
            stores = [a for a in self.trace.accesses if a.kind == "st" and a.tensor == dst_name]
            if dst is None or src is None or not stores:
                continue
            cause = not_tokens_heads_dim(dst_name, dst, src_name, src)
            if cause:
                out.append(
                    Result(f"{dst_name}'s rotation angles and signs", "not-proved", self.ctx.domain, cause=cause)
                )
                continue
            by_instr: dict[int, list[PtxAccess]] = {}
            for a in stores:
                by_instr.setdefault(a.instr.index, []).append(a)
            for group in by_instr.values():
                g = _Group()
                memo: dict = {}
                for a in group:
                    for inst, enumerated in self.instances(a):
                        seen = (len(g.signs), len(g.freqs), len(g.findings))
                        self.store(g, inst, dst_name, dst, src_name, src, memo)
                        grown = [n for n, x in zip(seen, (g.signs, g.freqs, g.findings)) if len(x) > n]
                        # an iteration's finding stands when the iteration runs (one query; a kind of finding
                        # already shown by an earlier one needs none: the verdict names the first)
                        if enumerated and grown and (min(grown) > 0 or self.ctx.ask(inst.guard).status != "sat"):
                            del g.signs[seen[0] :], g.freqs[seen[1] :], g.findings[seen[2] :]
                out += self.verdicts(g, group, dst_name)
        return out

    def instances(self, a: PtxAccess) -> list[tuple[PtxAccess, bool]]:
        """The store as it happens, under its own path: the value with the path's conditions decided (a
        pointer chosen by `c ? q : k` loads q where the store is to q), and, where its element depends on
        the iteration of a loop that provably runs at most ITERATIONS times (a thread striding over
        (head, pair) by blockDim), one instance per iteration: each with its dims constant again. The
        bool: the instance is one iteration (a finding there asks the solver that the iteration runs)."""
        path = self.ctx.path(a)
        known: dict = {}
        for x in path.args if path.op == "and" else (path,):
            if x.op == "not":
                known[x.args[0]] = T.FALSE
            elif x.sort == "bool":
                known[x] = T.TRUE
        ks = [
            lp.k
            for lp in self.trace.loops.values()
            if lp.k in T.below(a.offset, "sym") or lp.k in T.below(a.value, "sym")
        ]
        spans = [self.ctx.bounds.get(k.args[0], (0, 1 << 40))[1] + 1 for k in ks]
        if not ks or math.prod(spans) > ITERATIONS:
            return [(replace(a, value=T.substitute(a.value, known)), False)]
        out = []
        for n in range(math.prod(spans)):
            table, rest = {}, n
            for k, span in zip(ks, spans):
                table[k], rest = T.const(rest % span, k.width), rest // span
            guard = T.substitute(path, table)
            if guard is T.FALSE:
                continue
            done = {**table, **known}
            inst = replace(
                a,
                offset=T.substitute(a.offset, table),
                value=T.substitute(a.value, done),
                guard=guard,
                cond=(),
            )
            out.append((inst, True))
        return out

    def coefficient(self, f: T.Term, src_name: str, src) -> tuple[str, tuple] | None:
        """("cos" | "sin", source): source ("angle", a) for libdevice's sin/cos of a, ("table", load, dim)
        for an element of a [rows, rotary_dim] float table laid out [cos | sin] (vLLM's cos_sin_cache)."""
        got = recognise(f, self.env, self.cache)
        if got is not None:
            return got[0], ("angle", got[1])
        x = _strip(f)
        info = self.ctx.facts.tensors.get(x.args[0]) if x.op == "load" else None
        if info is not None and info.trig is not None:  # a separate cos or sin table (the facts say which)
            col = self.inner(info, x.args[1])
            return None if col is None else (info.trig.fn, ("trig", x, info.trig.frequency(col, self.half)))
        x = self.table_of(f, src_name)
        if x is None:
            return None
        col = self.inner(self.ctx.facts.tensors[x.args[0]], x.args[1])
        if col is None:
            return None
        return ("cos" if col < self.half else "sin"), ("table", x, col)

    def store(self, g: _Group, a: PtxAccess, dst_name: str, dst, src_name: str, src, memo: dict) -> None:
        c, ctx, r, half = self.c, self.ctx, self.r, self.half
        ins = a.instr
        form = linear(as_float(a.value), src_name, memo)
        if form is None:
            return g.cannot("a stored value is not a linear form of the input")
        if all(m == [(1, ())] for m in form.values()):
            return None  # a copy (the pass-through dims: rope_reads proves which)
        (t, _h, _i), ok = decode(ctx, dst, a.offset, "out", shared=True)
        base = T.and_(ctx.path(a), ok, ctx.lane_is(a))
        ci = self.inner(dst, a.offset, ctx.path(a))
        if ci is None:
            return g.cannot("a stored element's dim is not proved a constant of its thread")
        if not c.angle_skip:  # a [positions, rotary_dim] table's row, whatever its layout
            loads = {self.table_of(fs[0], src_name) for m in form.values() for _, fs in m if len(fs) == 1}
            for n, load in enumerate(x for x in loads if x is not None):
                self.table_rows(g, a, load, n, base, t, dst_name)
        coefs = []
        for leaf, mono in form.items():
            got = self.coefficient(mono[0][1][0], src_name, src) if len(mono) == 1 and len(mono[0][1]) == 1 else None
            cj = self.inner(src, leaf.args[1], ctx.path(a))
            if got is None or cj is None:
                return g.cannot("a coefficient is not recognised as sin or cos of an angle or a [cos | sin] table")
            if ci >= r or cj not in (ci, _partner(c.style, r, ci)):
                return g.cannot(f"dim {ci} is not rotated with its {c.style} partner (rope_reads says which)")
            coefs.append((cj, got[0], got[1], mono[0][0]))
        sources = [s for _, _, s, _ in coefs]
        tables = {s[1].args[0] for s in sources if s[0] == "table"}
        if tables and (len(tables) > 1 or any(s[0] != "table" for s in sources)):
            return g.cannot("the cos and sin of one element are not one [cos | sin] table row")
        if tables and {s[2] < half for s in sources} != {True, False}:
            return g.cannot("the cos and sin of one element are not one [cos | sin] table row (separate tables?)")
        if any(s[0] == "trig" for s in sources) and any(s[0] != "trig" for s in sources):
            return g.cannot("the cos and sin of one element come from a table and from the kernel's own angle")
        for cj, name, _source, sign in coefs:
            term = f"{'+' if sign > 0 else '-'}x[{cj}] {name} a"
            g.n_signs += 1
            if cj == ci and not (name == "cos" and sign > 0):
                g.signs.append(_found("rope-sign", ins, a, f"dim {ci} = ... {term}: wants +x[{ci}] cos a"))
            elif cj != ci:
                want = -1 if _first(c.style, r, ci) else 1
                if not (name == "sin" and sign == want):
                    wants = f"{'-' if want < 0 else '+'}x[{cj}] sin a"
                    g.signs.append(_found("rope-sign", ins, a, f"dim {ci} = ... {term}: wants {wants}"))
        want_j = ci % half if c.style != "gptj" else ci // 2
        if all(s[0] == "table" for s in sources):
            return self.table(g, a, sources, base, t, want_j, src, dst_name)
        if all(s[0] == "trig" for s in sources):
            return self.trig(g, a, sources, base, t, want_j, src, dst_name)
        angles = {s[1] if s[0] == "angle" else None for s in sources}
        if len(angles) != 1 or None in angles:
            return g.cannot("the coefficients of one element do not share one angle")
        ang = next(iter(angles))
        narrow = _narrow(ang)
        if narrow:
            what = f"{dst_name}'s angle is formed at float32"
            return g.findings.append(
                _found("precision", ins, a, f"the angle of dim {ci} passes through {narrow}", what)
            )
        if c.angle_skip:
            return None
        fs = _factors(ang)
        ints = [p for p in (_integer_of(f) for f in fs) if p is not None]
        if len(ints) != 1:
            return g.cannot("the angle is not a product of one integer and frequency factors")
        if not self.position(g, a, ints[0], base, t, dst_name):
            return None
        try:
            f = 1.0
            for x in fs:
                if _integer_of(x) is None:
                    f *= float(evaluate(x, {}))
        except Unknown:
            g.why_angle = (
                g.why_angle or "the frequency is not a constant of the launch (a loaded inverse-frequency table?)"
            )
            return None
        jf = -math.log(f) / math.log(c.base) * half if f > 0 else math.nan
        g.n_freqs += 1
        if not (math.isfinite(jf) and abs(jf - want_j) < 1e-3):
            wrong = f"dim {ci}'s frequency is {f:.6g} = base^(-2*{jf:.3f}/{r}), not base^(-2*{want_j}/{r})"
            g.freqs.append(_found("rope-frequency", ins, a, wrong))
        return None

    def position(self, g: _Group, a: PtxAccess, p: T.Term, base: T.Term, t: T.Term, dst_name: str) -> bool:
        """The integer p (the angle's factor, or a table's row) is positions[t] of the element's token."""
        c = self.c
        if p.op == "select" and p.args[0] == c.positions and self.pos_info is not None:
            (tp,), okp = decode(self.ctx, self.pos_info, p.args[1], "pos", shared=True)
            g.rows.append(T.and_(base, okp, T.not_(T.cmp("eq", tp, t))))
            return True
        if not any(x.op == "select" and x.args[0] == c.positions for x in T.walk(p)):
            what = f"{dst_name}'s angle takes positions[t] of its own token"
            g.findings.append(_found("rope-position", a.instr, a, f"its position term is {T.show(p, 4)}", what))
            return False
        g.cannot("the angle's position term is not one positions element")
        return False

    def table(self, g: _Group, a: PtxAccess, sources: list, base: T.Term, t: T.Term, want_j: int, src, dst_name):
        info = self.ctx.facts.tensors[sources[0][1].args[0]]
        if _narrow_table(g, a, info, src, dst_name, "table"):
            return None
        for _, _load, col in sources:
            g.n_freqs += 1
            if col % self.half != want_j:
                wrong = f"the table column {col} (frequency {col % self.half}) for frequency {want_j}"
                g.freqs.append(_found("rope-frequency", a.instr, a, wrong))
        if self.c.angle_skip:
            return None
        return None

    def trig(self, g: _Group, a: PtxAccess, sources: list, base: T.Term, t: T.Term, want_j: int, src, dst_name):
        """Separate cos and sin tables: each as precise as the input, read at the column of the element's
        frequency and at the row of its own token (or of its position, for a table by position)."""
        for n, (_, load, freq) in enumerate(sources):
            info = self.ctx.facts.tensors[load.args[0]]
            if _narrow_table(g, a, info, src, dst_name, f"{info.trig.fn} table"):
                return None
            g.n_freqs += 1
            if freq != want_j:
                wrong = f"the {info.trig.fn} table's column holds frequency {freq}, the element's is {want_j}"
                g.freqs.append(_found("rope-frequency", a.instr, a, wrong))
            if info.trig.rows == "position":
                self.table_rows(g, a, load, n, base, t, dst_name)
                continue
            coords, okt = decode(self.ctx, info, load.args[1], f"trig{n}", shared=True)
            g.token_rows.append(T.and_(base, okt, T.not_(T.cmp("eq", coords[-2], t))))
        return None

    def table_rows(self, g: _Group, a: PtxAccess, load: T.Term, n: int, base: T.Term, t: T.Term, dst_name: str):
        """A [rows, rotary_dim] table element is read at row positions[t] of the element's own token."""
        info = self.ctx.facts.tensors[load.args[0]]
        ps = {x for x in T.walk(load.args[1]) if x.op == "select" and x.args[0] == self.c.positions}
        if len(ps) != 1:  # a table of one row per token (gathered by the caller) is read by token, not position
            g.why_angle = g.why_angle or "the table's row is not one positions element (a table per token?)"
            return
        p = next(iter(ps))
        if self.position(g, a, p, base, t, dst_name):
            (row, _), okt = decode(self.ctx, info, load.args[1], f"tbl{n}", shared=True)
            g.pitch.append(T.and_(base, okt, T.not_(T.cmp("eq", row, T.zext(p, 64)))))

    def table_of(self, f: T.Term, src_name: str):
        """The load, when f is an element of a [rows, rotary_dim] float table."""
        x = _strip(f)
        info = self.ctx.facts.tensors.get(x.args[0]) if x.op == "load" else None
        if info is None or x.args[0] == src_name or info.index or info.trig is not None or len(info.shape) != 2:
            return None
        return x if _const(info.shape[1]) == self.r else None

    def verdicts(self, g: _Group, group: list[PtxAccess], dst_name: str) -> list[Result]:
        ctx, ins, c = self.ctx, group[0].instr, self.c
        out = [replace(f, domain=ctx.domain) for f in g.findings[:1]]
        for what, found, n, why in (
            (f"{dst_name} = x[i] cos a -/+ x[partner] sin a (the {c.style} signs)", g.signs, g.n_signs, g.why),
            (
                f"{dst_name}'s angle at dim i has frequency base^(-2j/{self.r}) of i's pair",
                g.freqs,
                g.n_freqs,
                g.why_angle or (g.why if g.n_freqs else ""),
            ),
        ):
            if found:
                out.append(replace(found[0], name=what, domain=ctx.domain))
            elif why and (n or what.endswith("signs)") or why is g.why_angle):
                out.append(Result(what, "not-proved", ctx.domain, where=ins, cause=why))
            elif n:
                out.append(Result(what, "proved", ctx.domain, where=ins))
        for what, formulas, cls in (
            (f"{dst_name}'s angle takes positions[t] of its own token", g.rows, "rope-position"),
            (f"{dst_name}'s cos/sin table row is its position", g.pitch, "stride"),
            (f"{dst_name}'s cos and sin table rows are its own token's", g.token_rows, "stride"),
        ):
            if formulas:
                out.append(ctx.result(what, ctx.ask(lanes_as_one(formulas)), cls, ins, group))
        return out


def rope_angles(trace: PtxTrace, ctx: Context) -> list[Result]:
    return RopeAngles(trace, ctx).run() if ctx.contract.rotations else []


def _narrow_table(g: _Group, a: PtxAccess, info, src, dst_name: str, kind: str) -> bool:
    """A cos/sin table narrower than the input it rotates: a `precision` finding."""
    if info.elsize >= src.elsize:
        return False
    what = f"{dst_name}'s cos/sin table is as precise as its input"
    detail = f"a {8 * info.elsize}-bit {kind} for {8 * src.elsize}-bit input"
    g.findings.append(_found("precision", a.instr, a, detail, what))
    return True


def _found(cls: str, ins, a: PtxAccess, detail: str, what: str = "") -> Result:
    return Result(what, "violated", "", cls, ins, cause=detail, lane=a.lane)
