"""Per-(token, head) KV append launched with a grid of one program per token: only head 0 is written

Parent: correct_per_head.py. Injected bug, in entry(): the launch grid is `(T,)` where it
should be `(T, Hkv)`; tl.program_id(1) is then always 0, so only KV head 0 of every token is
copied and heads 1..Hkv-1 of its slot keep their old contents (a grid left over from the
single-KV-head version of the kernel).
Bug class: kv-coverage.
Modelled on XPU-Forces/mojo_opset PR #250 (review): the KV-cache kernel's head grid was sized
with a fixed BLOCK_HEADS while the kernel autotuned it, so too few programs were launched to
cover all KV heads.
pos-0 probe: caught. The probe has Hkv = 2, so head 1 of slot 0 is never written and keeps
the zeros of the probe's cache.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "kv-coverage",
    "pos0": "caught",
    "params": {},
    "modelled_on": "https://github.com/XPU-Forces/mojo_opset/pull/250",
    "style": "per (token, head) kernel launched with grid (T,)",
}


@triton.jit
def _kv_append_head_kernel(key, value, k_cache, v_cache, slot_mapping,
                           stride_kt, stride_kh, stride_vt, stride_vh,
                           stride_kcb, stride_kcs, stride_kch,
                           stride_vcb, stride_vcs, stride_vch,
                           head_dim,
                           BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_mapping + t)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    d = tl.arange(0, BLOCK_D)
    mask = d < head_dim
    k = tl.load(key + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(k_cache + blk * stride_kcb + off * stride_kcs + h * stride_kch + d, k, mask=mask)
    tl.store(v_cache + blk * stride_vcb + off * stride_vcs + h * stride_vch + d, v, mask=mask)


def entry(key, value, k_cache, v_cache, slot_mapping):
    T, Hkv, D = key.shape
    assert key.stride(2) == 1 and value.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    _kv_append_head_kernel[(T,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        D,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_D=triton.next_power_of_2(D),
    )
