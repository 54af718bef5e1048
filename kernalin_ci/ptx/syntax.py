"""PTX text -> one entry kernel as plain data: parameters, instructions, labels, source lines.

A tolerant line parser for the PTX that LLVM's NVPTX back end writes (Triton's `asm["ptx"]`, nvcc's and
NVRTC's `-ptx`): module-level `.global` constant tables and `.shared`/`.local` declarations, one
`.entry` with its `.param` list and `.reqntid`/`.maxntid`, and in its body labels, predicated
instructions (`@%p`, `@!%p`), vector operands (`{%r1, %r2}`), memory operands (`[%rd1+8]`) and `.loc`
directives (each instruction carries the source file and line of the last `.loc` before it; within a
helper of another file inlined into the kernel, a header's or triton/language/standard.py's, the kernel's
line that calls it: `.loc`'s `inlined_at`). Comments,
inline-asm markers and the DWARF sections are skipped. Device functions (`.func`) are not inlined:
a kernel that calls one is refused by the executor, not here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class PtxSyntaxError(Exception):
    """The text is not PTX this parser reads (one line: the cause)."""


@dataclass(frozen=True)
class PtxParam:
    name: str
    type: str  # "u64", "u32", "f32", "b8" ...
    pointer: bool  # declared `.ptr` (LLVM marks global pointers so); a u64 without it may be one too
    size: int  # bytes


@dataclass(frozen=True)
class Mem:
    """A memory operand `[base+offset]`: base is a register, a parameter or a global symbol name."""

    base: str
    offset: int


@dataclass(frozen=True)
class Instr:
    index: int
    opcode: str  # "ld", "st", "add", ...
    mods: tuple[str, ...]  # ("global", "v4", "b32"), ("lt", "s32") ...
    operands: tuple  # str (register, immediate, label, special register), Mem, or tuple[str, ...] (vector)
    guard: tuple[str, bool] | None  # (predicate register, negated)
    file: str
    line: int

    @property
    def text(self) -> str:
        g = f"@{'!' if self.guard[1] else ''}{self.guard[0]} " if self.guard else ""
        return f"{g}{'.'.join((self.opcode, *self.mods))} {self.operands}"


@dataclass(frozen=True)
class Global:
    """A module-level array: `.global` data (a constant table), `.shared` or `.local`."""

    name: str
    space: str  # "global" | "shared" | "local"
    size: int  # bytes, 0 for an extern (dynamic) array
    data: bytes | None = None  # initialiser of a global table


@dataclass
class PtxKernel:
    name: str
    params: list[PtxParam]
    instrs: list[Instr]
    labels: dict[str, int]  # label -> index of the next instruction
    threads: int  # threads per block (.reqntid / .maxntid), 0 when the PTX does not say
    globals: dict[str, Global] = field(default_factory=dict)
    label_notes: dict[str, str] = field(default_factory=dict)  # label -> LLVM's block name comment

    def param_index(self, name: str) -> int:
        return next(i for i, p in enumerate(self.params) if p.name == name)


_PARAM = re.compile(
    r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+(\.ptr\s+)?(?:\.\w+\s+|\.align\s+\d+\s+)*([A-Za-z_$][\w$]*)(\[\d+\])?"
)
_GLOBAL = re.compile(
    r"^(?:\.extern\s+|\.visible\s+)?\.(global|shared|local|const)\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+([\w$]+)(?:\[(\d*)\])?\s*(?:=\s*\{([^}]*)\})?"
)
_LOC = re.compile(r"^\.loc\s+(\d+)\s+(\d+)\s+(\d+)")
_INLINED_AT = re.compile(r"inlined_at\s+(\d+)\s+(\d+)\s+(\d+)")  # the call site of an inlined helper
_FILE = re.compile(r'^\.file\s+(\d+)\s+"([^"]*)"(?:\s*,\s*"([^"]*)")?')
_LABEL = re.compile(r"^([$\w.]+):\s*(?://\s*(.*))?$")
_SIZES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2, "b32": 4, "u32": 4}
_SIZES |= {"s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8, "pred": 1}


def type_size(t: str) -> int:
    return _SIZES.get(t, 0)


def _strip_comment(line: str) -> str:
    i = line.find("//")
    return line if i < 0 else line[:i]


def _split_operands(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _operand(tok: str):
    tok = tok.strip()
    if tok.startswith("{"):
        return tuple(t.strip() for t in tok[1:-1].split(",") if t.strip())
    if tok.startswith("["):
        inner = tok[1:-1].replace(" ", "")
        m = re.fullmatch(r"([%\w$.]+?)(?:\+(-?\w+))?", inner)
        if not m:
            raise PtxSyntaxError(f"memory operand {tok!r}")
        off = m.group(2)
        return Mem(m.group(1), int(off, 0) if off else 0)
    return tok


def parse(text: str) -> PtxKernel:
    """The first `.entry` kernel of a PTX module."""
    files: dict[int, str] = {}
    for line in text.splitlines():
        m = _FILE.match(line.strip())
        if m:
            files[int(m.group(1))] = (m.group(3) + "/" + m.group(2)) if m.group(3) else m.group(2)
    globals_: dict[str, Global] = {}
    lines = text.splitlines()
    i = 0
    name = None
    while i < len(lines):
        s = _strip_comment(lines[i]).strip()
        g = _GLOBAL.match(s)
        if g and not s.startswith(".param"):
            data = None
            if g.group(5) is not None:
                data = bytes(int(x, 0) & 0xFF for x in g.group(5).split(",") if x.strip())
            size = _count(g.group(4)) * type_size(g.group(2))
            space = "global" if g.group(1) == "const" else g.group(1)
            globals_[g.group(3)] = Global(g.group(3), space, size, data)
        m = re.match(r"^(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$]+)\s*\(?", s)
        if m:
            name = m.group(1)
            break
        i += 1
    if name is None:
        raise PtxSyntaxError("no .entry kernel in the PTX")
    params: list[PtxParam] = []
    i += 1
    while i < len(lines):
        s = _strip_comment(lines[i]).strip()
        if s.startswith(")"):
            break
        m = _PARAM.search(s)
        if m:
            n = int(m.group(4)[1:-1]) if m.group(4) else 1
            params.append(PtxParam(m.group(3), m.group(1), bool(m.group(2)), type_size(m.group(1)) * n))
        i += 1
    threads = 0
    instrs: list[Instr] = []
    labels: dict[str, int] = {}
    notes: dict[str, str] = {}
    file, line_no = "", 0
    own = ""  # the number of the kernel's own source file (of its first .loc)
    depth = 0
    started = False
    for raw in lines[i + 1 :]:
        full = raw.strip()
        s = _strip_comment(raw).strip()
        if not started:
            m = re.match(r"^\.(reqntid|maxntid)\s+([\d,\s]+)", s)
            if m:
                threads = 1
                for x in m.group(2).split(","):
                    if x.strip():
                        threads *= int(x)
            if s.startswith("{"):
                started, depth = True, 1
            continue
        if s == "{":
            depth += 1
            continue
        if s == "}":
            depth -= 1
            if depth == 0:
                break
            continue
        lm = _LOC.match(s)
        if lm:
            own = own or lm.group(1)  # the kernel's own source: the file of its first line
            at = _INLINED_AT.search(s)
            if at and lm.group(1) != own and at.group(1) == own:  # a helper of another file (a header,
                lm = at  # triton/language/standard.py) inlined into the kernel: the line that calls it
            f = files.get(int(lm.group(1)), "")
            if int(lm.group(2)) != 0:
                file, line_no = f, int(lm.group(2))
            continue
        lab = _LABEL.match(full)
        if lab and not full.startswith("."):
            labels[lab.group(1)] = len(instrs)
            if lab.group(2):
                notes[lab.group(1)] = lab.group(2).strip()
            continue
        if not s or s.startswith("."):
            g = _GLOBAL.match(s) if s.startswith(".") else None
            if g:  # a .local depot or .shared array declared inside the body
                size = _count(g.group(4)) * type_size(g.group(2))
                globals_[g.group(3)] = Global(g.group(3), g.group(1), size)
            continue
        for stmt in s.split(";"):
            stmt = stmt.strip()
            if stmt:
                instrs.append(_instr(stmt, len(instrs), file, line_no))
    if not started:
        raise PtxSyntaxError(f"kernel {name}: no body")
    return PtxKernel(name, params, instrs, labels, threads, globals_, notes)


def _instr(stmt: str, index: int, file: str, line: int) -> Instr:
    guard = None
    if stmt.startswith("@"):
        g, _, stmt = stmt.partition(" ")
        neg = g.startswith("@!")
        guard = (g[2:] if neg else g[1:], neg)
        stmt = stmt.strip()
    head, _, rest = stmt.partition(" ")
    if "\t" in head:
        head, _, more = head.partition("\t")
        rest = more + " " + rest
    parts = head.split(".")
    try:
        operands = tuple(_operand(t) for t in _split_operands(rest))
    except PtxSyntaxError as e:
        raise PtxSyntaxError(f"line {line}: {stmt}: {e}") from None
    return Instr(index, parts[0], tuple(p for p in parts[1:] if p), operands, guard, file, line)


def _count(n: str | None) -> int:
    """Elements of a declaration: `[N]`, `[]` (extern: 0), or none (a scalar: 1)."""
    return 1 if n is None else int(n or 0)
