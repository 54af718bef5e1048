# kv_append through torch.utils.cpp_extension.load_inline: a C++ launcher around the catalogue's kv_append.cu,
# built by torch (nvcc and the host compiler, ninja) into TORCH_EXTENSIONS_DIR, which kernalin-ci shares between
# the run's workers of one checkout: built once (docs/cuda.md, "torch.utils.cpp_extension").
import functools
from pathlib import Path

from torch.utils.cpp_extension import load_inline

CUDA = Path(__file__).resolve().parents[2] / "checks" / "cuda"

LAUNCHER = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include "kv_append.cu"

void kv_append(torch::Tensor key, torch::Tensor value, torch::Tensor k_cache, torch::Tensor v_cache,
               torch::Tensor slot_mapping) {
    auto stream = c10::cuda::getCurrentCUDAStream();
    const int T = key.size(0), Hkv = key.size(1), D = key.size(2), bs = k_cache.size(1);
    if (key.element_size() == 4) {
        kv_append32<<<T, 128, 0, stream>>>(key.data_ptr<float>(), value.data_ptr<float>(),
            k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), static_cast<const i64*>(slot_mapping.data_ptr()),
            Hkv, D, bs,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2));
    } else {
        using u16 = unsigned short;
        kv_append16<<<T, 128, 0, stream>>>(static_cast<const u16*>(key.data_ptr()),
            static_cast<const u16*>(value.data_ptr()), static_cast<u16*>(k_cache.data_ptr()),
            static_cast<u16*>(v_cache.data_ptr()), static_cast<const i64*>(slot_mapping.data_ptr()),
            Hkv, D, bs,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2));
    }
}
"""


@functools.cache
def _extension():
    return load_inline(
        name="kernalin_kv_append_inline",
        cpp_sources="void kv_append(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor);",
        cuda_sources=LAUNCHER,
        functions=["kv_append"],
        extra_include_paths=[str(CUDA / "kv_append"), str(CUDA / "common")],
    )


_extension()  # built when the entry loads, as most users do


def entry(key, value, k_cache, v_cache, slot_mapping):
    _extension().kv_append(key, value, k_cache, v_cache, slot_mapping)
