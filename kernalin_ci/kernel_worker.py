"""The child process that runs untrusted kernels: `python -m kernalin_ci.kernel_worker JOB.json FD`.

It runs one task (named in the job) and writes JSON-line events to file
descriptor FD. The kernel's own prints go to stdout/stderr, which the parent
keeps apart from the events. The device is fixed by the parent through the
environment (TRITON_INTERPRET=1 for the CPU) before anything imports Triton.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

TASKS = {
    "verify-dynamic": "kernalin_ci.verify.dynamic:run_job",
    "verify-pipeline": "kernalin_ci.verify.pipeline:run_job",
    "verify-structural": "kernalin_ci.verify.structural.task:run_job",
    "bench": "kernalin_ci.bench.timing:run_job",
    "model-bench": "kernalin_ci.throughput.task:run_job",
    "tune-discover": "kernalin_ci.tune.pin:discover_job",
    "tune-race": "kernalin_ci.tune.schedule:run_job",
    "explain-compile": "kernalin_ci.explain.compiled:run_job",
    "explain-env": "kernalin_ci.explain.provenance:run_job",
    "explain-profile": "kernalin_ci.explain.profile:run_job",
    "cuda-build": "kernalin_ci.cuda.task:run_job",
    "verify-launch": "kernalin_ci.verify.dynamic:run_launch_job",
}
# Tasks whose worker ends right after its last event, skipping the interpreter's teardown (torch and the
# CUDA context: 0.6-0.9 s on the H200, on every verify's critical path). Not the others: a profiler that
# wraps a worker collects at its exit.
QUICK_EXIT = frozenset({"verify-dynamic", "verify-pipeline", "verify-structural"})


def main(argv: list[str]) -> int:
    job_path, fd = argv[0], int(argv[1])
    with open(job_path) as f:
        job = json.load(f)
    try:
        out = os.fdopen(fd, "w", buffering=1)
    except OSError:  # a wrapper that closes inherited descriptors (a profiler): events go to the output log
        out = sys.stdout

    def emit(event: dict) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    os.environ["KERNALIN_PARAMS"] = json.dumps(job.get("params", {}))
    from kernalin_ci.errors import UsageError

    try:
        if job.get("device") == "cuda":
            require_cuda()
        elif os.environ.get("TRITON_INTERPRET") == "1":
            from kernalin_ci.runtime.interp_patches import (
                aliased_builtins,
                autotune_first_config,
                int1_comparisons,
                libdevice_math,
                unsupported_constructs,
            )

            int1_comparisons()  # the interpreter's int32-typed comparison results (runtime/interp_patches.py)
            autotune_first_config()  # no benchmarking of autotune configs without a GPU
            unsupported_constructs()  # inline PTX: the case is not checked, not the kernel's error
            libdevice_math()  # libdevice calls with a tl.math counterpart
            aliased_builtins()  # `tl_exp2 = tl.exp2` in a kernel's module
        target = TASKS[job["task"]]
        mod, _, fn = target.partition(":")
        getattr(importlib.import_module(mod), fn)(job, emit)
    except UsageError as e:
        emit({"event": "usage-error", "message": str(e), "setting": e.setting})
        return 2
    except Exception as e:
        emit({"event": "internal-error", "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return 3
    emit({"event": "done"})
    if job["task"] in QUICK_EXIT:  # every result file is closed and every event sent
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def require_cuda() -> None:
    """The CLI saw a GPU through the driver; this torch must be able to use it."""
    import torch

    from kernalin_ci.errors import UsageError

    if not torch.cuda.is_available():
        raise UsageError(
            f"device cuda: torch {torch.__version__} here cannot use the GPU (a CPU-only build?); use the cpu device",
            setting="device",
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
