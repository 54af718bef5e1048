"""Decode tokens/s and $/Mtok in words: the PR comment's and step summary's section, and the lines of
`kernalin-ci bench --model` (a ModelResult: the model object of docs/tokens.md before the writer).

Nothing here computes a statistic: every figure is in the model result, only rounded and phrased.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kernalin_ci.ops.roles import FUSED
from kernalin_ci.report.text import code, md, prob

if TYPE_CHECKING:
    from kernalin_ci.throughput.result import ModelResult

NOT_MEASURED = "tokens/s: not measured"


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def rate(x) -> str:
    """Tokens per second: three significant figures at least, no fraction above 100."""
    if not _finite(x):
        return "n/a"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def dollars(x) -> str:
    if not _finite(x):
        return "n/a"
    return f"${x:,.2f}" if x >= 1 else f"${x:.3g}"


def change(ratio, hdi) -> str:
    """A tokens/s ratio head/base as '+3.7% (95% HDI +3.5%..+3.9%)'."""
    if not _finite(ratio, *hdi):
        return "n/a"
    d = 1 if max(abs(ratio - 1), abs(hdi[0] - 1), abs(hdi[1] - 1)) >= 0.01 else 2
    while d < 3 and f"{100 * hdi[0]:.{d}f}" == f"{100 * hdi[1]:.{d}f}":  # the two ends must read apart
        d += 1
    return f"{100 * (ratio - 1):+.{d}f}% (95% HDI {100 * (hdi[0] - 1):+.{d}f}%..{100 * (hdi[1] - 1):+.{d}f}%)"


def shape_text(m: ModelResult) -> str:
    s = m.spec
    return (
        f"{s.layers} layers, hidden {s.hidden_size}, heads {s.num_heads}/"
        f"{s.num_kv_heads}, head dim {s.head_dim}, MLP {s.intermediate_size}, "
        f"vocab {s.vocab_size}, {s.dtype}{features_text(m)}"
    )


def features_text(m: ModelResult) -> str:
    """The model's attention features (docs/tokens.md), each as ", ..."; "" for none."""
    s, out = m.spec, []
    if s.window is not None:
        out.append(f"window {s.window}" + (" (layers 0, 2, ...)" if s.window_layers == "even" else ""))
    if s.logit_cap is not None:
        out.append(f"logit cap {s.logit_cap:g}")
    if s.sinks:
        out.append("sinks")
    if s.kv_dtype:
        out.append(f"KV cache {s.kv_dtype}")
    return "".join(f", {x}" for x in out)


def how_text(m: ModelResult) -> str:
    if m.mode == "full":
        return "the whole model timed as one CUDA graph per step"
    if m.mode == "per-layer":
        return (
            f"per-layer estimate: a block of {m.layers_built} layers timed and scaled to {m.spec.layers}, "
            f"plus embedding and LM head ({m.mode_why})"
        )
    return ""


def kernels_text(m: ModelResult) -> str:
    return ", ".join(
        f"{name} (decode_step: rope, kv_append and attention)" if role == FUSED else f"{role} {name}"
        for role, name in m.roles.items()
    )


def not_measured_line(m: ModelResult) -> str:
    return f"{NOT_MEASURED} ({m.reason or 'unknown'})"


def point_label(p: dict) -> str:
    return f"batch {p.get('batch')}, context {p.get('context')}"


def point_line(p: dict) -> str:
    b, h = p.get("base") or {}, p.get("head") or {}
    return (
        f"{point_label(p)}: base {rate(b.get('tokens_per_s'))} tokens/s ({dollars(b.get('usd_per_mtok'))}/Mtok), "
        f"head {rate(h.get('tokens_per_s'))} tokens/s ({dollars(h.get('usd_per_mtok'))}/Mtok); tokens/s "
        f"{change(p.get('tokens_per_s_ratio'), p.get('tokens_per_s_ratio_hdi') or (None, None))}, "
        f"{p.get('verdict')}, P(more tokens/s) {prob(p.get('p_faster'))}"
    )


def text_lines(m: ModelResult) -> list[str]:
    """`kernalin-ci bench --model`'s lines."""
    lines = [f"model {m.spec.name} ({m.spec.source}): {shape_text(m)}", f"  kernels: {kernels_text(m)}"]
    if m.error:
        lines.append(f"  MODEL BENCH FAILED ({m.error_kind}): {m.error}")
    if not m.measured:
        lines.append(f"  {not_measured_line(m)}")
    else:
        lines.append(f"  {how_text(m)}; {m.rounds} rounds, {m.bench_seconds:.1f} GPU seconds (stopped: {m.stopped})")
        lines += [f"  {point_line(p)}" for p in m.points]
        lines.append(f"  price: ${m.spec.price_per_hour:.2f} per GPU-hour ({m.spec.price_source})")
    lines += [f"  note: {n}" for n in m.notes]
    return lines


TABLE_HEADER = (
    "| serving point | base tokens/s | head tokens/s | tokens/s change (95% HDI) | P(more tokens/s) "
    "| base $/Mtok | head $/Mtok | verdict |\n|---|--:|--:|--:|--:|--:|--:|---|"
)


def markdown_section(m: ModelResult | None) -> str | None:
    """The comment's 'Decode throughput' block, or None without a model result."""
    if m is None:
        return None
    lines = [
        f"#### Decode throughput · {code(m.spec.name)}",
        "",
        f"<sub>{md(shape_text(m))} · kernels: {md(kernels_text(m))}</sub>",
        "",
    ]
    if m.error:
        lines += [f"- **Error:** {md(m.error)}", ""]
    notes = [f"- note: {md(n)}" for n in m.notes]
    if not m.measured:
        lines.append(f"- **Tokens/s:** not measured ({md(m.reason or 'unknown')}).")
        return "\n".join(lines + notes) + "\n\n"
    lines.append(TABLE_HEADER)
    for p in m.points:
        b, h = p.get("base") or {}, p.get("head") or {}
        lines.append(
            f"| {point_label(p)} | {rate(b.get('tokens_per_s'))} | {rate(h.get('tokens_per_s'))} | "
            f"{change(p.get('tokens_per_s_ratio'), p.get('tokens_per_s_ratio_hdi') or (None, None))} | "
            f"{prob(p.get('p_faster'))} | {dollars(b.get('usd_per_mtok'))} | {dollars(h.get('usd_per_mtok'))} "
            f"| {md(p.get('verdict'))} |"
        )
    lines += [
        "",
        f"<sub>{md(how_text(m))}; {m.rounds} interleaved rounds; "
        f"${m.spec.price_per_hour:.2f} per GPU-hour ({md(m.spec.price_source)}); "
        f"reported, never gating</sub>",
    ]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n\n"
