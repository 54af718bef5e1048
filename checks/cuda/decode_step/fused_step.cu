// A whole decode step (decode_step, docs/ops.md) as ONE persistent kernel: a grid of a few blocks per SM takes
// sequences from an atomic work queue; for each sequence b, the block first rotates the new token's key and
// appends it (and the value) to the paged cache at slot_mapping[b], then, after a barrier, rotates each query
// head and attends over the cache with the new token included (common/decode_attention.cuh).
// Injected bugs (decode_step/bug_*.py): BUG_READ_BEFORE_WRITE, BUG_KEY_UNROTATED, BUG_STRAY_NEXT_SLOT,
// BUG_QUEUE_SKIP.
#include "decode_attention.cuh"

struct Rope {
    int rotary_dim, neox;
    float log_base;

    // element d of the row at BASE + ROW rotated to position POS
    __device__ float at(const void* base, i64 row, int d, float pos, int dt) const {
        const float x = ld(base, row + d, dt);
        if (d >= rotary_dim) return x;
        const int half = rotary_dim / 2;
        int i, partner;
        float sign;
        if (neox) {
            i = d < half ? d : d - half;
            partner = d < half ? d + half : d - half;
            sign = d < half ? -1.f : 1.f;
        } else {
            i = d / 2;
            partner = d % 2 == 0 ? d + 1 : d - 1;
            sign = d % 2 == 0 ? -1.f : 1.f;
        }
        float s, c;
        sincosf(pos * expf(-2.0f * i / rotary_dim * log_base), &s, &c);
        return x * c + sign * ld(base, row + partner, dt) * s;
    }
};

extern "C" __global__ void __launch_bounds__(THREADS)
    fused_step(const void* q, const void* k, const void* v, const i64* positions, void* k_cache, void* v_cache,
               const i64* slot_mapping, const int* block_tables, const int* kv_lens, void* out, int* next_item, int B,
               int Hq, int Hkv, int D, int block_size, float scale, int rotary_dim, int neox, float log_base,
               i64 sqb, i64 sqh, i64 skb, i64 skh, i64 svb, i64 svh, i64 bt_stride, i64 sb, i64 ss, i64 sh, int dt) {
    __shared__ AttendSmem sm;
    __shared__ int item;
    const Rope rope{rotary_dim, neox, log_base};
    const KvLayout kv{block_tables, bt_stride, block_size, sb, ss, sh};
    for (;;) {
        if (threadIdx.x == 0) {
#ifdef BUG_QUEUE_SKIP
            item = atomicAdd(next_item, 1) + 1;  // the first sequence is never taken
#else
            item = atomicAdd(next_item, 1);
#endif
        }
        __syncthreads();
        const int b = item;
        __syncthreads();  // everyone has read `item` before thread 0 takes the next one
        if (b >= B) return;
        const float pos = static_cast<float>(positions[b]);
        const i64 slot = slot_mapping[b];
        const i64 dst = (slot / block_size) * sb + (slot % block_size) * ss;
#ifndef BUG_READ_BEFORE_WRITE
        for (int e = threadIdx.x; e < Hkv * D; e += THREADS) {  // append the new token
            const int g = e / D, d = e % D;
#ifdef BUG_KEY_UNROTATED
            st(k_cache, dst + g * sh + d, dt, ld(k, b * skb + g * skh + d, dt));
#else
            st(k_cache, dst + g * sh + d, dt, rope.at(k, b * skb + g * skh, d, pos, dt));
#endif
            st(v_cache, dst + g * sh + d, dt, ld(v, b * svb + g * svh + d, dt));
#ifdef BUG_STRAY_NEXT_SLOT
            st(k_cache, dst + ss + g * sh + d, dt, ld(k, b * skb + g * skh + d, dt));  // and into the next slot
#endif
        }
        __syncthreads();  // the new slot is written (and visible to the block) before it is attended
#endif
        for (int h = 0; h < Hq; ++h) {
            for (int d = threadIdx.x; d < D; d += THREADS) sm.q[d] = rope.at(q, b * sqb + h * sqh, d, pos, dt);
            __syncthreads();
            attend(sm, k_cache, v_cache, kv, b, h / (Hq / Hkv), kv_lens[b], D, scale, dt, out,
                   (static_cast<i64>(b) * Hq + h) * D);
            __syncthreads();
        }
#ifdef BUG_READ_BEFORE_WRITE
        for (int e = threadIdx.x; e < Hkv * D; e += THREADS) {  // the append after the attention that needs it
            const int g = e / D, d = e % D;
            st(k_cache, dst + g * sh + d, dt, rope.at(k, b * skb + g * skh, d, pos, dt));
            st(v_cache, dst + g * sh + d, dt, ld(v, b * svb + g * svh + d, dt));
        }
        __syncthreads();
#endif
    }
}
