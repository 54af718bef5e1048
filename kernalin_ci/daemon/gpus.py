"""GPU slots: one job per GPU at a time. A slot is a GPU (named by its UUID where known, so
CUDA_VISIBLE_DEVICES and docker's device request cannot mean another board), or a CPU slot
where the gate runs under the Triton interpreter.

    slots("auto")          every GPU nvidia-smi lists, else `cpu_slots` CPU slots
    slots(2)               the first two GPUs (an error when fewer are present)
    slots([0, "GPU-..."])  exactly these
    slots("cpu", 3)        three CPU slots
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass

from kernalin_ci.errors import UsageError


@dataclass(frozen=True)
class Slot:
    name: str  # "gpu0", "cpu1", ...: in metrics, logs, job records
    device: str  # cuda | cpu
    visible: str  # CUDA_VISIBLE_DEVICES for the job ("" on a CPU slot)

    @property
    def worker(self) -> str:
        return f"{socket.gethostname()}/{self.name}"


def discover() -> list[tuple[int, str]]:
    """(index, UUID) of each GPU nvidia-smi lists; [] without a driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        r = subprocess.run(
            [smi, "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        idx, _, uuid = line.partition(",")
        if idx.strip().isdigit():
            out.append((int(idx), uuid.strip()))
    return out


def slots(spec, cpu_slots: int = 1, found: list[tuple[int, str]] | None = None) -> list[Slot]:
    if spec == "cpu":
        return [Slot(f"cpu{i}", "cpu", "") for i in range(cpu_slots)]
    found = discover() if found is None else found
    # a host that already restricts what this process sees (a container, a scheduler) is respected
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and found:
        allowed = [v.strip() for v in visible.split(",") if v.strip()]
        found = [(i, u) for i, u in found if str(i) in allowed or u in allowed]
    if spec == "auto":
        if not found:
            return slots("cpu", cpu_slots)
        return [Slot(f"gpu{i}", "cuda", u or str(i)) for i, u in found]
    if isinstance(spec, int):
        if len(found) < spec:
            raise UsageError(f"gpus: {spec} GPUs asked for, {len(found)} found")
        return [Slot(f"gpu{i}", "cuda", u or str(i)) for i, u in found[:spec]]
    out = []
    for item in spec:
        match = [(i, u) for i, u in found if str(i) == str(item) or u == str(item)]
        if not match:
            raise UsageError(f"gpus: no GPU {item!r} (found: {', '.join(str(i) for i, _ in found) or 'none'})")
        i, u = match[0]
        out.append(Slot(f"gpu{i}", "cuda", u or str(i)))
    return out
