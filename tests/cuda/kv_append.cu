// A hand-written CUDA C++ KV append (op kv_append), for the PTX engine's test: one block per token,
// the block's threads striding over its Hkv * D elements. SKIP_PADDING 0 is the bug of a kernel that
// writes padding tokens (slot -1) too; OFFSET_T int is the bug of 32-bit cache offsets.
typedef unsigned short half_bits;  // the bits of a float16: a copy moves them unchanged

#ifndef SKIP_PADDING
#define SKIP_PADDING 1
#endif
#ifndef OFFSET_T
#define OFFSET_T long long
#endif

extern "C" __global__ void __launch_bounds__(128)
kv_append(const half_bits* key, const half_bits* value, half_bits* k_cache, half_bits* v_cache,
          const long long* slot_mapping, int row, int block_size)
{
    int t = blockIdx.x;
    long long slot = slot_mapping[t];
    if (SKIP_PADDING && slot < 0) return;
    OFFSET_T blk = slot / block_size;
    OFFSET_T off = slot % block_size;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        long long src = (long long)t * row + i;
        OFFSET_T dst = (blk * block_size + off) * row + i;
        k_cache[dst] = key[src];
        v_cache[dst] = value[src];
    }
}
