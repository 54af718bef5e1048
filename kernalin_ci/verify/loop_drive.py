"""The decode loop, the worker's half (ops/decode_loop.py is the loop's model; verify/loop_judge.py the
parent's half): run each step's entries on the loop's state and hand back what they produced (outputs,
both whole caches), raw, one part file per step (`exchange.hand_back_parts`). Nothing is judged here.

Two ways of doing a step: the `decode_step` op's one entry (`drive_op_loop`, run by verify/dynamic.py
for a case the op runs as a loop, `Op.loop`), and the decode pipeline's three entries (`drive_pipeline`,
worker task 'verify-pipeline': `run_job`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from kernalin_ci.device import DEVICES
from kernalin_ci.entry import load_entry
from kernalin_ci.jobs import Emit, PipelineJob
from kernalin_ci.lazy import torch
from kernalin_ci.ops.decode_loop import (
    STEP_INPUTS,
    DecodeLoop,
    LoopState,
    Step,
    init_state,
    next_step,
    pipeline_loop,
    step_arguments,
)
from kernalin_ci.ops.roles import pipeline_op
from kernalin_ci.verify import exchange
from kernalin_ci.verify.exchange import plain
from kernalin_ci.verify.precision import launched_ttir, recorded_launches
from kernalin_ci.verify.support import Interpreter

HandBack = Callable[[int, dict[str, Any], float], None]


def drive_loop(loop: DecodeLoop, s: LoopState, run_step: Callable[[Step], dict[str, Any]], hand_back: HandBack) -> int:
    """Run the loop's steps from state `s`; `run_step` calls the entries and returns what they produced (CPU
    tensors, the caches after the step as `k_cache`, `v_cache`), which `hand_back(step, raw, seconds)`
    writes out. Nothing is judged here. An entry that raises ends the loop (the exception goes up).
    Returns the number of steps handed back."""
    for index in range(loop.steps):
        t0 = time.perf_counter()
        st = next_step(s, index, loop.dtype, loop.padding)
        raw = run_step(st)
        s.lens = list(st.kv_lens)
        hand_back(index, raw, time.perf_counter() - t0)
    return loop.steps


def launches(device: str) -> Any:
    """A block that records the compiled kernels launched in it (on a GPU: their TTIR is handed back as
    `ttir`, verify/precision.py); on the CPU nothing is recorded."""
    return recorded_launches() if DEVICES[device].gpu else nullcontext()


def raw_out(out: Any) -> Any:
    """The step's output as handed back: a CPU tensor, or the name of what came back instead."""
    return plain(out) if isinstance(out, torch.Tensor) else type(out).__name__


def _sync(device: str) -> None:
    if DEVICES[device].gpu:
        torch.cuda.synchronize()


def drive_op_loop(fn: Callable[..., Any], loop: DecodeLoop, device: str, hand_back: HandBack) -> int:
    """An op's loop case (`Op.loop`: the decode_step op), one entry doing the whole step with the step's
    arguments; handed back: its inputs as the call left them, both caches, the output."""
    s = init_state(loop, device)

    def run_step(st: Step) -> dict[str, Any]:
        kw = step_arguments(s, st, device)
        with launches(device) as launched:
            out = fn(**kw)
            _sync(device)
        return {
            **{n: plain(kw[n]) for n in (*STEP_INPUTS, "k_cache", "v_cache")},
            "out": raw_out(out),
            "ttir": launched_ttir(launched),
        }

    return drive_loop(loop, s, run_step, hand_back)


def drive_pipeline(fns: dict[str, Any], loop: DecodeLoop, device: str, hand_back: HandBack) -> int:
    """The pipeline's loop: each step, B decode tokens plus one padding token (slot -1) that must change
    nothing, through rope (when given), kv_append and attention (given the features' inputs and an FP8
    cache's scales); handed back: the rope outputs, both caches after kv_append and after attention, the
    attention output."""
    s = init_state(loop, device)
    rope_fn, kv_append, attention = (fns.get(pipeline_op(role)) for role in ("rope", "kv_append", "attention"))

    def run_step(st: Step) -> dict[str, Any]:
        B = len(st.kv_lens)
        raw: dict[str, Any] = {}
        q_in, k_in = st.q.to(device), st.k.to(device)
        if rope_fn is not None:
            pos = torch.tensor(st.positions, dtype=torch.int64)
            q_in, k_in = rope_fn(q=q_in, k=k_in, positions=pos.to(device))
            _sync(device)
            raw["q"], raw["k"] = plain(q_in), plain(k_in)
        kv_append(
            key=k_in,
            value=st.v.to(device),
            k_cache=s.k_cache,
            v_cache=s.v_cache,
            slot_mapping=torch.tensor(st.slots, dtype=torch.int64, device=device),
            **s.kv_scales,  # an FP8 cache: k_scale and v_scale, as kv_append takes them
        )
        _sync(device)
        # copies: on the CPU plain() keeps the live cache, which attention could still change
        raw["k_cache_append"], raw["v_cache_append"] = plain(s.k_cache.clone()), plain(s.v_cache.clone())
        with launches(device) as launched:  # the attention entry's kernels: their TF32 dots
            out = attention(
                q=q_in[:B],
                k_cache=s.k_cache,
                v_cache=s.v_cache,
                block_tables=s.tables,
                kv_lens=torch.tensor(st.kv_lens, dtype=torch.int32, device=device),
                scale=s.scale,
                **s.extra,  # the attention features' inputs (alibi_slopes, sinks), as the attention ops pass them
                **s.kv_scales,
            )
            _sync(device)
        raw["k_cache"], raw["v_cache"], raw["out"] = plain(s.k_cache), plain(s.v_cache), raw_out(out)
        raw["ttir"] = launched_ttir(launched)
        return raw

    return drive_loop(loop, s, run_step, hand_back)


def run_job(job: PipelineJob, device: str, emit: Emit) -> None:
    """Worker task 'verify-pipeline': each case from `start` on, handed back one step at a time (case-part
    events naming the head dim they ran at). A loop whose entries raise before its first step is handed
    back is refused at that head dim; the main loop then moves to the next of its `instead` head dims."""
    fns = {role: load_entry(spec, job.root) for role, spec in job.entries.items() if spec}
    rope = bool(fns.get(pipeline_op("rope")))
    interp = Interpreter(DEVICES[device].interpreted)
    for index in range(job.start, len(job.cases)):
        dims = job.cases[index].dims
        emit({"event": "case-start", "index": index})
        t0 = time.perf_counter()
        unfaithful = interp.cannot_run(job.dtype)
        if unfaithful:
            emit({"event": "case-done", "index": index, "seconds": 0.0, "status": "not-run", **unfaithful})
            continue
        ev: dict = {"status": "refused"}
        refused: list[dict] = []
        for D in [dims["D"], *dims.get("instead", [])]:
            hand_back = exchange.hand_back_parts(emit, job.results, index)
            parts = [0]

            moved = {"D": D} if D != dims["D"] else {}  # a part of a moved loop says where it ran

            def counted(step, raw, seconds, _hand_back=hand_back, _parts=parts, _moved=moved):
                _parts[0] += 1
                _hand_back(step, raw, seconds, **_moved)

            try:
                loop = pipeline_loop(job.params, job.dtype, job.seed, dims["steps"], rope, D)
                drive_pipeline(fns, loop, device, counted)
                ev = {"status": "ok"}
            except Exception as e:
                error = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
                unfaithful = interp.after_case()  # the interpreter's error, not the entry's: not checked
                if parts[0] == 0 and not unfaithful:
                    refused.append({"D": D, "error": error})
                    continue
                ev = {"status": "raised", "error": error}
            break
        unfaithful = unfaithful or interp.after_case()
        emit(
            {
                "event": "case-done",
                "index": index,
                "seconds": time.perf_counter() - t0,
                "refused": refused,
                **({"status": "not-run", **unfaithful} if unfaithful else ev),
            }
        )
