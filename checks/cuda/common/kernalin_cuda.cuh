// Helpers of the CUDA C++ catalogue (checks/cuda/): element access in float32, float16 and bfloat16 without
// any toolkit header (NVRTC and nvcc alike), and a warp-shuffle sum. dt: 0 float32, 1 float16, 2 bfloat16.
#pragma once

typedef long long i64;

__device__ __forceinline__ float ld(const void* p, i64 i, int dt) {
    if (dt == 0) return static_cast<const float*>(p)[i];
    unsigned short h = static_cast<const unsigned short*>(p)[i];
    if (dt == 1) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    return __uint_as_float(static_cast<unsigned>(h) << 16);
}

__device__ __forceinline__ void st(void* p, i64 i, int dt, float v) {
    if (dt == 0) {
        static_cast<float*>(p)[i] = v;
        return;
    }
    unsigned short h;
    if (dt == 1) asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    else asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    static_cast<unsigned short*>(p)[i] = h;
}

// The sum of V over the 32 lanes of a warp, in every lane (a butterfly over offsets 16, 8, 4, 2, 1).
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
