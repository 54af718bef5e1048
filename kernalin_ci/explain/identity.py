"""Unchanged by construction (parent side): compile base and head in worker children and compare.

A shape is identical when base and head launch the same kernels in the same order with the same launch
configuration (grid, scalar arguments, which tensor each pointer points into, constexprs, num_warps,
num_stages, num_ctas, shared memory), the same compiled code (TTGIR and PTX without line information,
and the SASS), and the entry's host code runs the same torch operations on the same shapes. Identical
shapes need no timing; a toolchain difference between the two children times everything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kernalin_ci.findings import known
from kernalin_ci.isolate import run_task
from kernalin_ci.jobs import CompileJob

EQUIVALENT = "equivalent (identical compiled code)"
CODE_KEYS = ("ttgir", "ptx", "sass")
CONFIG_KEYS = ("num_warps", "num_stages", "num_ctas", "shared_bytes")
TOOLCHAIN_KEYS = ("python", "torch", "triton", "triton_path", "cuda", "ptxas")


@dataclass
class SideCompile:
    """One side's compiled launches per shape (or why there are none)."""

    toolchain: dict = field(default_factory=dict)
    shapes: list = field(default_factory=list)  # per case: {"launches", "host_ops", "error"}
    error: str | None = None
    seconds: float = 0.0


def compile_side(op: str, entry: str, root: str, params: dict, cases: list, timeout_s: float = 600.0) -> SideCompile:
    """Run the explain-compile task for one side (the user's code runs only in the child)."""
    import time

    t0 = time.perf_counter()
    side = SideCompile(shapes=[None] * len(cases))
    job = CompileJob(op=op, entry=entry, root=root, params=params, cases=tuple(cases))

    def on_event(ev):
        if ev.get("event") == "explain-toolchain":
            side.toolchain = {k: ev.get(k) for k in TOOLCHAIN_KEYS}
        elif ev.get("event") == "explain-shape":
            side.shapes[ev["shape"]] = ev

    outcome = run_task(job, "cpu", timeout_s, on_event, env={"TRITON_INTERPRET": "0"})
    if outcome.status != "ok":
        tb = next((e.get("traceback", "") for e in outcome.events if e.get("event") == "internal-error"), "")
        last = tb.strip().splitlines()[-1] if tb.strip() else ""
        side.error = f"the compile worker {outcome.status}: {outcome.detail}" + (f" ({last})" if last else "")
    side.seconds = round(time.perf_counter() - t0, 3)
    return side


def launch_key(la: dict) -> dict:
    """What must match for two launches to be the same (source paths and lines excluded)."""
    c = la.get("compiled") or {}
    return {
        "kernel": la["kernel"],
        "grid": la["grid"],
        "args": la["args"],
        "constexprs": la["constexprs"],
        **{k: c.get(k) for k in CONFIG_KEYS + CODE_KEYS + ("name", "error")},
    }


def _launch_diff(b: dict, h: dict) -> list[str]:
    kb, kh = launch_key(b), launch_key(h)
    out = []
    for k in ("kernel", "grid") + CONFIG_KEYS:
        if kb[k] != kh[k]:
            out.append(f"{k} {kb[k]} -> {kh[k]}")
    for k, v in kb["constexprs"].items():
        if kh["constexprs"].get(k) != v:
            out.append(f"{k} {v} -> {kh['constexprs'].get(k)}")
    if kb["args"] != kh["args"] and not out:
        out.append("launch arguments differ")
    code = [k.upper() for k in CODE_KEYS if kb[k] != kh[k]]
    if code:
        out.append(f"{', '.join(code)} differ")
    if kb["error"] != kh["error"]:
        out.append("compile outcome differs")
    return out


@dataclass
class ShapeIdentity:
    shape: str
    identical: bool | None  # None: not compared (a side could not compile it)
    differences: list = field(default_factory=list)


@dataclass
class Identity:
    status: str  # "compared" | "not-compared"
    cause: str | None = None
    toolchain_changed: list = field(default_factory=list)  # "triton 3.5.0 -> 3.6.0"
    shapes: list = field(default_factory=list)  # ShapeIdentity
    toolchain: dict = field(default_factory=dict)  # {"base": {...}, "head": {...}}
    seconds: float = 0.0

    @property
    def all_identical(self) -> bool:
        return (
            self.status == "compared"
            and not self.toolchain_changed
            and bool(self.shapes)
            and all(s.identical for s in self.shapes)
        )

    def to_time(self, names: list[str]) -> list[str]:
        """The shapes to time: all of them unless identity is proven per shape with the same toolchain."""
        if self.status != "compared" or self.toolchain_changed:
            return list(names)
        same = {s.shape for s in self.shapes if s.identical}
        return [n for n in names if n not in same]

    @property
    def verdict(self) -> str | None:
        return EQUIVALENT if self.all_identical else None

    def to_json(self) -> dict:
        d = asdict(self)
        d["verdict"] = self.verdict
        return d

    @classmethod
    def from_json(cls, d: dict) -> Identity:
        """The Identity of its to_json (`verdict` follows from the shapes)."""
        d = known(cls, d)
        return cls(**{**d, "shapes": [ShapeIdentity(**known(ShapeIdentity, s)) for s in d.get("shapes", [])]})


def compare(base: SideCompile, head: SideCompile, cases: list) -> Identity:
    """Base against head, shape by shape."""
    ident = Identity(
        "compared",
        toolchain={"base": base.toolchain, "head": head.toolchain},
        seconds=round(base.seconds + head.seconds, 3),
    )
    if base.error or head.error:
        ident.status, ident.cause = (
            "not-compared",
            "; ".join(f"{side}: {e}" for side, e in (("base", base.error), ("head", head.error)) if e),
        )
        return ident
    ident.toolchain_changed = [
        f"{k} {base.toolchain.get(k)} -> {head.toolchain.get(k)}"
        for k in TOOLCHAIN_KEYS
        if base.toolchain.get(k) != head.toolchain.get(k)
    ]
    for i, case in enumerate(cases):
        b, h = base.shapes[i], head.shapes[i]
        if b is None or h is None or b.get("error") or h.get("error"):
            why = [
                f"{side}: {s.get('error') if s else 'no result'}"
                for side, s in (("base", b), ("head", h))
                if s is None or s.get("error")
            ]
            ident.shapes.append(ShapeIdentity(case.name, None, why))
            continue
        diffs = []
        bl, hl = b["launches"], h["launches"]
        if [la["kernel"] for la in bl] != [la["kernel"] for la in hl]:
            diffs.append(f"launches {[la['kernel'] for la in bl]} -> {[la['kernel'] for la in hl]}")
        else:
            for j, (x, y) in enumerate(zip(bl, hl)):
                d = _launch_diff(x, y)
                if d:
                    diffs.append(f"launch {j + 1} ({x['kernel']}): {'; '.join(d)}")
        if b.get("host_ops") != h.get("host_ops"):
            diffs.append(
                f"host torch operations differ ({len(b.get('host_ops') or [])} -> {len(h.get('host_ops') or [])})"
            )
        ident.shapes.append(ShapeIdentity(case.name, not diffs, diffs))
    return ident


# --------------------------------------------------------------------------- why it changed


def _facts(la: dict) -> dict:
    c = la.get("compiled") or {}
    r = c.get("resources") or {}
    occ = c.get("occupancy") or {}
    return {
        "num_warps": c.get("num_warps"),
        "num_stages": c.get("num_stages"),
        "constexprs": la.get("constexprs"),
        "grid": la.get("grid"),
        "autotuned": la.get("autotuned"),
        "registers": r.get("registers"),
        "spill_bytes": (
            None
            if r.get("spill_stores_bytes") is None
            else r.get("spill_stores_bytes", 0) + r.get("spill_loads_bytes", 0)
        ),
        "shared_bytes": (c.get("shared_bytes") or 0) + (r.get("static_smem_bytes") or 0),
        "occupancy": occ.get("fraction"),
        "occupancy_limited_by": occ.get("limited_by"),
        "mix": c.get("mix"),
        "error": c.get("error"),
        "notes": c.get("notes", []),
    }


def why_changed(base: SideCompile, head: SideCompile, cases: list, ident: Identity) -> list[dict]:
    """Base against head per kernel, for the shapes that differ (one row per distinct pair)."""
    rows: list[dict] = []
    seen = set()
    for i, s in enumerate(ident.shapes):
        if s.identical is not False:
            continue
        bl, hl = base.shapes[i]["launches"], head.shapes[i]["launches"]
        for j in range(max(len(bl), len(hl))):
            x = bl[j] if j < len(bl) else None
            y = hl[j] if j < len(hl) else None
            if x is not None and y is not None and not _launch_diff(x, y):
                continue
            bf, hf = (_facts(x) if x else None), (_facts(y) if y else None)
            key = repr((bf, hf))
            if key in seen:
                continue
            seen.add(key)
            changed = [
                k
                for k in (
                    "num_warps",
                    "num_stages",
                    "constexprs",
                    "grid",
                    "registers",
                    "spill_bytes",
                    "shared_bytes",
                    "occupancy",
                )
                if (bf or {}).get(k) != (hf or {}).get(k)
            ]
            rows.append(
                {
                    "kernel": (x or y)["kernel"],
                    "shape": s.shape,
                    "launch": j + 1,
                    "base": bf,
                    "head": hf,
                    "changed": changed,
                }
            )
    return rows
