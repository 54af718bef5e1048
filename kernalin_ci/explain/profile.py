"""`--profile`: Nsight Compute metrics of the changed kernels, base and head side by side.

Each side runs in its own worker child under `ncu` (task "explain-profile": the entry is called once to
compile and warm up, then once more inside an NVTX range `kernalin`, the only range ncu profiles). The
metrics: DRAM throughput (% of peak), achieved occupancy, L2 hit rate. Where `ncu` is not on PATH the
report says so.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import tempfile

METRICS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
    "gpu__time_duration.sum": "duration",
}


def run_job(job: dict, emit) -> None:
    """Worker task 'explain-profile' (in the child, under ncu)."""
    import torch

    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import Case

    op = get_op(job["op"], root=job.get("root"))
    fn = load_entry(job["entry"], job.get("root"))
    kw = op.inputs(Case.from_json(job["case"]), job["params"], "cuda", poison=False)
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


def profile_side(op: str, entry: str, root: str, params: dict, case, timeout_s: float = 300.0) -> dict:
    """One side under ncu -> {"kernels": [...]} or {"error": ...}."""
    from kernalin_ci.isolate import child_env
    from kernalin_ci.launch import module_argv

    ncu = shutil.which("ncu")
    job = {
        "task": "explain-profile",
        "op": op,
        "entry": entry,
        "root": root,
        "params": params,
        "case": case.to_json(),
        "device": "cuda",
    }
    with tempfile.TemporaryDirectory(prefix="kernalin-ncu-") as tmp:
        path = os.path.join(tmp, "job.json")
        with open(path, "w") as f:
            json.dump(job, f)
        log = os.open(os.path.join(tmp, "events"), os.O_WRONLY | os.O_CREAT)
        argv = [
            ncu,
            "--csv",
            "--target-processes",
            "all",
            "--nvtx",
            "--nvtx-include",
            "kernalin/",
            "--metrics",
            ",".join(METRICS),
            *module_argv("kernalin_ci.kernel_worker", cwd=root),
            path,
            str(log),
        ]
        try:
            r = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=child_env("cuda"),
                cwd=root,
                pass_fds=(log,),
            )
        except subprocess.TimeoutExpired:
            return {"error": f"ncu did not finish in {timeout_s:g} s"}
        finally:
            os.close(log)
    kernels = parse(r.stdout)
    if not kernels:
        tail = " ".join((r.stderr or r.stdout).split()[-40:])[-400:]
        return {"error": f"ncu exited {r.returncode} with no metrics: {tail}"}
    return {"kernels": kernels}


def nsight(
    requested: bool,
    op: str = "",
    entry: str = "",
    base_root: str = "",
    head_root: str = "",
    params: dict | None = None,
    case=None,
) -> dict | None:
    """Base and head under Nsight Compute, or why not."""
    if not requested:
        return None
    if shutil.which("ncu") is None:
        return {"status": "not available", "cause": "ncu (Nsight Compute) is not on PATH"}
    if case is None:
        return {"status": "not run", "cause": "no timed shape to profile"}
    from kernalin_ci.sandbox import ENV_WORKER_SANDBOX, worker_mode

    if worker_mode() != "off":  # ncu starts the worker itself, outside the worker sandbox
        return {
            "status": "not run",
            "cause": f"ncu would run the pull request's code outside the worker sandbox "
            f"(set {ENV_WORKER_SANDBOX}=off to profile trusted code)",
        }
    out = {"status": "profiled", "cause": f"shape {case.name}", "metrics": list(METRICS.values())}
    for side, root in (("base", base_root), ("head", head_root)):
        out[side] = profile_side(op, entry, root, params or {}, case)
    if all("error" in out[s] for s in ("base", "head")):
        out["status"] = "failed"
    return out


def profile_lines(p: dict | None) -> list[str]:
    if not p:
        return []
    if p.get("status") != "profiled":
        return [f"Nsight Compute: {p.get('status')} ({p.get('cause')})"]
    out = [f"Nsight Compute ({p.get('cause')}):"]
    for side in ("base", "head"):
        s = p.get(side) or {}
        if s.get("error"):
            out.append(f"  {side}: {s['error']}")
        for k in s.get("kernels", []):
            figs = ", ".join(
                f"{name} {k[name]:.1f}" if isinstance(k.get(name), float) else f"{name} {k.get(name)}"
                for name in METRICS.values()
                if name in k
            )
            out.append(f"  {side} {k['kernel'][:60]}: {figs}")
    return out
