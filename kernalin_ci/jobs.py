"""The worker boundary: one frozen dataclass per worker task, the job the parent writes and the child reads.

The parent builds a job (`BenchJob(op=..., rope_min=...)`) and hands it to `isolate.run_task`, which writes
`{"task": job.TASK, "device": ..., "job": job.to_json()}`; the child (`kernel_worker.py`) finds the task in
its typed table `TASKS` (task name -> job type and runner), reads the job back with the type's `from_json`
and calls the runner with it. Nothing crosses the boundary as an untyped dict: a field is plain JSON (a
str, a number, a dict of op params) or a type with `to_json`/`from_json` (a `Case`, a `Domain`, ...).

Torch-free, so the parent builds jobs without importing what the child runs.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, Union

from kernalin_ci.cuda.sources import CudaSpec
from kernalin_ci.domain import Domain
from kernalin_ci.ops.base import Case
from kernalin_ci.throughput.spec import ModelSpec

Emit = Callable[[dict[str, Any]], None]  # a worker's events: one JSON object each
R = TypeVar("R", bound="Record")


@dataclass(frozen=True, kw_only=True)
class Record:
    """Typed data that crosses the worker boundary as JSON, field by field (`to_json`, `from_json`)."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls: type[R], d: dict[str, Any]) -> R:
        hints = typing.get_type_hints(cls)
        return cls(**{f.name: _typed(hints[f.name], d[f.name]) for f in dataclasses.fields(cls) if f.name in d})


@dataclass(frozen=True, kw_only=True)
class WorkerJob(Record):
    """A worker task's job. `params`: the op params an entry reads (`current_params()`; KERNALIN_PARAMS)."""

    TASK: ClassVar[str]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EntryAt(Record):
    """An entry (`file.py:function` / `module:function`) and the folder it resolves against."""

    entry: str
    root: str | None = None


# ------------------------------------------------------------------------------------------ verify


@dataclass(frozen=True, kw_only=True)
class CasesJob(WorkerJob):
    """Cases run from `start` on, each handed back as raw result files in `results` (verify/supervisor.py)."""

    cases: tuple[Case, ...] = ()
    start: int = 0
    results: str = ""


@dataclass(frozen=True, kw_only=True)
class DynamicJob(CasesJob):
    """verify/dynamic.py: one call of the entry per case, in poisoned memory."""

    TASK = "verify-dynamic"
    op: str
    entry: str
    root: str | None = None
    poison: bool = True
    domain: Domain = field(default_factory=Domain)
    main_dtype: str | None = None


@dataclass(frozen=True, kw_only=True)
class PipelineJob(CasesJob):
    """verify/loop_drive.py: the decode loop of the pipeline check, per case, one step at a time."""

    TASK = "verify-pipeline"
    entries: dict[str, str]  # role -> entry
    root: str | None = None
    dtype: str
    seed: int


@dataclass(frozen=True, kw_only=True)
class LaunchJob(WorkerJob):
    """verify/dynamic.py: each case launched once, unjudged (under Compute Sanitizer, cuda/sanitizer.py)."""

    TASK = "verify-launch"
    op: str
    entry: str
    root: str | None = None
    cases: tuple[Case, ...] = ()
    results: str = ""


@dataclass(frozen=True, kw_only=True)
class StructuralJob(WorkerJob):
    """verify/structural/task.py: capture and compile the kernels, hand back the material in `results`."""

    TASK = "verify-structural"
    op: str
    entry: str
    root: str | None = None
    domain: Domain = field(default_factory=Domain)
    results: str
    engine: str = "ttir"


# ------------------------------------------------------------------------------------------ bench


@dataclass(frozen=True, kw_only=True)
class Instance(Record):
    """One timed instance of a benchmark: base, head, base2 (the A/A copy), a tune candidate."""

    name: str
    entry: str
    root: str | None = None


@dataclass(frozen=True, kw_only=True)
class TimedJob(WorkerJob):
    """The round loop's settings (bench/timing.py `timed_rounds`) and the verdict's region of practical
    equivalence, shared by the kernel and the model benchmark."""

    reps: int  # samples per instance, shape and round
    budget_s: float
    max_rounds: int | None
    adaptive: bool = True  # the verdict may stop the rounds early
    seed: int
    l2_flush: bool
    rope: float | None  # the verdict's region of practical equivalence (None: from the A/A pair)
    rope_min: float


@dataclass(frozen=True, kw_only=True)
class BenchJob(TimedJob):
    """bench/timing.py: base, head and base2 (and any extra instance) timed per shape, round after round."""

    TASK = "bench"
    op: str
    cases: tuple[Case, ...]
    instances: tuple[Instance, ...]
    regime: str  # bench/regime.py
    reference: int = 0  # kernel-only profiled replays per instance after the rounds (bench/kernel_time.py)


@dataclass(frozen=True, kw_only=True)
class RaceSchedule(Record):
    """A tune race's schedule (tune/schedule.py): screening rungs of `screen_rounds` (doubling) while the
    field is larger than `finalists`, then final chunks of rounds, at least `min_final_rounds` of them."""

    finalists: int
    screen_rounds: int
    final_chunks: tuple[int, ...]
    min_final_rounds: int


@dataclass(frozen=True, kw_only=True)
class RaceJob(BenchJob):
    """tune/schedule.py: a tune race over the instances, set up once."""

    TASK = "tune-race"
    race: RaceSchedule

    @classmethod
    def of(cls, bench: BenchJob, race: RaceSchedule) -> RaceJob:
        """BENCH's benchmark, raced on RACE's schedule."""
        return cls(**{f.name: getattr(bench, f.name) for f in dataclasses.fields(bench)}, race=race)


@dataclass(frozen=True, kw_only=True)
class ModelInstance(Record):
    """One instance of the model benchmark: an entry per role (attention, rope, kv_append, decode_step)."""

    name: str
    roles: dict[str, EntryAt]


@dataclass(frozen=True, kw_only=True)
class ModelJob(TimedJob):
    """throughput/task.py: the decode step of a model with each instance's kernels in their places."""

    TASK = "model-bench"
    spec: ModelSpec
    instances: tuple[ModelInstance, ...] = ()
    attention_op: str | None = None
    block_size: int = 16
    layout: str = "nhd"
    mode: str = "auto"


# ------------------------------------------------------------------------------------------ the rest


@dataclass(frozen=True, kw_only=True)
class DiscoverJob(WorkerJob):
    """tune/pin.py: the `@triton.autotune` kernels the entry reaches."""

    TASK = "tune-discover"
    entry: str
    root: str


@dataclass(frozen=True, kw_only=True)
class CompileJob(WorkerJob):
    """explain/compiled.py: the entry's launches compiled at each case (never run)."""

    TASK = "explain-compile"
    op: str
    entry: str
    root: str | None = None
    cases: tuple[Case, ...] = ()


@dataclass(frozen=True, kw_only=True)
class EnvJob(WorkerJob):
    """explain/provenance.py: the environment the timings ran in (`copy`: measure the copy bandwidth)."""

    TASK = "explain-env"
    copy: bool = False


@dataclass(frozen=True, kw_only=True)
class ProfileJob(WorkerJob):
    """explain/profile.py: one case of the entry under Nsight Compute."""

    TASK = "explain-profile"
    op: str
    entry: str
    root: str | None = None
    case: Case


@dataclass(frozen=True, kw_only=True)
class BuildJob(WorkerJob):
    """cuda/task.py: build the CUDA sources (and, on a GPU, warm what the entry builds)."""

    TASK = "cuda-build"
    cuda: CudaSpec
    op: str
    entry: str
    root: str
    dtype: str = "float32"


# ------------------------------------------------------------------------------------------ JSON


def _plain(value: Any) -> Any:
    """A field's value as JSON: a typed value through its to_json, containers element by element."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _typed(hint: Any, value: Any) -> Any:
    """VALUE (JSON) read as the field type HINT: `from_json` for a typed value, tuples and dicts of them."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):  # X | None
        return _typed(next(a for a in args if a is not type(None)), value)
    if origin is tuple:
        return tuple(_typed(args[0], v) for v in value)
    if origin is dict:
        return {k: _typed(args[1], v) for k, v in value.items()}
    if isinstance(hint, type) and hasattr(hint, "from_json"):
        return hint.from_json(value)
    return value
