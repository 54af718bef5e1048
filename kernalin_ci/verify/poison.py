"""Poison: canary NaNs with a recognisable payload, and poisoned allocations.

A canary is a quiet NaN with a payload no arithmetic produces (kernels and
numpy produce the canonical NaN), so "this element still holds the canary"
means "nothing wrote it", and "this element is NaN" means "something computed
a NaN" (often 0 * NaN from an unmasked load of a poisoned slot).
"""
from __future__ import annotations

import contextlib

import torch

# bit patterns, as the signed integer view of each dtype
CANARY_BITS = {
    torch.float32: 0x7FC0BEEF,
    torch.float16: 0x7E5B,
    torch.bfloat16: 0x7FDB,
}
CANARY_INT = 0x5A5A5A5A  # for integer scratch buffers
_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The integer view of a float tensor (for bitwise comparison, NaN payloads included)."""
    return t.view(_INT_VIEW[t.dtype]) if t.dtype in _INT_VIEW else t


def fill_canary(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in CANARY_BITS:
        # write through the integer view: a float fill would canonicalise the NaN
        v = CANARY_BITS[t.dtype]
        iv = _INT_VIEW[t.dtype]
        if iv is torch.int16 and v > 0x7FFF:
            v -= 0x10000
        bits(t).fill_(v)
    elif t.dtype.is_floating_point:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        info = torch.iinfo(t.dtype)
        t.fill_(min(CANARY_INT, info.max))
    return t


def is_canary(t: torch.Tensor) -> torch.Tensor:
    """Boolean mask of elements that still hold the canary."""
    if t.dtype not in CANARY_BITS:
        return torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    v = CANARY_BITS[t.dtype]
    if _INT_VIEW[t.dtype] is torch.int16 and v > 0x7FFF:
        v -= 0x10000
    return bits(t) == v


def canary_tensor(shape, dtype, device) -> torch.Tensor:
    return fill_canary(torch.empty(shape, dtype=dtype, device=device))


_PATCHED = ("empty", "empty_like", "empty_strided")


@contextlib.contextmanager
def poisoned_allocations():
    """Make every torch.empty* inside the block return canary-filled memory.

    Entries usually allocate their outputs (and split-KV scratch) with
    torch.empty / empty_like; poisoning those makes an unwritten element visible.
    On CUDA the caching allocator is also primed with a freed canary block.
    """
    originals = {name: getattr(torch, name) for name in _PATCHED}
    orig_new_empty = torch.Tensor.new_empty

    def wrap(fn):
        def poisoned(*args, **kwargs):
            return fill_canary(fn(*args, **kwargs))

        return poisoned

    for name, fn in originals.items():
        setattr(torch, name, wrap(fn))
    torch.Tensor.new_empty = wrap(orig_new_empty)
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = orig_new_empty


def prime_cuda_allocator(nbytes: int = 64 << 20) -> None:
    """Leave a canary-filled free block in the CUDA caching allocator."""
    if torch.cuda.is_available():
        blk = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
        fill_canary(blk)
        del blk
