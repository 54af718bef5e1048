"""Structural verification: prove a kernel's structure from its compiled IR, with no input and no GPU.

Parent side. The user's code is never imported here: the worker task
"verify-structural" (task.py) captures the entry's launches and compiles each
kernel to TTIR for sm_90 on the CPU, and hands back that raw material
(material.py); this process checks it, interprets each kernel abstractly and
runs the op's analyses (analyse.py), so the worker decides no finding.

Modules: capture.py (launch recording), compile.py (TTIR), material.py (what
the worker hands back), ir.py and ir_parser.py (TTIR as data, its parser), abstract_values.py,
interpreter.py, op_handlers.py and arith_handlers.py (the abstract interpreter: its value types,
the interpreter and its memory, one handler per op), dataflow.py (def-use,
loops, reductions, linear forms), common.py (every kernel), attention.py (with
attention_graph.py: the IR-graph checks on attention_values.py's values, attention_memory.py: the memory-access
checks), rope.py, kv_append.py, decode_step.py (one per analysis), task.py (the
worker task), analyse.py (the parent's analysis). docs/structural.md has the
checks and the catch matrix.
"""

from __future__ import annotations

from kernalin_ci.domain import Domain
from kernalin_ci.findings import Finding, Notice, StructuralStatus
from kernalin_ci.isolate import run_task
from kernalin_ci.jobs import StructuralJob
from kernalin_ci.ops import get_op
from kernalin_ci.sandbox import CappedFolder
from kernalin_ci.verify import exchange
from kernalin_ci.verify.exchange import BadResult
from kernalin_ci.verify.structural import material
from kernalin_ci.verify.structural.analyse import analyse
from kernalin_ci.verify.structural.capture import capture_cases
from kernalin_ci.verify.structural.ptx_run import analyse_ptx
from kernalin_ci.verify.structural.registry import analysis_of
from kernalin_ci.verify.structural.result import analysis_failure


def verify_structural(
    op_name: str,
    entry: str,
    params: dict,
    device: str = "cpu",
    root: str | None = None,
    timeout_s: float = 600.0,
    domain=None,
    engine: str = "ttir",
) -> tuple[list[Finding], list[Notice], StructuralStatus]:
    """Structural findings, notices and status for one entry. `device` is unused: nothing is launched.
    engine: "ttir" (the abstract interpreter of the TTIR, at the capture shape) or "ptx" (the symbolic
    engine over PTX, kernalin_ci/ptx: properties for every shape of the domain).

    The worker captures and compiles (task.py) and hands back only the material (material.py); this
    process checks it, parses, interprets and analyses it (analyse.py). Material that is missing,
    unreadable, oversized or malformed, and files no event named, are `bad-result` findings, with the
    status "not analysed (bad result: ...)"; a worker that hangs or dies is "not analysed" as before."""

    op = get_op(op_name)
    if op.structural is None:
        return [], [], StructuralStatus("not-analysed", f"no structural checks for op {op_name}")
    folder = CappedFolder("kernalin-structural-")  # the worker writes folder.path, this process reads folder.view
    job = StructuralJob(
        op=op_name,
        entry=entry,
        root=root,
        params=params,
        domain=domain if domain is not None else Domain(),
        results=folder.path,
        engine=engine,
    )
    try:
        # TRITON_INTERPRET=0: the child compiles the kernels (it never launches them)
        outcome = run_task(job, "cpu", timeout_s, env={"TRITON_INTERPRET": "0"}, writable=(folder,))
        bad = folder.full()  # the worker filled its results folder to its cap
        if bad is None and outcome.status == "internal-error":
            # the user's code made capture, compilation or packing fail in a way we did not foresee: the
            # analysis did not run, and that is all it says (the dynamic verdict stands)
            return [], [], StructuralStatus("not-analysed", f"the structural worker failed: {outcome.detail}")
        if bad is None:
            outcome.raise_for_error("structural")
        done = [e for e in outcome.events if e.get("event") == "structural-done"]
        mat = None
        if bad is None and len(done) > 1:
            bad = "the worker sent more than one structural-done event"
        elif bad is None and not done and outcome.status == "ok":
            bad = "the worker handed back no result"
        elif bad is None and done:
            try:
                mat = material.load(
                    folder.view, done[0].get("file"), capture_cases(op, params, domain), op_name, params
                )
            except BadResult as e:
                bad = str(e)
        left = exchange.leftovers(folder.view)
        if left and bad is None:
            bad = f"the worker wrote files no result named: {', '.join(left[:5])}" + (" ..." if len(left) > 5 else "")
    finally:
        folder.close()
    if bad is not None:
        finding = Finding("structural:worker-result", "bad-result", bad, kind="structural")
        return [finding], [], StructuralStatus("not-analysed", f"bad result: {bad}")
    if mat is None:
        return (
            [],
            [],
            StructuralStatus(
                "not-analysed", f"the structural worker {outcome.status}: {outcome.ended() or outcome.status}"
            ),
        )
    seconds = done[0].get("seconds")
    seconds = {k: v for k, v in seconds.items() if k in ("capture", "compile")} if isinstance(seconds, dict) else {}
    seconds = {k: float(v) for k, v in seconds.items() if isinstance(v, (int, float))}
    try:
        if engine == "ptx":
            out = analyse_ptx(op_name, mat, params, root, seconds, domain)
        else:
            out = analyse(op_name, mat, root, seconds)
    except Exception as e:  # an IR or capture our analysis does not foresee: not analysed, never exit 3
        return [], [], StructuralStatus("not-analysed", f"the analysis failed: {analysis_failure(e)}")
    return (
        [Finding.from_json(f) for f in out["findings"]],
        [Notice.from_json(n) for n in out["notices"]],
        StructuralStatus.from_json(out["status"]),
    )


__all__ = ["verify_structural", "analysis_of", "analysis_failure"]
