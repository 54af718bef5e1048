"""The catalogue (checks/): correct and injected-bug kernels per op, and their catch matrix.

Each catalogue module declares a literal `CATALOGUE` dict (op, bug_class, pos0,
params, modelled_on, style) and an `entry` function. The matrix runs every
kernel through the pos-0 probe, the dynamic checks and the structural checks,
and compares what was caught with what the file says.
"""

from __future__ import annotations

import ast
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kernalin_ci.cuda.sources import CudaSpec
from kernalin_ci.errors import UsageError
from kernalin_ci.findings import BUG_CLASSES
from kernalin_ci.ops import NAMES
from kernalin_ci.verify import verify

KINDS = ("probe", "dynamic", "structural", "sanitizer", "ptx")
CUDA_DIR = "cuda"  # checks/cuda/OP/*.py: the CUDA C++ catalogue (docs/cuda.md)


@dataclass
class CatalogueKernel:
    path: str
    op: str
    bug_class: str | None
    pos0: str | None
    params: dict
    modelled_on: str | None
    style: str | None
    cuda: dict | None = None  # a CUDA C++ kernel's sources and flags, relative to the CUDA catalogue's folder
    dynamic: str | None = None  # "racy": a race that normal runs may or may not show (no expectation)
    sanitizer: str | None = None  # "caught" | "missed": what Compute Sanitizer must report (None: no expectation)
    # "not-analysed": its params switch on what the structural analysis does not model (an attention feature,
    # a scaled RoPE table); the analysis must say so (the whole status, or a gap "not analysed for ..."), never
    # pass or catch it
    structural: str | None = None

    @property
    def name(self) -> str:
        p = Path(self.path)
        return f"{CUDA_DIR + '/' if self.cuda else ''}{p.parent.name}/{p.stem}"

    @property
    def root(self) -> str | None:
        """The folder a CUDA kernel's sources and flags are relative to (None for a Triton kernel)."""
        return str(Path(self.path).parent.parent) if self.cuda else None

    @property
    def is_bug(self) -> bool:
        return self.bug_class is not None


@dataclass
class Cell:
    caught: bool
    classes: list[str] = field(default_factory=list)
    notices: int = 0
    seconds: float = 0.0
    error: str | None = None
    not_checked: str | None = None  # why this kind could not run here (needs a GPU, n/a yet): no verdict
    # what the structural analysis says it does not analyse ("not analysed for" a feature): its whole cause or gaps
    unanalysed: list[str] = field(default_factory=list)

    @property
    def says_not_analysed(self) -> bool:
        return bool(self.unanalysed)


@dataclass
class Row:
    kernel: CatalogueKernel
    cells: dict  # kind -> Cell

    def expected(self, kind: str) -> bool | None:
        """What the catalogue says this kind must report (None: no expectation)."""
        k = self.kernel
        if not k.is_bug:
            return False
        if kind == "probe":
            return k.pos0 == "caught"
        if kind == "dynamic":
            return None if k.dynamic == "racy" else True
        if kind == "sanitizer":
            return {"caught": True, "missed": False}.get(k.sanitizer or "")
        return None  # structural, ptx: judged by the coverage tables (per op, per class), not per file

    def mismatches(self) -> list[str]:
        out = []
        for kind, cell in self.cells.items():
            want = self.expected(kind)
            if cell.error:
                out.append(f"{kind}: {cell.error}")
            elif kind == "structural" and self.kernel.structural == "not-analysed" and not cell.says_not_analysed:
                out.append("structural: analysed, catalogue says not-analysed")
            elif cell.not_checked:
                continue
            elif kind == "sanitizer" and not self.kernel.is_bug and cell.caught:
                out.append("sanitizer: a false finding on a correct kernel")
            elif kind in ("structural", "ptx") and not self.kernel.is_bug and cell.caught:
                out.append(f"{kind}: a false finding on a correct kernel")
            elif want is not None and cell.caught != want:
                out.append(
                    f"{kind}: {'caught' if cell.caught else 'missed'}, catalogue says {'caught' if want else 'missed'}"
                )
        return out


def default_dir() -> Path:
    env = os.environ.get("KERNALIN_CHECKS")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent / "checks"
    return here if here.is_dir() else Path.cwd() / "checks"


def discover(root: Path, ops: list[str] | None = None) -> list[CatalogueKernel]:
    if not root.is_dir():
        raise UsageError(f"catalogue directory not found: {root}")
    root = root.resolve()  # a CUDA kernel's entry is read relative to its root (CatalogueKernel.root)
    kernels = []
    for path in sorted([*root.glob("*/*.py"), *root.glob(f"{CUDA_DIR}/*/*.py")]):
        if path.name.startswith("_"):
            continue
        meta = read_meta(path)
        if ops and meta.op not in ops:
            continue
        kernels.append(meta)
    return kernels


def read_meta(path: Path) -> CatalogueKernel:
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CATALOGUE" for t in node.targets):
            try:
                d = ast.literal_eval(node.value)
            except ValueError:
                raise UsageError(f"{path}:{node.lineno}: CATALOGUE must be a literal dict") from None
            break
    else:
        raise UsageError(f"{path}: no CATALOGUE dict")
    if d.get("op") not in NAMES:
        raise UsageError(f"{path}: CATALOGUE op {d.get('op')!r} is not an op")
    bug = d.get("bug_class")
    if bug is not None and bug not in BUG_CLASSES:
        raise UsageError(f"{path}: CATALOGUE bug_class {bug!r} is not in the vocabulary")
    if d.get("structural") not in (None, "not-analysed"):
        raise UsageError(f"{path}: CATALOGUE structural must be 'not-analysed' when given")
    if bug is not None and d.get("pos0") not in ("caught", "missed"):
        raise UsageError(f"{path}: CATALOGUE pos0 must be 'caught' or 'missed' for a bug kernel")
    return CatalogueKernel(
        str(path),
        d["op"],
        bug,
        d.get("pos0"),
        dict(d.get("params") or {}),
        d.get("modelled_on"),
        d.get("style"),
        d.get("cuda"),
        d.get("dynamic"),
        d.get("sanitizer"),
        d.get("structural"),
    )


def run_one(kernel: CatalogueKernel, kind: str, device: str) -> Cell:

    entry = f"{kernel.path}:entry"
    cuda = CudaSpec.from_json(kernel.cuda)
    if cuda is not None and kind == "structural":  # the TTIR engine reads Triton only; the PTX engine reads both
        return Cell(False, not_checked="n/a (the TTIR engine reads Triton kernels only)")
    try:
        common = {"progress": False, "root": kernel.root, "cuda": cuda}
        if kind == "probe":
            r = verify(kernel.op, entry, kernel.params, device, probe=True, sanitizer=False, **common)
        elif kind == "dynamic":
            r = verify(kernel.op, entry, kernel.params, device, only=kind, sanitizer=False, **common)
        elif kind == "ptx":
            r = verify(
                kernel.op, entry, kernel.params, device, only="structural", engine="ptx", sanitizer=False, **common
            )
        else:
            r = verify(kernel.op, entry, kernel.params, device, only=kind, **common)
    except UsageError as e:
        return Cell(False, error=str(e))
    found = [f for f in r.findings if kind != "sanitizer" or f.kind in ("sanitizer", "build")]
    if not found and kind == "sanitizer" and r.sanitizer.status != "checked":
        return Cell(False, not_checked=f"not checked ({r.sanitizer.cause})", seconds=r.seconds)
    whole = kind in ("structural", "ptx") and r.structural.status == "not-analysed"
    said = [t for t in ([r.structural.cause or ""] if whole else r.structural.gaps) if "not analysed for" in t]
    said = said if kind == "structural" else []
    if whole:
        cause = f"not analysed ({r.structural.cause})"
        return Cell(
            bool(found),
            sorted({f.bug_class for f in found}),
            len(r.notices),
            r.seconds,
            not_checked=cause,
            unanalysed=said,
        )
    if not found and r.needs_gpu:
        return Cell(False, not_checked="not checked (needs a GPU)", seconds=r.seconds)
    return Cell(bool(found), sorted({f.bug_class for f in found}), len(r.notices), r.seconds, unanalysed=said)


def matrix(
    kernels: list[CatalogueKernel], kinds: tuple[str, ...], device: str, jobs: int = 1, on_row=None
) -> list[Row]:
    def work(k: CatalogueKernel) -> Row:
        row = Row(k, {kind: run_one(k, kind, device) for kind in kinds})
        if on_row:
            on_row(row)
        return row

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(work, kernels))


def row_json(row: Row) -> dict:
    return {
        "kernel": row.kernel.name,
        **asdict(row.kernel),
        "results": {k: asdict(c) for k, c in row.cells.items()},
        "mismatches": row.mismatches(),
    }
