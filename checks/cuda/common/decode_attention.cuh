// One query row against a sequence's cached keys and values: tiled online softmax, one block of 128 threads
// (4 warps) per (sequence, query head). Each tile of TILE keys is loaded into shared memory, each warp scores
// its keys (a warp-shuffle dot product), every thread updates the running max and sum from the tile's scores,
// then the tile's values are loaded into the same shared buffer and thread i accumulates output dims i and
// i + 128 from them. Three barriers per tile: keys loaded; scores written; values loaded; and a fourth at the
// end, before the next tile's keys overwrite the values. Used by the paged and the contiguous decode kernels and
// by the fused decode step (checks/cuda/*).
//
// Injected bugs (one -D flag each, see the bug_*.py files): BUG_SOFTMAX_NO_MAX, BUG_NO_RESCALE,
// BUG_UNMASKED_TAIL, BUG_KV_MASK_OFF_BY_ONE, BUG_WARP_LANES, BUG_SHARED_RACE, BUG_NO_SYNC_TILES.
#pragma once
#include "kernalin_cuda.cuh"

#define TILE 32
#define THREADS 128
#define MAXD 256
#define NEG_INF (-__int_as_float(0x7f800000))

// Where key/value position POS of sequence B, KV head G lives (element offset). block_tables == nullptr: a
// contiguous cache [B, Hkv, S, D] (sb, sh, ss: its strides); else a paged one (sb: block, ss: slot, sh: head).
struct KvLayout {
    const int* block_tables;
    i64 bt_stride;
    int block_size;
    i64 sb, ss, sh;

    __device__ __forceinline__ i64 at(int b, int g, int pos) const {
        if (block_tables == nullptr) return b * sb + g * sh + static_cast<i64>(pos) * ss;
        const i64 blk = block_tables[b * bt_stride + pos / block_size];
        return blk * sb + (pos % block_size) * ss + g * sh;
    }
};

struct AttendSmem {
    float kv[TILE][MAXD + 1];  // the tile's keys, then its values
    float scores[TILE];
    float q[MAXD];
};

// out[d] = softmax(scale * q . K^T) V over positions [0, kv_len); q already in sm.q (float). Every thread calls it.
__device__ void attend(AttendSmem& sm, const void* k_cache, const void* v_cache, const KvLayout& kv, int b, int g,
                       int kv_len, int D, float scale, int dt, void* out, i64 out_row) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    float qreg[MAXD / 32];
#pragma unroll
    for (int i = 0; i < MAXD / 32; ++i) qreg[i] = (lane + 32 * i < D) ? sm.q[lane + 32 * i] : 0.f;
    float m = NEG_INF, l = 0.f, acc[MAXD / THREADS] = {0.f, 0.f};
#ifdef BUG_KV_MASK_OFF_BY_ONE
    const int len = kv_len + 1;  // position kv_len is not part of the sequence
#else
    const int len = kv_len;
#endif
    for (int t0 = 0; t0 < len; t0 += TILE) {
        const int n = min(TILE, len - t0);
        for (int e = tid; e < TILE * D; e += THREADS) {
            const int j = e / D, d = e % D;
            sm.kv[j][d] = j < n ? ld(k_cache, kv.at(b, g, t0 + j) + d, dt) : 0.f;
        }
        __syncthreads();  // the keys are in place before anyone scores them
        for (int j = warp; j < TILE; j += THREADS / 32) {
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < MAXD / 32; ++i)
                if (lane + 32 * i < D) s += qreg[i] * sm.kv[j][lane + 32 * i];
#ifdef BUG_WARP_LANES
            for (int offset = 8; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);  // half-warps
#else
            s = warp_sum(s);
#endif
            if (lane == 0) sm.scores[j] = j < n ? s * scale : NEG_INF;
        }
#ifndef BUG_SHARED_RACE
        __syncthreads();  // the scores are written (and the keys read) before anyone reads them (or loads values)
#endif
        float tile_max = NEG_INF;
        for (int j = 0; j < TILE; ++j) tile_max = fmaxf(tile_max, sm.scores[j]);
#ifdef BUG_SOFTMAX_NO_MAX
        const float m_new = 0.f;  // exp of raw scores: overflows once scores pass ~88
#else
        const float m_new = fmaxf(m, tile_max);
#endif
        const float alpha = m == NEG_INF ? 0.f : expf(m - m_new);
        float p[TILE];
        float sum = 0.f;
        for (int j = 0; j < TILE; ++j) {
            p[j] = sm.scores[j] == NEG_INF ? 0.f : expf(sm.scores[j] - m_new);
            sum += p[j];
        }
        l = l * alpha + sum;
#ifdef BUG_UNMASKED_TAIL
        // values loaded to the end of the sequence's last block (p = 0 there): 0 * a poisoned slot is NaN
        const int block_end = kv.block_tables == nullptr ? len : (len + kv.block_size - 1) / kv.block_size * kv.block_size;
        const int nv = min(TILE, block_end - t0);
#else
        const int nv = n;
#endif
        for (int e = tid; e < TILE * D; e += THREADS) {  // the values into the buffer the keys were in
            const int j = e / D, d = e % D;
            sm.kv[j][d] = j < nv ? ld(v_cache, kv.at(b, g, t0 + j) + d, dt) : 0.f;
        }
        __syncthreads();  // the values are in place before anyone accumulates them
#pragma unroll
        for (int r = 0; r < MAXD / THREADS; ++r) {
            const int d = tid + r * THREADS;
            if (d >= D) continue;
#ifdef BUG_NO_RESCALE
            float a = acc[r];  // the accumulator keeps the scale of the tiles before
#else
            float a = acc[r] * alpha;
#endif
            for (int j = 0; j < nv; ++j) a += p[j] * sm.kv[j][d];
            acc[r] = a;
        }
        m = m_new;
#ifndef BUG_NO_SYNC_TILES
        __syncthreads();  // all threads are done with the values before the next keys overwrite them
#endif
    }
#pragma unroll
    for (int r = 0; r < MAXD / THREADS; ++r) {
        const int d = tid + r * THREADS;
        if (d < D) st(out, out_row + d, dt, acc[r] / l);
    }
}
