"""rope entry for xformers' rope_padded kernel (xformers 0.0.35, xformers/ops/_triton/rope_padded_kernels.py):
RoPE of q, k and v in one launch, the rotated q to an output and the rotated k and the v into a KV cache,
for a batch of sequences concatenated along the token axis. Its launcher's default pairs adjacent dims
(`adjacents=True`): the gptj style.

Each of our T tokens is one sequence of one query whose cache holds one slot: seqstartq = 0..T,
seqstartk = 0..T-1, seqlenk = 1, so token t's rotated key lands in slot t of a cache shaped like k, which
the adapter returns as k's output, and its explicit position comes from `seqpos`. v is not part of the
rope op: the adapter passes a zero v and a scratch v cache. The kernel is launched with the launcher's
grid and constants (the launcher takes an attention-bias object of xformers'); the module's one package
import, the libdevice lookup, is stood in for by Triton's libdevice.

Scaled frequencies (docs/ops.md, `rope` `scaling`): the kernel divides every angle by `linear_scale` (the op's
`linear` factor) and, with `use_dynamic_scaling`, scales the frequency table by Llama-3.1's rule from its old
context length, scale factor and low/high frequency factors (the op's `llama3` params, passed as they are).
"""

import torch
from _source import load
from triton.language.extra import libdevice

import kernalin_ci

_m = load(
    "xformers-0.0.35",
    "xformers/ops/_triton/rope_padded_kernels.py",
    stubs={"xformers.triton.importing": {"libdevice_find": lambda name: getattr(libdevice, name)}},
)


def scaling(params):
    """linear_scale, use_dynamic_scaling and its four constants, from the op's rope params."""
    kind, factor = params.get("scaling") or "none", params.get("scaling_factor")
    if kind == "linear":
        return factor, False, 0, 0, 0, 0
    if kind == "llama3":
        low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
        return 1.0, True, params["original_max_position"], factor, low, high
    if kind != "none":
        raise NotImplementedError(f"xformers rope_padded has no {kind} scaling")
    return 1.0, False, 0, 0, 0, 0


def entry(q, k, positions):
    params = kernalin_ci.current_params()
    base = params.get("base", 10000.0)
    T, hq, dim = q.shape
    hkv = k.shape[1]
    dev = q.device
    xq, xk = q[None], k[None]
    xv = torch.zeros_like(xk)
    out_q = torch.empty_like(xq)
    cache_k, cache_v = torch.empty_like(xk), torch.empty_like(xk)
    seqstartq = torch.arange(T + 1, dtype=torch.int32, device=dev)
    seqstartk = torch.arange(T, dtype=torch.int32, device=dev)
    seqlenk = torch.ones(T, dtype=torch.int32, device=dev)
    block = max(128, min(65536 // q.element_size(), 1 << (dim - 1).bit_length()))
    block = min(block, 4096)
    n_total_heads = hq + 2 * hkv
    _m._rope_padded_kernel[(1, T, n_total_heads)](
        xq, xk, xv, out_q, cache_k, cache_v, seqstartq, seqstartk, seqlenk,
        base, *scaling(params),
        None, positions, hq, hq + hkv, 1, dim,
        xq.stride(1), 0, xq.stride(2), xk.stride(1), 0, xk.stride(2), xv.stride(1), 0, xv.stride(2),
        cache_k.stride(1), 0, cache_k.stride(2), cache_v.stride(1), 0, cache_v.stride(2),
        seqstartq.stride(0), seqstartk.stride(0), seqlenk.stride(0),
        out_q.stride(1), 0, out_q.stride(2), positions.stride(0), "",
        const_batch_strides=False, cache_padding_length=0, seqlenk_shift=0,
        BLOCK_SIZE=block, adjacents=True, num_warps=min(max(block // 256, 1), 8),
    )  # fmt: skip
    return out_q[0], cache_k[0]
