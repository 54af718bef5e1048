"""The served-decode features of both attention ops (docs/ops.md, "Attention features"): a sliding
window, logit soft-capping, ALiBi slopes and attention sinks (the decode loops' attention too:
ops/decode_loop.py). Each is an op param, off by default (every existing kernel and case is then
unchanged); here are their params, extra inputs, float64 definition, the cases at the positions where
each matters, and the fingerprints of their known bugs.

Order of the definition, per query head h of sequence b (p = kv_lens[b] - 1, the query's position):
    s_j = scale * <q, k_j>                       the scaled score
    s_j = cap * tanh(s_j / cap)                  logit_cap (after the scale)
    s_j = s_j + alibi_slopes[h] * (j - p)        alibi (after the cap)
    keys with j <= p - window take no part       window (the last `window` keys, the query's own included)
    out = sum_j e^{s_j} v_j / (e^{sinks[h]} + sum_j e^{s_j})    sinks (one more logit, no value)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernalin_ci.lazy import torch
from kernalin_ci.ops.base import Case, Param, Params, Tensors, generator, positive

FEATURE_PARAMS = (
    Param("window", None, int, "sliding window: the last `window` keys, the query's own included", check=positive),
    Param("logit_cap", None, float, "soft-cap: s = cap * tanh(s / cap) on the scaled score", check=positive),
    Param("alibi", False, bool, "ALiBi: input alibi_slopes [Hq] float32, s_j += slope[h] * (j - p)"),
    Param("sinks", False, bool, "attention sinks: input sinks [Hq] float32, a per-head logit in the denominator"),
)
# the feature's name where a status or a document names it, by param
FEATURE_NAMES = {"window": "sliding window", "logit_cap": "soft-cap", "alibi": "ALiBi", "sinks": "attention sinks"}


def active(params: Params) -> list[str]:
    """The feature params switched on, in FEATURE_PARAMS order."""
    return [p.name for p in FEATURE_PARAMS if params.get(p.name)]


def of_params(params: Params) -> dict[str, Any]:
    """The feature params switched on and their values (a decode loop's `features`)."""
    return {n: params[n] for n in active(params)}


def unanalysed(params: Params) -> list[str]:
    """Each feature switched on, as a structural status names it (the analysis does not model them)."""
    return [f"{FEATURE_NAMES[n]} (param {n})" for n in active(params)]


@dataclass(frozen=True)
class Features:
    """The features of one call: the params and the extra inputs (float64 CPU), None where off."""

    window: int | None = None
    cap: float | None = None
    slopes: Any = None  # [Hq]
    sinks: Any = None  # [Hq]

    @classmethod
    def of(cls, params: Params, kw: Tensors) -> Features:
        def f64(name: str) -> Any:
            t = kw.get(name)
            return None if t is None else t.detach().to("cpu", torch.float64)

        return cls(
            params.get("window"),
            params.get("logit_cap"),
            f64("alibi_slopes") if params.get("alibi") else None,
            f64("sinks") if params.get("sinks") else None,
        )

    @property
    def off(self) -> bool:
        return self.window is None and self.cap is None and self.slopes is None and self.sinks is None


def alibi_slopes(n: int) -> list[float]:
    """The ALiBi slopes of Press et al. for n heads: 2^(-8i/n) for a power of two, else the power of two
    below and every other slope of the one above (as the reference implementation and serving stacks)."""

    def pow2(m: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start ** (i + 1) for i in range(m)]

    if math.log2(n).is_integer():
        return pow2(n)
    below = 2 ** math.floor(math.log2(n))
    return pow2(below) + pow2(2 * below)[0::2][: n - below]


def extra_inputs(case: Case, params: Params, Hq: int, device: str) -> Tensors:
    """A case's alibi_slopes and sinks (`inputs_of` at the case's seed and `sink_shift`)."""
    return inputs_of(params, Hq, case.seed, device, float(case.dims.get("sink_shift", 0.0)))


def inputs_of(params: Params, Hq: int, seed: int, device: str, sink_shift: float = 0.0) -> Tensors:
    """alibi_slopes and sinks (float32 [Hq]) where those params are on. Sinks are drawn from a generator of
    their own (the other inputs keep their draws): N(0, 1), plus `sink_shift` (a sink that dominates)."""
    out: Tensors = {}
    if params.get("alibi"):
        out["alibi_slopes"] = torch.tensor(alibi_slopes(Hq), dtype=torch.float32, device=device)
    if params.get("sinks"):
        g = generator(seed + 7919)
        s = torch.randn(Hq, generator=g, dtype=torch.float64) + sink_shift
        out["sinks"] = s.to(torch.float32).to(device)
    return out


def scores(s: Any, L: int, feat: Features, heads: Any, scale_cap_first: bool = False, scale: float = 1.0) -> Any:
    """The scores [Hq, L] of one sequence after cap, ALiBi and window (-inf outside the window).
    `s`: the scaled scores (or, with scale_cap_first, the raw ones: the cap is applied before the scale)."""
    if feat.cap is not None:
        s = feat.cap * torch.tanh(s / feat.cap) * (scale if scale_cap_first else 1.0)
    elif scale_cap_first:
        s = s * scale
    j = torch.arange(L, dtype=torch.float64)
    if feat.slopes is not None:
        s = s + feat.slopes[heads][:, None] * (j - (L - 1))[None, :]
    if feat.window is not None:
        s = s.masked_fill((j <= (L - 1) - feat.window)[None, :], float("-inf"))
    return s


def softmax_v(s: Any, V: Any, feat: Features, heads: Any, normalize: bool = True) -> Any:
    """sum_j p_j v_j with the sink (if any) in the denominator; V [Hq, L, D]."""
    if feat.sinks is not None:
        sink = feat.sinks[heads][:, None]
        m = torch.maximum(s.max(dim=-1, keepdim=True).values, sink)
        e = torch.exp(s - m)
        den = e.sum(-1, keepdim=True) + torch.exp(sink - m)
        p = e / den if normalize else e
    elif normalize:
        p = torch.softmax(s, dim=-1)
    else:
        p = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return torch.einsum("hl,hld->hd", p, V)


def underflow_slack(ref: Any, dtype: Any) -> Any:
    """Per output row, the relative error that rounding the output to `dtype` may add where the row is so
    small that its elements fall below the dtype's normal range (a sink that takes nearly all the mass:
    float16 keeps ~1e-7 absolute there). Zero for rows of ordinary size."""
    spacing = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    rows = ref.reshape(-1, ref.shape[-1])
    norm = rows.norm(dim=-1).clamp_min(1e-300)
    return (spacing * math.sqrt(rows.shape[-1]) / norm).to(torch.float64)


def plan_cases(params: Params, base: dict[str, Any], dtype: str) -> list[Case]:
    """The cases where each active feature matters (added to the plan; main dtype)."""
    cases = []
    dims = {k: base[k] for k in ("Hq", "Hkv", "D", "scale")}
    if params.get("window"):
        w = int(params["window"])
        lens = sorted({max(w - 1, 1), w, w + 1, w + 2, 2 * w + 3, 1})
        cases.append(Case("window-edge", {**dims, "kv_lens": lens}, dtype, 60, ("window",)))
    if params.get("logit_cap"):
        # |scale * q.k| around 8 caps: tanh saturated for most keys, its slope still there for a few
        std = math.sqrt(8.0 * float(params["logit_cap"]))
        cases.append(Case("cap-saturation", {**dims, "kv_lens": [2, 17, 100, 257], "qk_std": std}, dtype, 61, ("cap",)))
    if params.get("sinks"):  # e^7: the sink takes ~99.9% of the mass, the output ~1e-3 of a value
        cases.append(
            Case("sink-dominates", {**dims, "kv_lens": [1, 2, 65, 300], "sink_shift": 7.0}, dtype, 62, ("sinks",))
        )
    if params.get("alibi"):  # every query head its own slope; the first and last key of short and long rows
        hq = params.get("num_q_heads") or 16
        hkv = params.get("num_kv_heads") or (2 if hq % 2 == 0 else 1)
        d = {**dims, "Hq": hq, "Hkv": hkv if hq % hkv == 0 else 1}
        cases.append(Case("alibi-ends", {**d, "kv_lens": [2, 3, 64, 257]}, dtype, 63, ("alibi",)))
    return cases


def variants(feat: Features, Hq: int, Hkv: int) -> list[tuple[str, Features, bool]]:
    """(bug class, the features a known bug computes with, cap before the scale) for each feature bug."""
    out: list[tuple[str, Features, bool]] = []
    group = Hq // Hkv
    kv_head = torch.tensor([h // group for h in range(Hq)])
    if feat.window is not None:
        for w in (feat.window - 1, feat.window + 1):
            if w >= 1:
                out.append(("window-mask", Features(w, feat.cap, feat.slopes, feat.sinks), False))
        out.append(("window-mask", Features(None, feat.cap, feat.slopes, feat.sinks), False))
    if feat.cap is not None:
        out.append(("soft-cap", feat, True))
        out.append(("soft-cap", Features(feat.window, None, feat.slopes, feat.sinks), False))
    if feat.slopes is not None:
        if group > 1:
            out.append(("alibi", Features(feat.window, feat.cap, feat.slopes[kv_head], feat.sinks), False))
        out.append(("alibi", Features(feat.window, feat.cap, -feat.slopes, feat.sinks), False))
        out.append(("alibi", Features(feat.window, feat.cap, None, feat.sinks), False))
    if feat.sinks is not None:
        if group > 1:
            out.append(("attention-sink", Features(feat.window, feat.cap, feat.slopes, feat.sinks[kv_head]), False))
        out.append(("attention-sink", Features(feat.window, feat.cap, feat.slopes, None), False))
    return out
