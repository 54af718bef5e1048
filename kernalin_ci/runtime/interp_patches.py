"""Adjustments to the Triton interpreter (bfloat16: interp_bf16.py).

After every interpreted launch, the interpreter copies each argument's host
storage back onto the argument's storage. For CPU tensors the two are the same
storage, so the copy changes nothing, but it touches every page: a lazily
allocated 4 GiB cache (the 2^31-element kv_append case) becomes 4 GiB resident.
`skip_self_copy()` makes that copy skip storages that are the same memory.
If the interpreter's internals differ (another Triton version), nothing is
patched and `skip_self_copy()` returns False; callers then skip the huge case.

`int1_comparisons()`: the interpreter types a comparison's result as its operands' type (int32 for
`pid < H`) although the values are booleans; splatting such a scalar to a block (`(pid < H) & mask`)
then makes an int32 block of ones and `tl.load` rejects it ("mask has unsupported dtype"). Compiled,
the comparison is an i1 and the kernel runs; the patch types boolean comparison results as int1.

`autotune_first_config()`: an autotuned kernel left with several configs (after `prune_configs_by`)
benchmarks them, which under the interpreter asks for a GPU driver and raises ("0 active drivers").
Timing an interpreted kernel means nothing, so the patch makes every config time the same: the first
config left after pruning runs, as the structural capture checks the first config.

`unsupported_constructs()`: inline PTX (`tl.inline_asm_elementwise`) and external calls the interpreter
cannot run raise NotImplementedError there; the patch first records why (interp_bf16.note_unfaithful),
so that a case launching one is *not checked (interpreter)*, never the kernel's error.

`aliased_builtins()`: the interpreter gives the language's builtins (`tl.exp2`) its own semantics only
where a kernel reaches them through the `triton.language` module; a builtin the kernel's module holds
under another name (`tl_exp2 = tl.exp2`, as LMDeploy's kernels do) raises "Did you forget to add
@triton.jit ?". Compiled, it is the same builtin; the patch gives such aliases the interpreter's
semantics too. The same wrapper skips the interpreter's repatching of the whole language at every device
function call made inside a launch, whose patch is still in force (40% of an interpreted attention kernel's time).

`libdevice_math()`: the interpreter (3.9) cannot call libdevice (`libdevice.exp2(x)` fails with "cannot
convert None ... to tensor"). The patch gives the libdevice functions that have an exact counterpart
in `tl.math` (exp, exp2, log, cos, sqrt, rsqrt, erf, fma, ... and the fast_* variants) that counterpart,
tanh its definition through exp, and pow its definition through exp2 and log2 in float64 (negative bases
with whole exponents, 0^0 = 1), rounded once to the result dtype; any other libdevice call records why
before it fails (not checked).

`fp8_conversions()`: the interpreter (3.9) converts to and from FP8 with bit arithmetic that is wrong
where it matters for an FP8 KV cache: a mantissa that rounds up past its last bit is or-ed into an odd
exponent instead of carrying (124.9 -> e4m3 gives 64, not 128; every binade's top is halved), ties do
not go to even, values past the largest normal become NaN or arbitrary bytes instead of saturating,
subnormals are not rounded, and reading back e4m3's NaN (0x7F) gives 480 and e5m2's inf gives 65536.
Compiled on an NVIDIA GPU, Triton converts float32 to FP8 with `cvt.rn.satfinite`: round to nearest
even, a finite value past the largest normal saturates to it (sign kept), NaN stays NaN. The patch
converts float32/float16/bfloat16/float64 <-> float8e4nv (torch.float8_e4m3fn) and float8e5
(torch.float8_e5m2) through torch's conversions on values clamped to the format's range, which is
that rule; the other FP8 formats keep the interpreter's own code.

`boolean_operators()`: the interpreter (3.9) runs `a and b` / `a or b` as Python does, and a block's truth
value there is always True (`_get_bool`), so `lo < w and w <= hi` on blocks gives `w <= hi` alone.
Compiled, Triton applies `logical_and` / `logical_or` elementwise to blocks (xformers' rope_padded picks
Llama-3.1's middle wavelength band so). The patch rewrites each boolean operator of an interpreted function
into a call that does the same: on a block, both sides elementwise; on a scalar or constant, Python's
short circuit (as compiled code short-circuits a constant).
"""

from __future__ import annotations

import ast

from kernalin_ci.lazy import torch
from kernalin_ci.runtime.interp_bf16 import note_unfaithful


def skip_self_copy() -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    original = getattr(executor, "_restore_args_dev", None)
    if original is None or getattr(original, "_kernalin", False):
        return original is not None
    original_copy = torch.UntypedStorage.copy_

    def restore(self, *args, **kwargs):
        def copy_unless_same(dst, src, *a, **k):
            if dst.data_ptr() == src.data_ptr() and dst.nbytes() == src.nbytes():
                return dst
            return original_copy(dst, src, *a, **k)

        torch.UntypedStorage.copy_ = copy_unless_same
        try:
            return original(self, *args, **kwargs)
        finally:
            torch.UntypedStorage.copy_ = original_copy

    restore._kernalin = True
    executor._restore_args_dev = restore
    return True


def lazy_zeros(shape, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros whose pages are only allocated when written (calloc via numpy)."""
    import numpy as np

    n = 1
    for s in shape:
        n *= s
    raw = np.zeros(n * dtype.itemsize, dtype=np.uint8)
    return torch.from_numpy(raw).view(dtype).view(shape)


_CMP = (
    "create_icmpSLE",
    "create_icmpSLT",
    "create_icmpSGE",
    "create_icmpSGT",
    "create_icmpULE",
    "create_icmpULT",
    "create_icmpUGE",
    "create_icmpUGT",
    "create_icmpEQ",
    "create_icmpNE",
    "create_fcmpOLT",
    "create_fcmpOGT",
    "create_fcmpOLE",
    "create_fcmpOGE",
    "create_fcmpOEQ",
    "create_fcmpONE",
    "create_fcmpULT",
    "create_fcmpUGT",
    "create_fcmpULE",
    "create_fcmpUGE",
    "create_fcmpUEQ",
    "create_fcmpUNE",
)


def int1_comparisons() -> bool:
    """Type the interpreter's comparison results as int1 (see the module doc); idempotent.

    Returns False when this Triton's interpreter has no such builder methods (nothing patched)."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    if builder is None or handle is None:
        return False
    patched = False
    for name in _CMP:
        original = getattr(builder, name, None)
        if original is None:
            continue
        patched = True
        if getattr(original, "_kernalin", False):
            continue

        def compare(self, *args, _original=original):
            out = _original(self, *args)
            if getattr(out.data, "dtype", None) == np.bool_ and out.dtype != tl.int1:
                return handle(out.data, tl.int1)
            return out

        compare._kernalin = True
        setattr(builder, name, compare)
    return patched


def autotune_first_config() -> bool:
    """Under the interpreter, an autotuner with several configs runs the first one left after pruning
    instead of benchmarking them (see the module doc); idempotent. False when this Triton has no
    `Autotuner._bench` (nothing patched)."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return False
    original = getattr(Autotuner, "_bench", None)
    if original is None:
        return False
    if getattr(original, "_kernalin", False):
        return True

    def same_time(self, *args, config, **kwargs):
        return 0.0  # min() over equal timings keeps the first config

    same_time._kernalin = True
    Autotuner._bench = same_time
    return True


_NOT_IN_INTERPRETER = {
    "create_inline_asm": "the Triton interpreter cannot run inline PTX (tl.inline_asm_elementwise)",
    "create_extern_elementwise": "the Triton interpreter cannot run this external (libdevice) call",
}


def unsupported_constructs() -> bool:
    """Record the constructs the interpreter refuses before it raises (see the module doc); idempotent."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False

    builder = getattr(interpreter, "InterpreterBuilder", None)
    patched = False
    for name, why in _NOT_IN_INTERPRETER.items():
        original = getattr(builder, name, None)
        if original is None:
            continue
        patched = True
        if getattr(original, "_kernalin", False):
            continue

        def refuse(self, *args, _original=original, _why=why):
            note_unfaithful(_why)
            return _original(self, *args)

        refuse._kernalin = True
        setattr(builder, name, refuse)
    return patched


class _Globals:
    """A function's globals dict as an object (getattr/setattr/delattr), for the interpreter's patch scope."""

    def __init__(self, namespace: dict):
        object.__setattr__(self, "_ns", namespace)

    def __getattr__(self, name):
        try:
            return self._ns[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self._ns[name] = value

    def __delattr__(self, name):
        del self._ns[name]


def aliased_builtins() -> bool:
    """Under the interpreter, a language builtin a kernel's module holds under another name
    (`tl_exp2 = tl.exp2`) runs like `tl.exp2` (see the module doc); idempotent. False when the interpreter's
    internals differ (nothing patched)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if original is None or patch_attr is None:
        return False
    if getattr(original, "_kernalin", False):
        return True
    import triton.language as tl

    new_scope = getattr(interpreter, "_LangPatchScope", None)

    def patched_now(module) -> bool:
        return not tl.core.is_builtin(getattr(module, "load", None))

    def patch_lang(fn):
        # The interpreter patches the language again at every call of a device function (an
        # @triton.jit function a kernel calls), walking the whole of `triton.language` each time: 40% of an
        # interpreted attention kernel's time. Inside a launch, the launch's own patch is still in force;
        # the call's patch (never restored) changes nothing, so it is skipped.
        items = list(fn.__globals__.items())
        mods = [v for _, v in items if v is tl or v is tl.core]
        if new_scope is not None and mods and all(patched_now(m) for m in mods):
            scope = new_scope()
        else:
            scope = original(fn)
        namespace = _Globals(fn.__globals__)
        for name, value in items:
            if tl.core.is_builtin(value):
                patch_attr(namespace, name, value, interpreter.interpreter_builder, scope)
        return scope

    patch_lang._kernalin = True
    interpreter._patch_lang = patch_lang
    return True


_LIBDEVICE_SAME = (
    "exp",
    "exp2",
    "log",
    "log2",
    "cos",
    "sin",
    "sqrt",
    "sqrt_rn",
    "rsqrt",
    "floor",
    "ceil",
    "erf",
    "fma",
    "div_rn",
    "abs",
)
_LIBDEVICE_AS = {"fast_expf": "exp", "fast_logf": "log", "fast_dividef": "div_rn", "fabs": "abs"}


def libdevice_math() -> bool:
    """Under the interpreter, libdevice calls that have a tl.math counterpart run it (see the module doc);
    idempotent. False when this Triton has no libdevice module (nothing patched)."""
    import importlib

    import triton.language as tl

    modules = []
    for name in ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    if not modules:
        return False

    def same(target):
        def call(*args, **kwargs):
            return getattr(tl.math, target)(*args)

        call._kernalin = True
        return call

    def tanh(x, **kwargs):
        return 2.0 / (1.0 + tl.math.exp(-2.0 * x)) - 1.0

    tanh._kernalin = True

    def pow(x, y, **kwargs):  # noqa: A001 (libdevice's name): x^y in float64, rounded once to the result dtype
        dtype = next((a.dtype for a in (x, y) if isinstance(a, tl.tensor)), tl.float32)
        xd, yd = tl.cast(x, tl.float64), tl.cast(y, tl.float64)
        r = tl.math.exp2(yd * tl.math.log2(tl.abs(xd)))
        whole = tl.math.floor(yd) == yd
        odd = whole & (tl.math.floor(yd * 0.5) * 2.0 != yd)
        r = tl.where(xd < 0, tl.where(whole, tl.where(odd, -r, r), float("nan")), r)
        return tl.cast(tl.where(yd == 0, 1.0, r), dtype)

    pow._kernalin = True
    for mod in modules:
        for name, member in vars(mod).copy().items():
            if name.startswith("_") or not callable(member) or getattr(member, "_kernalin", False):
                continue
            target = name if name in _LIBDEVICE_SAME else _LIBDEVICE_AS.get(name)
            if target is not None and hasattr(tl.math, target):
                setattr(mod, name, same(target))
            elif name == "tanh":
                setattr(mod, name, tanh)
            elif name == "pow":
                setattr(mod, name, pow)
            elif getattr(member, "__module__", "").startswith("triton.language.extra"):

                def refuse(*args, _original=member, _name=name, **kwargs):
                    note_unfaithful(f"the Triton interpreter cannot run libdevice.{_name}")
                    return _original(*args, **kwargs)

                refuse._kernalin = True
                setattr(mod, name, refuse)
    return True


def _fp8_formats() -> dict:
    """Triton's FP8 element types this patch converts -> (torch dtype, largest finite value)."""
    import triton.language as tl

    return {
        tl.float8e4nv: (torch.float8_e4m3fn, 448.0),
        tl.float8e5: (torch.float8_e5m2, 57344.0),
    }


def _to_torch(data, src_ty):
    """An interpreter tensor's data as a torch tensor of its values (bfloat16 is stored as uint16 bits)."""
    import numpy as np
    import triton.language as tl

    arr = np.ascontiguousarray(data)
    if src_ty == tl.bfloat16:
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())


def fp8_conversions() -> bool:
    """Under the interpreter, conversions to and from float8e4nv / float8e5 round to nearest even and
    saturate as the GPU's `cvt.rn.satfinite` does (see the module doc); idempotent. False when this
    Triton's interpreter has no `create_fp_to_fp` (nothing patched)."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    original = getattr(builder, "create_fp_to_fp", None)
    if original is None or handle is None:
        return False
    if getattr(original, "_kernalin", False):
        return True
    formats = _fp8_formats()
    wide = {
        tl.float16: torch.float16,
        tl.bfloat16: torch.bfloat16,
        tl.float32: torch.float32,
        tl.float64: torch.float64,
    }

    def fp_to_fp(self, src, dst_type, rounding_mode, _original=original):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        rtz = rounding_mode is not None and "RTZ" in str(rounding_mode)  # tl.cast(..., fp_downcast_rounding='rtz')
        if dst_ty in formats and src_ty in wide and not rtz:  # round to nearest even, saturating
            fp8, top = formats[dst_ty]
            x = _to_torch(src.data, src_ty).to(torch.float64)
            x = torch.where(torch.isnan(x), x, x.clamp(-top, top))
            out = x.to(fp8).view(torch.uint8).numpy().reshape(np.shape(src.data))
            return handle(out, dst_ty)
        if src_ty in formats and dst_ty in wide:  # exact: every FP8 value is a float16 value
            fp8 = formats[src_ty][0]
            raw = np.ascontiguousarray(src.data).view(np.uint8)
            y = torch.from_numpy(raw.copy()).view(fp8).to(wide[dst_ty])
            if dst_ty == tl.bfloat16:
                out = y.view(torch.int16).numpy().view(np.uint16)
            else:
                out = y.numpy()
            return handle(out.reshape(np.shape(src.data)), dst_ty)
        return _original(self, src, dst_type, rounding_mode)

    fp_to_fp._kernalin = True
    builder.create_fp_to_fp = fp_to_fp
    return True


_BOOLEAN = "_kernalin_boolean_op"


def _boolean_op(is_and: bool, first, *rest):
    """`first and rest[0]() and ...` (`or`: is_and False) as compiled Triton computes it: a block operand
    combines elementwise with the next (both evaluated); a scalar or constant short-circuits as in Python."""
    import triton.language as tl

    value = first
    for later in rest:
        if isinstance(value, tl.tensor) and value.type.is_block():
            other = later()
            value = value.logical_and(other) if is_and else value.logical_or(other)
        elif bool(value) != is_and:  # `and` stops at a false value, `or` at a true one
            return value
        else:
            value = later()
    return value


def boolean_operators() -> bool:
    """Under the interpreter, `and` / `or` on blocks are elementwise, as compiled (see the module doc);
    idempotent. Takes effect for functions the interpreter rewrites after the call. False when this Triton's
    interpreter has no AST transformer (nothing patched)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    transformer = getattr(interpreter, "ASTTransformer", None)
    if transformer is None:
        return False
    if getattr(getattr(transformer, "visit_BoolOp", None), "_kernalin", False):
        return True

    def visit_BoolOp(self, node):  # noqa: N802 (ast.NodeTransformer's name)
        node = self.generic_visit(node)
        no_args = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        later = [ast.Lambda(args=no_args, body=v) for v in node.values[1:]]  # evaluated only when reached
        call = ast.Call(
            func=ast.Name(id=_BOOLEAN, ctx=ast.Load()),
            args=[ast.Constant(isinstance(node.op, ast.And)), node.values[0], *later],
            keywords=[],
        )
        return ast.copy_location(call, node)

    visit_BoolOp._kernalin = True
    setattr(interpreter, _BOOLEAN, _boolean_op)  # the rewriter copies the interpreter's globals into a kernel's
    transformer.visit_BoolOp = visit_BoolOp
    return True
