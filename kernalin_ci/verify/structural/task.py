"""Worker task "verify-structural": capture and compile, in the child process; nothing is judged here.

The user's code is imported only here (in `python -m kernalin_ci.kernel_worker`), with TRITON_INTERPRET off:
the kernels are compiled for sm_90 on the CPU and never launched. The child hands back the raw
material of the analyses (material.py: the captured launches, tensors and TTIR texts) in a file of the
results directory the parent made; its one event names that file:
`{"event": "structural-done", "file": "structural.pt", "seconds": {"capture": ..., "compile": ...}}`.
The parent (analyse.py) parses, interprets and analyses it.
"""

from __future__ import annotations

import os
import time

from kernalin_ci.entry import load_entry
from kernalin_ci.jobs import Emit, StructuralJob
from kernalin_ci.ops import get_op
from kernalin_ci.verify.structural import material
from kernalin_ci.verify.structural.capture import CaptureError, capture_at, capture_cases, shape_label
from kernalin_ci.verify.structural.compile import CompileError, ptx, ttir
from kernalin_ci.verify.structural.ir import ParseError
from kernalin_ci.verify.structural.ir_parser import parse_module


def capture_material(op_name: str, fn, params: dict, domain=None, engine: str = "ttir") -> tuple[dict, dict]:
    """Capture the entry (already loaded) at the first capture shape it accepts and compile its kernels
    to TTIR: (the material, material.pack; seconds spent). A capture the kernel refuses, or a kernel that
    does not compile or whose TTIR does not parse, moves on to the next candidate shape (the declared
    domain first); each refusal is recorded. engine "ptx": also each kernel's PTX and the twin call
    (Op.capture_twin), for the PTX engine."""

    times = {"capture": 0.0, "compile": 0.0}
    op = get_op(op_name)
    refused: list[str] = []
    for index, case in enumerate(capture_cases(op, params, domain)):
        shape = shape_label(case)
        t0 = time.perf_counter()
        try:
            cap = capture_at(op, fn, params, case)
        except CaptureError as e:
            refused.append(f"at {shape}: {e}")
            continue
        finally:
            times["capture"] += time.perf_counter() - t0
        if not cap.launches:
            refused.append(f"at {shape}: the entry launched no Triton kernel")
            continue
        cuda = next((la.kernel for la in cap.launches if la.ptx), None)
        if cuda is not None and engine != "ptx":  # the TTIR engine reads Triton kernels only
            refused.append(f"at {shape}: kernel {cuda} is CUDA C++ (only the PTX engine analyses it: --engine ptx)")
            continue
        t1 = time.perf_counter()
        try:
            texts = [ttir(la) if not la.ptx else "" for la in cap.launches]
            for text in filter(None, texts):
                parse_module(text)  # the parent parses it again; a text it cannot parse tries the next shape
        except (CompileError, ParseError) as e:
            refused.append(f"at {shape}: a kernel does not compile: {e}")
            continue
        finally:
            times["compile"] += time.perf_counter() - t1
        ptx, twin = _for_ptx(op, fn, params, case, cap, times) if engine == "ptx" else (None, None)
        return material.pack(index, refused, cap, texts, ptx, twin), times
    return material.pack(None, refused), times


def _for_ptx(op, fn, params: dict, case, cap, times: dict) -> tuple[list[str], dict | None]:
    """Each launch's PTX ("" where it does not compile: the PTX engine says so), and the twin call."""
    from dataclasses import replace

    t0 = time.perf_counter()
    texts = []
    for la in cap.launches:
        try:
            texts.append(la.ptx or ptx(la))
        except CompileError:
            texts.append("")
    times["compile"] += time.perf_counter() - t0
    dims = op.capture_twin(case.dims)
    if dims is None:
        return texts, None
    t1 = time.perf_counter()
    try:
        other = capture_at(op, fn, params, replace(case, dims=dims))
    except CaptureError:
        return texts, None
    finally:
        times["capture"] += time.perf_counter() - t1
    twin = {
        "tensors": {n: [list(map(int, t.shape)), list(map(int, t.strides))] for n, t in other.tensors.items()},
        "launches": [
            {
                "kernel": la.kernel,
                "grid": [int(g) for g in la.grid],
                "args": {a.name: a.value for a in la.args if a.kind in ("int", "bool")},
            }
            for la in other.launches
        ],
    }
    return texts, twin


def run_job(job: StructuralJob, emit: Emit) -> None:
    """Worker task 'verify-structural'."""
    # kernels are compiled, never interpreted: `triton.jit` must give JITFunctions (set before the entry
    # imports Triton; the parent sets it in the environment too)
    os.environ["TRITON_INTERPRET"] = "0"

    t0 = time.perf_counter()
    fn = load_entry(job.entry, job.root)
    emit({"event": "structural-start"})
    raw, seconds = capture_material(job.op, fn, job.params, job.domain, job.engine)
    name = material.save(job.results, raw)
    seconds["total"] = round(time.perf_counter() - t0, 4)
    emit({"event": "structural-done", "file": name, "seconds": seconds})
