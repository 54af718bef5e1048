"""The attention features of both attention ops (docs/ops.md, "Attention features"): the float64
definition against independent formulations, the params' validation, the structural status that names
them, and the catalogue's feature kernels at the cases where each feature matters (real Triton kernels
under the interpreter, one case each)."""

import json
import math
import subprocess
import sys

import pytest
import torch
from conftest import CHECKS

from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops import attention_features as af
from kernalin_ci.ops import decode_loop as dl
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params
from kernalin_ci.verify import pipeline_params, verify, verify_pipeline

ALL = {"window": 40, "logit_cap": 20.0, "alibi": True, "sinks": True}


def _qkv(seed=0, Hq=4, Hkv=2, L=9, D=8, std=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, Hq, D, generator=g, dtype=torch.float64) * std
    k = torch.randn(Hkv, L, D, generator=g, dtype=torch.float64) * std
    v = torch.randn(Hkv, L, D, generator=g, dtype=torch.float64)
    return q, k, v, ac.head_map(Hq, Hkv)


def test_features_off_is_plain_attention():
    q, k, v, hm = _qkv()
    assert torch.equal(ac.attend(q, [k], [v], 0.3, hm, feat=af.Features()), ac.attend(q, [k], [v], 0.3, hm))


def test_window_is_attention_over_the_last_window_keys():
    q, k, v, hm = _qkv(L=9)
    for w in (1, 3, 9, 20):
        got = ac.attend(q, [k], [v], 0.3, hm, feat=af.Features(window=w))
        want = ac.attend(q, [k[:, -w:]], [v[:, -w:]], 0.3, hm)
        assert torch.allclose(got, want, atol=1e-12), w


def test_cap_follows_the_scale_and_bounds_the_scores():
    q, k, v, hm = _qkv(std=8.0)
    cap, scale = 2.0, 0.5
    raw = torch.einsum("hd,hld->hl", q[0], k[hm])
    s = cap * torch.tanh(scale * raw / cap)
    want = torch.einsum("hl,hld->hd", torch.softmax(s, -1), v[hm])
    got = ac.attend(q, [k], [v], scale, hm, feat=af.Features(cap=cap))[0]
    assert torch.allclose(got, want, atol=1e-12)
    before = ac.attend(q, [k], [v], scale, hm, feat=af.Features(cap=cap), cap_first=True)[0]
    assert not torch.allclose(before, want, atol=1e-3)  # the bug's fingerprint differs where scores saturate


def test_sink_is_a_key_with_a_zero_value():
    q, k, v, hm = _qkv(Hq=4, Hkv=2)
    sinks = torch.tensor([0.5, -1.0, 3.0, 0.0], dtype=torch.float64)
    got = ac.attend(q, [k], [v], 0.3, hm, feat=af.Features(sinks=sinks))[0]
    s = 0.3 * torch.einsum("hd,hld->hl", q[0], k[hm])
    p = torch.softmax(torch.cat([s, sinks[:, None]], -1), -1)[:, :-1]
    assert torch.allclose(got, torch.einsum("hl,hld->hd", p, v[hm]), atol=1e-12)


def test_alibi_slopes_and_bias():
    assert af.alibi_slopes(8) == [2.0**-i for i in range(1, 9)]
    s12 = af.alibi_slopes(12)  # Press et al.: the 8 slopes of 8 heads, then every other of 16 heads
    assert s12[:8] == af.alibi_slopes(8) and s12[8:] == af.alibi_slopes(16)[0::2][:4]
    q, k, v, hm = _qkv(Hq=4, Hkv=2, L=6)
    slopes = torch.tensor(af.alibi_slopes(4), dtype=torch.float64)
    got = ac.attend(q, [k], [v], 0.3, hm, feat=af.Features(slopes=slopes))[0]
    s = 0.3 * torch.einsum("hd,hld->hl", q[0], k[hm]) + slopes[:, None] * (torch.arange(6.0) - 5)[None, :]
    assert torch.allclose(got, torch.einsum("hl,hld->hd", torch.softmax(s, -1), v[hm]), atol=1e-12)


@pytest.mark.parametrize("op", ["attention.decode", "attention.decode_paged"])
def test_defaults_leave_the_contract_unchanged(op):
    o = get_op(op)
    params = resolve_params(op, o.params, {})
    assert not af.active(params) and o.unanalysed(params) == []
    names = [c.name for c in o.cases(params, "cpu", None)]
    assert not {"window-edge", "cap-saturation", "sink-dominates", "alibi-ends"} & set(names)
    kw = o.inputs(o.probe(params, "float32"), params, "cpu", poison=False)
    assert "alibi_slopes" not in kw and "sinks" not in kw


def test_each_feature_adds_its_edge_cases_and_inputs():
    o = get_op("attention.decode")
    params = resolve_params(o.name, o.params, ALL)
    cases = {c.name: c for c in o.cases(params, "cpu", "float32")}
    assert {39, 40, 41} <= set(cases["window-edge"].dims["kv_lens"])
    assert cases["cap-saturation"].dims["qk_std"] == pytest.approx(math.sqrt(160.0))
    kw = o.inputs(cases["alibi-ends"], params, "cpu")
    assert kw["alibi_slopes"].tolist() == pytest.approx(af.alibi_slopes(16))
    assert kw["sinks"].shape == (16,) and kw["sinks"].dtype == torch.float32


@pytest.mark.parametrize(
    "param, line",
    [
        ("window=0", "op attention.decode: param window=0: must be positive"),
        ("logit_cap=nan", "op attention.decode: param logit_cap='nan' is not a valid float"),
        ("logit_cap=-3", "op attention.decode: param logit_cap=-3.0: must be positive"),
        ("sinks=maybe", "op attention.decode: param sinks='maybe' is not a valid bool"),
    ],
)
def test_a_bad_feature_value_is_one_line_and_exit_2(param, line):
    r = subprocess.run(
        [sys.executable, "-m", "kernalin_ci", "verify", "--op", "attention.decode", "--entry",
         f"{CHECKS / 'attention_decode' / 'correct_features.py'}:entry", "--param", param, "--device", "cpu"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"kernalin-ci verify: error: {line}"]


def test_the_decode_loop_attends_with_the_features_and_crosses_the_window():
    """The pipeline takes the features: its loop's reference is the attention ops' definition with the
    features' inputs drawn from the seed, and one sequence's kv_len first passes the window mid-loop."""
    params = pipeline_params({"kv_append": "a:b", "attention.decode_paged": "c:d"}, {**ALL, "window": 8})
    loop = dl.pipeline_loop(params, "float32", 0, 6, rope=False)
    assert loop.features == {"window": 8, "logit_cap": 20.0, "alibi": True, "sinks": True}
    assert 8 - dl.WINDOW_CROSSING_STEP in loop.shape.start_lens  # kv_len = 8 + 1 at that step
    s = dl.init_state(loop, "cpu")
    ref = af.inputs_of(params, loop.shape.Hq, 0, "cpu")
    assert set(s.extra) == {"alibi_slopes", "sinks"} and all(torch.equal(s.extra[k], ref[k]) for k in ref)
    st = dl.next_step(s, 0, "float32", loop.padding)
    q_ref, k_ref = dl.rotated(st, len(s.lens), None, loop.shape.D)
    dl.advance(s, st, *dl.new_rows(s, st, k_ref))
    want = ac.attend(q_ref, s.ref_k, s.ref_v, s.scale, ac.head_map(4, 2), feat=af.Features.of(params, ref))
    assert torch.equal(dl.attend_history(s, q_ref, "float32")[0], want)


def test_decode_step_loops_put_the_scores_where_the_cap_and_the_sinks_matter():
    """decode_step's cases with a soft-cap and sinks: besides the main loop (which crosses the window), a
    short loop whose scaled scores lie far past the cap (tanh saturated) and one whose sinks take nearly all
    the mass; neither without its feature."""
    o = get_op("decode_step")
    params = resolve_params(o.name, o.params, STEP_PARAMS)
    cases = {c.name: c for c in o.cases(params, "cpu", "float32")}
    assert {"decode-loop", "cap-saturation", "sink-dominates"} <= set(cases)
    assert 24 - dl.WINDOW_CROSSING_STEP in cases["cap-saturation"].dims["start_lens"]
    plain = resolve_params(o.name, o.params, {**STEP_PARAMS, "logit_cap": None, "sinks": False})
    assert not {"cap-saturation", "sink-dominates"} & {c.name for c in o.cases(plain, "cpu", "float32")}

    def first_step(name):
        s = dl.init_state(o.loop(cases[name], params, True), "cpu")
        st = dl.next_step(s, 0, "float32")
        q_ref, k_ref = dl.rotated(st, len(s.lens), dl.rope_params(params), s.shape.D)
        dl.advance(s, st, *dl.new_rows(s, st, k_ref))
        return s, q_ref

    s, q = first_step("cap-saturation")
    scores = torch.cat([torch.einsum("hd,hld->hl", q[b, ::2], s.ref_k[b]) * s.scale for b in range(len(s.lens))], 1)
    assert (scores.abs() > 3 * 20.0).float().mean() > 0.7  # tanh(3) = 0.995: saturated
    s, q = first_step("sink-dominates")
    out, *_ = dl.attend_history(s, q, "float32")
    f = s.feat
    no_sink = ac.attend(q, s.ref_k, s.ref_v, s.scale, ac.head_map(4, 2), feat=af.Features(f.window, f.cap, f.slopes))
    kept = out.norm(dim=-1) / no_sink.norm(dim=-1)  # the mass the keys keep beside the sink
    assert kept.median() < 0.01 and kept.max() < 0.2, kept


@pytest.mark.parametrize("name", ["decode-loop", "cap-saturation", "sink-dominates"])
def test_the_decode_step_reference_applies_the_features_as_its_loop_does(name):
    """decode_step's one-call reference (the first step of a case's loop: its inputs, sinks and scaled queries
    included) equals the loop's own step reference with the features, and differs from plain attention."""
    o = get_op("decode_step")
    params = resolve_params(o.name, o.params, STEP_PARAMS)
    case = next(c for c in o.cases(params, "cpu", "float32") if c.name == name)
    kw = o.inputs(case, params, "cpu")
    got = o.reference(kw, params).tensors["out"]
    s = dl.init_state(o.loop(case, params, True), "cpu")
    assert torch.equal(kw["sinks"], s.extra["sinks"]) and torch.equal(kw["alibi_slopes"], s.extra["alibi_slopes"])
    st = dl.next_step(s, 0, "float32")
    assert torch.equal(kw["q"], st.q)
    q_ref, k_ref = dl.rotated(st, len(s.lens), dl.rope_params(params), s.shape.D)
    dl.advance(s, st, *dl.new_rows(s, st, k_ref))
    assert torch.allclose(got, dl.attend_history(s, q_ref, "float32")[0], rtol=1e-12, atol=1e-12)
    plain = ac.attend(q_ref, s.ref_k, s.ref_v, s.scale, ac.head_map(s.shape.Hq, s.shape.Hkv))
    assert not torch.allclose(got, plain, atol=1e-3)


def _pipeline(attention: str, window: int, steps: int):
    entries = {
        "kv_append": f"{CHECKS / 'kv_append' / 'correct_per_token.py'}:entry",
        "attention.decode_paged": attention,
    }
    params = {**ALL, "window": window, "block_size": 16, "head_dim": 64}
    return verify_pipeline(entries, params, "cpu", steps=steps, progress=False)


def test_the_feature_kernel_passes_a_decode_pipeline_and_a_window_bug_shows_where_kv_len_passes_it(tmp_path):
    """The catalogue's paged feature kernel runs a decode pipeline with every feature on (window 60: no
    sequence starts past it); the same kernel with the window one key too wide (bug_window_one_too_wide.py's
    bug, in the paged kernel) is caught at step 3, where one sequence's kv_len first passes the window."""
    correct = CHECKS / "attention_decode_paged" / "correct_features_paged.py"
    r = _pipeline(f"{correct}:entry", 60, 5)
    assert r.cases_run == 1 and not r.findings, [f.message for f in r.findings]
    src = correct.read_text()
    assert src.count("lo = tl.maximum(kv_len - window, 0)") == 1
    bug = tmp_path / "window_one_too_wide_paged.py"
    bug.write_text(src.replace("lo = tl.maximum(kv_len - window, 0)", "lo = tl.maximum(kv_len - window - 1, 0)"))
    r = _pipeline(f"{bug}:entry", 60, 5)
    assert [(f.check, f.bug_class) for f in r.findings] == [("pipeline-attention", "wrong-output")], r.findings
    assert r.findings[0].message.startswith(f"step {dl.WINDOW_CROSSING_STEP}: "), r.findings[0].message
    assert "(kv_len=61)" in r.findings[0].message
    r = _pipeline(f"{CHECKS / 'attention_decode_paged' / 'bug_sink_kv_head.py'}:entry", 60, 2)  # the KV head's sink
    assert [(f.check, f.bug_class) for f in r.findings] == [("pipeline-attention", "wrong-output")], r.findings


def test_the_structural_status_names_each_feature_switched_on():
    entry = f"{CHECKS / 'attention_decode' / 'correct_features.py'}:entry"
    r = verify("attention.decode", entry, {"window": 8, "sinks": True}, "cpu", only="structural", progress=False)
    assert r.structural.status == "not-analysed" and not r.findings
    assert r.structural.cause == (
        "not analysed for sliding window (param window), attention sinks (param sinks): "
        "the structural analysis does not model them"
    )
    step = f"{CHECKS / 'decode_step' / 'correct_features_step.py'}:entry"  # the fused step: the same rule
    r = verify("decode_step", step, {"logit_cap": 20.0, "alibi": True}, "cpu", only="structural", progress=False)
    assert r.structural.status == "not-analysed" and not r.findings
    assert r.structural.cause.startswith("not analysed for soft-cap (param logit_cap), ALiBi (param alibi): ")


def _case(op, params, name):
    o = get_op(op)
    return next(c for c in o.cases(resolve_params(op, o.params, params), "cpu", "float32") if c.name == name)


# (op, file, params, the case where the bug shows, the class it must be named with; None: correct)
STEP_PARAMS = {"block_size": 16, **ALL, "window": 24, "steps": 24}  # the decode_step catalogue's feature params
FEATURE_KERNELS = [
    ("attention.decode", "correct_features", ALL, "window-edge", None),
    ("attention.decode", "correct_features", ALL, "sink-dominates", None),
    ("attention.decode", "bug_window_one_too_wide", ALL, "window-edge", "window-mask"),
    ("attention.decode", "bug_softcap_before_scale", {**ALL, "sinks": False}, "cap-saturation", "soft-cap"),
    ("attention.decode", "bug_alibi_slope_kv_head", ALL, "alibi-ends", "alibi"),
    ("attention.decode", "bug_sink_every_tile", ALL, "sink-dominates", "wrong-output"),
    ("attention.decode_paged", "correct_features_paged", {"block_size": 16, **ALL}, "window-edge", None),
    ("attention.decode_paged", "bug_sink_kv_head", {"block_size": 16, **ALL}, "alibi-ends", "attention-sink"),
    # decode_step's feature kernels run their whole plan in the catch matrix; here the loop where the cap saturates
    ("decode_step", "bug_step_softcap_before_scale", {**STEP_PARAMS, "sinks": False}, "cap-saturation", "soft-cap"),
]


@pytest.mark.parametrize(
    "op, name, params, case, cls", FEATURE_KERNELS, ids=[f"{k[1]}-{k[3]}" for k in FEATURE_KERNELS]
)
def test_feature_kernel_at_its_edge_case(op, name, params, case, cls):
    folder = op.replace(".", "_")
    entry = f"{CHECKS / folder / name}.py:entry"
    c = _case(op, params, case)
    r = verify(op, entry, params, "cpu", case_json=json.dumps(c.to_json()), progress=False)
    assert r.cases_run == 1
    if cls is None:
        assert not r.findings, [f.message for f in r.findings]
    else:
        assert cls in {f.bug_class for f in r.findings}, [(f.bug_class, f.message) for f in r.findings]


# a decode_step entry: the catalogue's rope and kv_append kernels, then the paged feature attention (whose
# source, its entry renamed `attention`, comes first in the file)
STEP = """
import importlib.util

def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

_rope = _load("_step_rope", {rope!r})
_append = _load("_step_append", {append!r})

def entry(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale, alibi_slopes=None,
          sinks=None):
    q_rot, k_rot = _rope.entry(q, k, positions)
    _append.entry(k_rot, v, k_cache, v_cache, slot_mapping)
    return attention(q_rot, k_cache, v_cache, block_tables, kv_lens, scale, alibi_slopes, sinks)
"""


def test_decode_step_takes_the_features_and_a_window_bug_shows_where_kv_len_passes_it(tmp_path):
    """The decode_step op takes the features: a step composed of the catalogue's kernels with the paged
    feature attention verifies clean; with the window one key too wide, the loop fails at the step where the
    sequence added to cross the window first passes it."""
    params = {**ALL, "window": 60, "steps": 5}
    src = (CHECKS / "attention_decode_paged" / "correct_features_paged.py").read_text()
    assert src.count("def entry(") == 1 and src.count("lo = tl.maximum(kv_len - window, 0)") == 1
    src = src.replace("def entry(", "def attention(")
    bug = src.replace("lo = tl.maximum(kv_len - window, 0)", "lo = tl.maximum(kv_len - window - 1, 0)")
    rope, append = CHECKS / "rope" / "correct_neox.py", CHECKS / "kv_append" / "correct_per_token.py"
    c = _case("decode_step", params, "decode-loop")
    assert c.dims["start_lens"] == [0, 17, 60 - dl.WINDOW_CROSSING_STEP]
    found = {}
    for name, attention in (("correct", src), ("bug", bug)):
        step = tmp_path / f"step_{name}.py"
        step.write_text(attention + STEP.format(rope=str(rope), append=str(append)))
        r = verify("decode_step", f"{step}:entry", params, "cpu", case_json=json.dumps(c.to_json()), progress=False)
        assert r.cases_run == 1
        found[name] = r.findings
    assert not found["correct"], [f.message for f in found["correct"]]
    assert [f.bug_class for f in found["bug"]] == ["window-mask"], [(f.bug_class, f.message) for f in found["bug"]]
    assert found["bug"][0].message.startswith(f"step {dl.WINDOW_CROSSING_STEP}: "), found["bug"][0].message
