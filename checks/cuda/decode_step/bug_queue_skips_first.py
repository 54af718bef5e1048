"""Persistent decode step whose work queue skips the first item (CUDA C++ only)

Parent: correct_persistent_queue.py. Injected bug, fused_step.cu under BUG_QUEUE_SKIP: `atomicAdd(next_item, 1) + 1`: the
first sequence is never appended nor attended (its output and its new slot keep what they held).
Bug class: kv-coverage. Modelled on ROCm/aotriton PR #181 (a persistent kernel's atomic tile counter that left some
tiles never executed, their outputs unwritten).
pos-0 probe: caught (the probe's only sequence is skipped).
"""

import ctypes
import math
from pathlib import Path

import torch

from kernalin_ci import current_params
from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "decode_step",
    "bug_class": "kv-coverage",
    "pos0": "caught",
    "params": {"block_size": 16},
    "modelled_on": "https://github.com/ROCm/aotriton/pull/181",
    "style": "CUDA C++, persistent, queue off by one",
    "cuda": {"sources": ["decode_step/fused_step.cu"], "flags": ["-Icommon", "-DBUG_QUEUE_SKIP"]},
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
