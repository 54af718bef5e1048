"""Adjustments to the Triton interpreter for very large CPU buffers (bfloat16: interp_bf16.py).

After every interpreted launch, the interpreter copies each argument's host
storage back onto the argument's storage. For CPU tensors the two are the same
storage, so the copy changes nothing, but it touches every page: a lazily
allocated 4 GiB cache (the 2^31-element kv_append case) becomes 4 GiB resident.
`skip_self_copy()` makes that copy skip storages that are the same memory.
If the interpreter's internals differ (another Triton version), nothing is
patched and `skip_self_copy()` returns False; callers then skip the huge case.
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
