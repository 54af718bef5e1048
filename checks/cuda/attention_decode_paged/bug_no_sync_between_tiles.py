"""Paged decode attention without the __syncthreads between tiles (CUDA C++ only)

Parent: correct_online_smem.py. Injected bug, decode_attention.cuh under BUG_NO_SYNC_TILES: the barrier at the end of the
tile loop is gone: a fast warp loads the next tile's keys into the shared buffer while slower threads still read this
tile's values from it (a write-after-read race; the other barriers separate every other pair of accesses). Normal runs
mostly give the right output; Compute Sanitizer racecheck reports the hazards on every sequence longer than one tile
(issue 31: about 2,000 in such a kernel).
Bug class: shared-race. Modelled on NVIDIA/cuml PR #6578 (a missing barrier after a reduction in shared memory: the next
loop iteration overwrote it while thread 0 still read it). pos-0 probe: missed (one tile).
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
    "modelled_on": "https://github.com/NVIDIA/cuml/pull/6578",
    "style": "CUDA C++, missing barrier between tiles",
    "cuda": {"sources": ["attention_decode_paged/paged_decode.cu"], "flags": ["-Icommon", "-DBUG_NO_SYNC_TILES"]},
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
