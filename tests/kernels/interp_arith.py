"""Half-precision arithmetic of real Triton kernels against torch's, for tests/test_interp_bf16.py.

`python tests/kernels/interp_arith.py patched|unpatched` (with TRITON_INTERPRET=1) runs the kernels
below on bfloat16 and on float16 inputs, with or without kernalin-ci's interpreter patch, and prints
one JSON object: the patch's self-test on the interpreter as it was, the patch's status, and per dtype
whether each op's result equals torch's bit for bit and what `take_unfaithful()` reports after the
arithmetic and after an atomic add.

Inputs are chosen so that every float32 sum in a reference is exact: then any order of summation
(numpy's, torch's, a GPU's) gives the same bits, and only the rounding of each op is compared.
"""
import json
import sys

import torch
import triton
import triton.language as tl

N = 256
M, K, NC = 16, 16, 16


@triton.jit
def _elementwise(x_ptr, y_ptr, z_ptr, f_ptr, c_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    y = tl.load(y_ptr + i)
    z = tl.load(z_ptr + i)
    f = tl.load(f_ptr + i)
    c = tl.load(c_ptr)
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + 0 * N + i, x + y)
    tl.store(out_ptr + 1 * N + i, x - y)
    tl.store(out_ptr + 2 * N + i, x * y)
    tl.store(out_ptr + 3 * N + i, x * y + z)
    tl.store(out_ptr + 4 * N + i, x * c - y * z)
    tl.store(out_ptr + 5 * N + i, tl.fma(x, y, z))
    tl.store(out_ptr + 6 * N + i, f.to(dt))
    tl.store(out_ptr + 7 * N + i, (x.to(tl.float32) * 3.0).to(dt))
    tl.store(out_ptr + 8 * N + i, tl.where(x > y, x, y))
    tl.store(out_ptr + 9 * N + i, tl.maximum(x, y))
    tl.store(out_ptr + 10 * N + i, x / y)
    tl.store(out_ptr + 11 * N + i, -x)
    tl.store(out_ptr + 12 * N + i, x * 0.1)
    tl.store(out_ptr + 13 * N + i, tl.abs(x - z))


ELEMENTWISE = ("add", "sub", "mul", "mul_add", "mul_sub_scalar", "fma", "cast_from_float32", "cast_roundtrip",
               "compare_where", "maximum", "div", "neg", "literal", "abs_sub")


@triton.jit
def _matrix(a_ptr, b_ptr, p_ptr, acc_ptr, pv_ptr, low_ptr, sum_ptr, arg_ptr,
            M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    m = tl.arange(0, M)[:, None]
    k = tl.arange(0, K)
    n = tl.arange(0, N)[None, :]
    a = tl.load(a_ptr + m * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n)
    p = tl.load(p_ptr + m * K + k[None, :])
    acc = tl.dot(a, b)                              # half x half, float32 accumulator
    tl.store(acc_ptr + m * N + n, acc)
    pv = tl.dot(p.to(b.dtype), b)                   # probabilities rounded to the value dtype
    tl.store(pv_ptr + m * N + n, pv)
    tl.store(low_ptr + m * N + n, acc.to(b.dtype))
    tl.store(sum_ptr + tl.arange(0, M), tl.sum(a, axis=1))
    tl.store(arg_ptr + tl.arange(0, M), tl.argmax(a, axis=1))


@triton.jit
def _atomic(out_ptr, x_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.atomic_add(out_ptr + i, tl.load(x_ptr + i))


def _inputs(dt):
    g = torch.Generator().manual_seed(0)

    def mag(n):
        return (torch.rand(n, generator=g) * 3.5 + 0.5) * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)

    # magnitudes in [0.5, 4) with 8 significant bits (bfloat16 values) in both dtypes: x * y + z is
    # exact in float32; a and b are multiples of 1/4, p in [0.5, 1): the dots and sums are exact too
    x, y, z = (mag(N).to(torch.bfloat16).to(dt) for _ in range(3))
    f = torch.randn(N, generator=g)  # float32 with all 24 bits: the cast must round to nearest even
    c = torch.tensor([0.3]).to(dt)
    a = (torch.randint(-16, 17, (M, K), generator=g) / 4.0).to(dt)
    b = (torch.randint(-16, 17, (K, NC), generator=g) / 4.0).to(dt)
    p = torch.rand(M, K, generator=g) * 0.5 + 0.5
    return x, y, z, f, c, a, b, p


def _same(got, want) -> bool:
    return got.dtype == want.dtype and torch.equal(got.view(torch.int16) if got.element_size() == 2 else got,
                                                   want.view(torch.int16) if want.element_size() == 2 else want)


def run(dt) -> dict:
    x, y, z, f, c, a, b, p = _inputs(dt)
    out = torch.empty(len(ELEMENTWISE) * N, dtype=dt)
    _elementwise[(1,)](x, y, z, f, c, out, N=N)
    want = {"add": x + y, "sub": x - y, "mul": x * y, "mul_add": x * y + z, "mul_sub_scalar": x * c - y * z,
            "fma": (x.float() * y.float() + z.float()).to(dt), "cast_from_float32": f.to(dt),
            "cast_roundtrip": (x.float() * 3.0).to(dt), "compare_where": torch.where(x > y, x, y),
            "maximum": torch.maximum(x, y), "div": x / y, "neg": -x, "literal": x * torch.tensor(0.1).to(dt),
            "abs_sub": (x - z).abs()}
    res = {}
    for j, name in enumerate(ELEMENTWISE):
        got = out[j * N:(j + 1) * N]
        res[name] = _same(got, want[name])

    acc = torch.empty(M, NC)
    pv = torch.empty(M, NC)
    low = torch.empty(M, NC, dtype=dt)
    sums = torch.empty(M, dtype=dt)
    arg = torch.empty(M, dtype=torch.int32)
    _matrix[(1,)](a, b, p, acc, pv, low, sums, arg, M=M, K=K, N=NC)
    exact = a.float() @ b.float()
    res["dot"] = _same(acc, exact)
    res["dot_p_to_value_dtype"] = _same(pv, p.to(dt).float() @ b.float())
    res["dot_result_cast"] = _same(low, exact.to(dt))
    res["sum"] = _same(sums, a.float().sum(1).to(dt))
    res["argmax"] = torch.equal(arg.long(), a.float().argmax(1))

    return res


def atomic(dt) -> str:
    """What an atomic add does here: 'ran', or the error the interpreter raised."""
    try:
        _atomic[(1,)](torch.zeros(N, dtype=dt), torch.ones(N, dtype=dt), N=N)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "ran"


def main(mode: str) -> None:
    import triton.language
    from triton.runtime import interpreter

    from kernalin_ci.runtime.interp_bf16 import _bf16_self_test, faithful_bf16, take_unfaithful

    out = {"self_test": _bf16_self_test(interpreter, triton.language)}
    out["status"] = faithful_bf16() if mode == "patched" else "not patched"
    for name in ("bfloat16", "float16"):
        take_unfaithful()
        res = run(getattr(torch, name))
        clean = take_unfaithful()
        ran = atomic(getattr(torch, name))
        out[name] = {"results": res, "unfaithful_after_arithmetic": clean, "atomic": ran,
                     "unfaithful_after_atomic": take_unfaithful()}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
