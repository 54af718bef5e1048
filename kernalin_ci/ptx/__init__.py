"""A symbolic engine over PTX: properties of a kernel proved for every shape of a declared domain.

Inputs are plain data, the same for a Triton kernel (its `asm["ptx"]`) and a CUDA C++ one (nvcc/NVRTC
`-ptx`): the PTX text and the launch facts (facts.py: parameters, grid, tensors with shapes and strides as
expressions over shape symbols, which tensors are index tensors and the contract's bounds on them) plus
the op's contract (context.Contract). Modules: syntax.py (the parser), terms.py (symbolic values),
semantics.py (instruction arithmetic), executor.py (every lane of a block, symbolic blocks, data, loops),
smem.py (shared memory, ldmatrix/stmatrix), mma.py (tensor-core products), cfg.py (where split lanes meet again),
pointers.py (a pointer chosen by a select),
solver.py (z3), context.py (the domain's constraints, verdicts), memory.py (memory properties),
attention_reads.py (attention's K/V reads), softmax.py (the softmax, from the float dataflow),
rope_reads.py (what each rotated element reads), rope_angles.py (its signs, angle and table row),
decode_step.py (a fused decode step's cache stores, step order and a work queue's coverage), atomics.py
(integer atomic additions: takes of a counter, a persistent loop over them), races.py (shared-memory races
between a block's threads), evaluate.py
(concrete evaluation of terms).
Nothing here imports the rest of kernalin_ci: verify/structural/ptx_*.py plugs it in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kernalin_ci.ptx import attention_reads, decode_step, memory, races, rope_angles, rope_reads, softmax, solver, terms
from kernalin_ci.ptx.context import Context, Contract, Result
from kernalin_ci.ptx.executor import execute
from kernalin_ci.ptx.facts import LaunchFacts
from kernalin_ci.ptx.semantics import Unsupported
from kernalin_ci.ptx.syntax import PtxSyntaxError, parse


@dataclass
class KernelAnalysis:
    kernel: str
    results: list[Result] = field(default_factory=list)
    not_analysed: str | None = None  # why the kernel could not be followed (no property is then proved)
    seconds: dict[str, float] = field(default_factory=dict)
    instructions: int = 0


def analyse(ptx: str, facts: LaunchFacts, contract: Contract) -> KernelAnalysis:
    """Parse, execute and prove the contract's properties of one kernel launch."""

    out = KernelAnalysis(facts.kernel)
    if not solver.available():
        out.not_analysed = "no solver (pip install z3-solver)"
        return out
    t0 = time.perf_counter()
    terms.reset()
    try:
        kernel = parse(ptx)
    except PtxSyntaxError as e:
        out.not_analysed = f"the PTX does not parse: {e}"
        return out
    symbols = {f"ctaid.{x}": terms.sym(f"ctaid.{x}", 32) for x in "xyz"}
    symbols |= {name: terms.sym(name, 64) for name in facts.symbols}
    t1 = time.perf_counter()
    try:
        trace = execute(kernel, facts, symbols)
    except Unsupported as e:
        out.not_analysed = f"not followed: {e}"
        out.seconds = {"parse": t1 - t0, "execute": time.perf_counter() - t1}
        return out
    t2 = time.perf_counter()
    out.instructions = len(kernel.instrs)
    ctx = Context(facts, contract, trace, symbols)
    out.results += memory.bounds(trace, ctx)
    out.results += races.check(trace, ctx)
    if contract.caches:
        out.results += memory.cache_stores(trace, ctx)
    if contract.query:
        out.results += attention_reads.kv_reads(trace, ctx)
    if contract.output:
        out.results += softmax.check(trace, ctx)
    if contract.new_key:
        out.results += decode_step.check(trace, ctx)
    if contract.rotations:
        out.results += rope_reads.rope_reads(trace, ctx)
        out.results += rope_angles.rope_angles(trace, ctx)
    out.seconds = {"parse": t1 - t0, "execute": t2 - t1, "prove": time.perf_counter() - t2}
    return out
