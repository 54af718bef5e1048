# kv_append through CuPy's RawModule: CuPy compiles the catalogue's kv_append.cu (NVRTC, its own cache under
# CUPY_CACHE_DIR) and launches it on torch's stream; the tensors go in as CuPy views of the same memory
# (__cuda_array_interface__, no copy) (docs/cuda.md, "CuPy").
import functools
from pathlib import Path

import cupy
import numpy as np
import torch

CUDA = Path(__file__).resolve().parents[2] / "checks" / "cuda"


@functools.cache
def _module():
    src = (CUDA / "kv_append" / "kv_append.cu").read_text()
    return cupy.RawModule(code=src, options=(f"-I{CUDA / 'common'}",))


def entry(key, value, k_cache, v_cache, slot_mapping):
    T, Hkv, D = key.shape
    fn = _module().get_function("kv_append32" if key.element_size() == 4 else "kv_append16")
    view = cupy.asarray  # a view of the tensor's memory, not a copy
    i64 = np.int64
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        fn(
            (T,),
            (128,),
            (
                view(key),
                view(value),
                view(k_cache),
                view(v_cache),
                view(slot_mapping),
                np.int32(Hkv),
                np.int32(D),
                np.int32(k_cache.shape[1]),
                i64(key.stride(0)),
                i64(key.stride(1)),
                i64(value.stride(0)),
                i64(value.stride(1)),
                i64(k_cache.stride(0)),
                i64(k_cache.stride(1)),
                i64(k_cache.stride(2)),
            ),
        )
