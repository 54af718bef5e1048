"""rope entry for FlashInfer's BatchQKApplyRotaryPosIds (flashinfer-python 0.7.2.post1), in place, float16: neox
pairs, or gptj with `interleave` (style gptj); rotary_dim below D leaves the rest as it is."""

import ctypes

from _flashinfer import call, half_only, library, ptr

import kernalin_ci

library("flashinfer_rope.cu")  # built when the entry loads (the build worker's load: once per source hash)


def entry(q, k, positions):
    half_only(q, k)
    p = kernalin_ci.current_params()
    T, Hq, D = q.shape
    fn = library("flashinfer_rope.cu").fi_rope
    u, ull = ctypes.c_uint, ctypes.c_ulonglong
    call(fn, ptr(q), ptr(k), ptr(positions), u(T), u(Hq), u(k.shape[1]), u(p["rotary_dim"] or D), u(D),
         ull(q.stride(0)), ull(q.stride(1)), ull(k.stride(0)), ull(k.stride(1)), ctypes.c_int(p["style"] == "gptj"),
         ctypes.c_float(p["base"]))  # fmt: skip
    return q, k
