"""A whole decode step as ONE persistent CUDA C++ kernel: blocks take sequences from an atomic work queue; per
sequence, rotate the new key and append it and the value to the paged cache, a barrier, then rotate each query head
and attend over the cache with the new token (decode_step/fused_step.cu, no bug flag).
"""

import ctypes
import math
from pathlib import Path

import torch

from kernalin_ci import current_params
from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "decode_step",
    "bug_class": None,
    "pos0": None,
    "params": {"block_size": 16},
    "modelled_on": None,
    "style": "CUDA C++, persistent, atomic work queue",
    "cuda": {"sources": ["decode_step/fused_step.cu"], "flags": ["-Icommon"]},
}

HERE = Path(__file__).resolve().parent
DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _kernel(name):
    defines = [f for f in CATALOGUE["cuda"]["flags"] if f.startswith("-D")]
    return nvrtc.load(HERE.parent / "decode_step/fused_step.cu", options=defines, include_dirs=[HERE.parent / "common"]).kernel(name)


def _i64(n):
    return ctypes.c_int64(n)


def entry(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    p = current_params()
    B, Hq, D = q.shape
    if D > 256:
        raise ValueError(f"head dim {D}: this kernel takes at most 256")
    if p["layout"] != "nhd":
        raise ValueError("this kernel takes the nhd cache layout")
    Hkv, block_size = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(q)
    next_item = torch.zeros(1, dtype=torch.int32, device=q.device)  # the work queue's head
    blocks = min(B, 4 * torch.cuda.get_device_properties(q.device).multi_processor_count)
    _kernel("fused_step")(
        (blocks,), (128,),
        [q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, out, next_item, B, Hq, Hkv, D,
         block_size, float(scale), p["rotary_dim"] or D, int(p["style"] == "neox"), math.log(p["base"]),
         _i64(q.stride(0)), _i64(q.stride(1)), _i64(k.stride(0)), _i64(k.stride(1)), _i64(v.stride(0)),
         _i64(v.stride(1)), _i64(block_tables.stride(0)), _i64(k_cache.stride(0)), _i64(k_cache.stride(1)),
         _i64(k_cache.stride(2)), DTYPE[q.dtype]],
    )
    return out
