"""The parser of Triton's TTIR text into ir.py's Module (`parse_module`): tolerant, one op per line (ir.py
says how)."""

from __future__ import annotations

import re

from kernalin_ci.verify.structural.ir import (
    UNKNOWN_LOC,
    Block,
    Function,
    IROp,
    LocTable,
    Module,
    ParseError,
    Type,
    Value,
    parse_type,
    split_commas,
)

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
    for part in split_commas(s):
        if "=" in part:
            k, _, v = part.partition("=")
            out[k.strip()] = v.strip()
        elif part:
            out[part.strip()] = "true"
    return out


def _types_after_arrow(section: str) -> list[str]:
    i = _rfind_top(section, "->")
    tail = section[i + 2 :].strip() if i >= 0 else section.strip()
    if tail.startswith("(") and tail.endswith(")"):
        tail = tail[1:-1]
    return split_commas(tail)


def _result_types(name: str, section: str, n: int) -> list[Type]:
    section = section.strip()
    if not section:
        return [parse_type("i1")] * n
    if _find_top(section, "->") >= 0:
        ts = _types_after_arrow(section)
    elif _find_top(section, " to ") >= 0:
        ts = [section[_find_top(section, " to ") + 4 :].strip()]
    else:
        parts = split_commas(section)
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
        for k, part in enumerate(split_commas(arglist)):
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
            for r in split_commas(m.group(1)):
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
                for k, part in enumerate(split_commas(args_txt or "")):
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
                for part in split_commas(im.group(1)):
                    a, _, init = part.partition("=")
                    carried.append(a.strip())
                    operand_names.append(init.strip())
            ti = _find_top(tail, "->")
            res_types = []
            if ti >= 0:
                seg = tail[ti + 2 :]
                ci = _find_top(seg, " : ")
                seg = seg[:ci] if ci >= 0 else seg
                res_types = split_commas(seg.strip()[1:-1] if seg.strip().startswith("(") else seg)
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
                rtypes = [parse_type(t) for t in split_commas(seg[1:-1] if seg.startswith("(") else seg)]
        elif op.name == "scf.while":
            wm = re.match(r"\s*\((.*?)\)\s*:\s*(.*)$", header)
            if not wm:
                raise ParseError(f"cannot read scf.while header {header[:160]!r}")
            before_args = []
            for part in split_commas(wm.group(1)):
                a, _, init = part.partition("=")
                before_args.append(a.strip())
                operand_names.append(init.strip())
            sig = wm.group(2)
            ai = _find_top(sig, "->")
            ins = split_commas(sig[:ai].strip()[1:-1]) if ai >= 0 else []
            outs_txt = sig[ai + 2 :].strip() if ai >= 0 else ""
            outs = split_commas(outs_txt[1:-1] if outs_txt.startswith("(") else outs_txt)
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
                    for k, part in enumerate(split_commas((am.group(1) if am else "") or "")):
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
