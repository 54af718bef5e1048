"""Build a CUDA C++ kernel once, before its checks start.

`build(...)` (the parent) runs the worker task `cuda-build` (`run_job`, in a sandboxed worker like every step
that reads a pull request's code) and waits for it. The worker builds the PTX of the kernel's sources into the
run's CUDA cache (build.py); on a GPU it also loads the entry and launches it once at the op's pos-0 probe, so
that whatever the entry builds itself (a torch extension with `load`/`load_inline`, CuPy, NVRTC) lands in the
same cache (caches.py). The worker's cache folder is copied back when it ends: every worker the checks start
afterwards (dynamic, structural, Compute Sanitizer) starts with the build in place, none builds it again.
Nothing the warm-up launch does is judged: the checks run every case again."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kernalin_ci.cuda.build import BuildResult, build_ptx
from kernalin_ci.cuda.caches import cache_dir
from kernalin_ci.cuda.sources import CudaSpec
from kernalin_ci.device import DEVICES
from kernalin_ci.entry import load_entry
from kernalin_ci.isolate import run_task
from kernalin_ci.jobs import BuildJob, Emit
from kernalin_ci.ops import get_op


def build(
    spec: CudaSpec,
    entry: str,
    op: str,
    params: dict,
    device: str,
    root: str | None,
    timeout_s: float,
    dtype: str = "float32",
) -> tuple[BuildResult, float]:
    """Build SPEC's sources (and, on a GPU, whatever the entry builds) in a worker; (the PTX build, seconds the
    worker took in all)."""

    t0 = time.perf_counter()
    job = BuildJob(cuda=spec, entry=entry, op=op, params=params, dtype=dtype, root=root or os.getcwd())
    outcome = run_task(job, device, timeout_s, cwd=root)
    outcome.raise_for_error("cuda-build")
    found = next((e for e in outcome.events if e.get("event") == "cuda-build"), None)
    if found is None:  # the worker died before it built anything: the checks after it will say how
        res = BuildResult("failed", log=f"the build worker ended before building: {outcome.ended()}")
    else:
        res = BuildResult.from_json({k: v for k, v in found.items() if k != "event"})
    return res, time.perf_counter() - t0


def run_job(job: BuildJob, device: str, emit: Emit) -> None:
    """Worker task 'cuda-build'."""
    gpu = DEVICES[device].gpu
    res = build_ptx(job.cuda, Path(job.root), cache_dir(), gpu_arch() if gpu else None)
    emit({"event": "cuda-build", **res.to_json()})
    if gpu and res.status != "failed":
        emit({"event": "cuda-warm", **warm(job)})


def gpu_arch() -> str | None:
    """compute_XY of the GPU in use (None where torch sees none)."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"compute_{major}{minor}"


def warm(job: BuildJob) -> dict:
    """Load the entry and launch it once at the op's pos-0 probe (its builds land in the cache); what it
    raised, if anything (not judged: the checks launch every case again)."""
    import torch

    t0 = time.perf_counter()
    try:
        fn = load_entry(job.entry, job.root)
        op = get_op(job.op, root=job.root)
        case = op.probe(job.params, job.dtype or "float32")
        fn(**op.inputs(case, job.params, "cuda", poison=False))
        torch.cuda.synchronize()
        return {"seconds": time.perf_counter() - t0, "error": None}
    except Exception as e:  # the user's code: reported by the checks that follow, not here
        return {"seconds": time.perf_counter() - t0, "error": f"{type(e).__name__}: {str(e)[:300]}"}
