"""Paged FP8 KV append that multiplies by the scale where it should divide

Parent: correct_fp8_per_head.py. Injected bug, in _quantise: `x * scale` where the contract stores key / k_scale
(the attention side multiplies the stored value back by the scale).
Bug class: kv-scale.
Modelled on vllm-project/vllm-xpu-kernels PR #475 (concat_and_cache_mla with an FP8 cache): its first root
cause was the scale direction -- the cache write applied the scale the wrong way round -- next to a missing
clamp to the FP8 maximum.
pos-0 probe: missed. With the probe's scales of 1.0, x * 1 == x / 1.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "kv-scale",
    "pos0": "missed",
    "params": {"kv_dtype": "fp8_e4m3", "kv_scale": "per-head"},
    "modelled_on": "https://github.com/vllm-project/vllm-xpu-kernels/pull/475",
    "style": "per token, scale multiplied on write",
    "structural": "not-analysed",
}


@triton.jit
def _quantise(x, scale, DT: tl.constexpr):
    return (x * scale).to(DT)


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
