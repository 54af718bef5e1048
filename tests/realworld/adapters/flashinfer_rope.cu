// Our launcher for FlashInfer's rotary embedding with position ids (flashinfer-python 0.7.2.post1,
// pos_enc.cuh): BatchQKApplyRotaryPosIds on q and k in place, float16, int64 positions; called through ctypes
// (flashinfer_rope.py). Errors come back as a message.
#include <cuda_fp16.h>

#include <cstdio>
#include <exception>
#include <flashinfer/pos_enc.cuh>

using namespace flashinfer;

extern "C" int fi_rope(void* q, void* k, long long* positions, unsigned nnz, unsigned num_qo_heads,
                       unsigned num_kv_heads, unsigned rotary_dim, unsigned head_dim, unsigned long long q_stride_n,
                       unsigned long long q_stride_h, unsigned long long k_stride_n, unsigned long long k_stride_h,
                       int interleave, float rope_theta, void* stream, char* err, int err_size) {
  try {
    half* qh = static_cast<half*>(q);
    half* kh = static_cast<half*>(k);
    cudaError_t st = BatchQKApplyRotaryPosIds<half, int64_t>(
        qh, kh, qh, kh, reinterpret_cast<int64_t*>(positions), nnz, num_qo_heads, num_kv_heads, rotary_dim,
        head_dim, q_stride_n, q_stride_h, k_stride_n, k_stride_h, q_stride_n, q_stride_h, k_stride_n, k_stride_h,
        interleave != 0, /*rope_scale*/ 1.f, rope_theta, static_cast<cudaStream_t>(stream));
    if (st != cudaSuccess) {
      std::snprintf(err, err_size, "%s", cudaGetErrorString(st));
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, err_size, "%s", e.what());
    return 1;
  }
}
