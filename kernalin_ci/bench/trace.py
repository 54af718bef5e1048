"""Timing traces in the `kernalin-ci compare` format (docs/cli.md), saved and loaded.

A trace holds `base` and `head` (and optionally `base2`, a second, separately
built base instance timed in the same rounds), each [rounds, reps] per-launch
times in one unit; round r of all of them was measured in the same interleaved
round. A benchmark over several shapes also stores the per-shape arrays
`base_shapes`, `head_shapes`, `base2_shapes` [rounds, shapes, reps]; its
`base`/`head`/`base2` are then the per-repetition geometric mean over the shapes
(every shape weighs the same), so `compare` on the file gives the benchmark's
overall verdict. `meta` (a JSON string) says what was measured and how.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field

import numpy as np

from kernalin_ci.errors import UsageError

ARRAYS = ("base", "head", "base2")


@dataclass
class Trace:
    base: np.ndarray
    head: np.ndarray
    base2: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    per_shape: dict | None = None  # {"base": [R, S, reps], "head": ..., "base2": ...} or None

    @property
    def rounds(self) -> int:
        return int(self.base.shape[0])

    def shape_trace(self, i: int) -> Trace:
        """The trace of shape i alone (needs per-shape arrays)."""
        ps = self.per_shape
        return Trace(
            ps["base"][:, i],
            ps["head"][:, i],
            ps["base2"][:, i] if ps.get("base2") is not None else None,
            dict(self.meta),
        )

    def first(self, rounds: int) -> Trace:
        """The first `rounds` rounds (what an adaptive run had seen at that point)."""
        ps = (
            None
            if self.per_shape is None
            else {k: (v[:rounds] if v is not None else None) for k, v in self.per_shape.items()}
        )
        return Trace(
            self.base[:rounds],
            self.head[:rounds],
            self.base2[:rounds] if self.base2 is not None else None,
            dict(self.meta),
            ps,
        )


def geometric_mean_over_shapes(t: np.ndarray) -> np.ndarray:
    """[rounds, shapes, reps] -> [rounds, reps]."""
    return np.exp(np.log(t).mean(axis=1))


def from_shapes(base: np.ndarray, head: np.ndarray, base2: np.ndarray | None, meta: dict) -> Trace:
    """A trace from per-shape arrays [rounds, shapes, reps]."""
    return Trace(
        geometric_mean_over_shapes(base),
        geometric_mean_over_shapes(head),
        geometric_mean_over_shapes(base2) if base2 is not None else None,
        meta,
        {"base": base, "head": head, "base2": base2},
    )


def save_trace(trace: Trace, path: str) -> None:
    """Write `.json` (lists) or `.npz` (anything else)."""
    arrays = {k: getattr(trace, k) for k in ARRAYS if getattr(trace, k) is not None}
    if trace.per_shape:
        arrays.update({f"{k}_shapes": v for k, v in trace.per_shape.items() if v is not None})
    try:
        if path.endswith(".json"):
            with open(path, "w") as f:
                json.dump({**{k: np.asarray(v).tolist() for k, v in arrays.items()}, "meta": trace.meta}, f)
        else:
            with open(path, "wb") as f:
                np.savez_compressed(f, **arrays, meta=np.array(json.dumps(trace.meta)))
    except OSError as e:
        raise UsageError(f"trace {path}: {e.strerror}", setting="trace") from None


def load_trace(path: str) -> Trace:
    """Read and validate a trace; every problem is a one-line UsageError naming the file."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    try:
        if path.endswith(".json"):
            with open(path) as f:
                raw = json.load(f)
            if not isinstance(raw, dict):
                raise UsageError(f"{path}: expected a JSON object with arrays 'base' and 'head'")
            meta = raw.get("meta") if isinstance(raw.get("meta"), dict) else {}
            arrays = {k: raw[k] for k in raw if k in ARRAYS or k.endswith("_shapes")}
        else:
            if not zipfile.is_zipfile(path):  # np.load would take it for a pickle and advise allow_pickle
                raise UsageError(
                    f"{path}: not a readable .npz or .json trace (a .npz is a zip archive: this file is not one)"
                )
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files if k in ARRAYS or k.endswith("_shapes")}
                meta = json.loads(str(z["meta"])) if "meta" in z.files else {}
    except UsageError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, json.JSONDecodeError) as e:
        msg = " ".join(str(e).split())[:160]
        raise UsageError(f"{path}: not a readable .npz or .json trace ({type(e).__name__}: {msg})") from None
    for k in ("base", "head"):
        if k not in arrays:
            raise UsageError(f"{path}: no array {k!r} (a trace holds 'base' and 'head', [rounds, reps] each)")
    got = {k: _array(path, k, arrays[k], 2) for k in ARRAYS if arrays.get(k) is not None}
    rounds = got["base"].shape[0]
    for k, a in got.items():
        if a.shape[0] != rounds:
            raise UsageError(
                f"{path}: {k} has {a.shape[0]} rounds but base has {rounds} (shapes "
                f"{tuple(got['base'].shape)} and {tuple(a.shape)})"
            )
    per_shape = None
    if "base_shapes" in arrays and "head_shapes" in arrays:
        per_shape = {
            k: _array(path, f"{k}_shapes", arrays[f"{k}_shapes"], 3)
            for k in ARRAYS
            if arrays.get(f"{k}_shapes") is not None
        }
        shapes = {v.shape[:2] for v in per_shape.values()}
        if len(shapes) != 1 or next(iter(shapes))[0] != rounds:
            raise UsageError(f"{path}: per-shape arrays disagree with each other or with base's {rounds} rounds")
    return Trace(got["base"], got["head"], got.get("base2"), meta if isinstance(meta, dict) else {}, per_shape)


def _array(path: str, name: str, value, ndim: int) -> np.ndarray:
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise UsageError(f"{path}: {name} is not an array of numbers") from None
    want = "[rounds, reps]" if ndim == 2 else "[rounds, shapes, reps]"
    if a.ndim != ndim:
        raise UsageError(f"{path}: {name} must be {ndim}-D {want}, got shape {tuple(a.shape)}")
    if a.size == 0:
        raise UsageError(f"{path}: {name} is empty (shape {tuple(a.shape)})")
    if not np.isfinite(a).all():
        raise UsageError(f"{path}: {name} holds {int((~np.isfinite(a)).sum())} NaN/Inf values")
    if (a <= 0).any():
        raise UsageError(f"{path}: {name} holds {int((a <= 0).sum())} times <= 0 (times must be positive)")
    return a
