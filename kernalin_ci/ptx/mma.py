"""`mma.sync.aligned` (the tensor-core product Triton emits for `tl.dot` on sm_80+): D = A x B + C per warp.

The warp holds each matrix in fragments, each lane a few registers (PTX ISA, "Matrix Fragments for mma.m16n8k16"
and ".m16n8k8"; lane L is in group g = L >> 2, thread t = L & 3 of its group):
- A (16 x K, row-major, f16/bf16, two per 32-bit register): element [r, k] is in lane (r mod 8) * 4 + (k mod 8) / 2,
  register (r >= 8) + 2 * (k >= 8), half k mod 2;
- B (K x 8, column-major, two per register): element [k, n] is in lane n * 4 + (k mod 8) / 2, register (k >= 8),
  half k mod 2;
- C and D (16 x 8, f32, one per register): lane L's register i is [g + 8 * (i >= 2), 2 t + i mod 2].
Each lane's D element is then its C element plus the products of its A row and B column, as fused
multiply-adds in k order: the exact dataflow (the softmax reads q . k products from it); the rounding of the
hardware's accumulation order is not modelled (float values are structural here). A bf16 element widens
exactly: its bits are the high half of an f32's.
"""

from __future__ import annotations

from kernalin_ci.ptx import terms as T
from kernalin_ci.ptx.semantics import Unsupported

SHAPES = {"m16n8k16": 16, "m16n8k8": 8}


def shape_of(mods: tuple[str, ...]) -> tuple[int, str]:
    """K and the input type of a supported mma (row.col, f32 = f16|bf16 x f16|bf16 + f32); Unsupported
    otherwise (tf32 among them: docs/structural.md says why)."""
    shape = next((m for m in mods if m in SHAPES), None)
    types = [m for m in mods if m in ("f32", "f16", "bf16", "tf32", "f64", "s8", "u8", "s32", "e4m3", "e5m2")]
    if (
        shape is None
        or "row" not in mods
        or "col" not in mods
        or len(types) != 4
        or types[0] != "f32"
        or types[3] != "f32"
        or types[1] not in ("f16", "bf16")
        or types[2] != types[1]
    ):
        raise Unsupported(f"mma.{'.'.join(mods)}")
    return SHAPES[shape], types[1]


def _half(reg: T.Term, i: int, ty: str) -> T.Term:
    """The f16/bf16 element i of a 32-bit register, widened to f32: a bf16 is the high half of an f32's bits."""
    bits = reg if reg.sort == "bv" else T.bits(reg)
    h = T.extract(bits, 16 * i, 16)
    if ty == "bf16":
        return T.fbits(T.concat([T.const(0, 16), h]), 32)
    return T.mk("fcvt", (T.fbits(h, 16), "f32"), "f", 32)


def _float(reg: T.Term) -> T.Term:
    return reg if reg.sort == "f" else T.fbits(reg, 32)


def warp_product(
    shape: tuple[int, str], a: list[list[T.Term]], b: list[list[T.Term]], c: list[list[T.Term]]
) -> list[list[T.Term]]:
    """D of one warp: a[reg][lane], b[reg][lane], c[reg][lane] (32 lanes) -> d[reg][lane] as 32-bit values."""
    k, ty = shape
    if len(a) != k // 4 or len(b) != k // 8 or len(c) != 4:  # 16 k and 8 k elements, two per register, 32 lanes
        raise Unsupported(f"mma.m16n8k{k}.{ty} with {len(a)}, {len(b)}, {len(c)} registers")

    def a_at(r: int, kk: int) -> T.Term:
        return _half(a[(r >= 8) + 2 * (kk >= 8)][(r % 8) * 4 + (kk % 8) // 2], kk % 2, ty)

    def b_at(kk: int, n: int) -> T.Term:
        return _half(b[kk >= 8][n * 4 + (kk % 8) // 2], kk % 2, ty)

    d: list[list[T.Term]] = [[], [], [], []]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            r, n = g + 8 * (i >= 2), 2 * t + i % 2
            acc = _float(c[i][lane])
            for kk in range(k):
                acc = T.fop("ffma", a_at(r, kk), b_at(kk, n), acc)
            d[i].append(T.bits(acc))
    return d


def block_product(shape: tuple[int, str], a: list, b: list, c: list) -> list[list[T.Term]]:
    """D of every warp of a block: a[reg][thread], b[reg][thread], c[reg][thread] -> d[reg][thread]."""
    n = len(c[0])
    if n % 32:
        raise Unsupported(f"mma in a block of {n} threads")
    d: list[list[T.Term]] = [[] for _ in c]
    for w in range(0, n, 32):
        part = warp_product(shape, *[[x[w : w + 32] for x in m] for m in (a, b, c)])
        for i, lanes in enumerate(part):
            d[i] += lanes
    return d
