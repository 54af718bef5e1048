"""An in-place rotary-embedding kernel reading a precomputed cos/sin cache [max_position, rotary_dim]
(cos in the first half, sin in the second), queries and keys flattened to [T, heads * head_size], an
is_neox flag, and one compiled head size only (the shape of several serving stacks' kernels).
Test-only: the worked example of docs/adapters.md."""
import triton
import triton.language as tl


@triton.jit
def _rope(positions, query, key, cos_sin_cache, s_qt, s_kt, s_ct, HQ: tl.constexpr, HKV: tl.constexpr,
          HEAD_SIZE: tl.constexpr, HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(positions + t)
    i = tl.arange(0, HALF)
    cos = tl.load(cos_sin_cache + pos * s_ct + i)
    sin = tl.load(cos_sin_cache + pos * s_ct + HALF + i)
    if IS_NEOX:
        a, b = i, i + HALF
    else:
        a, b = 2 * i, 2 * i + 1
    for h in range(HQ):
        base = query + t * s_qt + h * HEAD_SIZE
        x1 = tl.load(base + a).to(tl.float32)
        x2 = tl.load(base + b).to(tl.float32)
        tl.store(base + a, (x1 * cos - x2 * sin).to(query.dtype.element_ty))
        tl.store(base + b, (x2 * cos + x1 * sin).to(query.dtype.element_ty))
    for h in range(HKV):
        base = key + t * s_kt + h * HEAD_SIZE
        x1 = tl.load(base + a).to(tl.float32)
        x2 = tl.load(base + b).to(tl.float32)
        tl.store(base + a, (x1 * cos - x2 * sin).to(key.dtype.element_ty))
        tl.store(base + b, (x2 * cos + x1 * sin).to(key.dtype.element_ty))


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    """query [T, Hq * head_size], key [T, Hkv * head_size], rotated in place."""
    assert head_size == 128, "only head_size 128 is compiled"
    rot = cos_sin_cache.shape[-1]
    _rope[(positions.shape[0],)](positions, query, key, cos_sin_cache, query.stride(0), key.stride(0),
                                 cos_sin_cache.stride(0), HQ=query.shape[1] // head_size,
                                 HKV=key.shape[1] // head_size, HEAD_SIZE=head_size, HALF=rot // 2,
                                 IS_NEOX=is_neox)
