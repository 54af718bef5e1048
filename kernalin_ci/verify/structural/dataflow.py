"""The shared dataflow layer over one kernel's TTIR.

* def-use: `Value.owner`, `Value.uses`; `peel(v)` looks through ops that only move
  or reshape lanes or change float width (splat, broadcast, expand_dims,
  reshape, trans, extf/truncf);
* loop-carried values of `scf.for`: `carried(v)` for a body argument, `loop_*`
  for its init, yielded value, body argument and loop result;
* values yielded from `scf.if`: `updates(v)`, the branches that change a value
  (an update guarded by `if` inside a loop keeps the carried value in its other
  branch; an `if` around a loop keeps the loop's init);
* guarded values: `guarded(g, v)` sees through `where(x > -inf, x, c)` (a max made
  safe for fully masked rows) and `unguard(g, v)` through `where(cond, x, 0)`;
* reductions and their combiners: `reduce_kind(op)` ("addf", "maxnumf", ...);
* linear forms of float values, `Graph.lf(v)`: `v = const + sum(coef * atom)`,
  with coefficients from constants and scalar kernel arguments (their values are
  known from the capture); atoms are the values the form cannot see through
  (loads, reductions, dots, loop-carried values, exps...);
* backward slices (`Graph.reaches`), which follow loop-carried values through
  their init and yielded values;
* which tensor each load or store addresses (`KernelView.tensor_of`), from the
  interpreter's records: pointer arithmetic traced back to the arguments;
* the dataflow between the kernels of one entry (`link_views`): which stores of
  earlier launches wrote the elements a load reads, so `KernelView.reads` and the
  analyses follow a value through scratch memory into the kernel that computed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kernalin_ci.verify.structural.abstract_values import FloatValue, IntValue
from kernalin_ci.verify.structural.ir import IROp, Value
from kernalin_ci.verify.structural.op_handlers import combiner

TRANSPARENT = {
    "tt.splat",
    "tt.broadcast",
    "tt.expand_dims",
    "tt.reshape",
    "ttg.convert_layout",
    "arith.extf",
    "arith.truncf",
    "tt.fp_to_fp",
    "tt.trans",
}
MAX_KINDS = ("maxnumf", "maximumf")
EXP_OPS = ("math.exp", "math.exp2")
LOG2E = 1.0 / math.log(2.0)


def peel(v: Value) -> Value:
    seen = 0
    while v.owner is not None and v.owner.name in TRANSPARENT and seen < 64:
        v = v.owner.operands[0]
        seen += 1
    return v


def reduce_kind(op: IROp) -> str | None:

    return combiner(op) if op is not None and op.name == "tt.reduce" else None


def is_exp(op: IROp | None) -> bool:
    if op is None:
        return False
    if op.name in EXP_OPS:
        return True
    sym = op.attrs.get("symbol", "") if op.name == "tt.extern_elementwise" else ""
    return "exp" in sym and "expm1" not in sym


def exp_base2(op: IROp) -> bool:
    return op.name == "math.exp2" or "exp2" in op.attrs.get("symbol", "")


# --------------------------------------------------------------------------- loops


def carried(v: Value):
    """For a scf.for body argument: (loop op, j) with j the carried index (the induction variable is None)."""
    b = v.block
    if b is None or b.parent is None or b.parent.name != "scf.for" or v.index == 0:
        return None
    return b.parent, v.index - 1


def loop_init(loop: IROp, j: int) -> Value:
    return loop.operands[3 + j]


def loop_yield(loop: IROp, j: int) -> Value | None:
    body = loop.regions[0][0]
    y = body.ops[-1] if body.ops else None
    return y.operands[j] if y is not None and y.name == "scf.yield" and j < len(y.operands) else None


def loop_arg(loop: IROp, j: int) -> Value:
    return loop.regions[0][0].args[j + 1]


def for_result(v: Value):
    if v.owner is not None and v.owner.name == "scf.for":
        return v.owner, v.index
    return None


def if_result(v: Value):
    """For a result of scf.if: (if op, result index)."""
    if v.owner is not None and v.owner.name == "scf.if":
        return v.owner, v.index
    return None


def if_branches(op: IROp, i: int) -> list:
    """The values the branches of an scf.if yield for its result i."""
    out = []
    for region in op.regions:
        y = region[0].ops[-1] if region and region[0].ops else None
        if y is not None and y.name == "scf.yield" and i < len(y.operands):
            out.append(y.operands[i])
    return out


def _yields_into(y: Value | None, v: Value, depth: int = 0) -> bool:
    """Is v the value y, or one of the scf.if results y is chosen from?"""
    if y is None or depth > 8:
        return False
    if y is v:
        return True
    r = if_result(y)
    return r is not None and any(_yields_into(b, v, depth + 1) for b in if_branches(*r))


def updates(v: Value, depth: int = 0) -> list | None:
    """For an scf.if result: the values of its branches that change it (nested ifs expanded). A branch that
    passes a loop-carried value through (the guarded update `if c: m = ...` inside a loop) or the init of a
    loop another branch ran (an `if` around a loop) is no update. None when v is not an scf.if result."""
    r = if_result(v)
    if r is None:
        return None
    branches = if_branches(*r)
    out = []
    for b in branches:
        c = carried(b)
        if c is not None and _yields_into(loop_yield(*c), v):
            continue
        if any(for_result(o) is not None and loop_init(*for_result(o)) is b for o in branches if o is not b):
            continue
        sub = updates(b, depth + 1) if depth < 8 else None
        out.extend(sub if sub is not None else [b])
    return out


def alternatives(v: Value) -> list:
    """The values v stands for: the updates of an scf.if result, else v itself."""
    u = updates(v)
    return [v] if u is None else u


# --------------------------------------------------------------------------- guards

_ABOVE_NEG_INF = {"ogt", "one", "une", "ugt"}  # x > -inf, x != -inf  (x on the left)
_AT_NEG_INF = {"oeq", "ueq", "ole", "ule"}  # x == -inf, x <= -inf (x on the left)
_SWAP = {"ogt": "olt", "olt": "ogt", "ugt": "ult", "ult": "ugt", "oge": "ole", "ole": "oge", "uge": "ule", "ule": "uge"}


def guarded(g: Graph, v: Value) -> Value | None:
    """x when v is `where(x > -inf, x, c)` (or `where(x == -inf, c, x)`) with c a finite constant: a running max
    made safe for rows whose every score is masked. Where the guard replaces x, x is -inf, so every score it
    bounds is -inf too and exp(s - c) is 0, as exp(s - x) would be."""
    v = peel(v)
    op = v.owner
    if op is None or op.name != "arith.select":
        return None
    cnd = peel(op.operands[0]).owner
    if cnd is None or cnd.name != "arith.cmpf":
        return None
    for xi, ci, preds in ((1, 2, _ABOVE_NEG_INF), (2, 1, _AT_NEG_INF)):
        x, c = peel(op.operands[xi]), op.operands[ci]
        k = g.const(peel(c))
        if k is None or not math.isfinite(k):
            continue
        a, b = (peel(o) for o in cnd.operands[:2])
        pred = cnd.attrs.get("predicate", "")
        if b is not x and a is x:
            other = b
        elif a is not x and b is x:
            other, pred = a, _SWAP.get(pred, pred)
        else:
            continue
        if g.const(other) == -math.inf and pred in preds:
            return x
    return None


def unguard(g: Graph, v: Value) -> Value:
    """v without `where(cond, v, 0)` / `where(cond, 0, v)` around it (weights zeroed for masked rows)."""
    for _ in range(4):
        v = peel(v)
        op = v.owner
        if op is None or op.name != "arith.select":
            return v
        if g.const(peel(op.operands[2])) == 0.0 and g.const(peel(op.operands[1])) is None:
            v = op.operands[1]
        elif g.const(peel(op.operands[1])) == 0.0 and g.const(peel(op.operands[2])) is None:
            v = op.operands[2]
        else:
            return v
    return peel(v)


# --------------------------------------------------------------------------- linear forms


@dataclass
class LF:
    atoms: dict = field(default_factory=dict)  # Value -> coef
    const: float = 0.0

    def scaled(self, k: float) -> LF:
        return LF({a: c * k for a, c in self.atoms.items()}, self.const * k)

    def plus(self, other: LF, sign: float = 1.0) -> LF:
        atoms = dict(self.atoms)
        for a, c in other.atoms.items():
            atoms[a] = atoms.get(a, 0.0) + sign * c
        return LF({a: c for a, c in atoms.items() if c != 0.0}, self.const + sign * other.const)

    def positive(self) -> LF:
        return LF({a: c for a, c in self.atoms.items() if c > 0})

    def negative(self) -> LF:
        return LF({a: -c for a, c in self.atoms.items() if c < 0})


def lf_equal(a: LF, b: LF, rel: float = 1e-4) -> bool:
    if set(a.atoms) != set(b.atoms):
        return False
    for k, c in a.atoms.items():
        if not math.isclose(c, b.atoms[k], rel_tol=rel, abs_tol=1e-12):
            return False
    return True


def lf_ratio(a: LF, b: LF) -> float | None:
    """k such that a == k * b on the atoms (None if not proportional)."""
    if set(a.atoms) != set(b.atoms) or not a.atoms:
        return None
    ks = [a.atoms[x] / b.atoms[x] for x in a.atoms if b.atoms[x] != 0]
    if not ks or any(not math.isclose(k, ks[0], rel_tol=1e-4) for k in ks):
        return None
    return ks[0]


class Graph:
    """One kernel's IR plus the values the interpreter saw in its first program."""

    def __init__(self, module, values: dict):
        self.module = module
        self.values = values
        self._lf: dict = {}
        self._static: dict = {}
        self._equiv: dict = {}

    def static(self, v: Value, depth: int = 0) -> bool:
        """v depends only on constants, scalar arguments, program ids and ranges (no data, no loop state)."""
        if v in self._static:
            return self._static[v]
        op = v.owner
        if op is None:
            out = v.block is not None and v.block.parent is None and v in self.values
        elif op.regions or op.name in ("tt.load", "tt.atomic_rmw", "tt.atomic_cas") or depth > 200:
            out = False
        else:
            out = all(self.static(o, depth + 1) for o in op.operands)
        self._static[v] = out
        return out

    def const(self, v: Value):
        """The value of v when it is static and the same known number on every lane."""
        if not self.static(v):
            return None
        rv = self.values.get(v)
        if isinstance(rv, FloatValue):
            k = rv.known()
            if k.all() and rv.c.size and np.all(rv.c == rv.c.reshape(-1)[0]):
                return float(rv.c.reshape(-1)[0])
            return None
        if isinstance(rv, IntValue):
            if not rv.unk.any() and rv.v.size and np.all(rv.v == rv.v.reshape(-1)[0]):
                return float(rv.v.reshape(-1)[0])
        return None

    def lf(self, v: Value, depth: int = 0) -> LF:
        if v in self._lf:
            return self._lf[v]
        out = self._lf_compute(v, depth)
        self._lf[v] = out
        return out

    def _lf_compute(self, v: Value, depth: int) -> LF:
        v = peel(v)
        k = self.const(v)
        op = v.owner
        if k is not None and (op is None or op.name not in ("tt.load",)) and not _is_data(op):
            return LF({}, k)
        if op is None or depth > 64:
            return LF({v: 1.0})
        n = op.name
        if n in ("arith.addf", "arith.subf"):
            a, b = self.lf(op.operands[0], depth + 1), self.lf(op.operands[1], depth + 1)
            return a.plus(b, 1.0 if n == "arith.addf" else -1.0)
        if n == "arith.negf":
            return self.lf(op.operands[0], depth + 1).scaled(-1.0)
        if n == "arith.mulf":
            ka, kb = self.const(peel(op.operands[0])), self.const(peel(op.operands[1]))
            if kb is not None and not _is_data(peel(op.operands[1]).owner):
                return self.lf(op.operands[0], depth + 1).scaled(kb)
            if ka is not None and not _is_data(peel(op.operands[0]).owner):
                return self.lf(op.operands[1], depth + 1).scaled(ka)
            return LF({v: 1.0})
        if n in ("arith.divf", "tt.precise_divf"):
            kb = self.const(peel(op.operands[1]))
            if kb and not _is_data(peel(op.operands[1]).owner):
                return self.lf(op.operands[0], depth + 1).scaled(1.0 / kb)
            return LF({v: 1.0})
        if n == "math.fma":
            kb = self.const(peel(op.operands[1]))
            ka = self.const(peel(op.operands[0]))
            c = self.lf(op.operands[2], depth + 1)
            if kb is not None:
                return self.lf(op.operands[0], depth + 1).scaled(kb).plus(c)
            if ka is not None:
                return self.lf(op.operands[1], depth + 1).scaled(ka).plus(c)
            return LF({v: 1.0})
        return LF({v: 1.0})

    # ------------------------------------------------------------------ structural equivalence
    def equiv(self, a: Value, b: Value, depth: int = 0) -> bool:
        """Do a and b compute the same thing (same ops over the same arguments), e.g. the scores of a second
        pass that loads K again? Induction variables of loops with equivalent bounds are equivalent."""
        if a is b:
            return True
        if depth > 48 or a.type.text != b.type.text or a.index != b.index:
            return False
        key = (id(a), id(b))
        if key in self._equiv:
            return self._equiv[key]
        self._equiv[key] = False  # cycles are not equivalent
        oa, ob = a.owner, b.owner
        if oa is None or ob is None:
            la, lb = a.block.parent if a.block else None, b.block.parent if b.block else None
            out = (
                oa is None
                and ob is None
                and a.index == 0
                and la is not None
                and lb is not None
                and la.name == lb.name == "scf.for"
                and all(self.equiv(x, y, depth + 1) for x, y in zip(la.operands[:3], lb.operands[:3]))
            )
        elif oa.name != ob.name or oa.attrs != ob.attrs or len(oa.operands) != len(ob.operands):
            out = False
        elif oa.name == "arith.constant":
            out = True  # same attrs (the value) and type
        elif oa.name in ("scf.for", "scf.if", "scf.while"):
            out = False
        elif oa.regions and (oa.name != "tt.reduce" or reduce_kind(oa) != reduce_kind(ob) or reduce_kind(oa) is None):
            out = False
        else:
            out = all(self.equiv(x, y, depth + 1) for x, y in zip(oa.operands, ob.operands))
        self._equiv[key] = out
        return out

    def lf_equiv(self, a: LF, b: LF) -> bool:
        """Linear forms equal up to equivalent atoms."""
        if lf_equal(a, b):
            return True
        if len(a.atoms) != len(b.atoms) or not math.isclose(a.const, b.const, abs_tol=1e-9):
            return False
        rest = dict(b.atoms)
        for x, c in a.atoms.items():
            hit = next((y for y, d in rest.items() if math.isclose(c, d, rel_tol=1e-4) and self.equiv(x, y)), None)
            if hit is None:
                return False
            del rest[hit]
        return True

    # ------------------------------------------------------------------ slices
    def reaches(self, v: Value, pred, limit: int = 4000) -> bool:
        """Does the backward slice of v (through loop-carried values) contain an op satisfying pred?"""
        seen = set()
        stack = [v]
        while stack and len(seen) < limit:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            op = x.owner
            if op is None:
                c = carried(x)
                if c is not None:
                    loop, j = c
                    stack.append(loop_init(loop, j))
                    y = loop_yield(loop, j)
                    if y is not None:
                        stack.append(y)
                continue
            if pred(op):
                return True
            r = if_result(x)
            if r is not None:
                stack.append(op.operands[0])
                stack.extend(if_branches(*r))
                continue
            fr = for_result(x)
            if fr is not None:
                y = loop_yield(*fr)
                if y is not None:
                    stack.append(y)
                stack.append(loop_init(*fr))
                continue
            stack.extend(op.operands)
            for region in op.regions:
                for blk in region:
                    for o in blk.ops:
                        if o.name in ("tt.reduce.return", "scf.yield"):
                            stack.extend(o.operands)
        return False


def _is_data(op: IROp | None) -> bool:
    """Ops whose value is data even when the first program happened to see a constant."""
    return op is not None and op.name in ("tt.load", "tt.reduce", "tt.dot")


# --------------------------------------------------------------------------- kernel view


@dataclass(eq=False)
class KernelView:
    """Everything the analyses need about one launch: IR, graph, interpreter trace, tensors."""

    launch: object
    module: object
    trace: object
    capture: object
    names: list
    graph: Graph = None
    loads: dict = field(default_factory=dict)  # load op -> tensor name
    stores: dict = field(default_factory=dict)  # store op -> tensor name
    sources: dict = field(default_factory=dict)  # load op -> [(view, store op)] of earlier launches (link_views)
    consumers: dict = field(default_factory=dict)  # store op -> [(view, load op)] of later launches
    cache: dict = field(default_factory=dict)  # analyses' per-kernel results
    _reads: dict = field(default_factory=dict)

    def __post_init__(self):
        values = dict(self.trace.values)
        self.graph = Graph(self.module, values)
        for acc in self.trace.accesses:
            t = int(np.asarray(acc.tensor).reshape(-1)[0]) if np.asarray(acc.tensor).size else -1
            if t >= 0:
                (self.loads if acc.kind == "load" else self.stores).setdefault(acc.op, self.names[t])

    def tensor_of(self, op: IROp) -> str | None:
        return self.loads.get(op) or self.stores.get(op)

    def ops(self):
        return list(self.module.walk())

    def loads_of(self, *tensors) -> list:
        return [op for op, t in self.loads.items() if t in tensors]

    def reads(self, v: Value, *tensors) -> bool:
        """Does v depend on a load of one of these tensors, here or, through memory an earlier launch wrote,
        in the kernel that computed the stored value?"""
        key = (v, tensors)
        if key not in self._reads:
            want = set(tensors)
            linked = []

            def hit(op):
                if op.name != "tt.load":
                    return False
                if op in self.sources:
                    linked.append(op)
                return self.loads.get(op) in want

            self._reads[key] = self.graph.reaches(v, hit) or any(
                pv.reads(st.operands[1], *tensors) for op in linked for pv, st in self.sources[op]
            )
        return self._reads[key]

    def stored(self, load_op: IROp) -> list:
        """For a load of memory earlier launches wrote: [(view, stored value)] of the stores that wrote it."""
        return [(pv, st.operands[1]) for pv, st in self.sources.get(load_op, [])]

    def reads_int(self, v: Value, *tensors) -> bool:
        """Does an integer value depend on a load of one of these tensors?"""
        return self.reads(v, *tensors)

    def accesses(self, kind: str, *tensors):
        idx = [self.names.index(t) for t in tensors if t in self.names]
        for acc in self.trace.accesses:
            if acc.kind != kind:
                continue
            t = int(np.asarray(acc.tensor).reshape(-1)[0]) if np.asarray(acc.tensor).size else -1
            if t in idx:
                yield acc


def link_views(views: list) -> None:
    """The dataflow between launches: for every load, the stores of earlier launches that wrote the elements it
    reads (masked-in lanes), in `view.sources`, and the reverse in `view.consumers`."""
    writer: dict = {}  # tensor index -> per element: index into `writes`, -1 where no launch wrote
    writes: list = []  # (view, store op)
    index: dict = {}
    for view in views:
        for acc in view.trace.accesses:
            if acc.kind != "load":
                continue
            t = int(np.asarray(acc.tensor).reshape(-1)[0]) if np.asarray(acc.tensor).size else -1
            w = writer.get(t)
            if w is None:
                continue
            e = acc.elem[acc.mask & acc.inb]
            ids = np.unique(w[np.clip(e, 0, w.size - 1)]) if e.size else ()
            for i in ids:
                if i < 0:
                    continue
                pv, st = writes[int(i)]
                src = view.sources.setdefault(acc.op, [])
                if (pv, st) not in src:
                    src.append((pv, st))
                    pv.consumers.setdefault(st, []).append((view, acc.op))
        for acc in view.trace.accesses:
            if acc.kind != "store":
                continue
            t = int(np.asarray(acc.tensor).reshape(-1)[0]) if np.asarray(acc.tensor).size else -1
            if t < 0:
                continue
            info = view.capture.tensors[view.names[t]]
            w = writer.setdefault(t, np.full(max(info.storage.size // max(info.elsize, 1), 1), -1, dtype=np.int64))
            i = index.setdefault((view, acc.op), len(writes))
            if i == len(writes):
                writes.append((view, acc.op))
            e = acc.elem[acc.mask & acc.inb]
            w[np.clip(e, 0, w.size - 1)] = i


def line_of(op: IROp | None, launch) -> tuple[str, int] | None:
    """The source file and line of an op, preferring the kernel's own file."""
    if op is None:
        return None
    f = op.loc.user_frame(getattr(launch, "path", None))
    if f is None:
        return None
    return f.path, f.line
