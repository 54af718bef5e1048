"""Structural checks for attention.decode and attention.decode_paged.

From the IR graph (no data):
* every exp of the scores is exp(s - m) with m an upper bound of s: the max over
  the same scores, or a running max that includes it (`softmax-no-max`);
* the scale multiplies the scores exactly once (times log2(e) for exp2), before
  the max (`scale`);
* in a tiled loop with a running max, every accumulation of exponentials (the
  output accumulator, the running sum) is rescaled by exp(m_old - m_new)
  (`online-rescale`);
* the stored output is divided by a sum of the same exponentials
  (`softmax-no-normalize`);
* a split-KV combine weights partials by exp(lse_i - max lse) and divides by
  the sum of those weights (`split-combine`).

From the abstract interpretation (index arithmetic only, floats never computed):
* scores at positions >= kv_len get weight exactly 0 (`kv-mask`); K/V lanes past
  kv_len are masked so garbage never reaches the output (`kv-mask` for K,
  `unmasked-load` for V: 0 * NaN);
* query head h reads KV head h // (Hq / Hkv) (`gqa-mapping`), of its own
  sequence (`stride`; `paged-index` through the block table), every position
  < kv_len exactly once (`kv-mask` when the tail is dropped).
"""

from __future__ import annotations

from kernalin_ci.verify.structural.attention_graph import (
    check_combine,
    check_exps,
    check_lse_stores,
    check_normalize,
    check_partials,
    check_rescale,
)
from kernalin_ci.verify.structural.attention_memory import (
    AttentionModel,
    check_addressing,
    check_garbage,
    check_masks,
    check_output_coverage,
)
from kernalin_ci.verify.structural.attention_values import exps_of
from kernalin_ci.verify.structural.common import Analysis, StructuralFindings, kname

# --------------------------------------------------------------------------- entry point


def analyze(cap, views: list, rep: StructuralFindings, model: AttentionModel) -> None:
    """Every kernel of the entry gets every check, over one dataflow: a value an earlier kernel stored is
    followed into the kernel that computed it (scores, partial accumulators, their max, sum or lse)."""
    scale = float(cap.kwargs["scale"])
    out_name = cap.outputs.get("out")
    main = [v for v in views if v.loads_of("k_cache")]
    if not main:
        for prop in ANALYSIS.properties:
            rep.gap(
                prop, "structural:attention", "could not verify the attention kernels: no launched kernel reads k_cache"
            )
        return
    out_tensors = {out_name} | {t for t in cap.tensors if t.startswith("scratch")}
    partials = []
    for view in views:
        exps = exps_of(view)
        check_exps(view, exps, rep, scale)
        check_rescale(view, exps, rep)
        partials += check_normalize(view, exps, rep, out_tensors)
        check_lse_stores(view, exps, rep)
    if not any(exps_of(v).of("score") for v in views):
        for view in main:
            rep.gap(
                "softmax max subtraction",
                "structural:softmax",
                f"{kname(view)}: could not verify the softmax: no exp of the scores found",
                where=(view.launch.path, view.launch.line),
            )
    for view in views:
        check_combine(view, exps_of(view), rep, {out_name}, partials)
    check_partials(views, partials, rep, out_name)
    wrong = check_addressing(cap, main, rep, model)
    if wrong:
        rep.gap(
            "length mask",
            "structural:kv-mask",
            "the length-mask checks were skipped: the K/V addressing is already wrong, and "
            "every read of the wrong rows would show up again as a read past kv_len",
        )
    else:
        for view in views:
            check_masks(view, exps_of(view), rep)
        if out_name:
            check_garbage(cap, views, rep, out_name)
    if out_name:
        check_output_coverage(cap, views, rep, out_name)


ANALYSIS = Analysis(
    AttentionModel,
    analyze,
    properties=(
        "softmax max subtraction",
        "softmax scale",
        "online rescale",
        "normalisation",
        "split-KV combine",
        "length mask",
        "KV addressing",
        "output coverage",
    ),
)
