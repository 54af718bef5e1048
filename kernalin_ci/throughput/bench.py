"""bench_model(): decode tokens/s and $/Mtok of a model, base kernels against head kernels (parent side).

The kernels run only in the worker child (task "model-bench", kernalin_ci.throughput.task); this
process never imports them. Instances: base (every role from the base tree), head (from the head
tree) and base2 (the base again, from a copy of the base tree: the A/A noise floor), as in
kernalin_ci.bench.pair.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kernalin_ci.bench import stats
from kernalin_ci.bench.pair import aa_copy
from kernalin_ci.bench.trace import geometric_mean_over_shapes
from kernalin_ci.device import DEVICES
from kernalin_ci.entry import parse_entry
from kernalin_ci.errors import UsageError
from kernalin_ci.isolate import run_task
from kernalin_ci.jobs import EntryAt, ModelInstance, ModelJob
from kernalin_ci.ops import get_op
from kernalin_ci.ops.roles import FUSED, SEPARATE, role_ops
from kernalin_ci.progress import ModelRound, ProgressSink, sink_for
from kernalin_ci.throughput import cost
from kernalin_ci.throughput.result import ModelResult
from kernalin_ci.throughput.spec import ModelSpec

NOT_MEASURED_CPU = "no GPU: the decode step is timed on a GPU only"


@dataclass
class Role:
    """A gated kernel in its place in the step."""

    role: str  # attention | rope | kv_append | decode_step
    op: str
    kernel: str  # the kernel's name (the configuration's, or the entry)
    base_entry: str
    head_entry: str
    params: dict = field(default_factory=dict)  # the op's resolved params


def not_measured(spec: ModelSpec, device: str, reason: str, roles: dict | None = None) -> ModelResult:
    """The model result when nothing runs (no GPU, verification failed, benchmarks off)."""
    return ModelResult(spec, device, roles=roles or {}, reason=reason)


def unplaced(roles: list[Role]) -> dict[str, str]:
    """Kernels whose place this step cannot give them -> why (torch does that work instead)."""
    have = {r.role: r for r in roles}
    att, app = have.get("attention"), have.get("kv_append")
    if app and att and not get_op(att.op).paged_cache:
        return {
            "kv_append": f"{att.kernel} (attention.decode) reads a contiguous cache, {app.kernel} writes a paged one"
        }
    return {}


def role_names(roles: list[Role]) -> dict:
    """place -> the kernel in that place, or "torch" (no kernel configured for it, or one that has no place).
    With a decode_step kernel: its one place, which does the rope, kv_append and attention work."""
    have = {r.role: r for r in roles}
    if FUSED in have:
        return {FUSED: have[FUSED].kernel}
    out = {role: have[role].kernel if role in have else "torch" for role in SEPARATE}
    for role, why in unplaced(roles).items():
        out[role] = f"torch ({have[role].kernel} not used: {why})"
    return out


# The attention ops' feature params (docs/ops.md): in the model step the model's, never a kernel's own
FEATURE_PARAMS = ("window", "logit_cap", "alibi", "sinks", "kv_dtype")


def feature_conflicts(spec: ModelSpec, r: Role) -> None:
    """UsageError when a kernel's params set an attention feature the model does not have, or another value
    (a kernel verified with window 40 is no kernel for a model with window 4096)."""
    model = spec.features()
    for key in FEATURE_PARAMS:
        got = r.params.get(key)
        if got in (None, False):
            continue
        if model.get(key) != got:
            want = f"{key}={model[key]}" if key in model else f"no {key}"
            raise UsageError(f"model: {r.kernel} has {key}={got}, the model has {want} (docs/tokens.md)")
    if r.params.get("kv_scale") is not None and "kv_dtype" not in model:
        raise UsageError(f"model: {r.kernel} has kv_scale={r.params['kv_scale']}, the model has no kv_dtype")
    if r.params.get("kv_scale") == "per-token-head":  # its scale caches: no place of the step reads them
        raise UsageError(
            f"model: {r.kernel} has kv_scale=per-token-head; the step's attention reads given per-tensor or "
            "per-head scales (docs/ops.md)"
        )


def undeclared_features(spec: ModelSpec, fused: Role) -> None:
    """UsageError when the model sets an attention feature that the decode_step kernel's params do not declare:
    a fused step takes a feature only where it was verified with it (its params set it, to the model's value:
    `feature_conflicts`)."""
    model = spec.features()
    missing = [k for k in FEATURE_PARAMS if k in model and fused.params.get(k) in (None, False)]
    if missing:
        declared = any(fused.params.get(k) not in (None, False) for k in FEATURE_PARAMS)
        what = ", ".join(f"{k}={model[k]}" for k in missing) if declared else "attention features"
        raise UsageError(
            f"model: {fused.kernel} (decode_step) takes no {what}; the model sets "
            + ", ".join(f"{k}={v}" for k, v in model.items())
        )


def check_roles(spec: ModelSpec, roles: list[Role]) -> tuple[dict, dict]:
    """-> (the worker's params: the union of the roles' params, the cache layout). UsageError when a kernel's
    params cannot serve the model (a pinned head dim or head count, kv_append and attention on different caches)
    or a decode_step kernel comes with separate ones."""
    params: dict = {}
    by = {r.role: r for r in roles}
    fused = by.get(FUSED)
    if fused and len(by) > 1:
        others = ", ".join(f"{r.kernel} ({r.op})" for r in roles if r.role != FUSED)
        raise UsageError(
            f"model: {fused.kernel} (decode_step) does the rope, kv_append and attention work in one entry: "
            f"not with {others}"
        )
    for r in roles:
        takes = role_ops(r.role)
        if r.op not in takes:
            raise UsageError(f"model: the {r.role} place takes {' or '.join(takes)}, not {r.kernel} ({r.op})")
        for pin, want in (
            ("head_dim", spec.head_dim),
            ("num_q_heads", spec.num_heads),
            ("num_kv_heads", spec.num_kv_heads),
        ):
            got = r.params.get(pin)
            if got is not None and int(got) != want:
                raise UsageError(f"model: {r.kernel} pins {pin}={got}, the model has {want}")
        if r.params.get("max_position") is not None:  # rope's
            longest = max(p.context for p in spec.serving)
            if longest >= int(r.params["max_position"]):
                raise UsageError(
                    f"model: context {longest} is beyond {r.kernel}'s max_position {r.params['max_position']}"
                )
        feature_conflicts(spec, r)
        params.update({k: v for k, v in r.params.items() if v is not None or k not in params})
    for key in FEATURE_PARAMS:  # the model sets them, layer by layer (ModelSpec.attention_params)
        params.pop(key, None)
    if fused:
        undeclared_features(spec, fused)
    att = by.get("attention")
    layout = {"attention_op": att.op if att else None, "block_size": 16, "layout": "nhd"}
    app = by.get("kv_append")
    # a paged cache: the paged attention's, the decode_step's, or the kv_append kernel's with the torch attention
    cache = att if att and get_op(att.op).paged_cache else (fused or app) if not att else None
    if cache:
        layout["block_size"] = int(cache.params.get("block_size") or 16)
        layout["layout"] = cache.params.get("layout") or "nhd"
        if app and att:
            for key in ("block_size", "layout"):
                if (app.params.get(key) or layout[key]) != layout[key]:
                    raise UsageError(
                        f"model: {app.kernel} has {key} {app.params.get(key)}, "
                        f"{att.kernel} has {layout[key]}: they must share the cache"
                    )
    return params, layout


def bench_model(
    spec: ModelSpec,
    roles: list[Role],
    base_root: str | None,
    head_root: str | None,
    device: str,
    *,
    budget_s: float = 30.0,
    rope_min: float = stats.ROPE_MIN,
    rope: float | None = None,
    reps: int | None = None,
    l2_flush: bool = True,
    max_rounds: int | None = None,
    seed: int = 0,
    timeout_s: float | None = None,
    progress=None,
    mode: str = "auto",
) -> ModelResult:
    """Time the decode step of `spec` with the base kernels against the head kernels.

    On the CPU nothing is timed: the step runs once per instance at a small shape (`measured` false,
    reason "no GPU"). Usage problems raise UsageError; a benchmark that cannot finish returns a result
    with `error` set.
    """
    t_start = time.perf_counter()
    if budget_s <= 0:
        raise UsageError("--budget-s must be positive")
    params, layout = check_roles(spec, roles)
    for r in roles:
        parse_entry(r.base_entry), parse_entry(r.head_entry)
    base_root = str(Path(base_root or os.getcwd()).resolve())
    head_root = str(Path(head_root or os.getcwd()).resolve())
    reps = reps or DEVICES[device].bench_reps
    result = ModelResult(spec, device, roles=role_names(roles))
    with tempfile.TemporaryDirectory(prefix="kernalin-model-aa-") as tmp:
        os.chmod(tmp, 0o755)  # read by the kernel workers' sandbox user (uid 65534 under root)
        base2 = {}
        for r in roles:
            entry, root, note = aa_copy(r.base_entry, base_root, os.path.join(tmp, r.role))
            base2[r.role] = EntryAt(entry=entry, root=root)
            if note and note not in result.notes:
                result.notes.append(note)
        instances = (
            ModelInstance(name="base", roles={r.role: EntryAt(entry=r.base_entry, root=base_root) for r in roles}),
            ModelInstance(name="head", roles={r.role: EntryAt(entry=r.head_entry, root=head_root) for r in roles}),
            ModelInstance(name="base2", roles=base2),
        )
        job = ModelJob(
            params=params,
            spec=spec,
            instances=instances,
            attention_op=layout["attention_op"],
            block_size=layout["block_size"],
            layout=layout["layout"],
            reps=reps,
            budget_s=budget_s,
            max_rounds=max_rounds,
            seed=seed,
            l2_flush=l2_flush,
            rope=rope,
            rope_min=rope_min,
            mode=mode,
        )
        _drive(job, device, result, timeout_s or DEVICES[device].model_timeout_s, progress)
    _finish(result, rope, rope_min)
    result.seconds = time.perf_counter() - t_start
    return result


def _drive(job: ModelJob, device: str, result: ModelResult, timeout_s: float, progress) -> None:
    names = [i.name for i in job.instances]
    times: dict = {n: [] for n in names}
    state = {"where": "setting up"}
    sink = sink_for(progress)
    on_raw = progress if callable(progress) and not isinstance(progress, ProgressSink) else None

    def on_event(ev):
        kind = ev.get("event")
        if kind == "mode":
            result.mode, result.layers_built, result.mode_why = ev["mode"], ev["layers_built"], ev["why"]
        elif kind == "setup":
            state["where"] = f"setting up {ev['label']} ({ev['part']})"
        elif kind == "setup-done":
            result.setup_seconds = ev["seconds"]
        elif kind == "note":
            result.notes.append(ev["message"])
        elif kind == "cpu-check":
            p, s = ev["point"], ev["shape"]
            result.notes.append(
                f"the decode step ran once per instance ({', '.join(ev['instances'])}) at a small shape "
                f"(layers {s['layers']}, hidden {s['hidden_size']}, heads {s['num_heads']}/{s['num_kv_heads']}, "
                f"head dim {s['head_dim']}, {s['dtype']}; batch {p['batch']}, context {p['context']}) under the "
                f"Triton interpreter, and layer 0's attention outputs agree; nothing was timed"
            )
        elif kind == "round":
            for n in names:
                times[n].append(ev["times"][n])
            result.rounds, result.bench_seconds = ev["round"], ev["elapsed"]
            state["where"] = f"round {ev['round'] + 1}"
            v = ev.get("verdict")
            if v and (stats.is_look(ev["round"]) or ev["round"] % 50 == 0):
                sink.event(ModelRound(ev["round"], ev["elapsed"], stats.Verdict.from_json(v)))
        elif kind == "stopped":
            result.stopped = ev["reason"]
        elif kind == "bench-error":
            result.error, result.error_kind = ev["message"], ev["kind"]
        if on_raw is not None:
            on_raw(ev)

    outcome = run_task(job, device, timeout_s, on_event)
    outcome.raise_for_error("model-bench")
    if outcome.status in ("timeout", "crashed") and result.error is None:
        result.error_kind = outcome.status
        result.error = f"the model benchmark child {outcome.detail} while {state['where']}{outcome.last_output()}"
    if result.rounds:
        result.instances = {n: np.asarray(times[n], dtype=np.float64) for n in names}


def _finish(result: ModelResult, rope, rope_min) -> None:
    if not DEVICES[result.device].timed:
        result.reason = NOT_MEASURED_CPU
        return
    inst = result.instances
    if result.failed or not inst:
        result.reason = "the benchmark did not finish" if result.failed else "no rounds were timed"
        return
    result.measured = True
    geo = {n: geometric_mean_over_shapes(a) for n, a in inst.items()}
    result.verdict = stats.compare_trace(geo["base"], geo["head"], geo.get("base2"), rope=rope, rope_min=rope_min)
    for i, p in enumerate(result.spec.serving):
        s = cost.point_summary(
            inst["base"][:, i],
            inst["head"][:, i],
            inst["base2"][:, i] if "base2" in inst else None,
            p.batch,
            result.spec.price_per_hour,
            rope=rope,
            rope_min=rope_min,
        )
        result.points.append({"batch": p.batch, "context": p.context, **s})
