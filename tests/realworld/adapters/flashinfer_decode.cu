// Our launcher for FlashInfer's CUDA-core decode kernels (flashinfer-python 0.7.2.post1, its
// data/include/flashinfer headers, fetched by tests/realworld/fetch.py): extern "C" functions over raw
// pointers, called through ctypes (flashinfer_single_decode.py, flashinfer_batch_decode.py). One head dim
// (128) and one dtype (float16) are instantiated, as a model's build would; the entries refuse the others.
// Errors (a CUDA error, FlashInfer's own exceptions) come back as a message, never as an exception across C.
#include <cuda_fp16.h>

#include <cstdio>
#include <exception>
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/variants.cuh>

using namespace flashinfer;
using Variant = DefaultAttention</*custom mask*/ false, /*sliding window*/ false, /*soft cap*/ false, /*alibi*/ false>;
constexpr uint32_t HEAD_DIM = 128;

static int failed(char* err, int size, const char* what) {
  std::snprintf(err, size, "%s", what);
  return 1;
}

// One sequence, contiguous [num_kv_heads, kv_len, head_dim] cache rows (HND) with the given strides.
extern "C" int fi_single_decode(void* q, void* k, void* v, void* o, unsigned kv_len, unsigned num_qo_heads,
                                unsigned num_kv_heads, unsigned q_stride_h, unsigned kv_stride_n,
                                unsigned kv_stride_h, float sm_scale, void* stream, char* err, int err_size) {
  try {
    SingleDecodeParams<half, half, half> p;
    p.q = static_cast<half*>(q);
    p.k = static_cast<half*>(k);
    p.v = static_cast<half*>(v);
    p.o = static_cast<half*>(o);
    p.kv_len = kv_len;
    p.num_qo_heads = num_qo_heads;
    p.num_kv_heads = num_kv_heads;
    p.q_stride_n = num_qo_heads * q_stride_h;
    p.q_stride_h = q_stride_h;
    p.kv_stride_n = kv_stride_n;
    p.kv_stride_h = kv_stride_h;
    p.window_left = -1;
    p.sm_scale = sm_scale;
    p.rope_rcp_scale = 1.f;
    p.rope_rcp_theta = 1.f;
    cudaError_t st = SingleDecodeWithKVCacheDispatched<HEAD_DIM, PosEncodingMode::kNone, Variant>(
        p, /*tmp: no split-KV*/ nullptr, static_cast<cudaStream_t>(stream));
    return st == cudaSuccess ? 0 : failed(err, err_size, cudaGetErrorString(st));
  } catch (const std::exception& e) {
    return failed(err, err_size, e.what());
  }
}

// A batch over a paged cache: FlashInfer's CSR page table (indptr, indices, last_page_len) and, for its
// non-split path, one block row per request (request_indices, kv_tile_indices, kv_chunk_size).
extern "C" int fi_batch_decode(void* q, void* k_cache, void* v_cache, int* indices, int* indptr, int* last_page_len,
                               int* request_indices, int* kv_tile_indices, int* kv_chunk_size, void* o,
                               unsigned batch, unsigned num_requests, unsigned num_qo_heads, unsigned num_kv_heads,
                               unsigned page_size, int hnd, const long long* kv_strides, int q_stride_n,
                               int q_stride_h, float sm_scale, void* stream, char* err, int err_size) {
  try {
    const int64_t strides[3] = {kv_strides[0], kv_strides[1], kv_strides[2]};
    paged_kv_t<half, int> kv(num_kv_heads, page_size, HEAD_DIM, num_requests, hnd ? QKVLayout::kHND : QKVLayout::kNHD,
                             static_cast<half*>(k_cache), static_cast<half*>(v_cache), strides, indices, indptr,
                             last_page_len);
    BatchDecodeParams<half, half, half, int> p(static_cast<half*>(q), nullptr, kv, static_cast<half*>(o), nullptr,
                                               nullptr, num_qo_heads, q_stride_n, q_stride_h, -1, 0.f, sm_scale,
                                               1.f, 1e4f);
    p.padded_batch_size = batch;
    p.request_indices = request_indices;
    p.kv_tile_indices = kv_tile_indices;
    p.kv_chunk_size_ptr = kv_chunk_size;
    p.block_valid_mask = nullptr;
    cudaError_t st = BatchDecodeWithPagedKVCacheDispatched<HEAD_DIM, PosEncodingMode::kNone, Variant>(
        p, /*tmp_v: no split-KV*/ nullptr, nullptr, /*pdl*/ false, static_cast<cudaStream_t>(stream));
    return st == cudaSuccess ? 0 : failed(err, err_size, cudaGetErrorString(st));
  } catch (const std::exception& e) {
    return failed(err, err_size, e.what());
  }
}
