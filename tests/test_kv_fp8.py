"""FP8 KV caches (docs/ops.md, "FP8 KV caches"): the params and their validation, the quantise-on-write
definition at the format's edges (saturation, subnormals, ties, a carry into the exponent) against
hand-computed bytes, the 1-ulp window only where float32 arithmetic reaches a rounding boundary, the
attention reference that dequantises the stored bytes and its tolerance, the named bugs, the structural
status, the pipeline's refusal, and the catalogue's FP8 kernels at the cases where FP8 matters (real Triton
kernels under the interpreter, one case each)."""

import json

import pytest
import torch
from conftest import CHECKS, REPO

from kernalin_ci.errors import UsageError
from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops import get_op
from kernalin_ci.ops import kv_quant as kq
from kernalin_ci.ops.base import TOLERANCE, resolve_params
from kernalin_ci.runtime.poison import bits, fill_canary, is_canary
from kernalin_ci.verify import pipeline_params, verify, verify_pipeline
from kernalin_ci.verify.reference import check_reference

E4M3 = {"kv_dtype": "fp8_e4m3", "kv_scale": "per-head"}
E5M2 = {"kv_dtype": "fp8_e5m2", "kv_scale": "per-head"}
KERNELS = REPO / "tests" / "kernels"


def params(op, **raw):
    return resolve_params(op, get_op(op).params, raw)


def test_params_off_by_default_and_validated():
    """Unset, no op gets scales or an FP8 cache; a bad format, a bad scale kind, or kv_scale alone is exit 2."""
    for op in ("kv_append", "attention.decode", "attention.decode_paged"):
        p = params(op)
        assert p["kv_dtype"] is None and p["kv_scale"] is None
        o = get_op(op)
        kw = o.inputs(o.probe(p, None), p, "cpu")
        assert "k_scale" not in kw and kw["k_cache"].dtype == torch.float32
        for bad, why in (({"kv_dtype": "fp8"}, "must be one of"), ({"kv_scale": "per-head"}, "needs kv_dtype")):
            with pytest.raises(UsageError, match=why):
                params(op, **bad)
        with pytest.raises(UsageError, match="must be one of"):
            params(op, kv_dtype="fp8_e4m3", kv_scale="per-token")
    assert kq.spec_of(params("kv_append", kv_dtype="fp8_e5m2")) == kq.KvQuant("fp8_e5m2", False)


def test_inputs_carry_fp8_caches_and_scales():
    """The caches are FP8; per-head scales differ per head and V's are not K's; the probe's scales are 1."""
    for op in ("kv_append", "attention.decode", "attention.decode_paged"):
        o = get_op(op)
        p = params(op, **E4M3)
        case = next(c for c in o.cases(p, "cpu", None) if c.name == "fp8-edges")
        kw = o.inputs(case, p, "cpu")
        hkv = case.dims["Hkv"]
        assert kw["k_cache"].dtype == torch.float8_e4m3fn and kw["v_cache"].dtype == torch.float8_e4m3fn
        ks, vs = kw["k_scale"], kw["v_scale"]
        assert ks.dtype == torch.float32 and ks.shape == (hkv,) and len(set(ks.tolist())) == hkv
        assert torch.equal(vs, 2 * ks)  # fp8-edges: powers of two
        probe = o.inputs(o.probe(p, None), p, "cpu")
        assert probe["k_scale"].tolist() == probe["v_scale"].tolist() == [1.0] * probe["k_scale"].numel()
        pt = params(op, kv_dtype="fp8_e5m2")
        kw = o.inputs(o.cases(pt, "cpu", None)[0], pt, "cpu")
        assert kw["k_scale"].shape == (1,) and kw["k_cache"].dtype == torch.float8_e5m2


@pytest.mark.parametrize(
    "fmt, quotient, byte",
    [
        ("fp8_e4m3", 448.0, 0x7E),  # the largest normal
        ("fp8_e4m3", 470.4, 0x7E),  # past it: saturates (round-to-nearest would give 480, which is NaN's byte)
        ("fp8_e4m3", -1792.0, 0xFE),  # 4x past it, negative
        ("fp8_e4m3", 31.5, 0x60),  # the top of a binade rounds into the next: 32
        ("fp8_e4m3", 4.25, 0x48),  # a tie between 4 and 4.5: to even (4)
        ("fp8_e4m3", 2.0**-6, 0x08),  # the smallest normal
        ("fp8_e4m3", 2.0**-9, 0x01),  # the smallest subnormal
        ("fp8_e4m3", 2.0**-10, 0x00),  # half of it: a tie, to even (0)
        ("fp8_e4m3", -1.5 * 2.0**-9, 0x82),  # 1.5 of it: a tie, to even (2 subnormal steps)
        ("fp8_e5m2", 57344.0, 0x7B),
        ("fp8_e5m2", 70000.0, 0x7B),  # saturates, never inf (0x7C)
        ("fp8_e5m2", 2.0**-16, 0x01),
        ("fp8_e5m2", 2.0**-17, 0x00),
    ],
)
def test_quantise_on_write_at_the_edges(fmt, quotient, byte):
    """satfinite_rn of the quotient, bit for bit; with a power-of-two scale there is exactly one value."""
    q = kq.KvQuant(fmt, False)
    scale = torch.tensor([0.25])
    x = torch.full((1, 1, 1), quotient * 0.25, dtype=torch.float64)
    lo, hi = kq.expected_bytes(x, scale, q)
    assert lo.view(torch.uint8).item() == byte and hi.view(torch.uint8).item() == byte


def test_one_ulp_only_within_float32_reach_of_a_boundary():
    """A non-power-of-two scale: a quotient 2^-24 from the tie 4.25 accepts 4 and 4.5; one 2^-10 from it only
    its own rounding."""
    q = kq.KvQuant("fp8_e4m3", False)
    scale = torch.tensor([0.3], dtype=torch.float32)
    s = float(scale)
    near = torch.tensor([[[4.25 * (1 + 2.0**-24) * s]]], dtype=torch.float64)
    lo, hi = kq.expected_bytes(near, scale, q)
    assert {lo.view(torch.uint8).item(), hi.view(torch.uint8).item()} == {0x48, 0x49}
    far = torch.tensor([[[4.25 * (1 + 2.0**-10) * s]]], dtype=torch.float64)
    lo, hi = kq.expected_bytes(far, scale, q)
    assert lo.item() == hi.item() == 0x49


def _append_case(params_, name="fp8-edges"):
    op = get_op("kv_append")
    case = next(c for c in op.cases(params_, "cpu", None) if c.name == name)
    kw = op.inputs(case, params_, "cpu")
    return op, case, kw


def _write(kw, params_, cache, src, scale_name, convert):
    """Write every non-padding token of `src` into `cache` as `convert(x, scale)` gives it (nhd layout)."""
    bs = params_["block_size"]
    for t, s in enumerate(kw["slot_mapping"].tolist()):
        if s >= 0:
            kw[cache][s // bs, s % bs] = convert(kw[src][t : t + 1].double(), kw[scale_name])[0]


def _quant(q):
    return lambda x, s: kq.round_to(x / kq.per_head(s, x.shape[1]).reshape(1, -1, 1), q)


@pytest.mark.parametrize(
    "bug, cls",
    [
        (None, None),
        ("first-head", "kv-scale"),
        ("multiplied", "kv-scale"),
        ("other-scale", "kv-scale"),
        ("no-saturation", "kv-saturation"),
        ("from-key", "kv-source"),
    ],
)
def test_append_check_names_scale_and_saturation_bugs(bug, cls):
    """The exact check of a written FP8 cache: the correct bytes pass; a known bug is named."""
    p = params("kv_append", **E5M2)
    q = kq.spec_of(p)
    op, case, kw = _append_case(p)
    before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    good = _quant(q)

    def wrong(x, s):
        hkv = x.shape[1]
        sh = kq.per_head(s, hkv).reshape(1, -1, 1)
        if bug == "first-head":
            return kq.round_to(x / sh[:, :1], q)
        if bug == "multiplied":
            return kq.round_to(x * sh, q)
        if bug == "other-scale":
            return kq.round_to(x / (sh * 1.0 / 2.0), q)  # K's scale where V's belongs (fp8-edges: V's = 2 K's)
        out = kq.round_to(x / sh, q)
        if bug == "no-saturation":
            past = (x / sh).abs() > q.max
            out = out.clone()
            bits(out)[past] = torch.where((x / sh)[past] > 0, 0x7C, -4).to(torch.int8)  # +inf / -inf
        return out

    _write(kw, p, "k_cache", "key", "k_scale", good)
    if bug == "from-key":  # the value cache written from the key, with V's scale
        _write(kw, p, "v_cache", "key", "v_scale", good)
    else:
        _write(kw, p, "v_cache", "value", "v_scale", good if bug is None else wrong)
    findings = op.check(case, before, kw, op.outputs(None, kw), p)
    if cls is None:
        assert not findings, [f.message for f in findings]
    else:
        assert [f.bug_class for f in findings] == [cls], [(f.bug_class, f.message) for f in findings]
        assert findings[0].message.startswith("v_cache")


def test_fp8_canaries():
    """Poisoned FP8 tensors hold a NaN byte the saturating conversion never produces, and are seen as such."""
    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        t = fill_canary(torch.empty(8, dtype=dt))
        assert bool(is_canary(t).all()) and bool(torch.isnan(t.float()).all())
        assert not bool(
            is_canary(
                kq.round_to(
                    torch.tensor([1e9, -1e9, 0.0]),
                    kq.KvQuant("fp8_e4m3" if dt == torch.float8_e4m3fn else "fp8_e5m2", False),
                )
            ).any()
        )


@pytest.mark.parametrize("op", ["attention.decode", "attention.decode_paged"])
def test_attention_reference_dequantises_and_names_the_scale_bugs(op):
    """The reference equals plain float64 attention over the stored bytes times their head's scale, at the
    dtype's own tolerance (the bytes are read exactly: an output 1% off fails); an output computed with K's
    scale for V, or the first head's scale for every head, is a kv-scale finding, the right one passes."""
    o = get_op(op)
    p = params(op, **({"block_size": 16} if op.endswith("paged") else {}), **E4M3)
    case = next(c for c in o.cases(p, "cpu", None) if c.name == "gqa-8")
    kw = o.inputs(case, p, "cpu")
    exp = o.reference(kw, p)
    assert exp.tolerance is None
    lens = kw["kv_lens"].tolist()
    hq, hkv = kw["q"].shape[1], case.dims["Hkv"]
    if op.endswith("paged"):
        kc, vc, tb = kw["k_cache"], kw["v_cache"], kw["block_tables"]

        def rows(c, b, L):
            j = torch.arange(L)
            return c[tb[b, j // 16].long(), j % 16].permute(1, 0, 2)
    else:
        kc, vc = kw["k_cache"], kw["v_cache"]

        def rows(c, b, L):
            return c[b, :, :L]

    def attn(kscale, vscale):
        K = [rows(kc, b, L).double() * kscale.double().reshape(-1, 1, 1) for b, L in enumerate(lens)]
        V = [rows(vc, b, L).double() * vscale.double().reshape(-1, 1, 1) for b, L in enumerate(lens)]
        return ac.attend(kw["q"], K, V, kw["scale"], ac.head_map(hq, hkv))

    assert torch.allclose(exp.tensors["out"], attn(kw["k_scale"], kw["v_scale"]), rtol=1e-12, atol=1e-12)
    assert check_reference(o, case, kw, {"out": exp.tensors["out"].float()}, p, {}) == []
    assert check_reference(o, case, kw, {"out": (exp.tensors["out"] * 1.01).float()}, p, {}) != []
    assert TOLERANCE["float32"] < 0.01
    for ks, vs in ((kw["k_scale"], kw["k_scale"]), (kw["k_scale"][:1], kw["v_scale"][:1])):
        found = check_reference(o, case, kw, {"out": attn(ks, vs).float()}, p, {})
        assert [f.bug_class for f in found] == ["kv-scale"], [f.message for f in found]


def test_structural_status():
    """The structural analysis says it does not analyse FP8 caches."""
    for op in ("kv_append", "attention.decode", "attention.decode_paged", "decode_step"):
        assert get_op(op).unanalysed(params(op, **E4M3)) == ["FP8 caches (param kv_dtype=fp8_e4m3)"]
        assert get_op(op).unanalysed(params(op)) == []


def test_the_decode_loop_stores_and_reads_an_fp8_cache():
    """A loop with an FP8 cache: FP8 caches, per-head scales passed to every member, the prefill stored as
    kv_append quantises it and the history what those bytes dequantise to; a slot holding the token quantised
    with a wrong scale is named kv-scale, one within the window a correct kernel may store is not."""
    from kernalin_ci.ops import decode_loop as dl

    p = pipeline_params({"kv_append": "a", "attention.decode_paged": "b"}, {**E4M3, "head_dim": 64})
    loop = dl.pipeline_loop(p, "float32", 0, 2, rope=False)
    s = dl.init_state(loop, "cpu")
    assert s.k_cache.dtype == torch.float8_e4m3fn and s.kv_scales["k_scale"].shape == (2,)
    st = dl.next_step(s, 0, "float32", loop.padding)
    assert {"k_scale", "v_scale"} <= set(dl.step_arguments(s, st, "cpu"))
    ks, vs = s.kv_scales["k_scale"], s.kv_scales["v_scale"]
    kc = s.k_cache
    b, L = 1, s.lens[1]
    j = torch.arange(L)
    stored = kc[s.tables_cpu[b, j // 16].long(), j % 16]
    assert torch.equal(stored, kq.quantise(stored.double() * ks[None, :, None].double(), ks, kq.spec_of(p), 1))
    assert torch.equal(s.ref_k[b], kq.dequantise(stored.permute(1, 0, 2), ks))
    k_rows, _ = dl.step_writes(s, st, dl.rope_params(p), 64)
    right = kq.quantise(k_rows.rows[:1], ks, kq.spec_of(p), 1)[0]
    assert k_rows.holds(0, right, TOLERANCE["float32"])
    wrong = kq.quantise(k_rows.rows[:1], vs, kq.spec_of(p), 1)[0]
    assert not k_rows.holds(0, wrong, TOLERANCE["float32"])
    assert [c for c, alt in k_rows.alternatives if alt.holds(0, wrong, TOLERANCE["float32"])] == ["kv-scale"]


def test_the_decode_step_reference_reads_the_fp8_cache_as_the_loop_does():
    """decode_step's one-call reference (the first step of its loop) over an FP8 cache equals the loop's own
    step reference: the cache read with its scales, the new token quantised as it is stored, the FP8 slack."""
    from kernalin_ci.ops import decode_loop as dl

    o, p = get_op("decode_step"), params("decode_step", **E4M3)
    case = o.cases(p, "cpu", None)[0]
    kw = o.inputs(case, p, "cpu")
    assert kw["k_cache"].dtype == torch.float8_e4m3fn and kw["k_scale"].shape == (case.dims["Hkv"],)
    exp = o.reference(kw, p)
    loop = o.loop(case, p, True)
    s = dl.init_state(loop, "cpu")
    st = dl.next_step(s, 0, case.dtype)
    q_ref, k_ref = dl.rotated(st, len(s.lens), loop.rope, loop.shape.D)
    stored = [s.history(s.stored(x, n), n).permute(1, 0, 2) for x, n in ((k_ref, "k"), (st.v, "v"))]
    dl.advance(s, st, *stored)
    want, slack, _ = dl.attend_history(s, q_ref, case.dtype)
    assert torch.allclose(exp.tensors["out"], want, rtol=1e-12, atol=1e-12)
    assert torch.allclose(exp.row_slack["out"], slack) and bool((slack > 0).any())


def _fp8_pipeline(append: str, fmt: dict):
    entries = {
        "kv_append": f"{CHECKS / 'kv_append' / append}.py:entry",
        "attention.decode_paged": f"{CHECKS / 'attention_decode_paged' / 'correct_fp8_folded_scales'}.py:entry",
    }
    return verify_pipeline(entries, {**fmt, "head_dim": 64}, "cpu", steps=2, progress=False)


def test_a_decode_pipeline_runs_with_an_fp8_cache():
    """The catalogue's FP8 kv_append and paged attention run a decode pipeline over an e4m3 cache with per-head
    scales: no finding (e5m2 and per-tensor scales: the fused step below)."""
    r = _fp8_pipeline("correct_fp8_per_head", E4M3)
    assert r.cases_run == 1 and not r.findings, [f.message for f in r.findings]


def test_a_decode_pipeline_names_an_append_with_the_first_heads_scale():
    r = _fp8_pipeline("bug_fp8_scale_first_head", E4M3)
    assert [(f.check, f.bug_class) for f in r.findings] == [("pipeline-cache", "kv-scale")], r.findings
    assert "(quantised with the first head's scale for every head" in r.findings[0].message, r.findings[0].message


def _fp8_step(path, fmt: dict):
    p = {**fmt, "steps": 3}
    o = get_op("decode_step")
    c = o.cases(params("decode_step", **p), "cpu", None)[0]
    return verify("decode_step", f"{path}:entry", p, "cpu", case_json=json.dumps(c.to_json()), progress=False)


def test_a_fused_fp8_decode_step_passes_its_loop():
    """tests/kernels/decode_step_fp8.py over an e5m2 cache with per-tensor scales: no finding."""
    r = _fp8_step(KERNELS / "decode_step_fp8.py", {"kv_dtype": "fp8_e5m2"})
    assert r.cases_run == 1 and not r.findings, [f.message for f in r.findings]


def test_a_fused_step_appending_with_vs_scale_while_attention_reads_ks_is_caught(tmp_path):
    """The fused FP8 step that quantises the new key with V's scale while its attention reads the key with
    K's: the only check of a fused step is its loop, and the loop names the slot's scale."""
    src = (KERNELS / "decode_step_fp8.py").read_text()
    assert src.count("/ ks).to(KC.dtype.element_ty)") == 2
    bug = tmp_path / "decode_step_fp8_append_v_scale.py"
    bug.write_text(src.replace("/ ks).to(KC.dtype.element_ty)", "/ vs).to(KC.dtype.element_ty)"))
    r = _fp8_step(bug, E4M3)
    assert [(f.check, f.bug_class) for f in r.findings] == [("decode-step-cache", "kv-scale")], r.findings
    assert r.findings[0].message.startswith("step 0: k_cache slot"), r.findings[0].message
    assert r.findings[0].message.endswith("(quantised with the other cache's scale)"), r.findings[0].message


TOKEN_HEAD = {"kv_dtype": "fp8_e4m3", "kv_scale": "per-token-head"}


def test_per_token_head_scales_are_kv_appends_only():
    """kv_append takes per-token-head scales (the kernel computes them); the attention ops, decode_step and a
    decode pipeline read given scales: one line, exit 2."""
    o = get_op("kv_append")
    p = params("kv_append", **TOKEN_HEAD)
    assert o.written_names(p) == ("k_cache", "v_cache", "k_scale", "v_scale")
    assert "fp8-edges" not in {c.name for c in o.cases(p, "cpu", None)}
    for op in ("attention.decode", "attention.decode_paged", "decode_step"):
        with pytest.raises(UsageError, match="per-token-head: only kv_append takes it"):
            params(op, **TOKEN_HEAD)
    with pytest.raises(UsageError, match="per-token-head: only kv_append takes it"):
        pipeline_params({"kv_append": "a", "attention.decode_paged": "b"}, TOKEN_HEAD)


def _token_head_call(o, p, case, write):
    """kv_append's check of a call that `write(name, x [Hkv, D] float64, slot) -> (fp8 row, scales)` made."""
    kw = o.inputs(case, p, "cpu")
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    bs = p["block_size"]
    for t, slot in enumerate(kw["slot_mapping"].tolist()):
        if slot < 0:
            continue
        for cache, src, sname in (("k_cache", "key", "k_scale"), ("v_cache", "value", "v_scale")):
            row, sc = write(cache, kw[src][t].double(), kw)
            kw[cache][slot // bs, slot % bs] = row
            kw[sname][slot // bs, slot % bs] = sc
    return o.check(case, before, kw, o.outputs(None, kw), p)


def test_per_token_head_check_holds_the_scales_and_names_a_row_quantised_with_the_other_scale():
    """A write of each row quantised with its own max |x| / 448 passes; the value quantised with the key's scale
    is kv-scale, a scale 1 % off is kv-scale, a scale written past the slot a stray write."""
    o = get_op("kv_append")
    p = params("kv_append", **TOKEN_HEAD)
    case = next(c for c in o.cases(p, "cpu", None) if c.name == "odd-heads")
    q = kq.spec_of(p)

    def right(cache, x, kw):
        s = kq.token_head_scales(x[None], q)[0]
        return kq.round_to(x / s.double()[:, None], q), s

    assert _token_head_call(o, p, case, right) == []
    scales = {}

    def v_with_k_scale(cache, x, kw):
        row, s = right(cache, x, kw)
        if cache == "k_cache":
            scales["k"] = s
            return row, s
        return kq.round_to(x / scales["k"].double()[:, None], q), s

    found = _token_head_call(o, p, case, v_with_k_scale)
    assert [f.bug_class for f in found] == ["kv-scale"], found
    assert "written slots hold value quantised with the k_scale stored beside it" in found[0].message, found
    found = _token_head_call(o, p, case, lambda c, x, kw: (right(c, x, kw)[0], right(c, x, kw)[1] * 1.01))
    assert {f.bug_class for f in found} == {"kv-scale"} and "max |key| / 448" in found[0].message, found

    used = set(o.inputs(case, p, "cpu")["slot_mapping"].tolist())
    free = next(i for i in range(10**4) if i not in used)

    def stray(cache, x, kw):
        kw["v_scale"].view(-1, kw["v_scale"].shape[-1])[free, 0] = 1.0  # a slot no token writes
        return right(cache, x, kw)

    assert [f.bug_class for f in _token_head_call(o, p, case, stray)] == ["stray-write"]


FP8_KERNELS = [
    ("kv_append", "correct_fp8_per_head", E4M3, "fp8-edges", None),
    ("kv_append", "correct_fp8_per_head", E5M2, "fp8-edges", None),
    ("kv_append", "bug_fp8_scale_first_head", E4M3, "heads", "kv-scale"),
    ("kv_append", "bug_fp8_scale_multiplied", E4M3, "slots", "kv-scale"),
    ("kv_append", "bug_fp8_no_saturation", E5M2, "fp8-edges", "kv-saturation"),
    ("attention.decode", "correct_fp8_cache", E4M3, "fp8-edges", None),
    ("attention.decode", "bug_fp8_k_scale_for_v", E4M3, "gqa-8", "kv-scale"),
    ("attention.decode_paged", "correct_fp8_folded_scales", {"block_size": 16, **E5M2}, "fp8-edges", None),
    ("attention.decode_paged", "bug_fp8_scale_head_zero", {"block_size": 16, **E5M2}, "gqa-8", "kv-scale"),
]


@pytest.mark.parametrize("op, name, params_, case, cls", FP8_KERNELS, ids=[f"{k[1]}-{k[3]}" for k in FP8_KERNELS])
def test_fp8_kernel_at_its_case(op, name, params_, case, cls):
    """The catalogue's FP8 kernels, one case each, through the worker (the interpreter's FP8 patch on)."""
    o = get_op(op)
    c = next(c for c in o.cases(params(op, **params_), "cpu", None) if c.name == case)
    entry = f"{CHECKS / op.replace('.', '_') / name}.py:entry"
    r = verify(op, entry, params_, "cpu", case_json=json.dumps(c.to_json()), progress=False)
    assert r.cases_run == 1
    if cls is None:
        assert not r.findings, [f.message for f in r.findings]
    else:
        assert cls in {f.bug_class for f in r.findings}, [(f.bug_class, f.message) for f in r.findings]


def test_benchmark_rounds_build_fp8_inputs_anew():
    """A benchmark round does not redraw an FP8 cache and its scales as standard normal (a negative scale, a
    float8 normal_): with kv_dtype set the op builds each round's inputs anew, and base and head agree bit for
    bit on them."""
    from kernalin_ci.bench.pair import bench_pair

    assert get_op("kv_append").redraws(params("kv_append")) is True
    assert get_op("kv_append").redraws(params("kv_append", **E4M3)) is False
    assert get_op("attention.decode").redraws(params("attention.decode", **E4M3)) is False
    entry = "kv_append/correct_fp8_per_head.py:entry"
    r = bench_pair(
        "kv_append",
        entry,
        entry,
        str(CHECKS),
        str(CHECKS),
        {"tokens": 6, **E4M3},
        "cpu",
        reps=2,
        max_rounds=2,
        adaptive=False,
    )
    assert not r.failed, r.error
