"""bench_pair(): time head against base on an op's benchmark shapes and judge it (parent side).

The parent never imports user code: the harness runs in a worker child
(kernalin_ci.isolate.run_task, task "bench"), streams one event per round, and a
hang or crash ends the benchmark with an error instead of taking the caller
down. The A/A instance is the base entry loaded from a temporary copy of the
base tree, so it is a separately imported and compiled instance of the same code.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from kernalin_ci.bench import stats
from kernalin_ci.bench.regime import DEFAULT_REGIME, MICRO_US, REGIMES, is_micro
from kernalin_ci.bench.result import CLOCK_NOTE, BenchResult, ShapeResult
from kernalin_ci.bench.shapes import bench_cases, split_params
from kernalin_ci.bench.trace import from_shapes
from kernalin_ci.device import DEVICES
from kernalin_ci.entry import parse_entry
from kernalin_ci.errors import UsageError
from kernalin_ci.isolate import run_task
from kernalin_ci.jobs import BenchJob, Instance, RaceJob, RaceSchedule
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Case, resolve_params
from kernalin_ci.progress import BenchRound, BenchSetup, ProgressSink, sink_for

DEFAULT_BUDGET_S = 30.0
L2_FLUSH_DEFAULT = True  # docs/benchmarking.md: decided from the H200 measurement of benchmarks/gpu_bench.py
COPY_LIMIT_BYTES = 256 << 20
SKIP_DIRS = {"__pycache__", "venv", "env", "node_modules", "build", "dist"}  # and every hidden folder (.git, .venv)


def bench_pair(
    op: str,
    base_entry: str,
    head_entry: str,
    base_root: str | None = None,
    head_root: str | None = None,
    params: dict | None = None,
    device: str = "cuda",
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    rope_min: float = stats.ROPE_MIN,
    rope: float | None = None,
    reps: int | None = None,
    l2_flush: bool | None = None,
    max_rounds: int | None = None,
    adaptive: bool = True,
    seed: int = 0,
    timeout_s: float | None = None,
    progress=None,
    extra: list[tuple[str, str, str | None]] = (),
    shapes: list[str] | None = None,
    regime: str | None = None,
    reference: int = 0,
    race: RaceSchedule | None = None,
    cases: list[Case] | None = None,
) -> BenchResult:
    """Benchmark head against base; the gate and `kernalin-ci bench` call this.

    params: op params and bench params together (see kernalin_ci/bench/shapes.py).
    progress: None, True (lines on stderr), a kernalin_ci.progress sink, or a callable taking each raw
    worker event.
    extra: more instances to time in the same rounds, (name, entry, root); they are
    checked against the base and recorded in `instances`, never judged.
    shapes: time only the shapes with these names (kernalin_ci.explain: the ones whose code differs).
    regime: "warm" or "cold" (None: DEFAULT_REGIME); see kernalin_ci/bench/timing.py.
    reference: after the rounds, profile this many more replays of every instance's `inner` launches,
    launched eagerly on the same buffers, and record their kernel-only device time in `reference`
    (benchmarks/live_eval.py; kernalin_ci/bench/kernel_time.py; 0: none).
    race: the schedule of a tune race (kernalin_ci/tune/schedule.py, worker task "tune-race"): the same
    setup and rounds, over a field of instances that narrows; its rounds reach `progress` (a callable)
    as events and are not judged here (no verdict, no trace).
    cases: the shapes to time instead of the op's (a FlashInfer-Bench workload file's, kernalin_ci/workload.py);
    bench params may then set the dtype only.
    Usage problems raise UsageError; a benchmark that cannot finish returns a
    BenchResult with `error` set (outputs disagree, a crash, a hang).
    """
    t_start = time.perf_counter()
    op_obj = get_op(op)
    op_params, bench_params = split_params(dict(params or {}))
    resolved = resolve_params(op, op_obj.params, op_params)
    if cases is None:
        cases = bench_cases(op, resolved, device, bench_params)
    elif set(bench_params) - {"dtype"}:
        shaping = ", ".join(sorted(set(bench_params) - {"dtype"}))
        raise UsageError(f"bench params {shaping}: the workload gives the shapes", setting="workload")
    else:
        cases = [Case(c.name, c.dims, bench_params.get("dtype", c.dtype), c.seed, c.tags) for c in cases]
    if shapes is not None:
        cases = [c for c in cases if c.name in shapes]
    if budget_s <= 0:
        raise UsageError("budget_s: must be positive", setting="budget_s")
    reps = reps or DEVICES[device].bench_reps
    if reps < 1:
        raise UsageError("reps: must be at least 1", setting="reps")
    l2_flush = L2_FLUSH_DEFAULT if l2_flush is None else l2_flush
    regime = DEFAULT_REGIME if regime is None else regime
    if regime not in REGIMES:
        raise UsageError(f"--regime must be one of {', '.join(REGIMES)}, got {regime!r}")
    base_root = str(Path(base_root or os.getcwd()).resolve())
    head_root = str(Path(head_root or os.getcwd()).resolve())
    parse_entry(base_entry), parse_entry(head_entry)
    result = BenchResult(
        op=op,
        base=base_entry,
        head=head_entry,
        device=device,
        budget_s=budget_s,
        reps=reps,
        l2_flush=l2_flush if DEVICES[device].gpu else None,
        regime=regime,
    )
    with tempfile.TemporaryDirectory(prefix="kernalin-aa-") as tmp:
        os.chmod(tmp, 0o755)  # read by the kernel workers' sandbox user (uid 65534 under root)
        base2_entry, base2_root, note = aa_copy(base_entry, base_root, tmp)
        if note:
            result.notes.append(note)
        instances = [
            Instance(name="base", entry=base_entry, root=base_root),
            Instance(name="head", entry=head_entry, root=head_root),
            Instance(name="base2", entry=base2_entry, root=base2_root),
        ]
        instances += [Instance(name=n, entry=e, root=str(Path(r or os.getcwd()).resolve())) for n, e, r in extra]
        bench = BenchJob(
            op=op,
            params=resolved,
            cases=tuple(cases),
            instances=tuple(instances),
            reps=reps,
            budget_s=budget_s,
            max_rounds=max_rounds,
            adaptive=adaptive,
            seed=seed,
            l2_flush=l2_flush,
            regime=regime,
            rope=rope,
            rope_min=rope_min,
            reference=reference,
        )
        job = RaceJob.of(bench, race) if race else bench
        info = _run(job, result, cases, device, timeout_s or DEVICES[device].bench_timeout_s, progress)
    _finish(result, cases, info, rope, rope_min)
    result.seconds = time.perf_counter() - t_start
    return result


def aa_copy(entry: str, root: str, tmp: str) -> tuple[str, str, str | None]:
    """Copy the base tree for the A/A instance -> (entry, root, note or None)."""
    es = parse_entry(entry)
    src_root = Path(root)
    if es.is_file:
        path = es.file_path(src_root).resolve()
        try:
            rel = path.relative_to(src_root)
        except ValueError:  # an entry file outside the root: copy its own directory
            src_root, rel = path.parent, Path(path.name)
        dest = Path(tmp) / "base2"
        if not _copy_tree(src_root, dest):
            return (
                entry,
                root,
                (
                    "the base tree is larger than 256 MB: the A/A instance is loaded from the same "
                    "files (still a separate module and a separate Triton JIT instance)"
                ),
            )
        return f"{dest / rel}:{es.function}", str(dest), None
    dest = Path(tmp) / "base2"
    if not _copy_tree(src_root, dest):
        return entry, root, "the base tree is larger than 256 MB: the A/A instance is loaded from the same files"
    return entry, str(dest), None


def _copy_tree(src: Path, dest: Path) -> bool:
    total = 0
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [
            d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
        ]
        rel = Path(dirpath).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for f in filenames:
            p = Path(dirpath) / f
            if p.is_symlink() or not p.is_file():
                continue
            total += p.stat().st_size
            if total > COPY_LIMIT_BYTES:
                return False
            shutil.copy2(p, dest / rel / f)
    return True


def _run(job: BenchJob, result: BenchResult, cases, device: str, timeout_s: float, progress) -> dict:
    """Drive the child; fill result's rounds, trace and error. -> per-shape inner and timing."""
    names = [i.name for i in job.instances]
    race = isinstance(job, RaceJob)  # a race's rounds time part of the instances: its caller reads them
    times = {n: [] for n in names}
    orders = []
    labels = [c.name for c in cases]
    info: dict = {"inner": {}, "timing": {}, "copies": {}, "same_addresses": {}}
    state = {"where": "setting up"}
    sink = sink_for(progress)
    on_raw = progress if callable(progress) and not isinstance(progress, ProgressSink) else None

    def working(text: str) -> None:
        sink.event(BenchSetup(text))

    # said once the worker has loaded both entries (a user's mistake before that is the one line of its error)
    def on_event(ev):
        kind = ev.get("event")
        if kind == "setup":
            working(f"setting up the shapes: {ev['label']} ready")
            info["inner"][ev["shape"]] = ev["inner"]
            info["timing"][ev["shape"]] = ev["timing"]
            info["copies"][ev["shape"]] = ev.get("copies")
            info["same_addresses"][ev["shape"]] = ev.get("same_output_addresses")
            state["where"] = f"setting up {ev['label']}"
        elif kind == "setup-done":
            result.setup_seconds = ev["seconds"]
            result.clock = ev["clock"]
        elif kind == "note":
            result.notes.append(ev["message"])
        elif kind == "round":
            if not race:
                for n in names:
                    times[n].append(ev["times"][n])
                orders.append(ev["order"])
            result.rounds = ev["round"]
            result.bench_seconds = ev["elapsed"]
            state["where"] = f"round {ev['round'] + 1}"
            v = stats.Verdict.from_json(ev["verdict"]) if ev.get("verdict") else None
            look = stats.is_look(ev["round"]) or ev["round"] % 50 == 0
            sink.event(BenchRound(ev["round"], ev["elapsed"], result.clock or "", v, look))
        elif kind == "reference":
            keys = ("shape", "kernel_ms", "span_ms", "kernels", "method", "launch", "invalid")
            result.reference.append({k: ev[k] for k in keys})
        elif kind == "stopped":
            result.stopped = ev["reason"]
        elif kind == "bench-error":
            result.error, result.error_kind = ev["message"], ev["kind"]
        if on_raw is not None:
            on_raw(ev)

    outcome = run_task(job, device, timeout_s, on_event)
    sink.flush()
    outcome.raise_for_error("bench")
    if outcome.status in ("timeout", "crashed") and result.error is None:
        result.error_kind = outcome.status
        result.error = f"the benchmark child {outcome.detail} while {state['where']}" + outcome.last_output()
    if result.rounds and not race:
        result.instances = {n: np.asarray(times[n], dtype=np.float64) for n in names}
        result.orders = np.asarray(orders, dtype=np.int8)
        meta = {
            "op": job.op,
            "base": result.base,
            "head": result.head,
            "device": device,
            "unit": "ms",
            "clock": result.clock,
            "shapes": labels,
            "inner": [info["inner"].get(i) for i in range(len(labels))],
            "timing": [info["timing"].get(i) for i in range(len(labels))],
            "reps": job.reps,
            "l2_flush": result.l2_flush,
            "regime": result.regime,
            "seed": job.seed,
            "copies": [info["copies"].get(i) for i in range(len(labels))],
            "same_output_addresses": [info["same_addresses"].get(i) for i in range(len(labels))],
        }
        result.trace = from_shapes(
            result.instances["base"], result.instances["head"], result.instances.get("base2"), meta
        )
    return info


def _finish(result: BenchResult, cases, info: dict, rope, rope_min) -> None:
    tr = result.trace
    per_shape = None
    if tr is not None and not result.failed:
        ps = tr.per_shape
        result.verdict, per_shape = stats.compare_run(
            ps["base"], ps["head"], ps.get("base2"), rope=rope, rope_min=rope_min
        )
    for i, c in enumerate(cases):
        timed = {}
        if per_shape is not None:
            st = tr.shape_trace(i)
            timed = {
                "verdict": per_shape[i],
                "base_ms": float(np.median(st.base)),
                "head_ms": float(np.median(st.head)),
            }
        result.shapes.append(
            ShapeResult(
                c.name,
                _compact(c.dims),
                c.dtype,
                info["inner"].get(i),
                info["timing"].get(i),
                info["copies"].get(i),
                **timed,
            )
        )
    if not result.failed and result.clock == "cpu-wall-clock":
        result.notes.append(CLOCK_NOTE["cpu-wall-clock"])
    if not result.failed and result.clock == "cuda-events" and (note := micro_note(result.shapes)):
        result.notes.append(note)


def micro_note(shapes: list[ShapeResult]) -> str | None:
    """The note for shapes whose base runs under MICRO_US per launch (None: no such shape)."""
    short = [s for s in shapes if is_micro(s.base_ms)]
    if not short:
        return None
    us = sorted(s.base_ms * 1e3 for s in short)
    span = f"{us[0]:.1f} us" if len(us) == 1 else f"{us[0]:.1f}-{us[-1]:.1f} us"
    which = "the shape" if len(shapes) == 1 else ", ".join(s.shape.split(" ")[0] for s in short)
    return (
        f"{which}: {span} per launch, under {MICRO_US:g} us: the ratio is this timing context's; other contexts and "
        "profilers put such kernels' ratios 1-5% apart on an H200, in the same direction for effects of 2% "
        "or more (docs/statistics.md, Micro-kernels)"
    )


def _compact(dims: dict) -> dict:
    out = {}
    for k, v in dims.items():
        if isinstance(v, list) and len(v) > 4:
            out[k] = [min(v), max(v)]
            out[f"{k}_count"] = len(v)
        else:
            out[k] = v
    return out
