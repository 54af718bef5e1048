"""Correct kv_append entries, each launching its kernel the way some production stack does (issue 30,
item 2): constexprs of every kind (enum, str, None, tuple, dataclass), @triton.heuristics,
@triton.autotune with prune_configs_by, do_not_specialize, tl.static_range and tl.range with
num_stages, inline PTX (tl.inline_asm_elementwise), a host tensor descriptor (TMA), fp8 pointers,
launch_metadata, a launch from a class method and one through functools.partial.

Every kernel copies each token's Hkv x D key and value into its cache slot, bit for bit, and skips
padding tokens (slot -1). tests/test_robust_kernels.py verifies each: it must pass, or say exactly
what could not be analysed or checked; nothing here may end in an internal error.
"""
import dataclasses
import enum
import functools

import torch
import triton
import triton.language as tl


def _rows(key, value, k_cache, v_cache):
    """The caches as [slots, Hkv * D] rows, the tokens as [T, Hkv * D] rows (views)."""
    nb, bs, hkv, d = k_cache.shape
    return key.reshape(key.shape[0], -1), value.reshape(value.shape[0], -1), k_cache.view(nb * bs, hkv * d), \
        v_cache.view(nb * bs, hkv * d)


@triton.jit
def _copy_row(src, dst, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(dst + i, tl.load(src + i, mask=i < n), mask=i < n)


# ------------------------------------------------------------------ enum, str, None, tuple, dataclass constexprs


class Source(enum.Enum):
    KEY = 1
    VALUE = 2


class Dtype(enum.IntEnum):
    FP16 = 0
    BF16 = 1


class Layout(str, enum.Enum):
    NHD = "nhd"


@triton.jit
def _enum_kernel(src, cache, slots, n, stride_s, stride_c, WHICH: tl.constexpr, DTYPE: tl.constexpr,
                 LAYOUT: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    if s >= 0:
        _copy_row(src + t * stride_s, cache + s * stride_c, n, BLOCK)


def enum_constexpr(key, value, k_cache, v_cache, slot_mapping):
    k, v, kc, vc = _rows(key, value, k_cache, v_cache)
    n = k.shape[1]
    for which, src, cache in ((Source.KEY, k, kc), (Source.VALUE, v, vc)):
        _enum_kernel[(k.shape[0],)](src, cache, slot_mapping, n, src.stride(0), cache.stride(0), WHICH=which,
                                    DTYPE=Dtype.FP16, LAYOUT=Layout.NHD, BLOCK=triton.next_power_of_2(n))


@triton.jit
def _str_none_kernel(key, value, kc, vc, slots, n, stride_k, stride_v, stride_c, scale_ptr,
                     MODE: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    i = tl.arange(0, BLOCK)
    m = (i < n) & (s >= 0)
    k = tl.load(key + t * stride_k + i, mask=m)
    v = tl.load(value + t * stride_v + i, mask=m)
    if scale_ptr is not None:  # never taken: the launcher passes None
        k = k * tl.load(scale_ptr)
    if MODE == "copy":
        tl.store(kc + s * stride_c + i, k, mask=m)
        tl.store(vc + s * stride_c + i, v, mask=m)


def str_none_constexpr(key, value, k_cache, v_cache, slot_mapping):
    k, v, kc, vc = _rows(key, value, k_cache, v_cache)
    n = k.shape[1]
    _str_none_kernel[(k.shape[0],)](k, v, kc, vc, slot_mapping, n, k.stride(0), v.stride(0), kc.stride(0), None,
                                    MODE="copy", BLOCK=triton.next_power_of_2(n))


@triton.jit
def _tuple_kernel(key, value, kc, vc, slots, stride_k, stride_v, stride_c, SHAPE: tl.constexpr,
                  BLOCKS: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    h = tl.arange(0, BLOCKS[0])[:, None]
    d = tl.arange(0, BLOCKS[1])[None, :]
    m = (h < SHAPE[0]) & (d < SHAPE[1]) & (s >= 0)
    off = h * SHAPE[1] + d
    tl.store(kc + s * stride_c + off, tl.load(key + t * stride_k + off, mask=m), mask=m)
    tl.store(vc + s * stride_c + off, tl.load(value + t * stride_v + off, mask=m), mask=m)


def tuple_constexpr(key, value, k_cache, v_cache, slot_mapping):
    hkv, d = key.shape[1], key.shape[2]
    k, v, kc, vc = _rows(key, value, k_cache, v_cache)
    _tuple_kernel[(k.shape[0],)](k, v, kc, vc, slot_mapping, k.stride(0), v.stride(0), kc.stride(0),
                                 SHAPE=(hkv, d), BLOCKS=(triton.next_power_of_2(hkv), triton.next_power_of_2(d)))


@dataclasses.dataclass(frozen=True)
class Tiling:
    block: int
    warps: int


@triton.jit
def _dataclass_kernel(key, value, kc, vc, slots, n, stride_k, stride_v, stride_c, TILING: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    if s >= 0:
        _copy_row(key + t * stride_k, kc + s * stride_c, n, TILING.block)
        _copy_row(value + t * stride_v, vc + s * stride_c, n, TILING.block)


def dataclass_constexpr(key, value, k_cache, v_cache, slot_mapping):
    k, v, kc, vc = _rows(key, value, k_cache, v_cache)
    n = k.shape[1]
    tiling = Tiling(triton.next_power_of_2(n), 4)
    _dataclass_kernel[(k.shape[0],)](k, v, kc, vc, slot_mapping, n, k.stride(0), v.stride(0), kc.stride(0),
                                     TILING=tiling, num_warps=tiling.warps)


# ------------------------------------------------------------------ heuristics, autotune, do_not_specialize


@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"]), "EVEN": lambda args: args["n"] % 64 == 0})
@triton.jit
def _heuristics_kernel(key, value, kc, vc, slots, n, stride_k, stride_v, stride_c, BLOCK: tl.constexpr,
                       EVEN: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    i = tl.arange(0, BLOCK)
    m = (i < n) & (s >= 0)
    tl.store(kc + s * stride_c + i, tl.load(key + t * stride_k + i, mask=m), mask=m)
    tl.store(vc + s * stride_c + i, tl.load(value + t * stride_v + i, mask=m), mask=m)


def heuristics(key, value, k_cache, v_cache, slot_mapping):
    k, v, kc, vc = _rows(key, value, k_cache, v_cache)
    _heuristics_kernel[(k.shape[0],)](k, v, kc, vc, slot_mapping, k.shape[1], k.stride(0), v.stride(0),
                                      kc.stride(0))


def _prune(configs, named_args, **kwargs):
    return [c for c in configs if c.kwargs["CHUNK"] <= max(16, triton.next_power_of_2(named_args["n"]))]


@triton.autotune(
    configs=[triton.Config({"CHUNK": c}, num_warps=w) for c in (64, 128, 4096) for w in (1, 4)],
    key=["n"],
    prune_configs_by={"early_config_prune": _prune},
)
@triton.jit
def _autotuned_kernel(key, value, kc, vc, slots, n, stride_k, stride_v, stride_c, CHUNK: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    if s >= 0:
        for start in range(0, n, CHUNK):
            i = start + tl.arange(0, CHUNK)
            tl.store(kc + s * stride_c + i, tl.load(key + t * stride_k + i, mask=i < n), mask=i < n)
            tl.store(vc + s * stride_c + i, tl.load(value + t * stride_v + i, mask=i < n), mask=i < n)


def autotune_pruned(key, value, k_cache, v_cache, slot_mapping):
    k, v, kc, vc = _rows(key, value, k_cache, v_cache)
    _autotuned_kernel[(k.shape[0],)](k, v, kc, vc, slot_mapping, k.shape[1], k.stride(0), v.stride(0),
                                     kc.stride(0))


@triton.jit(do_not_specialize=["n", "stride_k"])
def _no_specialize_kernel(key, value, kc, vc, slots, n, stride_k, stride_v, stride_c, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    i = tl.arange(0, BLOCK)
    m = (i < n) & (s >= 0)
    tl.store(kc + s * stride_c + i, tl.load(key + t * stride_k + i, mask=m), mask=m)
    tl.store(vc + s * stride_c + i, tl.load(value + t * stride_v + i, mask=m), mask=m)


def do_not_specialize(key, value, k_cache, v_cache, slot_mapping):
    k, v, kc, vc = _rows(key, value, k_cache, v_cache)
    n = k.shape[1]
    _no_specialize_kernel[(k.shape[0],)](k, v, kc, vc, slot_mapping, n, k.stride(0), v.stride(0), kc.stride(0),
                                         BLOCK=triton.next_power_of_2(n))


# ------------------------------------------------------------------ static_range, tl.range with num_stages


@triton.jit
def _ranges_kernel(key, value, kc, vc, slots, stride_kt, stride_kh, stride_vt, stride_vh, stride_c, stride_ch,
                   HKV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    d = tl.arange(0, BLOCK_D)
    m = (d < D) & (s >= 0)
    for h in tl.static_range(HKV):
        tl.store(kc + s * stride_c + h * stride_ch + d, tl.load(key + t * stride_kt + h * stride_kh + d, mask=m),
                 mask=m)
    for h in tl.range(0, HKV, num_stages=2):
        tl.store(vc + s * stride_c + h * stride_ch + d, tl.load(value + t * stride_vt + h * stride_vh + d, mask=m),
                 mask=m)


def ranges(key, value, k_cache, v_cache, slot_mapping):
    T, hkv, d = key.shape
    kc, vc = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    _ranges_kernel[(T,)](key, value, kc, vc, slot_mapping, key.stride(0), key.stride(1), value.stride(0),
                         value.stride(1), kc.stride(0), kc.stride(1), HKV=hkv, D=d, BLOCK_D=triton.next_power_of_2(d))


# ------------------------------------------------------------------ inline PTX, tensor descriptors, fp8


@triton.jit
def _inline_asm_kernel(key, value, kc, vc, slots, n, stride_k, stride_v, stride_c, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    i = tl.arange(0, BLOCK)
    m = (i < n) & (s >= 0)
    k = tl.load(key + t * stride_k + i, mask=m)
    k = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [k], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(kc + s * stride_c + i, k, mask=m)
    tl.store(vc + s * stride_c + i, tl.load(value + t * stride_v + i, mask=m), mask=m)


def inline_asm(key, value, k_cache, v_cache, slot_mapping):
    """The rows as 32-bit words (a bit-exact copy of any dtype whose row is a whole number of words)."""
    k, v, kc, vc = (x.view(torch.int32) for x in _rows(key, value, k_cache, v_cache))
    n = k.shape[1]
    _inline_asm_kernel[(k.shape[0],)](k, v, kc, vc, slot_mapping, n, k.stride(0), v.stride(0), kc.stride(0),
                                      BLOCK=triton.next_power_of_2(n))


@triton.jit
def _descriptor_kernel(k_desc, v_desc, kc, vc, slots, n, stride_c, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    i = tl.arange(0, BLOCK)
    m = (i < n) & (s >= 0)
    k = tl.reshape(k_desc.load([t, 0]), [BLOCK])
    v = tl.reshape(v_desc.load([t, 0]), [BLOCK])
    tl.store(kc + s * stride_c + i, k, mask=m)
    tl.store(vc + s * stride_c + i, v, mask=m)


def tensor_descriptor(key, value, k_cache, v_cache, slot_mapping):
    from triton.tools.tensor_descriptor import TensorDescriptor

    k, v, kc, vc = _rows(key, value, k_cache, v_cache)
    n = k.shape[1]
    block = triton.next_power_of_2(n)
    k_desc = TensorDescriptor.from_tensor(k, [1, block])
    v_desc = TensorDescriptor.from_tensor(v, [1, block])
    _descriptor_kernel[(k.shape[0],)](k_desc, v_desc, kc, vc, slot_mapping, n, kc.stride(0), BLOCK=block)


@triton.jit
def _fp8_kernel(key, value, kc, vc, slots, n, stride_k, stride_v, stride_c, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    i = tl.arange(0, BLOCK)
    m = (i < n) & (s >= 0)
    tl.store(kc + s * stride_c + i, tl.load(key + t * stride_k + i, mask=m), mask=m)
    tl.store(vc + s * stride_c + i, tl.load(value + t * stride_v + i, mask=m), mask=m)


def fp8_bytes(key, value, k_cache, v_cache, slot_mapping):
    """The rows' bytes as float8_e4m3fn: the kernel moves fp8 elements without arithmetic (bit-exact)."""
    k, v, kc, vc = (x.view(torch.float8_e4m3fn) for x in _rows(key, value, k_cache, v_cache))
    n = k.shape[1]
    _fp8_kernel[(k.shape[0],)](k, v, kc, vc, slot_mapping, n, k.stride(0), v.stride(0), kc.stride(0),
                               BLOCK=triton.next_power_of_2(n))


# ------------------------------------------------------------------ launch_metadata, class method, partial


def _metadata(grid, kernel, args):
    return {"name": f"kv_append T={grid[0]}", "bytes": 2 * args["n"] * grid[0]}


@triton.jit(launch_metadata=_metadata)
def _metadata_kernel(key, value, kc, vc, slots, n, stride_k, stride_v, stride_c, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    i = tl.arange(0, BLOCK)
    m = (i < n) & (s >= 0)
    tl.store(kc + s * stride_c + i, tl.load(key + t * stride_k + i, mask=m), mask=m)
    tl.store(vc + s * stride_c + i, tl.load(value + t * stride_v + i, mask=m), mask=m)


def launch_metadata(key, value, k_cache, v_cache, slot_mapping):
    k, v, kc, vc = _rows(key, value, k_cache, v_cache)
    n = k.shape[1]
    _metadata_kernel[(k.shape[0],)](k, v, kc, vc, slot_mapping, n, k.stride(0), v.stride(0), kc.stride(0),
                                    BLOCK=triton.next_power_of_2(n))


class CacheWriter:
    """A serving stack's cache object: the launch is a method."""

    def __init__(self, k_cache, v_cache):
        self.k_cache, self.v_cache = k_cache, v_cache

    def append(self, key, value, slot_mapping):
        k, v, kc, vc = _rows(key, value, self.k_cache, self.v_cache)
        n = k.shape[1]
        _metadata_kernel[(k.shape[0],)](k, v, kc, vc, slot_mapping, n, k.stride(0), v.stride(0), kc.stride(0),
                                        BLOCK=triton.next_power_of_2(n))


def class_method(key, value, k_cache, v_cache, slot_mapping):
    CacheWriter(k_cache, v_cache).append(key, value, slot_mapping)


def through_partial(key, value, k_cache, v_cache, slot_mapping):
    k, v, kc, vc = _rows(key, value, k_cache, v_cache)
    n = k.shape[1]
    launch = functools.partial(_no_specialize_kernel[(k.shape[0],)], BLOCK=triton.next_power_of_2(n), num_warps=2)
    launch(k, v, kc, vc, slot_mapping, n, k.stride(0), v.stride(0), kc.stride(0))
