"""Paged KV append into an FP8 cache with per-head scales (correct): one program per token

Program t loads slot_mapping[t] (a negative slot is padding: nothing written), loads its [Hkv, D] key
and value tiles in float32, divides each head's row by that head's scale (k_scale[h], v_scale[h]) and
stores the quotient into the FP8 cache; Triton's float32 -> FP8 cast rounds to nearest even and
saturates at the format's largest normal (docs/ops.md, "FP8 KV caches"). With `kv_scale: per-tensor`
the scale tensors have one element and every head reads it (the head index is masked to 0).
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": None,
    "pos0": None,
    "params": {"kv_dtype": "fp8_e4m3", "kv_scale": "per-head"},
    "modelled_on": None,
    "style": "one program per token, [Hkv, D] tile, quantise on write",
    "structural": "not-analysed",
}


@triton.jit
def _quantise(x, scale, DT: tl.constexpr):
    return (x / scale).to(DT)  # round to nearest even, saturating (docs/ops.md, "FP8 KV caches")


@triton.jit
def _kv_append_fp8_kernel(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale,
                          stride_kt, stride_kh, stride_vt, stride_vh,
                          stride_kcb, stride_kcs, stride_kch,
                          stride_vcb, stride_vcs, stride_vch,
                          num_kv_heads, head_dim,
                          BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                          PER_HEAD: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping + t)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    hh = tl.arange(0, BLOCK_H)
    h = hh[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_kv_heads) & (d < head_dim)
    sh = hh if PER_HEAD else hh * 0
    ks = tl.load(k_scale + sh, mask=hh < num_kv_heads, other=1.0)[:, None]
    vs = tl.load(v_scale + sh, mask=hh < num_kv_heads, other=1.0)[:, None]
    k = tl.load(key + t * stride_kt + h * stride_kh + d, mask=mask).to(tl.float32)
    v = tl.load(value + t * stride_vt + h * stride_vh + d, mask=mask).to(tl.float32)
    kq = _quantise(k, ks, k_cache.dtype.element_ty)
    vq = _quantise(v, vs, v_cache.dtype.element_ty)
    tl.store(k_cache + blk * stride_kcb + off * stride_kcs + h * stride_kch + d, kq, mask=mask)
    tl.store(v_cache + blk * stride_vcb + off * stride_vcs + h * stride_vch + d, vq, mask=mask)


def entry(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale):
    T, Hkv, D = key.shape
    _kv_append_fp8_kernel[(T,)](
        key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        Hkv, D,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_H=triton.next_power_of_2(Hkv), BLOCK_D=triton.next_power_of_2(D),
        PER_HEAD=k_scale.numel() > 1,
    )
