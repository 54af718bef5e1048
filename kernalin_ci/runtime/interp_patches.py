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
"""

from __future__ import annotations

from kernalin_ci.lazy import torch


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
