"""Paged KV-cache layouts shared by attention.decode_paged and kv_append.

A serving stack holds its cache in one order and an entry must receive it as a
view, never a copy, so the op param `layout` names the order of the cache
tensors the entry gets:

  nhd  [num_blocks, block_size, Hkv, D]   (default)
  hnd  [num_blocks, Hkv, block_size, D]

A token-level pool ([num_tokens, Hkv, D] addressed through a request-to-token
table) is the nhd layout with block_size 1: the block table is the table.

Inside kernalin-ci every analysis works on the nhd order: `nhd(cache, layout)`
is a permuted view of the entry's tensor (same storage), so reading and
writing through it reads and writes the entry's cache.
"""

from __future__ import annotations

from typing import Any

from kernalin_ci.ops.base import Param, Params

LAYOUTS = ("nhd", "hnd")
LAYOUT = Param(
    "layout",
    "nhd",
    str,
    "cache order: nhd [num_blocks, block_size, Hkv, D] or hnd [num_blocks, Hkv, block_size, D]",
    choices=LAYOUTS,
)


def layout_of(params: Params) -> str:
    return str(params.get("layout") or "nhd")


def nhd(cache: Any, layout: str) -> Any:
    """The [num_blocks, block_size, Hkv, D] view of a cache held in `layout` (no copy)."""
    return cache if layout == "nhd" else cache.permute(0, 2, 1, 3)


def from_nhd(cache: Any, layout: str) -> Any:
    """A contiguous tensor in `layout` holding the same cache as the nhd tensor `cache`."""
    return cache if layout == "nhd" else cache.permute(0, 2, 1, 3).contiguous()


def shape(num_blocks: int, block_size: int, hkv: int, d: int, layout: str) -> tuple[int, int, int, int]:
    return (num_blocks, block_size, hkv, d) if layout == "nhd" else (num_blocks, hkv, block_size, d)
