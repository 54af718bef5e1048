// Paged decode attention, attention.decode_paged (docs/ops.md): one block per (sequence, query head), the tiled
// online softmax of common/decode_attention.cuh. Query head h reads KV head h / (Hq / Hkv). Injected bugs: the
// -D flags of decode_attention.cuh, and BUG_GQA_MODULO here.
#include "decode_attention.cuh"

extern "C" __global__ void __launch_bounds__(THREADS)
    paged_decode(const void* q, const void* k_cache, const void* v_cache, const int* block_tables, const int* kv_lens,
                 void* out, int Hq, int Hkv, int D, int block_size, float scale, i64 sqb, i64 sqh, i64 bt_stride,
                 i64 sb, i64 ss, i64 sh, int dt) {
    __shared__ AttendSmem sm;
    const int b = blockIdx.x / Hq, h = blockIdx.x % Hq;
#ifdef BUG_GQA_MODULO
    const int g = h % Hkv;  // interleaved heads: h -> h mod Hkv
#else
    const int g = h / (Hq / Hkv);
#endif
    for (int d = threadIdx.x; d < D; d += THREADS) sm.q[d] = ld(q, b * sqb + h * sqh + d, dt);
    __syncthreads();
    const KvLayout kv{block_tables, bt_stride, block_size, sb, ss, sh};
    attend(sm, k_cache, v_cache, kv, b, g, kv_lens[b], D, scale, dt, out, (static_cast<i64>(b) * Hq + h) * D);
}

// attention.decode: the same kernel over a contiguous cache [B, Hkv, S, D] (no block table).
extern "C" __global__ void __launch_bounds__(THREADS)
    contiguous_decode(const void* q, const void* k_cache, const void* v_cache, const int* kv_lens, void* out, int Hq,
                      int Hkv, int D, float scale, i64 sqb, i64 sqh, i64 sb, i64 sh, i64 ss, int dt) {
    __shared__ AttendSmem sm;
    const int b = blockIdx.x / Hq, h = blockIdx.x % Hq;
    const int g = h / (Hq / Hkv);
    for (int d = threadIdx.x; d < D; d += THREADS) sm.q[d] = ld(q, b * sqb + h * sqh + d, dt);
    __syncthreads();
    const KvLayout kv{nullptr, 0, 1, sb, ss, sh};
    attend(sm, k_cache, v_cache, kv, b, g, kv_lens[b], D, scale, dt, out, (static_cast<i64>(b) * Hq + h) * D);
}
