"""Triton's TTIR (the `make_ttir` stage) as data: types, locations, values, ops, functions, a module; the
parser that reads its text into them is ir_parser.py (`parse_module`), a small, tolerant one.

TTIR prints one operation per line, with regions opened by `{` and closed by
`}` (or `})` for ops in MLIR's generic form such as `"tt.reduce"`). Rather than
a grammar per op, the parser splits each line into its parts (results, op name,
operands, attribute dict, type section, location) and derives result types
from the type section with a few rules; the op vocabulary the analyses
understand is closed (see `op_handlers.py`), and anything else is parsed anyway and
left for the analyses to refuse with a notice.

Source locations: every op carries `loc(...)`, usually an alias `#locN` whose
definition (`#locN = loc("file":line:col)`, a named location `loc("var"(#locM))`
or a call site `loc(callsite(#locA at #locB))`) is printed at the end of the
module. `Loc` resolves these to the first frame in the user's file, and the
innermost variable name when there is one.

The printed form differs a little between Triton versions (value names, column
numbers, alias numbering); nothing here depends on those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# --------------------------------------------------------------------------- types


@dataclass(frozen=True)
class Type:
    """`tensor<16x32xf32>`, `!tt.ptr<f16>`, `tensor<16x!tt.ptr<f32>>`, `i32`, `f32`, `i1`."""

    text: str
    shape: tuple = ()
    elem: str = ""  # "f32", "i32", "i1", "ptr"
    pointee: str = ""  # for pointers: "f16", "i32", ...

    @property
    def is_ptr(self) -> bool:
        return self.elem == "ptr"

    @property
    def is_float(self) -> bool:
        return self.elem[:1] == "f" or self.elem.startswith("bf")

    @property
    def is_int(self) -> bool:
        return self.elem[:1] == "i" or self.elem == "index"

    @property
    def bits(self) -> int:
        """Bit width of the element (64 for pointers and index)."""
        if self.elem in ("ptr", "index"):
            return 64
        m = re.search(r"(\d+)", self.elem)
        return int(m.group(1)) if m else 0

    def with_elem(self, elem: str) -> Type:
        inner = f"{'x'.join(map(str, self.shape))}x{elem}" if self.shape else elem
        return parse_type(f"tensor<{inner}>" if self.shape else elem)


_FLOAT_NAMES = {
    "f16": "f16",
    "bf16": "bf16",
    "f32": "f32",
    "f64": "f64",
    "f8E5M2": "f8",
    "f8E4M3FN": "f8",
    "f8E4M3FNUZ": "f8",
    "f8E5M2FNUZ": "f8",
    "f8E4M3B11FNUZ": "f8",
}


def _scalar_elem(s: str) -> tuple[str, str]:
    s = s.strip()
    if s.startswith("!tt.ptr<"):
        inner = s[len("!tt.ptr<") : -1]
        inner = inner.split(",")[0].strip()  # address space
        if inner.startswith("tensor<"):  # block pointer
            return "ptr", "block:" + inner
        return "ptr", _FLOAT_NAMES.get(inner, inner)
    return _FLOAT_NAMES.get(s, s), ""


def parse_type(text: str) -> Type:
    text = text.strip()
    if text.startswith("tensor<") and text.endswith(">"):
        inner = text[len("tensor<") : -1]
        # strip an encoding (TTGIR): tensor<16x32xf32, #blocked>
        depth, cut = 0, len(inner)
        for i, ch in enumerate(inner):
            if ch in "<([{":
                depth += 1
            elif ch in ">)]}":
                depth -= 1
            elif ch == "," and depth == 0:
                cut = i
                break
        inner = inner[:cut]
        dims = []
        rest = inner
        while True:
            m = re.match(r"(\d+)x", rest)
            if not m:
                break
            dims.append(int(m.group(1)))
            rest = rest[m.end() :]
        elem, pointee = _scalar_elem(rest)
        return Type(text, tuple(dims), elem, pointee)
    elem, pointee = _scalar_elem(text)
    return Type(text, (), elem, pointee)


# --------------------------------------------------------------------------- locations


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    col: int


@dataclass(frozen=True)
class Loc:
    frames: tuple = ()  # innermost first
    name: str = ""  # innermost variable name, when the IR has one

    def user_frame(self, prefer: str | None = None) -> Frame | None:
        """The frame in the kernel's own file (else the first one outside Triton's package)."""
        if prefer:
            for f in self.frames:
                if f.path == prefer:
                    return f
        for f in self.frames:
            if "/triton/language/" not in f.path and "/triton/runtime/" not in f.path:
                return f
        return self.frames[0] if self.frames else None


UNKNOWN_LOC = Loc()


class LocTable:
    """Resolves `#locN` aliases and inline location expressions."""

    def __init__(self, defs: dict[str, str]):
        self.defs = defs
        self.cache: dict[str, Loc] = {}

    def resolve(self, expr: str, depth: int = 0) -> Loc:
        expr = expr.strip()
        if expr in self.cache:
            return self.cache[expr]
        loc = self._resolve(expr, depth)
        self.cache[expr] = loc
        return loc

    def _resolve(self, e: str, depth: int) -> Loc:
        if depth > 64:
            return UNKNOWN_LOC
        if e.startswith("loc(") and e.endswith(")"):
            e = e[4:-1].strip()
        if e.startswith("#"):
            d = self.defs.get(e)
            return self.resolve(d, depth + 1) if d else UNKNOWN_LOC
        if e == "unknown" or not e:
            return UNKNOWN_LOC
        m = re.match(r'^"((?:[^"\\]|\\.)*)":(\d+):(\d+)', e)
        if m:
            return Loc((Frame(m.group(1), int(m.group(2)), int(m.group(3))),))
        if e.startswith("callsite(") and e.endswith(")"):
            inner = e[len("callsite(") : -1]
            callee, caller = split_top(inner, " at ")
            a, b = self.resolve(callee, depth + 1), self.resolve(caller, depth + 1)
            return Loc(a.frames + b.frames, a.name or b.name)
        if e.startswith("fused"):
            body = e[e.index("[") + 1 : e.rindex("]")] if "[" in e else ""
            frames, name = (), ""
            for part in split_commas(body):
                loc = self.resolve(part, depth + 1)
                frames += loc.frames
                name = name or loc.name
            return Loc(frames, name)
        m = re.match(r'^"((?:[^"\\]|\\.)*)"\((.*)\)$', e, re.S)
        if m:
            inner = self.resolve(m.group(2), depth + 1)
            return Loc(inner.frames, m.group(1))
        m = re.match(r'^"((?:[^"\\]|\\.)*)"$', e)
        if m:
            return Loc((), m.group(1))
        return UNKNOWN_LOC


def split_top(s: str, sep: str) -> tuple[str, str]:
    depth = 0
    in_str = False
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == '"' and (i == 0 or s[i - 1] != "\\"):
            in_str = not in_str
        elif not in_str:
            if ch in "([{<":
                depth += 1
            elif ch in ")]}>":
                depth -= 1
            elif depth == 0 and s.startswith(sep, i):
                return s[:i], s[i + len(sep) :]
        i += 1
    return s, ""


def split_commas(s: str) -> list[str]:
    out, depth, in_str, start = [], 0, False, 0
    for i, ch in enumerate(s):
        if ch == '"' and (i == 0 or s[i - 1] != "\\"):
            in_str = not in_str
        elif not in_str:
            if ch in "([{<":
                depth += 1
            elif ch in ")]}>":
                depth -= 1
            elif ch == "," and depth == 0:
                out.append(s[start:i].strip())
                start = i + 1
    tail = s[start:].strip()
    if tail:
        out.append(tail)
    return out


# --------------------------------------------------------------------------- values and ops


@dataclass(eq=False)
class Value:
    name: str
    type: Type
    owner: IROp | None = None  # defining op; None for block arguments
    index: int = 0  # result index, or block-argument index
    block: Block | None = None  # for block arguments
    uses: list = field(default_factory=list)  # ops using this value

    def __repr__(self):
        return f"{self.name}: {self.type.text}"


@dataclass(eq=False)
class Block:
    args: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    parent: IROp | None = None
    label: str = ""


@dataclass(eq=False)
class IROp:
    name: str
    results: list = field(default_factory=list)
    operands: list = field(default_factory=list)
    attrs: dict = field(default_factory=dict)
    regions: list = field(default_factory=list)  # list[list[Block]]
    loc: Loc = UNKNOWN_LOC
    text: str = ""  # the header line, for messages
    parent: Block | None = None
    types: str = ""  # the raw type section

    @property
    def result(self) -> Value:
        return self.results[0]

    def __repr__(self):
        return f"IROp({self.name} {self.text[:80]!r})"


@dataclass(eq=False)
class Function:
    name: str
    args: list  # list[Value]
    arg_attrs: list  # list[dict]
    body: Block  # the entry block
    public: bool = True
    blocks: list = field(default_factory=list)  # every block (early returns make more than one)

    def block(self, label: str) -> Block | None:
        return next((b for b in self.blocks if b.label == label), None)


@dataclass(eq=False)
class Module:
    functions: dict  # name -> Function
    locs: LocTable

    @property
    def kernel(self) -> Function:
        pub = [f for f in self.functions.values() if f.public]
        return pub[0] if pub else next(iter(self.functions.values()))

    def walk(self, fn: Function | None = None):
        """Every op of a function (default: the kernel), depth first, in program order."""
        f = fn or self.kernel
        stack = [iter([op for b in (f.blocks or [f.body]) for op in b.ops])]
        while stack:
            try:
                op = next(stack[-1])
            except StopIteration:
                stack.pop()
                continue
            yield op
            for region in reversed(op.regions):
                for block in reversed(region):
                    stack.append(iter(block.ops))


class ParseError(Exception):
    pass


def attr_int(op: IROp, key: str, default=None):
    v = op.attrs.get(key)
    if v is None:
        return default
    m = re.match(r"\s*(-?\d+)", v)
    return int(m.group(1)) if m else default


# --------------------------------------------------------------------------- constants


def parse_constant(op: IROp):
    """The value of an `arith.constant`: a Python number (or bool), for scalars and splat-dense tensors.

    Returns None for non-uniform dense constants."""
    v = op.attrs.get("value", "").strip()
    t = op.result.type
    if v.startswith("dense<"):
        inner = v[len("dense<") : v.rindex(">")].strip()
        if inner.startswith("["):
            return None
        v = inner
    return _number(v, t)


def _number(s: str, t: Type):
    s = s.strip()
    if s in ("true", "false"):
        return s == "true"
    if t.is_float:
        if s.startswith("0x"):
            bits = int(s, 16)
            import struct

            if t.elem == "f32" or len(s) == 10:
                return struct.unpack("<f", struct.pack("<I", bits))[0]
            if t.elem == "f64":
                return struct.unpack("<d", struct.pack("<Q", bits))[0]
            if t.elem == "f16":
                import numpy as np

                return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])
            if t.elem == "bf16":
                return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
        return float(s)
    try:
        return int(s)
    except ValueError:
        return float(s)
