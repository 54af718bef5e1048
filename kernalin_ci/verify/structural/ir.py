"""A small, tolerant parser for Triton's TTIR text (the `make_ttir` stage).

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
            callee, caller = _split_top(inner, " at ")
            a, b = self.resolve(callee, depth + 1), self.resolve(caller, depth + 1)
            return Loc(a.frames + b.frames, a.name or b.name)
        if e.startswith("fused"):
            body = e[e.index("[") + 1 : e.rindex("]")] if "[" in e else ""
            frames, name = (), ""
            for part in _split_commas(body):
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


def _split_top(s: str, sep: str) -> tuple[str, str]:
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


def _split_commas(s: str) -> list[str]:
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


# --------------------------------------------------------------------------- the parser

_LOC_DEF = re.compile(r"^(#loc\d*)\s*=\s*(loc\(.*\))\s*$")
_VALUE = re.compile(r"%[A-Za-z0-9_$.\-]+(?:#\d+)?")
_RESULTS = re.compile(r"^((?:%[A-Za-z0-9_$.\-]+(?::\d+)?\s*,\s*)*%[A-Za-z0-9_$.\-]+(?::\d+)?)\s*=\s*(.*)$")


def _strip_loc(line: str) -> tuple[str, str]:
    """Split a trailing ` loc(...)` (balanced) off a line."""
    s = line.rstrip()
    if not s.endswith(")"):
        return s, ""
    depth = 0
    in_str = False
    for i in range(len(s) - 1, -1, -1):
        ch = s[i]
        if ch == '"' and (i == 0 or s[i - 1] != "\\"):
            in_str = not in_str
        if in_str:
            continue
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                if s[max(0, i - 3) : i] == "loc" and (i < 4 or s[i - 4] in " \t,("):
                    return s[: i - 3].rstrip(), s[i - 3 :]
                return s, ""
    return s, ""


def _find_top(s: str, token: str, start: int = 0) -> int:
    """Index of `token` at bracket depth 0 (outside strings), or -1."""
    depth, in_str = 0, False
    i = start
    while i < len(s):
        ch = s[i]
        if ch == '"' and (i == 0 or s[i - 1] != "\\"):
            in_str = not in_str
        elif not in_str:
            if depth == 0 and s.startswith(token, i):
                return i
            if ch in "([{<":
                depth += 1
            elif ch in ")]}>" and not (ch == ">" and i > 0 and s[i - 1] == "-"):
                depth -= 1
        i += 1
    return -1


def _rfind_top(s: str, token: str) -> int:
    last, i = -1, 0
    while True:
        j = _find_top(s, token, i)
        if j < 0:
            return last
        last, i = j, j + 1


def _parse_attr_dict(s: str) -> dict:
    """`{axis = 1 : i32, start = 0 : i32}` or `<{...}>` -> {'axis': '1 : i32', ...} (raw strings)."""
    s = s.strip()
    if s.startswith("<{") and s.endswith("}>"):
        s = s[1:-1]
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    out = {}
    for part in _split_commas(s):
        if "=" in part:
            k, _, v = part.partition("=")
            out[k.strip()] = v.strip()
        elif part:
            out[part.strip()] = "true"
    return out


def attr_int(op: IROp, key: str, default=None):
    v = op.attrs.get(key)
    if v is None:
        return default
    m = re.match(r"\s*(-?\d+)", v)
    return int(m.group(1)) if m else default


def _types_after_arrow(section: str) -> list[str]:
    i = _rfind_top(section, "->")
    tail = section[i + 2 :].strip() if i >= 0 else section.strip()
    if tail.startswith("(") and tail.endswith(")"):
        tail = tail[1:-1]
    return _split_commas(tail)


def _result_types(name: str, section: str, n: int) -> list[Type]:
    section = section.strip()
    if not section:
        return [parse_type("i1")] * n
    if _find_top(section, "->") >= 0:
        ts = _types_after_arrow(section)
    elif _find_top(section, " to ") >= 0:
        ts = [section[_find_top(section, " to ") + 4 :].strip()]
    else:
        parts = _split_commas(section)
        if name == "arith.select":
            ts = [parts[-1]]
        else:
            ts = [parts[0]]
    types = [parse_type(t) for t in ts]
    if name in ("tt.load",) and types and types[0].is_ptr and not types[0].pointee.startswith("block:"):
        t = types[0]
        types = [t.with_elem(t.pointee)]
    elif name == "tt.load" and types and types[0].pointee.startswith("block:"):
        types = [parse_type(types[0].pointee[len("block:") :])]
    elif name in ("arith.cmpi", "arith.cmpf") and types:
        types = [types[0].with_elem("i1")]
    if len(types) == 1 and n > 1:
        types = types * n
    if len(types) < n:
        types = types + [types[-1] if types else parse_type("i1")] * (n - len(types))
    return types[:n]


class _Parser:
    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.values: dict[str, Value] = {}
        loc_defs = {}
        for ln in self.lines:
            m = _LOC_DEF.match(ln.strip())
            if m:
                loc_defs[m.group(1)] = m.group(2)
        self.locs = LocTable(loc_defs)

    def value(self, name: str) -> Value | None:
        return self.values.get(name)

    def define(self, name: str, type_: Type, owner=None, index=0, block=None) -> Value:
        v = Value(name, type_, owner, index, block)
        self.values[name] = v
        return v

    def parse(self) -> Module:
        functions = {}
        i = 0
        n = len(self.lines)
        while i < n:
            line = self.lines[i].strip()
            if line.startswith("tt.func"):
                fn, i = self.parse_function(i)
                functions[fn.name] = fn
                continue
            i += 1
        if not functions:
            raise ParseError("no tt.func in the module")
        return Module(functions, self.locs)

    def bind(self, op: IROp, names: list[str]) -> None:
        """Resolve operand names now: MLIR prints a value's definition before its uses, and names
        may be reused in sibling regions, so the latest definition is the right one."""
        for nm in names:
            v = self.values.get(nm)
            if v is None:
                raise ParseError(f"undefined value {nm} in {op.text[:120]!r}")
            op.operands.append(v)
            v.uses.append(op)

    def parse_function(self, i: int) -> tuple[Function, int]:
        header, loc = _strip_loc(self.lines[i].strip())
        m = re.match(r"tt\.func\s+(public|private|nested)?\s*@([\w$.\-]+)\s*\(", header)
        if not m:
            raise ParseError(f"cannot read function header {header[:120]!r}")
        public = (m.group(1) or "public") == "public"
        name = m.group(2)
        start = m.end() - 1
        depth, end = 0, -1
        for j in range(start, len(header)):
            ch = header[j]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    end = j
                    break
        arglist = header[start + 1 : end]
        args, arg_attrs = [], []
        for k, part in enumerate(_split_commas(arglist)):
            part, _ = _strip_loc(part)
            am = re.match(r"(%[\w$.\-]+)\s*:\s*(.*)$", part)
            if not am:
                continue
            rest = am.group(2).strip()
            attrs = {}
            bi = _find_top(rest, "{")
            if bi >= 0:
                attrs = _parse_attr_dict(rest[bi:])
                rest = rest[:bi].strip()
            v = self.define(am.group(1), parse_type(rest), None, k, None)
            args.append(v)
            arg_attrs.append(attrs)
        blocks: list[Block] = []
        i = self._parse_region_blocks(i + 1, blocks, None)
        body = blocks[0]
        body.args = args
        for v in args:
            v.block = body
        return Function(name, args, arg_attrs, body, public, blocks), i + 1

    def parse_block_ops(self, i: int, block: Block, until_close: bool) -> int:
        """Parse ops into `block` until the closing line of the enclosing region; return the index after it."""
        n = len(self.lines)
        while i < n:
            raw = self.lines[i].strip()
            if not raw or raw.startswith("//"):
                i += 1
                continue
            if raw.startswith("}") or raw.startswith("^"):
                return i  # the caller handles region ends and block labels
            op, i = self.parse_op(i)
            op.parent = block
            block.ops.append(op)
        return i

    def parse_op(self, i: int) -> tuple[IROp, int]:
        raw = self.lines[i].strip()
        body, locexpr = _strip_loc(raw)
        opens_region = body.endswith("{")
        names: list[str] = []
        m = _RESULTS.match(body)
        rest = body
        if m and "=" in body.split('"')[0]:
            for r in _split_commas(m.group(1)):
                rm = re.match(r"(%[\w$.\-]+)(?::(\d+))?$", r.strip())
                count = int(rm.group(2) or 1)
                # `%acc:3 = ...` defines %acc#0, %acc#1, %acc#2 (that is how uses print)
                names += [f"{rm.group(1)}#{k}" for k in range(count)] if rm.group(2) else [rm.group(1)]
            rest = m.group(2)
        generic = rest.startswith('"')
        if generic:
            name = rest[1 : rest.index('"', 1)]
            rest = rest[rest.index('"', 1) + 1 :]
        else:
            nm = re.match(r"([A-Za-z_][\w.]*)", rest)
            if not nm:
                raise ParseError(f"cannot read op in {raw[:120]!r}")
            name = nm.group(1)
            rest = rest[nm.end() :]
        op = IROp(name=name, text=raw[:300])
        regions: list[list[Block]] = []
        if name in ("scf.for", "scf.if", "scf.while", "scf.execute_region") or (opens_region and not generic):
            op, i = self._parse_structured(op, names, rest, locexpr, i)
            return op, i
        if generic and opens_region:
            # "tt.reduce"(%x) <{axis = 1 : i32}> ({ ... }) : (T) -> T loc(...)
            head = rest
            operand_names = _VALUE.findall(head[: head.index("({")] if "({" in head else head)
            ai = head.find("<{")
            if ai >= 0:
                op.attrs = _parse_attr_dict(head[ai : head.index("}>", ai) + 2])
            self.bind(op, operand_names)
            i += 1
            region: list[Block] = []
            i = self._parse_region_blocks(i, region, op)
            regions.append(region)
            # the closing line: `}) : (types) -> types loc(...)`, possibly `}, {` for more regions
            while True:
                close, closeloc = _strip_loc(self.lines[i].strip())
                if close.startswith("}, {") or close.startswith("},{"):
                    i += 1
                    region = []
                    i = self._parse_region_blocks(i, region, op)
                    regions.append(region)
                    continue
                break
            ti = close.find(":")
            op.types = close[ti + 1 :].strip() if ti >= 0 else ""
            locexpr = closeloc or locexpr
            op.regions = regions
            for region in regions:
                for b in region:
                    b.parent = op
            types = _result_types(name, op.types, len(names))
            op.results = [self.define(names[k], t, op, k) for k, t in enumerate(types)]
            op.loc = self.locs.resolve(locexpr) if locexpr else UNKNOWN_LOC
            return op, i + 1
        # pretty form: operands, optional attr dict, ` : types`
        ci = _find_top(rest, " : ")
        if ci < 0 and rest.rstrip().endswith(":"):
            ci = len(rest.rstrip()) - 1
        head = rest if ci < 0 else rest[:ci]
        op.types = "" if ci < 0 else rest[ci + 3 :].strip()
        bi = _find_top(head, "{")
        if bi >= 0:
            be = _find_matching(head, bi)
            op.attrs = _parse_attr_dict(head[bi : be + 1])
            head_ops = head[:bi] + head[be + 1 :]
        else:
            head_ops = head
        # strings (e.g. tt.assert messages, print prefixes) never hold operands
        head_ops = re.sub(r'"(?:[^"\\]|\\.)*"', '""', head_ops)
        operand_names = _VALUE.findall(head_ops)
        # keyword-ish leading tokens: predicates, program-id axis, constant values, dot precision
        self._keywords(op, head_ops)
        if name == "arith.constant":
            op.attrs["value"] = head.strip()
        if name in ("cf.br", "cf.cond_br"):
            targets = re.findall(r"\^(\w+)(?:\(([^)]*)\))?", head)
            op.attrs["targets"] = []
            cond = _VALUE.findall(head.split("^")[0]) if name == "cf.cond_br" else []
            operand_names = list(cond)
            for label, args_txt in targets:
                names_ = _VALUE.findall(args_txt.split(":")[0]) if args_txt else []
                op.attrs["targets"].append((label, len(names_)))
                operand_names += names_
        if name == "tt.print":
            # `tt.print " " {...} : %x : tensor<..>` -- operands live in the type section
            operand_names = _VALUE.findall(op.types)
            op.types = ""
        types = _result_types(name, op.types, len(names))
        if name == "arith.constant" and not op.types:
            types = [parse_type("i1")] * len(names)
        op.results = [self.define(names[k], t, op, k) for k, t in enumerate(types)]
        op.loc = self.locs.resolve(locexpr) if locexpr else UNKNOWN_LOC
        self.bind(op, operand_names)
        return op, i + 1

    def _keywords(self, op: IROp, head: str) -> None:
        h = head.strip()
        if op.name in ("arith.cmpi", "arith.cmpf"):
            op.attrs["predicate"] = h.split(",")[0].strip()
        elif op.name in ("tt.get_program_id", "tt.get_num_programs"):
            ax = h.split()[0] if h.split() else "x"
            op.attrs["axis"] = {"x": "0", "y": "1", "z": "2"}.get(ax, ax)
        elif op.name == "tt.atomic_rmw":
            op.attrs["rmw"] = h.split(",")[0].strip()
        for key in ("inputPrecision", "rounding", "propagateNan", "maxNumImpreciseAcc"):
            km = re.search(key + r"\s*=\s*([\w]+)", h)
            if km:
                op.attrs[key] = km.group(1)

    def _parse_region_blocks(self, i: int, region: list, owner: IROp) -> int:
        """Blocks of one region, from the line after `{` to its closing `}` line (not consumed)."""
        block = Block(parent=owner)
        region.append(block)
        n = len(self.lines)
        while i < n:
            raw = self.lines[i].strip()
            if raw.startswith("^"):
                body, _ = _strip_loc(raw.split("//")[0].strip())
                am = re.match(r"\^([\w]+)(?:\((.*)\))?\s*:\s*$", body)
                args_txt = am.group(2) if am else ""
                if block.ops or block.args or block.label:
                    block = Block(parent=owner)
                    region.append(block)
                block.label = am.group(1) if am else ""
                for k, part in enumerate(_split_commas(args_txt or "")):
                    part, _ = _strip_loc(part)
                    pm = re.match(r"(%[\w$.\-]+)\s*:\s*(.*)$", part)
                    if pm:
                        block.args.append(self.define(pm.group(1), parse_type(pm.group(2)), None, k, block))
                i += 1
                continue
            if raw.startswith("}"):
                return i
            i = self.parse_block_ops(i, block, until_close=True)
        raise ParseError("unterminated region")

    def _parse_structured(self, op: IROp, names: list, rest: str, locexpr: str, i: int) -> tuple[IROp, int]:
        """scf.for / scf.if / scf.while: header, regions, closing `} loc(...)`."""
        header = rest.rstrip()
        if header.endswith("{"):
            header = header[:-1].rstrip()
        operand_names: list[str] = []
        region_args: list[list[tuple[str, str]]] = []
        if op.name == "scf.for":
            fm = re.match(
                r"\s*(%[\w$.\-]+)\s*=\s*(%[\w$.\-#]+)\s+to\s+(%[\w$.\-#]+)\s+step\s+(%[\w$.\-#]+)(.*)$", header
            )
            if not fm:
                raise ParseError(f"cannot read scf.for header {header[:160]!r}")
            iv = fm.group(1)
            operand_names = [fm.group(2), fm.group(3), fm.group(4)]
            tail = fm.group(5)
            carried = []
            im = re.search(r"iter_args\((.*?)\)\s*(->|:)", tail)
            if im:
                for part in _split_commas(im.group(1)):
                    a, _, init = part.partition("=")
                    carried.append(a.strip())
                    operand_names.append(init.strip())
            ti = _find_top(tail, "->")
            res_types = []
            if ti >= 0:
                seg = tail[ti + 2 :]
                ci = _find_top(seg, " : ")
                seg = seg[:ci] if ci >= 0 else seg
                res_types = _split_commas(seg.strip()[1:-1] if seg.strip().startswith("(") else seg)
            ivm = re.search(r":\s*(\w+)\s*$", tail)
            iv_type = ivm.group(1) if ivm else "index"
            args = [(iv, iv_type)] + list(zip(carried, res_types))
            region_args.append(args)
            op.types = " , ".join(res_types)
            rtypes = [parse_type(t) for t in res_types]
        elif op.name == "scf.if":
            cm = re.match(r"\s*(%[\w$.\-#]+)(.*)$", header)
            operand_names = [cm.group(1)]
            ti = _find_top(cm.group(2), "->")
            rtypes = []
            if ti >= 0:
                seg = cm.group(2)[ti + 2 :].strip()
                rtypes = [parse_type(t) for t in _split_commas(seg[1:-1] if seg.startswith("(") else seg)]
        elif op.name == "scf.while":
            wm = re.match(r"\s*\((.*?)\)\s*:\s*(.*)$", header)
            if not wm:
                raise ParseError(f"cannot read scf.while header {header[:160]!r}")
            before_args = []
            for part in _split_commas(wm.group(1)):
                a, _, init = part.partition("=")
                before_args.append(a.strip())
                operand_names.append(init.strip())
            sig = wm.group(2)
            ai = _find_top(sig, "->")
            ins = _split_commas(sig[:ai].strip()[1:-1]) if ai >= 0 else []
            outs_txt = sig[ai + 2 :].strip() if ai >= 0 else ""
            outs = _split_commas(outs_txt[1:-1] if outs_txt.startswith("(") else outs_txt)
            region_args.append(list(zip(before_args, ins)))
            rtypes = [parse_type(t) for t in outs]
        else:
            rtypes = [parse_type("i1")] * len(names)
        op.results = [self.define(names[k], t, op, k) for k, t in enumerate(rtypes[: len(names)])]
        for k in range(len(op.results), len(names)):
            op.results.append(self.define(names[k], parse_type("i1"), op, k))
        self.bind(op, operand_names)
        i += 1
        regions = []
        ridx = 0
        while True:
            region: list[Block] = []
            block = Block(parent=op)
            for a, t in region_args[ridx] if ridx < len(region_args) else []:
                block.args.append(self.define(a, parse_type(t), None, len(block.args), block))
            region.append(block)
            # blocks of this region
            while True:
                raw = self.lines[i].strip()
                if raw.startswith("^"):
                    body, _ = _strip_loc(raw)
                    am = re.match(r"\^[\w]+(?:\((.*)\))?\s*:\s*$", body)
                    if block.ops or block.args:
                        block = Block(parent=op)
                        region.append(block)
                    for k, part in enumerate(_split_commas((am.group(1) if am else "") or "")):
                        part, _ = _strip_loc(part)
                        pm = re.match(r"(%[\w$.\-]+)\s*:\s*(.*)$", part)
                        if pm:
                            block.args.append(self.define(pm.group(1), parse_type(pm.group(2)), None, k, block))
                    i += 1
                    continue
                if raw.startswith("}"):
                    break
                i = self.parse_block_ops(i, block, until_close=True)
            regions.append(region)
            ridx += 1
            close, closeloc = _strip_loc(self.lines[i].strip())
            if re.match(r"^\}\s*(else|do)\s*\{$", close):
                i += 1
                continue
            locexpr = closeloc or locexpr
            i += 1
            break
        op.regions = regions
        op.loc = self.locs.resolve(locexpr) if locexpr else UNKNOWN_LOC
        return op, i


def _find_matching(s: str, i: int) -> int:
    pairs = {"{": "}", "(": ")", "[": "]", "<": ">"}
    open_ch, close_ch = s[i], pairs[s[i]]
    depth, in_str = 0, False
    for j in range(i, len(s)):
        ch = s[j]
        if ch == '"' and s[j - 1] != "\\":
            in_str = not in_str
        elif not in_str:
            if ch == open_ch:
                depth += 1
            elif ch == close_ch:
                depth -= 1
                if depth == 0:
                    return j
    return len(s) - 1


def parse_module(text: str) -> Module:
    """Parse TTIR text into a Module. Raises ParseError when the text is not TTIR as we know it."""
    return _Parser(text).parse()


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
