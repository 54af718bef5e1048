"""The launch facts: what the engine is told about one launch, besides its PTX text.

Plain data, independent of Triton: a CUDA C++ kernel compiled to PTX by nvcc or NVRTC is described the
same way. Sizes are `Expr`s over named shape symbols, each symbol with its range, so a property proved
holds for every value of those symbols (the domain), not only at the shape the kernel was captured at.

  ShapeSymbol   a name and an inclusive range (B in [1, 256], W in [1, 8192], ...)
  Expr          an integer polynomial over shape symbols: {monomial: coefficient}, a monomial being a
                sorted tuple of symbol names (() is the constant)
  TensorFacts   one buffer: dtype, element size, shape and strides as Exprs, whether it is an index
                tensor (its loaded values are symbols, bounded by `value_range`), and its role
  TrigTable     a float table the entry filled with cos or sin of its tokens' RoPE angles (HF-style
                separate cos and sin tensors), as recognised on the capture call's data
  ParamFacts    one kernel parameter, in PTX order: a pointer into a tensor (plus a byte offset), an
                integer (an Expr), a float (its value), or unknown
  IndexRelation a contract relation between index tensors (slot = table[b, p // bs] * bs + p % bs)
  LaunchFacts   the kernel's parameters, the grid (Exprs), the tensors, the symbols, the relations,
                and `distinct` (index tensors whose valid entries are pairwise distinct: slot_mapping)
"""

from __future__ import annotations

from dataclasses import dataclass, field

Monomial = tuple[str, ...]


@dataclass(frozen=True)
class Expr:
    terms: tuple[tuple[Monomial, int], ...]  # sorted, no zero coefficient

    @staticmethod
    def of(x: int | str | Expr) -> Expr:
        if isinstance(x, Expr):
            return x
        if isinstance(x, str):
            return Expr(((((x,), 1)),))
        return Expr(((((), int(x))),)) if x else Expr(())

    def __add__(self, other: int | str | Expr) -> Expr:
        d = dict(self.terms)
        for m, c in Expr.of(other).terms:
            d[m] = d.get(m, 0) + c
        return Expr(tuple(sorted((m, c) for m, c in d.items() if c)))

    def __mul__(self, other: int | str | Expr) -> Expr:
        d: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in Expr.of(other).terms:
                m = tuple(sorted(m1 + m2))
                d[m] = d.get(m, 0) + c1 * c2
        return Expr(tuple(sorted((m, c) for m, c in d.items() if c)))

    def at(self, values: dict[str, int]) -> int:
        total = 0
        for m, c in self.terms:
            p = c
            for s in m:
                p *= values[s]
            total += p
        return total

    def pin(self, values: dict[str, int]) -> Expr:
        """The expression with these symbols replaced by their values."""
        out = Expr.of(0)
        for m, c in self.terms:
            p = Expr.of(c)
            for s in m:
                p = p * (values[s] if s in values else s)
            out = out + p
        return out

    @property
    def symbols(self) -> set[str]:
        return {s for m, _ in self.terms for s in m}

    @property
    def constant(self) -> int | None:
        if not self.terms:
            return 0
        if len(self.terms) == 1 and self.terms[0][0] == ():
            return self.terms[0][1]
        return None

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in self.terms:
            if not m:
                parts.append(str(c))
            else:
                parts.append("*".join(([str(c)] if c != 1 else []) + list(m)))
        return " + ".join(parts)


@dataclass(frozen=True)
class ShapeSymbol:
    name: str
    lo: int
    hi: int
    captured: int  # its value in the capture call (the counterexample's starting point)


@dataclass(frozen=True)
class TrigTable:
    """A float table whose element [row, column] held `fn` of one RoPE angle at the capture call (checked on
    its data there: an assumption about the entry's tables, not a proof for every input)."""

    fn: str  # "cos" | "sin"
    rows: str  # "token": row t is token t's angles; "position": row p is position p's
    columns: str  # the frequency of column c: "half" c; "repeat" c mod r/2 (HF's [cos | cos]); "interleave" c // 2

    def frequency(self, column: int, half: int) -> int:
        return {"half": column, "repeat": column % half, "interleave": column // 2}[self.columns]


@dataclass(frozen=True)
class TensorFacts:
    name: str
    dtype: str  # "float16", "int32", ...
    elsize: int
    shape: tuple[Expr, ...]
    strides: tuple[Expr, ...]  # in elements
    index: bool = False  # an index tensor: loads give symbols (positions, slot_mapping, block_tables, kv_lens)
    value_range: tuple[Expr, Expr] | None = None  # index values in [lo, hi] (inclusive), when the contract bounds them
    allow_negative_one: bool = False  # -1 also allowed (a padding slot)
    role: str = "input"  # "input" | "written" | "output" | "scratch"
    max_elements: int = 1 << 31  # the domain holds tensors up to this size (elements from element 0)
    initial: int | None = None  # every element's value at the launch, where known (a counter of zeros: 0)
    trig: TrigTable | None = None  # a cos or sin table the entry filled (rope_angles reads the rotation through it)

    @property
    def extent(self) -> Expr:
        """Elements spanned from element 0: 1 + sum((n - 1) * stride), for positive strides."""
        e = Expr.of(1)
        for n, s in zip(self.shape, self.strides):
            e = e + (n + (-1)) * s
        return e


@dataclass(frozen=True)
class ParamFacts:
    kind: str  # "pointer" | "int" | "float" | "unknown"
    tensor: str | None = None
    byte_offset: Expr = field(default_factory=lambda: Expr.of(0))
    value: Expr | float | None = None  # int: an Expr; float: its value
    name: str = ""


@dataclass(frozen=True)
class IndexRelation:
    """slot(b) == table[b, pos(b) // block] * block + pos(b) % block, and kv_len(b) == pos(b) + 1: the
    decode step's contract between its index tensors (each name None when the op has no such tensor)."""

    slots: str | None
    table: str | None
    positions: str | None
    lens: str | None
    block: int
    table_width: Expr


@dataclass
class LaunchFacts:
    kernel: str
    params: list[ParamFacts]  # the PTX parameters in order (extra trailing ones are scratch: unknown)
    grid: tuple[Expr, Expr, Expr]
    tensors: dict[str, TensorFacts]
    symbols: dict[str, ShapeSymbol]
    relations: list[IndexRelation] = field(default_factory=list)
    distinct: tuple[str, ...] = ()  # index tensors whose entries >= 0 are pairwise distinct
    block_threads: int = 0  # threads per block when the PTX does not declare it
    note: str = ""  # a restriction of the domain, in words

    def domain_text(self) -> str:
        """The domain a proof holds for, in words."""
        parts = [
            f"{s.name} in [{s.lo}, {s.hi}]" if s.lo < s.hi else f"{s.name} = {s.lo}" for s in self.symbols.values()
        ]
        big = sorted(t.name for t in self.tensors.values() if t.max_elements > 1 << 31)
        parts.append("tensors under 2^31 elements" + (f" ({', '.join(big)}: under 2^36)" if big else ""))
        for t in self.tensors.values():
            if t.index and t.value_range is not None:
                lo, hi = t.value_range
                extra = " or -1" if t.allow_negative_one else ""
                parts.append(f"every {t.name} entry in [{lo}, {hi}]{extra}")
            if t.trig is not None:
                parts.append(f"{t.name} holding {t.trig.fn} of each {t.trig.rows}'s angles (as at the capture call)")
        return ", ".join(parts + ([self.note] if self.note else []))
