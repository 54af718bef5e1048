"""Paged decode attention that reads the tile's scores before they are all written (CUDA C++ only)

Parent: correct_online_smem.py. Injected bug, decode_attention.cuh under BUG_SHARED_RACE: the __syncthreads between the
warps' score writes to shared memory and every thread's reads of them is gone: a thread may read another warp's score
before it lands (or the previous tile's), and the tile's values may overwrite keys a slower warp still scores.
Bug class: shared-race. Modelled on sgl-project/sglang PR #37663 (no barrier between shared-memory stores and the
reads of other threads: stale data read). Compute Sanitizer racecheck sees the hazards;
the outputs are wrong only when the timing says so (dynamic: no expectation).
pos-0 probe: missed.
"""

import ctypes
from pathlib import Path

import torch

from kernalin_ci import current_params
from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "attention.decode_paged",
    "bug_class": "shared-race",
    "pos0": "missed",
    "params": {"block_size": 16},
    "modelled_on": "https://github.com/sgl-project/sglang/pull/37663",
    "style": "CUDA C++, shared-memory race",
    "cuda": {"sources": ["attention_decode_paged/paged_decode.cu"], "flags": ["-Icommon", "-DBUG_SHARED_RACE"]},
    "dynamic": "racy",
    "sanitizer": "caught",
}

HERE = Path(__file__).resolve().parent
DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _kernel(name):
    defines = [f for f in CATALOGUE["cuda"]["flags"] if f.startswith("-D")]
    return nvrtc.load(HERE.parent / "attention_decode_paged/paged_decode.cu", options=defines, include_dirs=[HERE.parent / "common"]).kernel(name)


def _i64(n):
    return ctypes.c_int64(n)


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    B, Hq, D = q.shape
    if D > 256:
        raise ValueError(f"head dim {D}: this kernel takes at most 256")
    hnd = current_params()["layout"] == "hnd"
    Hkv, block_size = (k_cache.shape[1], k_cache.shape[2]) if hnd else (k_cache.shape[2], k_cache.shape[1])
    slot_stride, head_stride = (k_cache.stride(2), k_cache.stride(1)) if hnd else (k_cache.stride(1), k_cache.stride(2))
    out = torch.empty_like(q)
    _kernel("paged_decode")(
        (B * Hq,), (128,),
        [q, k_cache, v_cache, block_tables, kv_lens, out, Hq, Hkv, D, block_size, float(scale),
         _i64(q.stride(0)), _i64(q.stride(1)), _i64(block_tables.stride(0)),
         _i64(k_cache.stride(0)), _i64(slot_stride), _i64(head_stride), DTYPE[q.dtype]],
    )
    return out
