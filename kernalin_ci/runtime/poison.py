"""Poison: canary NaNs with a recognisable payload, and poisoned allocations.

A canary is a quiet NaN with a payload no arithmetic produces (kernels and
numpy produce the canonical NaN), so "this element still holds the canary"
means "nothing wrote it", and "this element is NaN" means "something computed
a NaN" (often 0 * NaN from an unmasked load of a poisoned slot).
"""

from __future__ import annotations

import contextlib
import functools

from kernalin_ci.lazy import torch

CANARY_INT = 0x5A5A5A5A  # for integer scratch buffers


@functools.cache
def _canaries() -> dict:
    """float dtype -> (canary as a signed integer of the same width, that integer dtype)."""

    def signed(v, bits):
        return v - (1 << bits) if v >= 1 << (bits - 1) else v

    return {
        torch.float32: (signed(0x7FC0BEEF, 32), torch.int32),
        torch.float16: (signed(0x7E5B, 16), torch.int16),
        torch.bfloat16: (signed(0x7FDB, 16), torch.int16),
        # FP8 caches (docs/ops.md, "FP8 KV caches"): e4m3 has one NaN pattern, e5m2 a NaN with payload 01; a
        # saturating conversion never produces either from a finite value
        torch.float8_e4m3fn: (0x7F, torch.int8),
        torch.float8_e5m2: (0x7D, torch.int8),
    }


def bits(t: torch.Tensor) -> torch.Tensor:
    """The integer view of a float tensor (for bitwise comparison, NaN payloads included)."""
    c = _canaries().get(t.dtype)
    return t.view(c[1]) if c else t


def words(t: torch.Tensor) -> torch.Tensor:
    """t's rows (first dimension) as 64-bit words where their bytes allow (else as `bits`): a row is all
    zero bits iff its words are; ten times faster to scan than 16-bit elements (the 2^31-element caches)."""
    rows = t.reshape(t.shape[0] if t.dim() else 1, -1)
    if (
        rows.shape[1] * rows.element_size() % 8 == 0
        and rows.is_contiguous()
        and rows.storage_offset() * rows.element_size() % 8 == 0
    ):
        return rows.view(torch.int64)
    return bits(rows)


def fill_canary(t: torch.Tensor) -> torch.Tensor:
    c = _canaries().get(t.dtype)
    if c:
        bits(t).fill_(c[0])  # through the integer view: a float fill would canonicalise the NaN
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
    c = _canaries().get(t.dtype)
    if not c:
        return torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    return bits(t) == c[0]


_PATCHED = ("empty", "empty_like", "empty_strided")


@contextlib.contextmanager
def poisoned_allocations():
    """Make every torch.empty* inside the block return canary-filled memory.

    Entries usually allocate their outputs (and split-KV scratch) with
    torch.empty / empty_like; poisoning those makes an unwritten element visible.
    On CUDA the caching allocator is also primed with a freed canary block.
    """
    import torch as real  # patch the module itself, not kernalin_ci.lazy's stand-in

    originals = {name: getattr(real, name) for name in _PATCHED}
    orig_new_empty = real.Tensor.new_empty

    def wrap(fn):
        def poisoned(*args, **kwargs):
            return fill_canary(fn(*args, **kwargs))

        return poisoned

    for name, fn in originals.items():
        setattr(real, name, wrap(fn))
    real.Tensor.new_empty = wrap(orig_new_empty)
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(real, name, fn)
        real.Tensor.new_empty = orig_new_empty


def prime_cuda_allocator(nbytes: int = 64 << 20) -> None:
    """Leave a canary-filled free block in the CUDA caching allocator."""
    if torch.cuda.is_available():
        blk = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
        fill_canary(blk)
        del blk
