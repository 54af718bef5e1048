"""Provenance: where and with what a benchmark ran, and whether base and head ran alike.

Worker task "explain-env" (no user code): the GPU's model, UUID, driver, clocks and throttle reasons
from NVML (`pynvml`, the nvidia-ml-py package) when importable, else what torch.cuda tells, else "not
available"; torch, CUDA and Triton versions; on a GPU, a measured device-to-device copy bandwidth.
The gate records it before and after timing; the timing regime comes from the benchmark itself.
"""

from __future__ import annotations

import platform

from kernalin_ci.isolate import run_task
from kernalin_ci.jobs import Emit, EnvJob

NA = "not available"
# NVML clock-event (throttle) reason bits
THROTTLE = {
    0x1: "gpu-idle",
    0x2: "applications-clocks-setting",
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x10: "sync-boost",
    0x20: "sw-thermal-slowdown",
    0x40: "hw-thermal-slowdown",
    0x80: "hw-power-brake-slowdown",
    0x100: "display-clock-setting",
}
COPY_BYTES = 512 << 20  # per buffer: ten times any current L2
SAME_KEYS = ("gpu_uuid", "gpu_name", "driver", "torch", "cuda", "triton")


def _nvml(uuid: str | None) -> dict | None:
    try:
        import pynvml as N
    except ImportError:
        return None
    try:
        N.nvmlInit()
    except Exception as e:
        return {"nvml": f"{NA} (nvmlInit failed: {type(e).__name__})"}
    try:
        h = None
        if uuid:
            try:
                h = N.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            except Exception:
                h = None
        h = h or N.nvmlDeviceGetHandleByIndex(0)

        def s(x):
            return x.decode() if isinstance(x, bytes) else x

        out = {
            "source": "nvml",
            "gpu_name": s(N.nvmlDeviceGetName(h)),
            "gpu_uuid": s(N.nvmlDeviceGetUUID(h)),
            "driver": s(N.nvmlSystemGetDriverVersion()),
            "sm_clock_mhz": N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
            "mem_clock_mhz": N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_SM),
            "temperature_c": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
        }
        get = getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", None) or N.nvmlDeviceGetCurrentClocksThrottleReasons
        bits = int(get(h))
        out["throttle_reasons"] = [name for bit, name in THROTTLE.items() if bits & bit]
        try:
            out["power_w"] = N.nvmlDeviceGetPowerUsage(h) / 1000.0
        except Exception:
            pass
        return out
    except Exception as e:
        return {"nvml": f"{NA} ({type(e).__name__}: {' '.join(str(e).split())[:120]})"}
    finally:
        try:
            N.nvmlShutdown()
        except Exception:
            pass


def copy_bandwidth() -> float:
    """GB/s of a device-to-device copy (bytes read + bytes written over the time), median of 10."""
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    del src, dst
    torch.cuda.empty_cache()
    return 2 * COPY_BYTES / times[len(times) // 2] / 1e9


def facts(measure_copy: bool) -> dict:
    """Everything known here (the worker child)."""
    import torch

    out: dict = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = NA
    if not torch.cuda.is_available():
        out.update(
            {
                "source": None,
                "gpu_name": None,
                "gpu_uuid": None,
                "driver": None,
                "unavailable": f"no GPU: GPU model, UUID, driver, clocks, throttle reasons and copy "
                f"bandwidth {NA} on the CPU",
            }
        )
        return out
    props = torch.cuda.get_device_properties(0)
    uuid = str(getattr(props, "uuid", "")) or None
    out.update(
        {
            "source": "torch",
            "gpu_name": props.name,
            "gpu_uuid": uuid,
            "driver": None,
            "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_gb": round(props.total_memory / 1e9, 1),
        }
    )
    nv = _nvml(uuid)
    if nv is None:
        out["unavailable"] = f"driver, clocks and throttle reasons {NA} (pynvml is not installed)"
    elif "nvml" in nv:
        out["unavailable"] = f"driver, clocks and throttle reasons: {nv['nvml']}"
    else:
        uuid_torch = out.pop("gpu_uuid")
        out.update(nv)
        out["gpu_uuid"] = nv.get("gpu_uuid") or uuid_torch
    if measure_copy:
        out["copy_gbs"] = round(copy_bandwidth(), 1)
    return out


def run_job(job: EnvJob, emit: Emit) -> None:
    """Worker task 'explain-env'."""
    emit({"event": "explain-env", **facts(job.copy)})


def environment(device: str, measure_copy: bool = False, timeout_s: float = 120.0) -> dict:
    """The facts of a fresh worker on `device` (parent side); {"error": ...} if it could not run."""
    out = run_task(EnvJob(copy=measure_copy), device, timeout_s)
    ev = next((e for e in out.events if e.get("event") == "explain-env"), None)
    if ev is None:
        return {"error": f"the environment worker {out.status}: {out.detail}"}
    ev.pop("event")
    return ev


def changed(a: dict, b: dict) -> list[str]:
    """What differs between two environments (GPU, driver, software), as 'key a -> b'."""
    return [f"{k} {a.get(k)} -> {b.get(k)}" for k in SAME_KEYS if a.get(k) != b.get(k)]


def provenance_text(env: dict) -> str:
    if env.get("error"):
        return f"provenance {NA}: {env['error']}"
    parts = []
    if env.get("gpu_name"):
        parts.append(f"{env['gpu_name']} ({env.get('gpu_uuid') or 'UUID ' + NA})")
    parts.append(f"driver {env.get('driver') or NA}")
    if env.get("sm_clock_mhz") is not None:
        parts.append(f"SM clock {env['sm_clock_mhz']} MHz")
    if env.get("throttle_reasons"):
        parts.append(f"throttle: {', '.join(env['throttle_reasons'])}")
    parts.append(f"torch {env.get('torch')}, CUDA {env.get('cuda') or NA}, Triton {env.get('triton')}")
    if env.get("copy_gbs"):
        parts.append(f"measured copy {env['copy_gbs']:.0f} GB/s")
    text = "; ".join(parts)
    return text + (f" ({env['unavailable']})" if env.get("unavailable") else "")
