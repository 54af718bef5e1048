"""Structural verification: prove a kernel's structure from its compiled IR, with no input and no GPU.

Parent side. The user's code is never imported here: the worker task
"verify-structural" (task.py) captures the entry's launches, compiles each
kernel to TTIR for sm_90 on the CPU, interprets it abstractly and runs the
op's analyses; this module starts it and turns its event into findings and
notices.

Modules: capture.py (launch recording), compile.py (TTIR), ir.py (the TTIR
parser), abstract_values.py, interpreter.py and op_handlers.py (the abstract
interpreter: its value types, the interpreter and its memory, one handler per op), dataflow.py (def-use, loops,
reductions, linear forms), common.py (every kernel), attention.py (with
attention_graph.py: the IR-graph checks, attention_memory.py: the memory-access checks), rope.py,
kv_append.py, decode_step.py (one per analysis), task.py (the worker task). docs/structural.md has
the checks and the catch matrix.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kernalin_ci.findings import Finding, Notice, StructuralStatus
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Op

if TYPE_CHECKING:
    from kernalin_ci.verify.structural.common import Analysis

TASK = "verify-structural"


def analysis_of(op: Op) -> Analysis | None:
    """The structural analysis the op names (`Op.structural`), or None when it has none."""
    if op.structural is None:
        return None
    analysis: Analysis = importlib.import_module(f"kernalin_ci.verify.structural.{op.structural}").ANALYSIS
    return analysis


def verify_structural(
    op_name: str,
    entry: str,
    params: dict,
    device: str = "cpu",
    root: str | None = None,
    timeout_s: float = 600.0,
    domain=None,
) -> tuple[list[Finding], list[Notice], StructuralStatus]:
    """Structural findings, notices and status for one entry. `device` is unused: nothing is launched."""
    from kernalin_ci.isolate import run_task

    if get_op(op_name).structural is None:
        return [], [], StructuralStatus("not-analysed", f"no structural checks for op {op_name}")
    job = {
        "task": TASK,
        "op": op_name,
        "entry": entry,
        "root": root,
        "params": params,
        "domain": domain.to_json() if domain is not None else {},
    }
    # TRITON_INTERPRET=0: the child compiles the kernels (it never launches them)
    outcome = run_task(job, "cpu", timeout_s, env={"TRITON_INTERPRET": "0"})
    done = next((e for e in outcome.events if e.get("event") == "structural-done"), None)
    outcome.raise_for_error("structural")
    if done is None:
        return (
            [],
            [],
            StructuralStatus(
                "not-analysed", f"the structural worker {outcome.status}: {outcome.ended() or outcome.status}"
            ),
        )
    return (
        [Finding.from_json(f) for f in done["findings"]],
        [Notice.from_json(n) for n in done["notices"]],
        StructuralStatus.from_json(done["status"]),
    )


__all__ = ["verify_structural", "analysis_of", "TASK"]
