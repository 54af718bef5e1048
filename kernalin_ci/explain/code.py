"""Plain functions on compiled code (no Triton, no GPU): the text the identity check compares, the
resource figures ptxas reports, the instruction mix of the SASS, and the theoretical occupancy.

Line information is not code: TTGIR `loc(...)` attributes, PTX `.loc`/`.file` directives and debug
sections move when a comment shifts the source lines, while the machine code stays the same. The
identity check compares the text with them removed, and the SASS (which carries no line information).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter

_LOC_ATTR = re.compile(r"\s*loc\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)")


def normalize_ttgir(text: str) -> str:
    """TTGIR without location attributes and `#loc` alias lines."""
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith("#loc"):
            continue
        out.append(_LOC_ATTR.sub("", line).rstrip())
    return "\n".join(out)


def normalize_ptx(text: str) -> str:
    """PTX without `.loc`/`.file` directives, line-info labels and `.section .debug_*` blocks."""
    out = []
    skipping = False
    for line in text.splitlines():
        s = line.strip()
        if skipping:
            if s == "}":
                skipping = False
            continue
        if s.startswith(".section") and ".debug" in s:
            skipping = not s.endswith("}")
            continue
        if s.startswith((".loc", ".file")) or re.fullmatch(r"\$L__\w+:", s) or s.startswith("//"):
            continue
        out.append(line.rstrip())
    return "\n".join(out)


def sass_instructions(sass: str) -> list[str]:
    """The instructions of a `cuobjdump -sass` listing (no addresses, no encodings)."""
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m:
            out.append(m.group(1))
    return out


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- ptxas -v


def ptxas_resources(stderr: str) -> dict:
    """Registers, spills, stack and static shared memory from `ptxas -v` output (None when absent)."""

    def grab(pattern: str) -> int | None:
        m = re.search(pattern, stderr)
        return int(m.group(1)) if m else None

    return {
        "registers": grab(r"Used (\d+) registers"),
        "spill_stores_bytes": grab(r"(\d+) bytes spill stores"),
        "spill_loads_bytes": grab(r"(\d+) bytes spill loads"),
        "stack_bytes": grab(r"(\d+) bytes stack frame"),
        "static_smem_bytes": grab(r"(\d+) bytes smem") or 0,
    }


# --------------------------------------------------------------------------- instruction mix

# SASS opcode (before the first dot) -> the class shown
_CLASSES = (
    ("tensor-core", ("HMMA", "HGMMA", "IMMA", "QGMMA", "WGMMA", "UTCHMMA", "UTCQMMA")),
    ("global-load", ("LDG",)),
    ("global-store", ("STG", "RED", "ATOMG")),
    ("tma", ("UTMALDG", "UTMASTG", "UBLKCP")),
    ("shared", ("LDS", "STS", "LDSM", "STSM", "ATOMS")),
    ("local (spill)", ("LDL", "STL")),
    ("fp32", ("FFMA", "FADD", "FMUL", "FMNMX", "FSEL", "FSETP", "FCHK")),
    ("fp16x2", ("HFMA2", "HADD2", "HMUL2", "HMNMX2")),
    ("special-function", ("MUFU",)),
    ("convert", ("F2F", "F2FP", "I2F", "F2I", "I2FP", "F2IP")),
    ("barrier", ("BAR", "SYNCS", "MEMBAR", "WARPSYNC")),
    ("branch", ("BRA", "BRX", "JMP", "EXIT", "RET", "CALL")),
)


def instruction_mix(instructions: list[str]) -> dict:
    """Counts per class, the total, and the widest global access in bits."""
    counts: Counter = Counter()
    widest = 0
    for ins in instructions:
        op = ins.split()[0] if ins.split() else ""
        if op.startswith("@"):  # predicated: @P0 LDG...
            op = ins.split()[1] if len(ins.split()) > 1 else ""
        base = op.split(".")[0]
        cls = next((c for c, ops in _CLASSES if base in ops), None)
        if cls:
            counts[cls] += 1
        if base in ("LDG", "STG"):
            m = re.search(r"\.(64|128|256)\b", op)
            widest = max(widest, int(m.group(1)) if m else 32)
    return {"total": len(instructions), "classes": dict(counts), "widest_global_bits": widest or None}


def mix_text(mix: dict | None) -> str:
    if not mix:
        return "not available"
    cls = mix.get("classes") or {}
    parts = [f"{k} {v}" for k, v in sorted(cls.items(), key=lambda kv: -kv[1])]
    wide = f"; widest global access {mix['widest_global_bits']}-bit" if mix.get("widest_global_bits") else ""
    return f"{mix.get('total', 0)} instructions: " + ", ".join(parts) + wide


# --------------------------------------------------------------------------- occupancy

# per SM, from NVIDIA's CUDA C++ Programming Guide, "Compute Capabilities" table
SM_LIMITS = {
    80: {"warps": 64, "blocks": 32, "registers": 65536, "smem": 167936, "reserved_smem": 1024},
    86: {"warps": 48, "blocks": 16, "registers": 65536, "smem": 102400, "reserved_smem": 1024},
    89: {"warps": 48, "blocks": 24, "registers": 65536, "smem": 102400, "reserved_smem": 1024},
    90: {"warps": 64, "blocks": 32, "registers": 65536, "smem": 233472, "reserved_smem": 1024},
}
REG_UNIT = 256  # registers are allocated per warp in units of 256


def occupancy(arch: int, num_warps: int, registers: int | None, smem_bytes: int) -> dict | None:
    """Theoretical occupancy: resident warps per SM over the maximum, and what limits it."""
    lim = SM_LIMITS.get(arch)
    if lim is None or registers is None or num_warps < 1:
        return None
    per_warp = -(-max(registers, 1) * 32 // REG_UNIT) * REG_UNIT
    by = {
        "warps": lim["warps"] // num_warps,
        "blocks": lim["blocks"],
        "registers": (lim["registers"] // per_warp) // num_warps,
    }
    if smem_bytes:
        by["shared memory"] = lim["smem"] // (smem_bytes + lim["reserved_smem"])
    blocks = min(by.values())
    limiter = min(by, key=lambda k: by[k])
    return {
        "blocks_per_sm": blocks,
        "warps_per_sm": blocks * num_warps,
        "fraction": round(blocks * num_warps / lim["warps"], 4),
        "limited_by": limiter,
    }
