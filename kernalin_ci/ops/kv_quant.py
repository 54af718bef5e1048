"""FP8 KV caches (docs/ops.md, "FP8 KV caches"): kv_append quantises on write, the attention ops dequantise
on read. Two op params, off by default (every existing kernel and case is then unchanged): `kv_dtype`, the
cache's format, and `kv_scale`, one scale per cache (`per-tensor`) or one per KV head (`per-head`). The
entry then also gets `k_scale` and `v_scale` (float32, [1] or [Hkv]).

    stored[t, h, d] = satfinite_rn(key[t, h, d] / k_scale[h])     (kv_append; likewise value, v_scale)
    K[b, h, j, d]   = float(k_cache[..., h, d]) * k_scale[h]       (attention; likewise V, v_scale)

satfinite_rn: round to nearest even in the format; a value past the largest normal (448 in e4m3, 57344 in
e5m2) becomes that normal, its sign kept, as `cvt.rn.satfinite` on NVIDIA GPUs, vLLM's
`__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, ...)` and Triton's float32 -> FP8 cast do; never inf.

Here are the params, the scales the checks pass, the float64 definition of both directions, the cases at
the format's edges and the fingerprints of the known bugs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernalin_ci.lazy import torch
from kernalin_ci.ops.base import Param, Params
from kernalin_ci.runtime.poison import bits, fill_canary

FORMATS = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}  # kv_dtype -> torch dtype name
MANTISSA = {"fp8_e4m3": 3, "fp8_e5m2": 2}
SCALES = ("per-tensor", "per-head", "per-token-head")
# per-token-head (kv_append only): the kernel computes each (token, KV head) row's scale, its largest |value| over
# the format's largest normal in float32, at least TOKEN_HEAD_FLOOR (vLLM's _reshape_cache_per_token_head), and
# stores it in the scale caches k_scale, v_scale [num_blocks, block_size, Hkv]; a GPU's float32 division may be
# 2 ulp off (Triton's default div.full.f32), so the stored scale is held to SCALE_EPS (relative)
TOKEN_HEAD_FLOOR = 1e-6
SCALE_EPS = 2.0**-21
# A correct kernel divides in float32 (or multiplies by a float32 reciprocal: two roundings), so its
# quotient is within 2^-22 (relative) of the exact one; where the exact quotient is that close to a rounding
# boundary of the format, either neighbour is the correctly rounded value of what the kernel computed.
QUOTIENT_EPS = 2.0**-22


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    return check


KV_PARAMS = (
    Param(
        "kv_dtype",
        None,
        str,
        "FP8 cache: fp8_e4m3 or fp8_e5m2 (inputs k_scale, v_scale)",
        check=_one_of(tuple(FORMATS)),
    ),
    Param(
        "kv_scale",
        None,
        str,
        "FP8 cache scales: per-tensor [1] or per-head [Hkv] (default per-tensor); kv_append also per-token-head "
        "(scale caches [num_blocks, block_size, Hkv] the kernel writes)",
        check=_one_of(SCALES),
    ),
)


def check_params(params: Params, token_head: bool = False) -> str | None:
    """`token_head`: the op takes per-token-head scales (kv_append: it computes and writes them)."""
    if params.get("kv_scale") and not params.get("kv_dtype"):
        return "param kv_scale needs kv_dtype (an FP8 cache format)"
    if params.get("kv_scale") == "per-token-head" and not token_head:
        return (
            "param kv_scale=per-token-head: only kv_append takes it (it computes the scales); "
            "the attention ops and decode loops read given per-tensor or per-head scales"
        )
    return None


@dataclass(frozen=True)
class KvQuant:
    """The FP8 cache format of one op's params."""

    kv_dtype: str
    per_head: bool
    per_token_head: bool = False

    @property
    def dtype(self) -> Any:
        return getattr(torch, FORMATS[self.kv_dtype])

    @property
    def max(self) -> float:
        return float(torch.finfo(self.dtype).max)

    @property
    def label(self) -> str:
        kind = "per-token-head" if self.per_token_head else "per-head" if self.per_head else "per-tensor"
        return f"{self.kv_dtype} cache, {kind} scales"


def spec_of(params: Params) -> KvQuant | None:
    kv = params.get("kv_dtype")
    scale = params.get("kv_scale")
    return KvQuant(kv, scale == "per-head", scale == "per-token-head") if kv else None


def unanalysed(params: Params) -> list[str]:
    """The structural analysis does not model quantised caches (it reads a cache element as the value)."""
    q = spec_of(params)
    return [f"FP8 caches (param kv_dtype={q.kv_dtype})"] if q else []


# ---------------------------------------------------------------- the scales the checks pass


def scales(q: KvQuant, tags: tuple[str, ...], hkv: int, std: float, device: str) -> dict[str, Any]:
    """k_scale and v_scale (float32, [1] or [Hkv]). A calibrated scale maps about 4 standard deviations to the
    largest normal, so the tails saturate and small values reach the subnormals. Per head the scales differ
    (1, 1.45, 1.9, ... times the first), and V's are 1.6 times K's, so another head's or the other cache's
    scale shows. The `fp8-edges` cases take powers of two (1, 2, 4, ... times the first; V's twice K's): then
    x / scale is exact in any float arithmetic and a tie is a tie, so rounding to even is held exactly. The
    pos-0 probe passes 1.0 everywhere, as a demo test (and vLLM without calibration) does. `tags`: the case's."""
    n = hkv if q.per_head else 1
    h = torch.arange(n, dtype=torch.float64)
    if "probe" in tags:
        one = torch.ones(n, dtype=torch.float32, device=device)
        return {"k_scale": one, "v_scale": one.clone()}
    if "fp8-edges" in tags:
        k = 2.0 ** (round(math.log2(4.0 * std / q.max)) + h)
        return {"k_scale": k.to(torch.float32).to(device), "v_scale": (2 * k).to(torch.float32).to(device)}
    k = 4.0 * std / q.max * (1.0 + 0.45 * h)
    return {"k_scale": k.to(torch.float32).to(device), "v_scale": (1.6 * k).to(torch.float32).to(device)}


def scale_caches(cshape: tuple[int, int, int], poison: bool, device: str) -> dict[str, Any]:
    """Per-token-head scale caches k_scale, v_scale [num_blocks, block_size, Hkv] float32: the canary (or
    zeros without poison) until the kernel writes a slot's scales."""
    out = {}
    for name in ("k_scale", "v_scale"):
        t = torch.empty(cshape, dtype=torch.float32)
        out[name] = (fill_canary(t) if poison else t.zero_()).to(device)
    return out


def token_head_scales(x: Any, q: KvQuant) -> Any:
    """The per-token-head scales [n, Hkv] (float32) of rows x [n, Hkv, D]: max |x| over the row divided by the
    format's largest normal, in float32 (x's values are exact in float32), at least TOKEN_HEAD_FLOOR."""
    a = x.detach().to("cpu", torch.float32).abs().amax(-1)
    return torch.clamp(a / q.max, min=TOKEN_HEAD_FLOOR)


def per_head(scale: Any, hkv: int) -> Any:
    """A scale tensor ([1] or [Hkv]) as float64 [Hkv]."""
    s = scale.detach().to("cpu", torch.float64).reshape(-1)
    return s.expand(hkv) if s.numel() == 1 else s


def broadcast(scale: Any, x: Any) -> Any:
    """A scale as float64 broadcastable against rows x [n, Hkv, D]: [1] or [Hkv] (one per head), or [n, Hkv]
    (one per token and head)."""
    if scale.dim() == 2:
        return scale.detach().to("cpu", torch.float64).reshape(x.shape[0], x.shape[1], 1)
    return per_head(scale, x.shape[1]).reshape(1, -1, 1)


# ---------------------------------------------------------------- quantise (kv_append, building caches)


def round_to(x64: Any, q: KvQuant) -> Any:
    """satfinite_rn of float64 values, as FP8 (NaN stays NaN)."""
    x = torch.where(torch.isnan(x64), x64, x64.clamp(-q.max, q.max))
    return x.to(q.dtype)


def quantise(x: Any, scale: Any, q: KvQuant, head_axis: int) -> Any:
    """An FP8 tensor holding satfinite_rn(x / scale[h]) (h along `head_axis`); NaN (a canary) stays the FP8
    canary. On the CPU."""
    x64 = x.detach().to("cpu", torch.float64)
    s = per_head(scale, x64.shape[head_axis])
    shape = [1] * x64.dim()
    shape[head_axis] = -1
    out = round_to(x64 / s.reshape(shape), q)
    nan = torch.isnan(x64)
    if bool(nan.any()):
        canary = fill_canary(torch.empty(1, dtype=q.dtype))
        bits(out)[nan] = bits(canary)[0]
    return out


def expected_bytes(x: Any, scale: Any, q: KvQuant) -> tuple[Any, Any]:
    """The two FP8 values a correct kernel may store for rows x [n, Hkv, D] (float64): the correctly rounded
    quotient of x / scale[h] nudged by -QUOTIENT_EPS and +QUOTIENT_EPS (equal except within float32 reach of a
    rounding boundary), as int8 bit patterns. Scales that are all powers of two make the quotient exact in
    any float arithmetic: then there is one value (0 ulp, ties to even)."""
    s = broadcast(scale, x)
    quot = x / s
    eps = 0.0 if bool((torch.frexp(s)[0].abs() == 0.5).all()) else QUOTIENT_EPS
    lo = round_to(quot * (1 - eps), q).view(torch.int8)
    hi = round_to(quot * (1 + eps), q).view(torch.int8)
    return lo, hi


def write_scale_bugs(scale: Any, other: Any, q: KvQuant) -> list[tuple[str, Any]]:
    """(what, the scale it divides by) for each known quantise-on-write scale bug, given the right `scale` and
    the other cache's `other`: the first head's scale for every head (per-tensor where per-head is given), the
    other cache's scale, the value multiplied by the scale instead of divided (its reciprocal, float64)."""
    out = []
    if q.per_head and scale.numel() > 1:
        out.append(("the first head's scale for every head (per-tensor where per-head is given)", scale[:1]))
    out.append(("the other cache's scale", other))
    out.append(("the value multiplied by the scale instead of divided", 1.0 / scale.detach().double()))
    return out


def wrong_scales(x: Any, scale: Any, other: Any, q: KvQuant) -> list[tuple[str, Any]]:
    """(what, bytes) a kernel with a known scale bug (`write_scale_bugs`) stores for rows x [n, Hkv, D]."""
    hkv = x.shape[1]
    return [
        (what, round_to(x / per_head(s, hkv).reshape(1, -1, 1), q).view(torch.int8))
        for what, s in write_scale_bugs(scale, other, q)
    ]


def holds(got: Any, x: Any, scale: Any, q: KvQuant, slack: Any = None) -> bool:
    """Whether FP8 rows `got` [n, Hkv, D] hold rows x (float64) quantised on write with `scale`: with no
    `slack`, one of the two values of `expected_bytes` (kv_append's contract); with `slack` [n, Hkv, 1] (an
    absolute error the value may carry before it is quantised: a fused kernel's own rotation), any value
    satfinite_rn gives within [x - slack, x + slack] (it is monotone: the two ends bound it)."""
    g = got.detach().to("cpu")
    if slack is None:
        lo, hi = expected_bytes(x, scale, q)
        b = bits(g)
        return bool(((b == lo) | (b == hi)).all())
    s = per_head(scale, x.shape[1]).reshape(1, -1, 1)
    lo = round_to((x - slack) / s, q).to(torch.float64)
    hi = round_to((x + slack) / s, q).to(torch.float64)
    v = g.to(torch.float64)
    return bool(((v >= lo) & (v <= hi)).all())


def saturating(x: Any, scale: Any, q: KvQuant) -> Any:
    """Mask of the elements of rows x [n, Hkv, D] whose quotient lies past the format's largest normal."""
    return (x / per_head(scale, x.shape[1]).reshape(1, -1, 1)).abs() > q.max


# ---------------------------------------------------------------- dequantise (attention)


def dequantise(t: Any, scale: Any) -> Any:
    """float64 values of cache rows t [Hkv, L, D] (FP8) read with `scale` ([1] or [Hkv]); t itself when
    scale is None (an unquantised cache)."""
    if scale is None:
        return t
    return t.to("cpu").to(torch.float64) * per_head(scale, t.shape[0]).reshape(-1, 1, 1)


def read_variants(scales_kv: dict[str, Any], q: KvQuant) -> list[tuple[str, dict[str, Any]]]:
    """(why, {"k_scale": .., "v_scale": ..}) for each known dequantisation bug: the scales a buggy kernel
    reads with. None: the cache read raw (no scale)."""
    k, v = scales_kv["k_scale"], scales_kv["v_scale"]
    out = [("K's scale for V", {"k_scale": k, "v_scale": k}), ("V's scale for K", {"k_scale": v, "v_scale": v})]
    if q.per_head and k.numel() > 1:
        out.append(("the first head's scale for every head", {"k_scale": k[:1], "v_scale": v[:1]}))
    out.append(("no scale", {"k_scale": torch.ones(1), "v_scale": torch.ones(1)}))
    out.append(("the scale divided", {"k_scale": 1.0 / k.double(), "v_scale": 1.0 / v.double()}))
    return out


# ---------------------------------------------------------------- cases at the format's edges


def edge_quotients(q: KvQuant) -> list[float]:
    """Quotients x / scale where FP8 conversion goes wrong: the largest normal and just around it, past it
    (saturation: 1.05, 1.5 and 4 times), the smallest normal and just under it, the smallest subnormal, half
    of it (a tie that rounds to zero), 1.5 times it (a tie that rounds to even), the top of a binade (a
    mantissa that carries into the exponent) and a tie between normals."""
    fi = torch.finfo(q.dtype)
    top, low = float(fi.max), float(fi.smallest_normal)
    tiny = low * float(fi.eps)
    m = MANTISSA[q.kv_dtype]
    binade_top = 2.0**4 * (2 - 2.0 ** -(m + 2))  # rounds up into the next binade (a carry)
    tie = 2.0**2 * (1 + 2.0 ** -(m + 1))  # halfway between two normals: to even
    return [
        top,
        -top,
        top * (1 - 2.0 ** -(m + 2)),
        top * 1.05,
        -top * 1.5,
        top * 4,
        low,
        -low * (1 - 2.0 ** -(m + 1)),
        tiny,
        tiny * 0.5,
        -tiny * 1.5,
        binade_top,
        -binade_top,
        tie,
    ]


def place_edges(x: Any, scale: Any, q: KvQuant) -> None:
    """Write the edge quotients (times each head's scale) into the first dims of rows x [T, Hkv, D] in place,
    shifted by one per token so every edge lands on several tokens and dims."""
    edges = torch.tensor(edge_quotients(q), dtype=torch.float64)
    s = per_head(scale, x.shape[1])
    n = min(len(edges), x.shape[2])
    for t in range(x.shape[0]):
        vals = torch.roll(edges, t)[:n]
        x[t, :, :n] = (vals[None, :] * s[:, None]).to(x.dtype)
