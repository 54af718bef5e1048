"""Worker side of `tune` (runs in `python -m kernalin_ci.kernel_worker`, never in the gate process).

A candidate reaches the kernel in one of two explicit ways (docs/tune.md):
- keyword values (`tune.params`): the entry accepts them as keyword parameters; the candidate
  entry calls the user's entry with the op's tensors plus those keywords;
- an autotune config: the candidate entry loads its own copy of the user's module and pins the
  named `@triton.autotune` kernel to that one config (its `configs` list becomes `[config]`, so
  the autotuner launches it without timing anything).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

from kernalin_ci.entry import load_entry
from kernalin_ci.jobs import DiscoverJob, Emit


def autotuners(fn, root: str) -> dict:
    """name -> Autotuner object reachable from the entry: its module's globals, and the globals of
    modules it imported from the same tree (one level)."""
    from triton.runtime.autotuner import Autotuner

    found: dict = {}
    root_real = os.path.realpath(root)
    spaces = [getattr(fn, "__globals__", {})]
    for v in list(spaces[0].values()):
        f = getattr(v, "__file__", None)
        if isinstance(v, type(os)) and f and os.path.realpath(f).startswith(root_real + os.sep):
            spaces.append(vars(v))
    for space in spaces:
        for v in space.values():
            if isinstance(v, Autotuner):
                found.setdefault(base_function(v).__name__, v)
    return found


def base_function(at):
    """The Python function under an Autotuner (through heuristics and the JIT wrapper)."""
    f = at.fn
    while not inspect.isfunction(f):
        f = f.fn
    return f


def config_json(c) -> dict:
    out = {"kwargs": dict(c.kwargs)}
    for k in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        v = getattr(c, k, None)
        if v is not None:
            out[k] = v
    if getattr(c, "pre_hook", None) is not None:
        out["pre_hook"] = True
    return out


def discover_job(job: DiscoverJob, emit: Emit) -> None:
    """Worker task: the autotuned kernels the entry reaches, with their configs."""

    fn = load_entry(job.entry, job.root)
    kernels = []
    for name, at in sorted(autotuners(fn, job.root).items()):
        code = base_function(at).__code__
        path = code.co_filename
        try:
            path = str(Path(path).resolve().relative_to(Path(job.root).resolve()))
        except ValueError:
            pass
        kernels.append(
            {
                "kernel": name,
                "file": path,
                "line": code.co_firstlineno,
                "key": list(getattr(at, "keys", []) or []),
                "configs": [config_json(c) for c in at.configs],
            }
        )
    emit({"event": "autotune", "kernels": kernels})


def load_candidate(entry: str, root: str, params: dict, autotune: dict | None):
    """The candidate entry: the user's entry with keyword values and/or one pinned autotune config.
    autotune: {"kernel": name, "index": i, "config": {...}} (index into the discovered list)."""

    fn = load_entry(entry, root)
    if autotune is not None:
        tuners = autotuners(fn, root)
        at = tuners.get(autotune["kernel"])
        if at is None:
            raise RuntimeError(f"autotuned kernel {autotune['kernel']!r} not found from {entry}")
        config = at.configs[autotune["index"]]
        if json.loads(json.dumps(config_json(config))) != autotune["config"]:
            raise RuntimeError(f"{autotune['kernel']}: config {autotune['index']} changed since discovery")
        at.configs = [config]
        at.cache = {}
    if not params:
        return fn

    def candidate(**kw):
        return fn(**kw, **params)

    candidate.__wrapped__ = fn
    return candidate
