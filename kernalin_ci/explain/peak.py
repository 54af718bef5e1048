"""% of peak: achieved GB/s and TFLOP/s per benchmark shape, against the GPU's datasheet peaks and
(on a GPU) a measured device-to-device copy bandwidth.

Peaks are NVIDIA's datasheet figures, dense (no structured sparsity): the H200 (NVIDIA H200 Tensor Core GPU
datasheet), H100 (NVIDIA H100 Tensor Core GPU datasheet), A100 (NVIDIA A100 Tensor Core GPU datasheet),
L40S (NVIDIA L40S datasheet), L4 (NVIDIA L4 Tensor Core GPU datasheet), A10 (NVIDIA A10 datasheet).
Tensor-core FLOP/s apply to a kernel whose SASS has tensor-core instructions; otherwise the FP32
CUDA-core FLOP/s. A figure above a peak is a measurement problem (data resident in L2, work skipped), never
a win: above the datasheet HBM bandwidth or FLOP/s, or more than COPY_MARGIN above the device-to-device copy
bandwidth measured on the machine (what its DRAM really delivers: 85% of the datasheet on the H200).
"""

from __future__ import annotations

# name match (all substrings, case-insensitive, first match wins) -> HBM GB/s, dense tensor TFLOP/s for
# fp16/bf16 (and tf32 for float32 dots), CUDA-core fp32 TFLOP/s, L2 MB
GPUS = (
    (
        ("h200", "nvl"),
        {"model": "H200 NVL", "hbm_gbs": 4800, "tensor_16": 835.5, "tensor_tf32": 417.5, "fp32": 60.0, "l2_mb": 50},
    ),
    (
        ("h200",),
        {"model": "H200 SXM", "hbm_gbs": 4800, "tensor_16": 989.5, "tensor_tf32": 494.5, "fp32": 67.0, "l2_mb": 50},
    ),
    (
        ("h100", "nvl"),
        {"model": "H100 NVL", "hbm_gbs": 3900, "tensor_16": 835.5, "tensor_tf32": 417.5, "fp32": 60.0, "l2_mb": 50},
    ),
    (
        ("h100", "pcie"),
        {"model": "H100 PCIe", "hbm_gbs": 2000, "tensor_16": 756.5, "tensor_tf32": 378.0, "fp32": 51.2, "l2_mb": 50},
    ),
    (
        ("h100",),
        {"model": "H100 SXM", "hbm_gbs": 3350, "tensor_16": 989.5, "tensor_tf32": 494.5, "fp32": 67.0, "l2_mb": 50},
    ),
    (
        ("a100", "40gb"),
        {"model": "A100 40GB", "hbm_gbs": 1555, "tensor_16": 312.0, "tensor_tf32": 156.0, "fp32": 19.5, "l2_mb": 40},
    ),
    (
        ("a100", "pcie"),
        {
            "model": "A100 80GB PCIe",
            "hbm_gbs": 1935,
            "tensor_16": 312.0,
            "tensor_tf32": 156.0,
            "fp32": 19.5,
            "l2_mb": 40,
        },
    ),
    (
        ("a100",),
        {
            "model": "A100 80GB SXM",
            "hbm_gbs": 2039,
            "tensor_16": 312.0,
            "tensor_tf32": 156.0,
            "fp32": 19.5,
            "l2_mb": 40,
        },
    ),
    (
        ("l40s",),
        {"model": "L40S", "hbm_gbs": 864, "tensor_16": 362.05, "tensor_tf32": 183.0, "fp32": 91.6, "l2_mb": 96},
    ),
    (("l4",), {"model": "L4", "hbm_gbs": 300, "tensor_16": 121.0, "tensor_tf32": 60.0, "fp32": 30.3, "l2_mb": 48}),
    (("a10",), {"model": "A10", "hbm_gbs": 600, "tensor_16": 125.0, "tensor_tf32": 62.5, "fp32": 31.2, "l2_mb": 6}),
)


def gpu_peaks(name: str | None) -> dict | None:
    """The datasheet row for a device name (torch or NVML spelling), or None when not in the table."""
    low = (name or "").lower()
    for keys, row in GPUS:
        if all(k in low for k in keys):
            return dict(row)
    return None


def uses_tensor_cores(compiled_launches: list[dict]) -> bool:
    return any(
        ((la.get("compiled") or {}).get("mix") or {}).get("classes", {}).get("tensor-core") for la in compiled_launches
    )


# A kernel that only reads (decode attention) may outrun a copy, which reads and writes, by a few percent
# (no read/write turnaround on the DRAM bus); by more than this it is not reading DRAM.
COPY_MARGIN = 1.10


def shape_peak(traffic, ms: float | None, dtype: str, peaks: dict | None, copy_gbs: float | None, tensor: bool) -> dict:
    """One shape: achieved GB/s and TFLOP/s at `ms` per call, share of the peaks, the bound, a flag."""
    out: dict = {
        "bytes": traffic.bytes,
        "flops": traffic.flops,
        "ms": ms,
        "achieved_gbs": None,
        "achieved_tflops": None,
        "peak_gbs": None,
        "peak_tflops": None,
        "peak_flops_kind": None,
        "pct_peak_bw": None,
        "pct_peak_flops": None,
        "pct_copy_bw": None,
        "bound": None,
        "above_peak": False,
        "problem": None,
    }
    if not ms or ms <= 0:
        return out
    s = ms * 1e-3
    out["achieved_gbs"] = traffic.bytes / s / 1e9
    out["achieved_tflops"] = traffic.flops / s / 1e12
    over = []  # the peaks the figure exceeds
    if copy_gbs:
        out["pct_copy_bw"] = out["achieved_gbs"] / copy_gbs
        if out["pct_copy_bw"] > COPY_MARGIN:
            over.append(f"{out['pct_copy_bw']:.0%} of the measured copy bandwidth {copy_gbs:.0f} GB/s")
    if peaks is not None:
        kind = ("tensor_tf32" if dtype == "float32" else "tensor_16") if tensor else "fp32"
        out["peak_gbs"], out["peak_tflops"], out["peak_flops_kind"] = peaks["hbm_gbs"], peaks[kind], kind
        out["pct_peak_bw"] = out["achieved_gbs"] / peaks["hbm_gbs"]
        out["pct_peak_flops"] = out["achieved_tflops"] / peaks[kind] if traffic.flops else None
        # the bound by the op's arithmetic intensity against the machine's ridge point
        t_mem = traffic.bytes / (peaks["hbm_gbs"] * 1e9)
        t_math = traffic.flops / (peaks[kind] * 1e12)
        out["bound"] = "memory-bound" if t_mem >= t_math else "compute-bound"
        if out["pct_peak_bw"] > 1.0:
            over.insert(0, f"{out['pct_peak_bw']:.0%} of the datasheet HBM peak {peaks['hbm_gbs']:.0f} GB/s")
        if (out["pct_peak_flops"] or 0.0) > 1.0:
            over.append(f"{out['pct_peak_flops']:.0%} of the datasheet {kind} peak")
    if over:
        out["above_peak"] = True
        l2 = (peaks or {}).get("l2_mb")
        fits = (
            f"the {traffic.bytes / 1e6:.3g} MB it moves fit in the {l2} MB L2, "
            if l2 is not None and traffic.bytes <= l2 * 1e6
            else ""
        )
        out["problem"] = (
            f"{' and '.join(over)}: a measurement problem, not a win ({fits}data resident in L2 or work skipped)"
        )
    return out


def peak_text(p: dict) -> str:
    """One line for a shape: '3.9 TB/s (81% of HBM peak, 95% of measured copy), memory-bound'."""
    if p.get("achieved_gbs") is None:
        return f"{p['bytes'] / 1e6:.3g} MB moved, {p['flops'] / 1e6:.3g} MFLOP by the op's definition; not measured"
    parts = [f"{p['achieved_gbs']:.0f} GB/s"]
    share = []
    if p.get("pct_peak_bw") is not None:
        share.append(f"{p['pct_peak_bw']:.0%} of HBM peak {p['peak_gbs']:.0f} GB/s")
    if p.get("pct_copy_bw") is not None:
        share.append(f"{p['pct_copy_bw']:.0%} of measured copy")
    if share:
        parts[0] += f" ({', '.join(share)})"
    if p.get("flops"):
        t = f"{p['achieved_tflops']:.2f} TFLOP/s"
        if p.get("pct_peak_flops") is not None:
            t += f" ({p['pct_peak_flops']:.1%} of {p['peak_flops_kind']} peak)"
        parts.append(t)
    if p.get("bound"):
        parts.append(p["bound"])
    if p.get("problem"):
        parts.append("⚠ " + p["problem"])
    return ", ".join(parts)
