"""The device a run uses, once: what differs between the CPU (the Triton interpreter) and a CUDA GPU.

`DEVICES[name]` is built from the user's choice (`--device`); its attributes replace the per-device
tables that each stage kept (timeouts, repetitions, worker counts, the clock's sample length, the cold
regime's memory, the worker's Triton mode) and the comparisons with its name: code elsewhere asks the
Device what it is (`gpu`, `interpreted`, `timed`), never compares its name (tests/test_layers.py).
Plain data; imports nothing of kernalin_ci.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str  # "cpu" | "cuda": also torch's name for it
    gpu: bool  # a CUDA GPU: torch.cuda applies (streams, graphs, synchronize, its memory and errors), and
    # what needs one can run (compute-sanitizer, Nsight Compute, CUDA C++ kernels, a GPU's device nodes)
    interpreted: bool  # Triton kernels run in its interpreter (TRITON_INTERPRET=1 in the worker)
    timed: bool  # its wall-clock times measure the kernel: benchmarks may gate, the model benchmark
    # measures (the interpreter's times are the interpreter's: never a verdict, docs/config.md)
    l2_bytes: int  # the L2 size assumed when the device does not report one (the CPU never does)
    verify_timeout_s: float  # verify's per-step worker timeout
    dynamic_workers: (
        int  # dynamic verify workers per entry (a GPU: one per dtype; the interpreter keeps the cores busy)
    )
    bench_reps: int  # samples per instance, shape and round (bench, model benchmark)
    bench_timeout_s: float  # the kernel benchmark's per-step worker timeout
    model_timeout_s: float  # the model benchmark's per-step worker timeout
    sample_s: float  # the clock's target length of one sample (inner launches per sample)
    cold_max_bytes: int  # the cold regime: all copies of one shape's inputs, at most
    tune_budget_s: float  # tune's race budget
    tune_verify_jobs: int  # candidates verified at once by tune
    tune_reps: int  # tune's race: samples per instance, shape and round

    def worker_env(self, env: dict[str, str]) -> dict[str, str]:
        """ENV with this device's Triton mode set (the interpreter on, or off)."""
        env = dict(env)
        if self.interpreted:
            env["TRITON_INTERPRET"] = "1"
        else:
            env.pop("TRITON_INTERPRET", None)
        return env


CPU = Device(
    name="cpu",
    gpu=False,
    interpreted=True,
    timed=False,
    l2_bytes=32 << 20,
    verify_timeout_s=600.0,
    dynamic_workers=1,
    bench_reps=3,
    bench_timeout_s=600.0,
    model_timeout_s=600.0,
    sample_s=5e-3,
    cold_max_bytes=256 << 20,
    tune_budget_s=60.0,
    tune_verify_jobs=1,
    tune_reps=1,
)
CUDA = Device(
    name="cuda",
    gpu=True,
    interpreted=False,
    timed=True,
    l2_bytes=50 << 20,
    verify_timeout_s=180.0,
    dynamic_workers=3,
    bench_reps=5,
    bench_timeout_s=180.0,
    model_timeout_s=300.0,
    sample_s=1e-3,
    cold_max_bytes=4 << 30,
    tune_budget_s=120.0,
    tune_verify_jobs=4,
    tune_reps=5,
)
DEVICES = {d.name: d for d in (CPU, CUDA)}
