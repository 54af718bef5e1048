"""bfloat16 computed on values under the Triton interpreter (a worker-side patch, like interp_patches.py's).

The interpreter stores bfloat16 as its raw 16-bit pattern (numpy uint16) and, apart from the
float32 <-> bfloat16 casts, runs numpy on those integers: `x + y` adds bit patterns, `tl.dot`
multiplies them, comparisons order them as unsigned integers, and float32 -> bfloat16 truncates.

`faithful_bf16()` wraps the builder methods that compute on values (and the reductions and scans,
which the interpreter runs outside the builder): bfloat16 operands are widened to float32 (float64
for an fma), the original method runs, and a result of the operands' type is rounded back to
bfloat16 to nearest even, as the hardware does. float32 has 24 bits, more than 2 * 8 + 2, so
rounding a float32 sum, difference, product, quotient or square root once more to bfloat16 gives
the correctly rounded bfloat16 result. Data movement (loads, stores, where, splat, reshape) keeps
the bit patterns, NaN payloads (the poison canary) included; a computed NaN is the canonical 0x7FFF.

A Triton without these hooks is not patched; either way a self-test through the builder decides
whether bfloat16 is faithful: if not, `faithful_bf16()` says why and bfloat16 cases are not checked.
A construct the interpreter cannot run on bfloat16 (its atomics fail with "Unsupported data type")
is recorded: `take_unfaithful()` names it, and that case is not checked instead of an entry-error.
float16 needs nothing: numpy's float16 is IEEE half with round-to-nearest-even.
"""

from __future__ import annotations

import numpy as np

_BF16_HOOKS = {
    "InterpreterBuilder": (
        "binary_op",
        "unary_op",
        "create_fma",
        "create_erf",
        "create_rsqrt",
        "create_clampf",
        "create_dot",
        "cast_impl",
        "create_fp_to_fp",
        "get_bf16",
        "create_atomic_rmw",
        "create_atomic_cas",
    ),
    "ReduceOps": ("sum", "min_max"),
    "ScanOps": ("cumsum", "cumprod"),
}
_BF16_NAN = np.uint16(0x7FFF)
_U16 = np.dtype(np.uint16)
_bf16_state: dict = {}
_unfaithful: list[str] = []


def faithful_bf16() -> str | None:
    """Make the Triton interpreter compute bfloat16 on values; idempotent.

    Returns None when bfloat16 is faithful afterwards (a self-test through the interpreter's
    builder says so), else why not: then bfloat16 cases cannot be checked on the CPU.
    """
    if "reason" not in _bf16_state:
        _bf16_state["reason"] = _install_bf16()
    return _bf16_state["reason"]


def note_unfaithful(why: str) -> None:
    """Record a construct the interpreter cannot run (the case that launched it is not checked)."""
    _unfaithful.append(why)


def take_unfaithful() -> str | None:
    """The first bfloat16 construct the interpreter cannot run faithfully since the last call (or None); clears."""
    why = _unfaithful[0] if _unfaithful else None
    _unfaithful.clear()
    return why


def _install_bf16() -> str | None:
    try:
        import triton
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError as e:
        return f"the Triton interpreter cannot be imported ({e})"
    missing = []
    if _stores_bf16_as_bits(interpreter, tl):
        missing = [
            f"{cls}.{name}"
            for cls, names in _BF16_HOOKS.items()
            for name in names
            if not hasattr(getattr(interpreter, cls, None), name)
        ]
        missing += [name for name in ("TensorHandle", "interpreter_builder", "_ir") if not hasattr(interpreter, name)]
        if not missing:
            _patch_bf16(interpreter, tl)
    # a Triton that stores bfloat16 some other way is left alone: the self-test says whether it is faithful
    try:
        wrong = _bf16_self_test(interpreter, tl)
    except Exception as e:  # an interpreter whose builder API differs
        wrong = f"{type(e).__name__}: {e}"
    if not wrong:
        return None
    why = f"no {missing[0]} to patch" if missing else wrong
    version = getattr(triton, "__version__", "?")
    return f"bfloat16 is not computed faithfully by this Triton {version} interpreter ({why})"


def _stores_bf16_as_bits(interpreter, tl) -> bool:
    try:
        return interpreter._get_np_dtype(tl.bfloat16) == _U16
    except Exception:
        return False


def _bf16_bits_to_f32(u: np.ndarray) -> np.ndarray:
    return (np.asarray(u).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _to_bf16_bits(x, toward_zero: bool = False) -> np.ndarray:
    """Values (any float or integer dtype) -> bfloat16 bit patterns, rounded to nearest even (or toward zero)."""
    x = np.asarray(x)
    with np.errstate(over="ignore", invalid="ignore"):
        if x.dtype != np.float32:
            x = _f64_to_f32_sticky(x.astype(np.float64), toward_zero)
        b = x.view(np.uint32)
        if not toward_zero:
            b = b + (np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)))
        return np.where(np.isnan(x), _BF16_NAN, (b >> np.uint32(16)).astype(np.uint16))


def _f64_to_f32_sticky(x: np.ndarray, toward_zero: bool) -> np.ndarray:
    """float64 -> float32 rounded toward zero, or to odd (so that rounding once more to bfloat16 is exact)."""
    f = x.astype(np.float32)
    back = f.astype(np.float64)
    bits = f.view(np.uint32) - (np.abs(back) > np.abs(x)).astype(np.uint32)  # one step back toward zero
    if not toward_zero:
        bits = bits | (back != x).astype(np.uint32)
    return bits.view(np.float32)


def _patch_bf16(interpreter, tl) -> None:
    Handle, Builder = interpreter.TensorHandle, interpreter.InterpreterBuilder
    bf16 = tl.bfloat16

    def is_bf16(h) -> bool:
        return isinstance(h, Handle) and h.data.dtype is _U16 and h.dtype == bf16

    def widen(h, wide=np.float32):
        if not is_bf16(h):
            return h
        return Handle(
            _bf16_bits_to_f32(h.data).astype(wide, copy=False), tl.float32 if wide is np.float32 else tl.float64
        )

    def narrow(h):
        if isinstance(h, Handle) and h.data.dtype in (np.float32, np.float64):
            return Handle(_to_bf16_bits(h.data), bf16)
        return h

    def on_values(method, probe=0, result=0, wide=np.float32):
        """Run `method` on widened values when args[probe] is bfloat16; round back if args[result] was."""

        def patched(self, *args):
            if args[probe].data.dtype is not _U16 or not is_bf16(args[probe]):  # the first test is the cheap one
                return method(self, *args)
            ret = method(self, *[widen(a, wide) for a in args])
            return narrow(ret) if is_bf16(args[result]) else ret

        return patched

    def cast_impl(self, src, dst_type, _original=Builder.cast_impl):
        to_bf16 = dst_type.scalar == bf16
        if not (to_bf16 or is_bf16(src)):
            return _original(self, src, dst_type)
        values = _bf16_bits_to_f32(src.data) if is_bf16(src) else src.data
        if to_bf16:
            return Handle(_to_bf16_bits(values), bf16)
        return _original(self, Handle(values, tl.float32), dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode, _original=Builder.create_fp_to_fp):
        if dst_type.scalar == bf16 and src.data.dtype in (np.float32, np.float64):
            rtz = rounding_mode == interpreter._ir.ROUNDING_MODE.RTZ
            return Handle(_to_bf16_bits(src.data, toward_zero=rtz), bf16)
        return _original(self, src, dst_type, rounding_mode)

    def get_bf16(self, value):
        return Handle(_to_bf16_bits(np.array([value], dtype=np.float64)), bf16)

    def unsupported_atomic(name, method):
        def patched(self, *args):
            if any(is_bf16(a) for a in args):
                _unfaithful.append(f"the Triton interpreter has no bfloat16 {name}")
            return method(self, *args)

        return patched

    def tensor_of(handle, like, scalar):
        ty = like.type.with_element_ty(scalar) if like.type.is_block() else scalar
        return tl.tensor(handle, ty)

    def narrow_tensors(ret):
        if isinstance(ret, (list, tuple)):
            return type(ret)(narrow_tensors(r) for r in ret)
        if isinstance(ret, tl.tensor) and ret.dtype == tl.float32:
            return tensor_of(narrow(ret.handle), ret, bf16)
        return ret

    def reduction_on_values(method):
        def patched(self, input, *args, **kwargs):
            if not (isinstance(input, tl.tensor) and is_bf16(input.handle)):
                return method(self, input, *args, **kwargs)
            return narrow_tensors(method(self, tensor_of(widen(input.handle), input, tl.float32), *args, **kwargs))

        return patched

    wrapped = {
        "binary_op": on_values(Builder.binary_op),
        "unary_op": on_values(Builder.unary_op),
        "create_erf": on_values(Builder.create_erf),
        "create_rsqrt": on_values(Builder.create_rsqrt),
        "create_clampf": on_values(Builder.create_clampf),
        "create_fma": on_values(Builder.create_fma, result=2, wide=np.float64),
        "create_dot": on_values(Builder.create_dot, result=2),  # bf16 x bf16, result of the accumulator's type
        "cast_impl": cast_impl,
        "create_fp_to_fp": create_fp_to_fp,
        "get_bf16": get_bf16,
        "create_atomic_rmw": unsupported_atomic("atomic read-modify-write", Builder.create_atomic_rmw),
        "create_atomic_cas": unsupported_atomic("atomic compare-and-swap", Builder.create_atomic_cas),
    }
    for name, fn in wrapped.items():
        setattr(Builder, name, fn)
    for cls, names in (("ReduceOps", ("sum", "min_max")), ("ScanOps", ("cumsum", "cumprod"))):
        klass = getattr(interpreter, cls)
        for name in names:
            setattr(klass, name, reduction_on_values(getattr(klass, name)))


def _bf16_self_test(interpreter, tl) -> str | None:
    """A few bfloat16 ops through the interpreter's builder; the first wrong one, or None."""
    b = interpreter.interpreter_builder
    c = b.get_bf16

    def value(h) -> float:
        return float(np.asarray(b.create_fp_ext(h, tl.float32).data).reshape(-1)[0])

    def block(h, shape, dtype):
        return b.create_splat(tl.block_type(dtype, shape), h)

    step = 3 * 2.0**-9  # 3/4 of a bfloat16 ulp at 1: nearest-even rounds up, truncation down
    dot = b.create_dot(
        block(c(1.5), [2, 2], tl.bfloat16),
        block(c(-2.0), [2, 2], tl.bfloat16),
        block(b.get_fp32(0.0), [2, 2], tl.float32),
        None,
        0,
    )
    total = interpreter.ReduceOps(0, None, False).sum(
        tl.tensor(block(c(-1.5), [4], tl.bfloat16), tl.block_type(tl.bfloat16, [4]))
    )
    checks = {
        "constant": (value(c(1 + step)), 1 + 2.0**-7),
        "cast": (value(b.create_fp_trunc(b.get_fp32(1 + step), tl.bfloat16)), 1 + 2.0**-7),
        "add": (value(b.create_fadd(c(1.0), c(step))), 1 + 2.0**-7),
        "mul": (value(b.create_fmul(c(-1.5), c(1.5))), -2.25),
        "compare": (bool(np.asarray(b.create_fcmpOLT(c(-2.0), c(1.0)).data).reshape(-1)[0]), True),
        "dot": (float(np.asarray(dot.data).reshape(-1)[0]), -6.0),
        "sum": (value(total.handle), -6.0),
    }
    for name, (got, want) in checks.items():
        if got != want:
            return f"{name}: {got} instead of {want}"
    return None
