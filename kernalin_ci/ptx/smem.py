"""A lane's local memory (a map from concrete byte addresses to terms) and the warp's tile moves through
shared memory (shared.py's SharedMemory).

`read_map`/`write_map` read and write one value at a concrete address (a read spanning several narrower
writes is their concatenation; an address that is not a constant is not followed). `matrix_load` and
`matrix_store` are `ldmatrix`/`stmatrix` .m8n8.x{1,2,4}(.trans).b16: a warp moves 8x8 tiles of 16-bit
elements between shared memory and registers. Lane 8 i + r of the warp gives the address of row r of tile
i; lane t holds, in its register i, row t // 4, elements 2 (t % 4) and 2 (t % 4) + 1 of tile i (with .trans:
column t // 4, rows 2 (t % 4) and 2 (t % 4) + 1). Every element has a concrete address, so the move is
exact: what a layout conversion stores is what it loads back.
"""

from __future__ import annotations

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.semantics import Unsupported
from kernalin_ci.ptx.shared import SharedMemory


def read_map(mem: dict, a: T.Term, w: int) -> T.Term:
    if not T.is_const(a):
        raise Unsupported("a shared or local memory address that is not known")
    addr = T.value(a)
    hit = mem.get(addr)
    if hit is not None and hit.width == w:
        return hit
    if hit is not None and hit.width > w:
        return T.extract(hit, 0, w)
    parts, pos = [], 0
    while pos < w:
        x = mem.get(addr + pos // 8)
        if x is None:
            return T.fresh("uninitialised shared memory", w)
        parts.append(x)
        pos += x.width
    if pos != w:
        return T.fresh("shared memory", w)
    return T.concat(parts)


def write_map(mem: dict, a: T.Term, x: T.Term, g: T.Term, w: int) -> None:
    if not T.is_const(a):
        raise Unsupported("a shared or local memory address that is not known")
    addr = T.value(a)
    if g is not T.TRUE:
        old = mem.get(addr)
        x = T.ite(g, x, old if old is not None and old.width == w else T.fresh("shared memory", w))
    mem[addr] = x


def read_half(mem: SharedMemory, a: T.Term) -> T.Term:
    """The 16-bit element at a, a half of the 32-bit word holding it (at a symbolic address, the word at
    a & ~3 and the half a & 2 selects: elements are 2-byte aligned)."""
    if not T.is_const(a):
        word = mem.read(T.bv("and", a, T.const(T.mask(a.width) & ~3, a.width)), 32)
        high = T.cmp("eq", T.bv("and", a, T.const(2, a.width)), T.const(2, a.width))
        return T.ite(high, T.extract(word, 16, 16), T.extract(word, 0, 16))
    addr = T.value(a)
    return T.extract(mem.read(T.const(addr & ~3, a.width), 32), 8 * (addr & 3), 16)


def _element(addrs: list[T.Term], lane: int, i: int, half: int, trans: bool) -> T.Term:
    """The shared address of 16-bit half `half` of lane's register i (addrs: every lane's row address)."""
    base, t = lane - lane % 32, lane % 32
    row, col = (2 * (t % 4) + half, t // 4) if trans else (t // 4, 2 * (t % 4) + half)
    a = addrs[base + 8 * i + row]
    return T.bv("add", a, T.const(2 * col, a.width))


def matrix_load(mem: SharedMemory, addrs: list[T.Term], tiles: int, trans: bool) -> list[list[T.Term]]:
    """ldmatrix: per register i, per lane, its 32 bits."""
    out = []
    for i in range(tiles):
        vals = []
        for lane in range(len(addrs)):
            if trans:
                vals.append(T.concat([read_half(mem, _element(addrs, lane, i, h, True)) for h in (0, 1)]))
            else:
                vals.append(mem.read(_element(addrs, lane, i, 0, False), 32))
        out.append(vals)
    return out


def matrix_store(
    addrs: list[T.Term], values: list[list[T.Term]], guards: list[T.Term], trans: bool
) -> list[tuple[T.Term, T.Term, T.Term]]:
    """stmatrix: per register i, per lane, its 32 bits (values) into the tiles, where the lane executes; the
    instruction's stores as one batch for SharedMemory.store, (address, bits, guard) each (.trans: each 16-bit
    half at its own address)."""
    batch = []
    for i, regs in enumerate(values):
        for lane, x in enumerate(regs):
            if trans:
                for h in (0, 1):
                    batch.append((_element(addrs, lane, i, h, True), T.extract(x, 16 * h, 16), guards[lane]))
            else:
                batch.append((_element(addrs, lane, i, 0, False), x, guards[lane]))
    return batch
