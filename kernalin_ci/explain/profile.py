"""`--profile`: Nsight Compute metrics of the changed kernels, base and head side by side.

Each side runs in its own worker child under `ncu`, inside the same worker sandbox as every kernel worker
(kernalin_ci/sandbox/): ncu is the command that starts the worker there (isolate.run_task's `wrap`), its
installation bound read-only, its CSV written to a folder the parent made. Task "explain-profile": the
entry is called once to compile and warm up, then once more inside an NVTX range `kernalin`, the only range
ncu profiles. The metrics: DRAM throughput (% of peak), achieved occupancy, L2 hit rate, duration.

GPU performance counters are for administrators unless the driver allows everyone
(RmProfilingAdminOnly 0, `NVreg_RestrictProfilingToAdminUsers=0`). The sandboxed worker never has a
capability (CAP_SYS_ADMIN would let it leave the sandbox; CAP_PERFMON, which drivers since R565 accept,
would let it watch every process on the host), so where counters are admin-only a sandboxed profile is
not run, and the report says why. Where ncu is not on PATH, or on the CPU, the report says so too.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil

from kernalin_ci import sandbox
from kernalin_ci.device import DEVICES
from kernalin_ci.entry import load_entry
from kernalin_ci.isolate import run_task
from kernalin_ci.jobs import Emit, ProfileJob
from kernalin_ci.ops import get_op
from kernalin_ci.sandbox import CappedFolder

METRICS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
    "gpu__time_duration.sum": "duration_ns",
}
NOT_PROFILED = "not profiled"
TIMEOUT_S = 180.0  # one side under ncu, without a word from the worker
DRIVER_PARAMS = "/proc/driver/nvidia/params"
ADMIN_ONLY = (
    "the GPU driver lets only administrators read performance counters (RmProfilingAdminOnly 1) and the "
    "sandboxed worker has no capability; an administrator may allow everyone "
    "(nvidia module option NVreg_RestrictProfilingToAdminUsers=0)"
)
DENIED = (
    "the profiled process may not read GPU performance counters (the driver keeps them for processes with "
    "CAP_SYS_ADMIN, or CAP_PERFMON since R565, unless NVreg_RestrictProfilingToAdminUsers=0)"
)


def run_job(job: ProfileJob, emit: Emit) -> None:
    """Worker task 'explain-profile' (in the child, under ncu)."""
    import torch

    op = get_op(job.op, root=job.root)
    fn = load_entry(job.entry, job.root)
    kw = op.inputs(job.case, job.params, "cuda", poison=False)
    fn(**kw)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("kernalin")
    fn(**kw)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    emit({"event": "explain-profiled"})


def parse(text: str) -> list[dict]:
    """ncu --csv output -> [{"kernel", metric: value, ...}] per profiled launch."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows: dict = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        name = r.get("Metric Name")
        if name not in METRICS:
            continue
        key = r.get("ID", "0")
        row = rows.setdefault(key, {"kernel": r.get("Kernel Name", "?")})
        try:
            row[METRICS[name]] = float(str(r.get("Metric Value", "")).replace(",", ""))
        except ValueError:
            row[METRICS[name]] = r.get("Metric Value")
    return list(rows.values())


def counters_admin_only(params_file: str = DRIVER_PARAMS) -> bool | None:
    """Whether the driver restricts GPU performance counters to administrators; None: not known here."""
    try:
        with open(params_file) as f:
            m = re.search(r"RmProfilingAdminOnly:\s*(\d+)", f.read())
    except OSError:
        return None
    return None if m is None else m.group(1) != "0"


def install_dirs(ncu: str) -> list[str]:
    """The folders an ncu on PATH runs from: its own, and the installation above a `bin` folder (the CUDA
    toolkit's `bin/ncu` is a script that starts `nsight-compute-*/ncu` beside it)."""
    here = os.path.dirname(os.path.realpath(ncu))
    return [os.path.dirname(here)] if os.path.basename(here) == "bin" else [here]


def ncu_argv(ncu: str, log: str) -> list[str]:
    """ncu, profiling only the NVTX range `kernalin`, the METRICS in base units, as CSV into LOG; clocks as
    the benchmark ran them (not locked to base)."""
    return [
        ncu,
        "--csv",
        "--print-units",
        "base",
        "--clock-control",
        "none",
        "--target-processes",
        "all",
        "--nvtx",
        "--nvtx-include",
        "kernalin/",
        "--metrics",
        ",".join(METRICS),
        "--log-file",
        log,
    ]


def profile_side(op: str, entry: str, root: str, params: dict, case, timeout_s: float | None = None) -> dict:
    """One side under ncu, in the worker sandbox -> {"kernels": [...]} or {"error": ...}."""

    ncu = shutil.which("ncu")
    job = ProfileJob(op=op, entry=entry, root=root, params=params, case=case)
    with CappedFolder("kernalin-ncu-") as out:  # ncu writes out.path, this process reads out.view
        o = run_task(
            job,
            "cuda",
            timeout_s or TIMEOUT_S,
            cwd=root,
            writable=(out,),
            wrap=tuple(ncu_argv(ncu, os.path.join(out.path, "ncu.csv"))),
            readonly=tuple(install_dirs(ncu)),
        )
        try:
            with open(os.path.join(out.view, "ncu.csv"), errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        if out.full():
            text += f"\n==ERROR== {out.full()}"
    kernels = parse(text)
    if kernels:
        return {"kernels": kernels}
    said = f"{text}\n{o.output_tail}"
    if "ERR_NVGPUCTRPERM" in said:
        return {"error": f"ncu: ERR_NVGPUCTRPERM: {DENIED}"}
    errs = [ln.strip() for ln in said.splitlines() if "==ERROR==" in ln or "Error" in ln][:3]
    tail = " ".join((" ".join(errs) or said).split()[-40:])[-400:]
    how = "ok" if o.status == "ok" else o.ended()
    return {"error": f"ncu profiled no kernel (worker: {how}): {tail}"}


def nsight(
    requested: bool,
    op: str = "",
    entry: str = "",
    base_root: str = "",
    head_root: str = "",
    params: dict | None = None,
    case=None,
    device: str = "cuda",
) -> dict | None:
    """Base and head under Nsight Compute, or why not."""
    if not requested:
        return None
    if not DEVICES[device].gpu:
        return {"status": NOT_PROFILED, "cause": f"Nsight Compute needs a GPU (device {device})"}
    if shutil.which("ncu") is None:
        return {"status": NOT_PROFILED, "cause": "ncu (Nsight Compute) is not on PATH"}
    if case is None:
        return {"status": NOT_PROFILED, "cause": "no timed shape to profile"}

    sandboxed = sandbox.workers_sandboxed()
    if sandboxed and counters_admin_only():
        return {"status": NOT_PROFILED, "cause": ADMIN_ONLY, "sandboxed": True}
    closed = [d for d in install_dirs(shutil.which("ncu") or "") if not sandbox.others_can_read(d)]
    if sandboxed and os.geteuid() == 0 and closed:  # the worker would start without the sandbox instead
        return {
            "status": NOT_PROFILED,
            "cause": f"ncu's installation {closed[0]} is not readable by the sandbox's unprivileged user",
            "sandboxed": True,
        }
    out = {
        "status": "profiled",
        "cause": f"shape {case.name}",
        "sandboxed": sandboxed,
        "metrics": list(METRICS.values()),
    }
    for side, root in (("base", base_root), ("head", head_root)):
        out[side] = profile_side(op, entry, root, params or {}, case)
    if all("error" in out[s] for s in ("base", "head")):
        out["status"] = "failed"
    out["side_by_side"] = side_by_side(out)
    return out


LABELS = {
    "dram_throughput_pct": ("DRAM throughput", "%"),
    "achieved_occupancy_pct": ("achieved occupancy", "%"),
    "l2_hit_rate_pct": ("L2 hit rate", "%"),
    "duration_ns": ("duration", " ns"),
}


def side_by_side(p: dict) -> list[dict]:
    """Base and head per profiled launch, in launch order: {"kernel", metric: [base, head], ...}."""
    base, head = (p.get(s, {}).get("kernels") or [] for s in ("base", "head"))
    rows = []
    for i in range(max(len(base), len(head))):
        b = base[i] if i < len(base) else {}
        h = head[i] if i < len(head) else {}
        row: dict = {"kernel": h.get("kernel") or b.get("kernel")}
        for m in METRICS.values():
            if m in b or m in h:
                row[m] = [b.get(m), h.get(m)]
        rows.append(row)
    return rows


def profile_lines(p: dict | None) -> list[str]:
    if not p:
        return []
    if p.get("status") != "profiled":
        return [f"Nsight Compute: {p.get('status')} ({p.get('cause')})"]
    where = "in the worker sandbox" if p.get("sandboxed") else "without a sandbox"
    out = [f"Nsight Compute, base -> head ({p.get('cause')}, {where}):"]
    for side in ("base", "head"):
        if (p.get(side) or {}).get("error"):
            out.append(f"  {side}: {p[side]['error']}")

    def fig(x, unit: str) -> str:
        return "n/a" if not isinstance(x, (int, float)) else f"{x:.1f}{unit}"

    for row in p.get("side_by_side") or side_by_side(p):
        figs = [
            f"{label} {fig(row[m][0], unit)} -> {fig(row[m][1], unit)}"
            for m, (label, unit) in LABELS.items()
            if m in row
        ]
        out.append(f"  {str(row['kernel'])[:60]}: {', '.join(figs)}")
    return out
