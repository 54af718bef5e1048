// RoPE of q [T, Hq, D] and k [T, Hkv, D], in place: one block per token, a thread per (head, pair).
// Injected bugs (one -D flag each; checks/cuda/rope/bug_*.py): BUG_SIGN, BUG_POSITION_TOKEN_INDEX,
// BUG_PAIRING_IGNORED, BUG_FREQUENCY_HEAD_DIM.
#include "kernalin_cuda.cuh"

extern "C" __global__ void rope(void* q, void* k, const i64* positions, int Hq, int Hkv, int D, int rotary_dim,
                                int neox, float log_base, i64 sqt, i64 sqh, i64 skt, i64 skh, int dt) {
    const int t = blockIdx.x;
    const int half = rotary_dim / 2;
#ifdef BUG_POSITION_TOKEN_INDEX
    const float pos = static_cast<float>(t);  // the token's index, not its position
#else
    const float pos = static_cast<float>(positions[t]);
#endif
    for (int w = threadIdx.x; w < (Hq + Hkv) * half; w += blockDim.x) {
        const int head = w / half, i = w % half;
        void* base = head < Hq ? q : k;
        const i64 row = head < Hq ? t * sqt + head * sqh : t * skt + (head - Hq) * skh;
#ifdef BUG_FREQUENCY_HEAD_DIM
        const float theta = expf(-2.0f * i / D * log_base);  // partial rotary: the frequencies need rotary_dim
#else
        const float theta = expf(-2.0f * i / rotary_dim * log_base);
#endif
        float s, c;
        sincosf(pos * theta, &s, &c);
#ifdef BUG_PAIRING_IGNORED
        const bool pair_halves = true;  // neox pairs whatever the style
#else
        const bool pair_halves = neox != 0;
#endif
        const i64 a = row + (pair_halves ? i : 2 * i), b = row + (pair_halves ? i + half : 2 * i + 1);
        const float x = ld(base, a, dt), y = ld(base, b, dt);
#ifdef BUG_SIGN
        st(base, a, dt, x * c + y * s);  // the inverse rotation
        st(base, b, dt, y * c - x * s);
#else
        st(base, a, dt, x * c - y * s);
        st(base, b, dt, y * c + x * s);
#endif
    }
}
