"""Checks every kernel gets, and the report the analyses write into.

* out-of-range accesses: a load or store whose (unmasked) index leaves its tensor;
* reduced precision: sums (tt.reduce with addf), loop-carried accumulations
  and tl.dot accumulators held in float16/bfloat16.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernalin_ci.findings import Finding, Location, Notice
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Op
from kernalin_ci.verify.structural.dataflow import (
    KernelView,
    alternatives,
    carried,
    line_of,
    loop_yield,
    peel,
    reduce_kind,
)
from kernalin_ci.verify.structural.ir import IROp

LOW = ("f16", "bf16", "f8")


def op_of(cap: Any) -> Op | None:
    """The op a capture is of (what it is: a paged cache, a rotation, ...; kernalin_ci/ops), None without one."""
    name = getattr(cap, "op", None)
    return get_op(name) if name else None


def _check_id(check: str) -> str:
    """A structural check id is written whole where it is produced (`"structural:kv-mask"`), so that
    grepping for the id a report shows finds the code."""
    if not check.startswith("structural:"):
        raise ValueError(f"structural check id {check!r}: must start with 'structural:'")
    return check


class StructuralFindings:
    """Findings and notices of one entry, one per (check, class, location)."""

    def __init__(self):
        self.findings: list[Finding] = []
        self.notices: list[Notice] = []
        self._seen: set = set()
        self.gaps: dict[str, str] = {}  # property of Analysis.properties -> why it could not be verified

    def finding(
        self, check: str, bug_class: str, message: str, op: IROp | None = None, view=None, where: tuple | None = None
    ) -> None:
        loc = where or (line_of(op, view.launch) if view is not None else None)
        key = ("F", bug_class, loc)  # one finding per class and line, whichever check saw it first
        if key in self._seen:
            return
        self._seen.add(key)
        self.findings.append(
            Finding(
                check=_check_id(check),
                bug_class=bug_class,
                message=message,
                location=Location(*loc) if loc else None,
                kind="structural",
            )
        )

    def notice(self, check: str, message: str, op: IROp | None = None, view=None, where: tuple | None = None) -> None:
        loc = where or (line_of(op, view.launch) if view is not None else None)
        key = ("N", check, message, loc)
        if key in self._seen:
            return
        self._seen.add(key)
        self.notices.append(Notice(check=_check_id(check), message=message, location=Location(*loc) if loc else None))

    def gap(
        self, prop: str, check: str, message: str, op: IROp | None = None, view=None, where: tuple | None = None
    ) -> None:
        """A property the analysis could not verify: a notice, and the property is reported as a gap (never
        as proved) in the result's structural status."""
        self.notice(check, message, op, view, where)
        self.gaps.setdefault(prop, message)

    def has(self, bug_class: str) -> bool:
        return any(f.bug_class == bug_class for f in self.findings)


@dataclass(frozen=True)
class Analysis:
    """One op's structural analysis (the module an op names in `Op.structural` defines `ANALYSIS`):
    `model(capture)` is what the interpreter tracks for the op, `analyze(capture, views, report, model)`
    runs its checks once every kernel was followed. `store_bounds`: False where `analyze` judges the
    write set itself (the common bounds check then looks at loads only). `properties`: what the analysis
    proves of a kernel it follows whole; each one it cannot verify it reports with `StructuralFindings.gap`
    (the result lists the properties proved and the gaps, docs/structural.md)."""

    model: Callable[[Any], Any]
    analyze: Callable[[Any, list, StructuralFindings, Any], None]
    store_bounds: bool = True
    properties: tuple[str, ...] = ()


# what every followed kernel gets (check_bounds, check_precision)
COMMON_PROPERTIES = ("memory bounds", "accumulation precision")


def kname(view: KernelView) -> str:
    return view.launch.kernel


# --------------------------------------------------------------------------- out of range


def check_bounds(view: KernelView, rep: StructuralFindings, stores: bool = True) -> None:
    """Masked-in lanes whose address falls outside the tensor they point into."""
    seen = set()
    for acc in view.trace.accesses:
        bad = acc.mask & ~acc.inb
        if not bad.any() or acc.op in seen or (acc.kind == "store" and not stores):
            continue
        seen.add(acc.op)
        t = view.names[int(np.asarray(acc.tensor).reshape(-1)[0])]
        info = view.capture.tensors[t]
        n = int(bad.sum())
        e = acc.elem[bad]
        side = "past the end of" if (e >= 0).all() else "before the start of"
        what = "loads" if acc.kind == "load" else "stores"
        msg = (
            f"{kname(view)} {what} {n} element(s) {side} {t} {list(info.shape)} "
            f"(program {acc.program}, element offsets {e[:3].tolist()}): the index is not masked"
        )
        if acc.kind == "load":
            rep.finding("structural:bounds", "unmasked-load", msg, acc.op, view)
        else:
            rep.finding("structural:bounds", "stray-write", msg, acc.op, view)


# --------------------------------------------------------------------------- precision


def check_precision(view: KernelView, rep: StructuralFindings) -> None:
    for op in view.ops():
        if op.name == "tt.reduce" and reduce_kind(op) == "addf":
            t = op.operands[0].type
            if t.elem in LOW:
                rep.finding(
                    "structural:precision",
                    "precision",
                    f"{kname(view)} sums {t.elem} values with a {t.elem} reduction (accumulate in float32)",
                    op,
                    view,
                )
        elif op.name == "tt.dot":
            if op.result.type.elem in LOW:
                rep.finding(
                    "structural:precision",
                    "precision",
                    f"{kname(view)} accumulates tl.dot in {op.result.type.elem} (use a float32 accumulator)",
                    op,
                    view,
                )
        elif op.name == "scf.for":
            body = op.regions[0][0]
            for j, arg in enumerate(body.args[1:]):
                if arg.type.elem not in LOW:
                    continue
                y = loop_yield(op, j)
                if y is None:
                    continue
                for u in alternatives(y):  # an update under an `if` in the loop counts too
                    yo = peel(u).owner
                    if (
                        yo is not None
                        and yo.name in ("arith.addf", "arith.subf", "math.fma", "tt.dot")
                        and any(peel(o) is arg or carried(peel(o)) == (op, j) for o in yo.operands)
                    ):
                        rep.finding(
                            "structural:precision",
                            "precision",
                            f"{kname(view)} accumulates {arg.name} across loop iterations in {arg.type.elem}",
                            yo,
                            view,
                        )
