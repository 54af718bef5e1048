"""The child process that runs untrusted kernels: `python -m kernalin_ci.kernel_worker JOB.json FD`.

It runs one task and writes JSON-line events to file descriptor FD. JOB.json is what the parent's
`isolate.run_task` wrote: the task's name, the device and the task's typed job (`kernalin_ci/jobs.py`),
read back through the job type that `TASKS` names for the task. The kernel's own prints go to
stdout/stderr, which the parent keeps apart from the events. The device is fixed by the parent through
the environment (TRITON_INTERPRET=1 for the CPU) before anything imports Triton.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TextIO, TypeVar

from kernalin_ci.device import DEVICES
from kernalin_ci.errors import UsageError
from kernalin_ci.jobs import (
    BenchJob,
    BuildJob,
    CompileJob,
    DiscoverJob,
    DynamicJob,
    Emit,
    EnvJob,
    LaunchJob,
    ModelJob,
    PipelineJob,
    ProfileJob,
    RaceJob,
    StructuralJob,
    WorkerJob,
)
from kernalin_ci.runtime.interp_patches import (
    aliased_builtins,
    autotune_first_config,
    boolean_operators,
    fp8_conversions,
    int1_comparisons,
    libdevice_math,
    unsupported_constructs,
)

J = TypeVar("J", bound=WorkerJob)


@dataclass(frozen=True)
class Task(Generic[J]):
    """A worker task: its job type and its runner (called with the job, the device's name and `emit`).
    `quick_exit`: the worker ends right after its last event, skipping the interpreter's teardown (torch
    and the CUDA context: 0.6-0.9 s on the H200, on every verify's critical path). Not the others: a
    profiler that wraps a worker collects at its exit."""

    job: type[J]
    run: Callable[[J, str, Emit], None]
    quick_exit: bool = False


# The runners, each imported only in the worker that runs it.
def _verify_dynamic(job: DynamicJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.verify.dynamic import run_job

    run_job(job, device, emit)


def _verify_pipeline(job: PipelineJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.verify.loop_drive import run_job

    run_job(job, device, emit)


def _verify_structural(job: StructuralJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.verify.structural.task import run_job

    run_job(job, emit)


def _verify_launch(job: LaunchJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.verify.dynamic import run_launch_job

    run_launch_job(job, device, emit)


def _bench(job: BenchJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.bench.timing import run_job

    run_job(job, device, emit)


def _tune_race(job: RaceJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.tune.schedule import run_job

    run_job(job, device, emit)


def _model_bench(job: ModelJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.throughput.task import run_job

    run_job(job, device, emit)


def _tune_discover(job: DiscoverJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.tune.pin import discover_job

    discover_job(job, emit)


def _explain_compile(job: CompileJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.explain.compiled import run_job

    run_job(job, emit)


def _explain_env(job: EnvJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.explain.provenance import run_job

    run_job(job, emit)


def _explain_profile(job: ProfileJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.explain.profile import run_job

    run_job(job, emit)


def _cuda_build(job: BuildJob, device: str, emit: Emit) -> None:
    # deferred: each worker imports only the runner it runs (most import torch)
    from kernalin_ci.cuda.task import run_job

    run_job(job, device, emit)


def task(job: type[J], run: Callable[[J, str, Emit], None], quick_exit: bool = False) -> Task[Any]:
    """A table entry, its runner checked against its job type (mypy, tests/test_typecheck.py)."""
    return Task(job, run, quick_exit)


TASKS: dict[str, Task[Any]] = {
    DynamicJob.TASK: task(DynamicJob, _verify_dynamic, quick_exit=True),
    PipelineJob.TASK: task(PipelineJob, _verify_pipeline, quick_exit=True),
    StructuralJob.TASK: task(StructuralJob, _verify_structural, quick_exit=True),
    LaunchJob.TASK: task(LaunchJob, _verify_launch),
    BenchJob.TASK: task(BenchJob, _bench),
    RaceJob.TASK: task(RaceJob, _tune_race),
    ModelJob.TASK: task(ModelJob, _model_bench),
    DiscoverJob.TASK: task(DiscoverJob, _tune_discover),
    CompileJob.TASK: task(CompileJob, _explain_compile),
    EnvJob.TASK: task(EnvJob, _explain_env),
    ProfileJob.TASK: task(ProfileJob, _explain_profile),
    BuildJob.TASK: task(BuildJob, _cuda_build),
}


def main(argv: list[str]) -> int:
    job_path, fd = argv[0], int(argv[1])
    with open(job_path) as f:
        sent = json.load(f)
    out: TextIO
    try:
        out = os.fdopen(fd, "w", buffering=1)
    except OSError:  # a wrapper that closes inherited descriptors (a profiler): events go to the output log
        out = sys.stdout

    def emit(event: dict[str, Any]) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    task: Task[Any] = TASKS[sent["task"]]
    device: str = sent["device"]

    try:
        job = task.job.from_json(sent["job"])
        os.environ["KERNALIN_PARAMS"] = json.dumps(job.params)
        if DEVICES[device].gpu:
            require_cuda()
        elif os.environ.get("TRITON_INTERPRET") == "1":
            int1_comparisons()  # the interpreter's int32-typed comparison results (runtime/interp_patches.py)
            autotune_first_config()  # no benchmarking of autotune configs without a GPU
            unsupported_constructs()  # inline PTX: the case is not checked, not the kernel's error
            libdevice_math()  # libdevice calls with a tl.math counterpart
            aliased_builtins()  # `tl_exp2 = tl.exp2` in a kernel's module
            fp8_conversions()  # FP8 casts round to nearest even and saturate, as the GPU's cvt.rn.satfinite
            boolean_operators()  # `a and b` on blocks elementwise, as compiled
        task.run(job, device, emit)
    except UsageError as e:
        emit({"event": "usage-error", "message": str(e), "setting": e.setting})
        return 2
    except Exception as e:
        emit({"event": "internal-error", "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return 3
    emit({"event": "done"})
    if task.quick_exit:  # every result file is closed and every event sent
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def require_cuda() -> None:
    """The CLI saw a GPU through the driver; this torch must be able to use it."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError(
            f"device cuda: torch {torch.__version__} here cannot use the GPU (a CPU-only build?); use the cpu device",
            setting="device",
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
