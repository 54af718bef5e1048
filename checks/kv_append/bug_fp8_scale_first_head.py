"""Paged FP8 KV append that quantises every head with the first head's scale

Parent: correct_fp8_per_head.py. Injected bug, in the launcher: per-head scales are detected with
`k_scale.dim() > 1` where it should be `k_scale.numel() > 1`. The per-head scales are a 1-D [Hkv]
tensor, so the kernel takes the per-tensor path and every head is divided by k_scale[0] (v_scale[0]).
Bug class: kv-scale.
Modelled on sgl-project/sglang PR #26436 (per-head FP8 KV cache scales): its review found a loader that
copies a single head's scale into a per-tensor parameter, so one head's scale serves every head -- silent
accuracy loss, no error.
pos-0 probe: missed. The probe passes scales of 1.0 (as a demo test, or vLLM without calibrated scales,
does), so every head's scale is the first head's.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "kv-scale",
    "pos0": "missed",
    "params": {"kv_dtype": "fp8_e4m3", "kv_scale": "per-head"},
    "modelled_on": "https://github.com/sgl-project/sglang/pull/26436",
    "style": "per token, per-head scales read as one",
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
        PER_HEAD=k_scale.dim() > 1,
    )
