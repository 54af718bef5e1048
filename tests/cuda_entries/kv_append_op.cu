// The launcher of tests/cuda_entries/kv_append_torch_op.py: the catalogue's kv_append.cu registered as the
// operator kernalin_demo::kv_append (it writes k_cache and v_cache).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include "kv_append.cu"

static void kv_append(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
                      const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
    auto stream = c10::cuda::getCurrentCUDAStream();
    const int T = key.size(0), Hkv = key.size(1), D = key.size(2), bs = k_cache.size(1);
    using u16 = unsigned short;
    if (key.element_size() == 4) {
        kv_append32<<<T, 128, 0, stream>>>(key.data_ptr<float>(), value.data_ptr<float>(),
            k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), static_cast<const i64*>(slot_mapping.data_ptr()),
            Hkv, D, bs,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2));
    } else {
        kv_append16<<<T, 128, 0, stream>>>(static_cast<const u16*>(key.data_ptr()),
            static_cast<const u16*>(value.data_ptr()), static_cast<u16*>(k_cache.data_ptr()),
            static_cast<u16*>(v_cache.data_ptr()), static_cast<const i64*>(slot_mapping.data_ptr()),
            Hkv, D, bs,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2));
    }
}

TORCH_LIBRARY(kernalin_demo, m) {
    m.def("kv_append(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(kernalin_demo, CUDA, m) { m.impl("kv_append", &kv_append); }
