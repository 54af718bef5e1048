"""Paged FP8 (e5m2) KV append whose software conversion does not saturate

Parent: correct_fp8_per_head.py (with `kv_dtype: fp8_e5m2`). Injected bug: the quotient is converted to
e5m2 in integer arithmetic (_quantise: round to nearest even through the float16 bit pattern, as
software FP8 paths for GPUs without a native conversion do) and nothing clamps it to the largest normal
57344: a quotient past it is stored as inf (or a NaN byte) instead of 57344. Every other value is the
correctly rounded one.
Bug class: kv-saturation.
Modelled on vllm-project/vllm-xpu-kernels PR #475 (concat_and_cache_mla with an FP8 cache): one of its
three root causes was the missing clamp to fp8_max before the conversion.
pos-0 probe: missed. The probe's key is N(0, 1) with scales of 1.0: nothing is near 57344.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "kv-saturation",
    "pos0": "missed",
    "params": {"kv_dtype": "fp8_e5m2", "kv_scale": "per-head"},
    "modelled_on": "https://github.com/vllm-project/vllm-xpu-kernels/pull/475",
    "style": "per token, software e5m2 conversion without the clamp",
    "structural": "not-analysed",
}


@triton.jit
def _quantise(x, scale, DT: tl.constexpr):
    # e5m2 is float16's high byte: a sticky bit, truncate to float16, round at the byte; nothing clamps to 57344
    u = (x / scale).to(tl.int32, bitcast=True)
    h = (u | (((u & 0xFFFF) != 0).to(tl.int32) << 16)).to(tl.float32, bitcast=True)
    b = h.to(tl.float16, fp_downcast_rounding="rtz").to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return (((b >> 8) & 0x80) | (((b & 0x7FFF) + 0x7F + ((b >> 8) & 1)) >> 8)).to(tl.uint8).to(DT, bitcast=True)


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
