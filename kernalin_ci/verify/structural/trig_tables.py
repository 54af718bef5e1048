"""Cos and sin tables an entry filled on the host, recognised on the capture call's data.

Many RoPE kernels take the rotation as two float tensors, cos and sin, one row per token (LightLLM,
ColossalAI: [T, r/2]; LMDeploy, Liger, Unsloth: HF's [T, r], the half table repeated) or one row per position.
Their PTX only loads them: nothing in the kernel says which is which. The capture call has their data: a
scratch tensor whose every element is cos (or sin) of the op's angle for its row's token (or position) and
its column's frequency, within the table format's rounding, is that table (`TrigTable`). The PTX engine then
reads the rotation's signs, frequencies and rows through it; the domain says the tables are assumed to hold
what they held at the capture call.
"""

from __future__ import annotations

import numpy as np

from kernalin_ci.lazy import torch
from kernalin_ci.ops.rope import spec_of
from kernalin_ci.ptx.facts import TrigTable

TOL = {8: 1e-6, 4: 1e-3, 2: 2e-2}  # |table - expected| by element size (float32 tables come from float32 angles)
_NP = {"float64": np.float64, "float32": np.float32, "float16": np.float16}  # and bfloat16 (read as its bits)


def identify(op_params: dict, cap) -> dict[str, TrigTable]:
    """The scratch tensors of a capture that hold cos or sin of the capture's RoPE angles."""
    pos, q = cap.kwargs.get("positions"), cap.tensors.get("q")
    candidates = {
        name: info
        for name, info in cap.tensors.items()
        if info.role == "scratch"
        and info.dtype in (*_NP, "bfloat16")
        and len(info.shape) >= 2
        and all(n == 1 for n in info.shape[:-2])
    }
    if pos is None or q is None or not q.shape or not candidates:
        return {}
    positions = pos.to("cpu", torch.int64).numpy()
    spec = spec_of(op_params, int(q.shape[-1]))
    angles = spec.angles(pos).numpy()  # [T, r/2]
    want = {"cos": spec.magnitude * np.cos(angles), "sin": spec.magnitude * np.sin(angles)}
    if np.abs(want["cos"] - want["sin"]).max() < 0.5:  # the capture's angles cannot tell cos from sin
        return {}
    half = spec.r // 2
    columns = {
        "half": np.arange(half),
        "repeat": np.arange(2 * half) % half,
        "interleave": np.arange(2 * half) // 2,
    }
    out = {}
    for name, info in candidates.items():
        rows, width = int(info.shape[-2]), int(info.shape[-1])
        by_row = {}
        if rows == len(angles):
            by_row["token"] = _rows(info, np.arange(rows))
        if positions.ndim == 1 and rows > int(positions.max()):
            by_row["position"] = _rows(info, positions)
        tol = TOL[info.elsize]
        for fn, expected in want.items():
            found = [
                TrigTable(fn, row, col)
                for row, got in by_row.items()
                for col, freq in columns.items()
                if len(freq) == width and np.abs(got - expected[:, freq]).max() <= tol
            ]
            if found:
                out[name] = found[0]
    return out


def _rows(info, rows: np.ndarray) -> np.ndarray:
    """[len(rows), width]: these rows of a table (its dims before the last two all of size 1)."""
    cols = np.arange(int(info.shape[-1]))
    elem = rows[:, None].astype(np.int64) * int(info.strides[-2]) + cols[None, :] * int(info.strides[-1])
    return _read(info, elem.reshape(-1)).reshape(len(rows), len(cols))


def _read(info, elem: np.ndarray) -> np.ndarray:
    """A float tensor's elements at these element offsets, as float64."""
    byte = elem * info.elsize
    if info.dtype == "bfloat16":
        raw, _ = info.read(byte, np.uint16)
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    raw, _ = info.read(byte, _NP[info.dtype])
    return raw.astype(np.float64)
