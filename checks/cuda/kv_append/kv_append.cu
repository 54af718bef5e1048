// Paged KV append: token t's key and value [Hkv, D] into slot slot_mapping[t] of k_cache and v_cache
// [num_blocks, block_size, Hkv, D]; a slot < 0 is a padding token (skipped). One block per token, raw element
// copies (bit for bit). Injected bugs (checks/cuda/kv_append/bug_*.py): BUG_PADDING_NOT_SKIPPED,
// BUG_UNMASKED_ROW, BUG_VALUE_FROM_KEY.
#include "kernalin_cuda.cuh"

template <typename E>
__device__ void append(const E* key, const E* value, E* k_cache, E* v_cache, const i64* slot_mapping, int Hkv, int D,
                       int block_size, i64 skt, i64 skh, i64 svt, i64 svh, i64 scb, i64 scs, i64 sch) {
    const int t = blockIdx.x;
    const i64 slot = slot_mapping[t];
#ifndef BUG_PADDING_NOT_SKIPPED
    if (slot < 0) return;
#endif
    const i64 blk = slot >= 0 ? slot / block_size : -1, off = slot >= 0 ? slot % block_size : slot + block_size;
    const int n = Hkv * D;
#ifdef BUG_UNMASKED_ROW
    const int end = (n + blockDim.x - 1) / blockDim.x * blockDim.x;  // rounded up to the block: no tail mask
#else
    const int end = n;
#endif
    for (int e = threadIdx.x; e < end; e += blockDim.x) {
        const int h = e / D, d = e % D;
        const i64 dst = blk * scb + off * scs + h * sch + d;
        k_cache[dst] = key[t * skt + h * skh + d];
#ifdef BUG_VALUE_FROM_KEY
        v_cache[dst] = key[t * skt + h * skh + d];
#else
        v_cache[dst] = value[t * svt + h * svh + d];
#endif
    }
}

extern "C" __global__ void kv_append32(const float* key, const float* value, float* k_cache, float* v_cache,
                                       const i64* slots, int Hkv, int D, int bs, i64 skt, i64 skh, i64 svt, i64 svh,
                                       i64 scb, i64 scs, i64 sch) {
    append(key, value, k_cache, v_cache, slots, Hkv, D, bs, skt, skh, svt, svh, scb, scs, sch);
}

extern "C" __global__ void kv_append16(const unsigned short* key, const unsigned short* value,
                                       unsigned short* k_cache, unsigned short* v_cache, const i64* slots, int Hkv,
                                       int D, int bs, i64 skt, i64 skh, i64 svt, i64 svh, i64 scb, i64 scs, i64 sch) {
    append(key, value, k_cache, v_cache, slots, Hkv, D, bs, skt, skh, svt, svh, scb, scs, sch);
}
