"""Decode tokens/s and $/Mtok (docs/tokens.md): the `model:` section and --model, the arithmetic and its
posterior, the decode step's shapes (torch and the example kernels under the interpreter, in the
worker), and the report. The timing itself is GPU-only (benchmarks/model_step_check.py); on the CPU
every report says "not measured (no GPU: ...)".
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import cmarkgfm
import jsonschema
import numpy as np
import pytest
import torch

from kernalin_ci import config
from kernalin_ci.errors import UsageError
from kernalin_ci.gate.run import check_model
from kernalin_ci.report.markdown import render_markdown
from kernalin_ci.report.model import KernelReport, Report
from kernalin_ci.report.schema import REPORT_SCHEMA
from kernalin_ci.report.tokens import change, dollars, rate, text_lines
from kernalin_ci.report.writer import report_json
from kernalin_ci.throughput import cost
from kernalin_ci.throughput import step as st
from kernalin_ci.throughput.bench import NOT_MEASURED_CPU, Role, bench_model
from kernalin_ci.throughput.result import ModelResult
from kernalin_ci.throughput.spec import PRESETS, ModelSpec, ServingPoint, from_cli

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "decode-kernels"
TRACE = Path(__file__).resolve().parent / "data" / "gpu-traces" / "timings_attn.npz"
KERNELS = (
    "kernels:\n  - {name: paged, op: attention.decode_paged, entry: k.py:f}\n  - {name: r, op: rope, entry: r.py:f}\n"
)


# ---------------------------------------------------------------------------------------- configuration


def test_presets_are_the_published_shapes_and_the_section_overrides_them():
    cfg = config.parse(
        KERNELS + "model:\n  preset: llama-3.1-70b\n  serving: [{batch: 8, context: 1024}]\n"
        "  gpu_price_per_hour: 2.25\n"
    )
    m = cfg.model
    assert (
        m.layers,
        m.hidden_size,
        m.num_heads,
        m.num_kv_heads,
        m.head_dim,
        m.intermediate_size,
        m.vocab_size,
        m.dtype,
    ) == (80, 8192, 64, 8, 128, 28672, 128256, "bfloat16")
    assert m.serving == [ServingPoint(8, 1024)] and m.price_per_hour == 2.25
    assert m.kernels == {"attention": "paged", "rope": "r"}  # the only kernel of each op; no kv_append: torch
    assert PRESETS["qwen2.5-7b"]["hidden_size"] == 28 * 128 and PRESETS["mistral-7b"]["vocab_size"] == 32768
    custom = config.parse(KERNELS + "model: {preset: mistral-7b, layers: 4}\n").model
    assert custom.layers == 4 and custom.name == "mistral-7b (modified)"
    assert from_cli("Qwen2.5-7B").shape()["layers"] == 28
    assert config.parse(KERNELS).model is None


@pytest.mark.parametrize(
    "text, where, message",
    [
        ("model: {preset: gpt-9}", "model.preset", "unknown preset 'gpt-9'"),
        ("model: {layers: 2, hidden_size: 64}", "model", "missing num_heads"),
        ("model: {preset: mistral-7b, num_kv_heads: 5}", "model.num_kv_heads", "not a multiple"),
        ("model: {preset: mistral-7b, layers: 0}", "model.layers", "positive integer"),
        ("model: {preset: mistral-7b, dtype: int8}", "model.dtype", "must be one of"),
        ("model: {preset: mistral-7b, serving: []}", "model.serving", "non-empty list"),
        ("model: {preset: mistral-7b, serving: [{batch: 4}]}", "model.serving[0].context", "{batch: N, context: N}"),
        ("model: {preset: mistral-7b, gpu_price_per_hour: 0}", "model.gpu_price_per_hour", "positive number"),
        ("model: {preset: mistral-7b, kernels: {attention: r}}", "model.kernels.attention", "is rope"),
        ("model: {preset: mistral-7b, kernels: {attention: nope}}", "model.kernels.attention", "no kernel named"),
        ("model: {preset: mistral-7b, tokens: 3}", "model.tokens", "unknown key"),
    ],
)
def test_a_bad_model_section_is_one_line_naming_file_line_and_key(text, where, message):
    with pytest.raises(UsageError) as e:
        config.parse(KERNELS + text + "\n", "cfg.yml")
    assert str(e.value).startswith(f"cfg.yml:4: {where}: ") and message in str(e.value) and "\n" not in str(e.value)


def test_several_kernels_of_one_op_need_a_name():
    two = KERNELS + "  - {name: paged2, op: attention.decode_paged, entry: k.py:g}\n"
    with pytest.raises(UsageError, match="several attention.decode_paged kernels"):
        config.parse(two + "model: {preset: mistral-7b}\n")
    assert config.parse(two + "model: {preset: mistral-7b, kernels: {attention: paged2}}\n").model.kernels == {
        "attention": "paged2",
        "rope": "r",
    }


def test_model_file_and_bad_cli_values_exit_2_with_one_line(tmp_path):
    f = tmp_path / "m.yml"
    f.write_text(
        "layers: 2\nhidden_size: 64\nnum_heads: 4\nnum_kv_heads: 2\nhead_dim: 16\n"
        "intermediate_size: 128\nvocab_size: 256\ndtype: float32\nserving: [{batch: 2, context: 9}]\n"
    )
    spec = from_cli(str(f))
    assert (spec.name, spec.layers, spec.serving) == ("custom", 2, [ServingPoint(2, 9)])
    f.write_text("preset: llama-3.1-8b\nkernels: {attention: a}\n")
    with pytest.raises(UsageError, match="only in .kernalin.yml"):
        from_cli(str(f))
    for value, msg in (("gpt-9", "neither a preset"), (str(f), "kernels: only in .kernalin.yml")):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "kernalin_ci",
                "bench",
                "--model",
                value,
                "--op",
                "rope",
                "--base",
                "a.py:f",
                "--head",
                "a.py:f",
                "--device",
                "cpu",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=60,
        )
        assert proc.returncode == 2 and msg in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ---------------------------------------------------------------------------------------- arithmetic


def test_tokens_and_cost_from_step_times():
    assert cost.tokens_per_s(10.0, 64) == pytest.approx(6400.0)
    assert cost.usd_per_mtok(3.6, 1000.0) == pytest.approx(1.0)  # $3.60/h = $0.001/s; 1000 tok/s -> $1/Mtok
    assert cost.step_ms([(32 / 2, 0.5), (1.0, 0.25)]) == pytest.approx(8.25)


def test_point_summary_on_an_h200_trace():
    """Real interleaved H200 timings as step times: head ~2.6% less time -> ~2.7% more tokens/s."""
    t = np.load(TRACE)["t"]
    base, head, base2 = t[:, 4], t[:, 0], None
    s = cost.point_summary(base, head, base2, batch=16, price_per_hour=3.5)
    assert s["verdict"] == "faster" and s["p_faster"] > 0.95
    loc_b, loc_h = np.median(base, axis=1), np.median(head, axis=1)
    assert s["base"]["step_ms"] == pytest.approx(loc_b.mean(), rel=1e-3)
    assert s["base"]["tokens_per_s"] == pytest.approx(16 / (s["base"]["step_ms"] / 1e3))
    assert s["head"]["usd_per_mtok"] == pytest.approx(3.5 / 3600 / s["head"]["tokens_per_s"] * 1e6)
    lo, hi = s["tokens_per_s_ratio_hdi"]
    assert 1 < lo < s["tokens_per_s_ratio"] < hi
    assert s["tokens_per_s_ratio"] == pytest.approx(np.exp(np.mean(np.log(loc_b) - np.log(loc_h))), rel=2e-3)
    assert s["tokens_per_s_ratio"] * s["step_ratio"] == pytest.approx(1, abs=2e-3)
    blo, bhi = s["base"]["tokens_per_s_hdi"]
    assert blo < s["base"]["tokens_per_s"] < bhi
    assert s["usd_per_mtok_change"] < 0


# ---------------------------------------------------------------------------------------- the step

TINY = ModelSpec(
    "tiny",
    layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=96,
    vocab_size=50,
    dtype="float32",
    serving=[ServingPoint(3, 21)],
)


def _paged_attention(q, k_cache, v_cache, block_tables, kv_lens, scale):
    """A plain torch paged attention (the op's contract, docs/ops.md) standing in for a kernel."""
    B, Hq, D = q.shape
    bs, Hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    for b in range(B):
        rows = [int(block_tables[b, j // bs]) * bs + j % bs for j in range(int(kv_lens[b]))]
        keys, vals = k_cache.reshape(-1, Hkv, D)[rows], v_cache.reshape(-1, Hkv, D)[rows]
        for h in range(Hq):
            g = h // (Hq // Hkv)
            out[b, h] = torch.softmax(keys[:, g] @ q[b, h] * scale, 0) @ vals[:, g]
    return out


def _kv_append(key, value, k_cache, v_cache, slot_mapping):
    """A plain torch kv_append (docs/ops.md) standing in for a kernel."""
    k_cache.view(-1, *key.shape[1:])[slot_mapping] = key
    v_cache.view(-1, *value.shape[1:])[slot_mapping] = value


@pytest.mark.parametrize("places", ["paged attention kernel", "kv_append kernel, torch attention", "torch"])
def test_the_torch_step_has_the_model_shapes_and_attends_over_context_plus_one(places):
    paged = places != "torch"
    k = {
        "paged attention kernel": st.Kernels(
            attention=_paged_attention, attention_op="attention.decode_paged", block_size=8
        ),
        "kv_append kernel, torch attention": st.Kernels(kv_append=_kv_append, block_size=8),
        "torch": st.Kernels(),
    }[places]
    assert k.paged == paged
    w = st.build_weights(TINY, TINY.layers, "cpu", 0)
    pi = st.build_point(TINY, TINY.serving[0], k, TINY.layers, "cpu", 1)
    B, L, Hq, Hkv, D = 3, 21, 4, 2, 16
    if paged:
        assert pi.block_tables.shape == (B, 3) and pi.block_tables.dtype == torch.int32
        assert pi.caches[0].k.shape == (B * 3 + 1, 8, Hkv, D)
        assert pi.slots.tolist() == [int(pi.block_tables[b, L // 8]) * 8 + L % 8 for b in range(B)]
    else:
        assert pi.caches[0].k.shape == (B, Hkv, L + 1, D)
    assert pi.kv_lens.tolist() == [L + 1] * B and pi.positions.tolist() == [L] * B
    out = st.full_step(TINY, w, pi, k)
    assert out["logits"].shape == (B, 50) and out["attn0"].shape == (B, Hq * D)
    assert torch.isfinite(out["logits"]).all()
    # layer 0 by hand, float64: its attention output over the cache plus the new token
    x = torch.nn.functional.embedding(pi.tokens, w.embed).double()
    xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + st.RMS_EPS)
    lw = w.layers[0]
    q = (xn @ lw.wq.double()).view(B, Hq, D)
    kk = (xn @ lw.wk.double()).view(B, Hkv, D)
    rot = lambda t: st.torch_rope(t, pi.cos.double(), pi.sin.double())  # noqa: E731
    q, kk = rot(q), rot(kk)
    c = pi.caches[0]
    for b in range(B):
        if paged:
            rows = [int(pi.block_tables[b, j // 8]) * 8 + j % 8 for j in range(L + 1)]
            keys = c.k.reshape(-1, Hkv, D)[rows].double()
            vals = c.v.reshape(-1, Hkv, D)[rows].double()
        else:
            keys, vals = c.k[b].transpose(0, 1).double(), c.v[b].transpose(0, 1).double()
        assert torch.allclose(keys[L], kk[b], atol=1e-5)  # the new token's rotated key is in its slot
        for h in range(Hq):
            g = h // (Hq // Hkv)
            p = torch.softmax(keys[:, g] @ q[b, h] * D**-0.5, 0)
            assert torch.allclose(out["attn0"][b, h * D : (h + 1) * D].double(), p @ vals[:, g], atol=1e-4)


def _decode_step(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    """A plain torch decode_step (docs/ops.md: rotate q and k at positions, append, attend) standing in for a
    fused kernel: neox rotation, base 10000."""
    D = q.shape[-1]
    ang = positions.double()[:, None] * 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    cos, sin = ang.cos().float()[:, None], ang.sin().float()[:, None]
    q, k = st.torch_rope(q, cos, sin), st.torch_rope(k, cos, sin)
    _kv_append(k, v, k_cache, v_cache, slot_mapping)
    return _paged_attention(q, k_cache, v_cache, block_tables, kv_lens, scale)


def test_the_decode_step_place_does_what_rope_kv_append_and_attention_do():
    """A decode_step kernel takes the three places at once: it gets q, k, v before rotation and the paged
    caches, and the step computes what the separate places compute."""
    fused = st.Kernels(decode_step=_decode_step, block_size=8)
    separate = st.Kernels(kv_append=_kv_append, block_size=8)  # torch rope, the kv_append, torch paged attention
    assert fused.paged and separate.paged
    w = st.build_weights(TINY, TINY.layers, "cpu", 0)
    outs = []
    for k in (fused, separate):
        pi = st.build_point(TINY, TINY.serving[0], k, TINY.layers, "cpu", 1)
        outs.append((st.full_step(TINY, w, pi, k), pi))
    (a, pa), (b, pb) = outs
    assert torch.allclose(a["attn0"], b["attn0"], atol=1e-5) and torch.allclose(a["logits"], b["logits"], atol=1e-4)
    assert torch.allclose(pa.caches[1].k, pb.caches[1].k, atol=1e-5)  # the rotated new key in its slot, each layer
    with pytest.raises(AssertionError):  # and the comparison can fail: a decode_step that skips the rotation
        no_rope = st.Kernels(
            decode_step=lambda positions, **kw: _decode_step(positions=0 * positions, **kw), block_size=8
        )
        pi = st.build_point(TINY, TINY.serving[0], no_rope, TINY.layers, "cpu", 1)
        assert torch.allclose(st.full_step(TINY, w, pi, no_rope)["attn0"], b["attn0"], atol=1e-5)


def test_a_decode_step_kernel_takes_its_place_alone():
    from kernalin_ci.throughput.bench import check_roles, role_names

    step = Role("decode_step", "decode_step", "fused", "k.py:f", "k.py:f", {"block_size": 32, "layout": "hnd"})
    assert check_roles(from_cli("mistral-7b"), [step])[1] == {
        "attention_op": None,
        "block_size": 32,
        "layout": "hnd",
    }
    assert role_names([step]) == {"decode_step": "fused"}
    rope = Role("rope", "rope", "r", "r.py:f", "r.py:f", {})
    with pytest.raises(UsageError, match=r"fused \(decode_step\) does the rope, kv_append and attention work"):
        check_roles(from_cli("mistral-7b"), [step, rope])
    att = Role("attention", "attention.decode", "dense", "a.py:f", "a.py:f", {})
    app = Role("kv_append", "kv_append", "app", "a.py:g", "a.py:g", {})
    assert role_names([att, app])["kv_append"].startswith("torch (app not used: dense (attention.decode) reads")


@pytest.mark.parametrize("mode", ["full", "per-layer"])
def test_the_timed_rounds_are_the_benchmark_loop_around_the_step(mode):
    """The loop a GPU runs (task._run, device-generic) on the CPU wall clock with torch places: the rounds
    come from the kernel benchmark's own loop (timing.timed_rounds), every instance agrees each round, and an
    instance that computes something else stops the benchmark."""
    from kernalin_ci.bench import stats
    from kernalin_ci.bench.timing import BenchAbort
    from kernalin_ci.jobs import ModelJob
    from kernalin_ci.throughput import task

    k = st.Kernels(attention=_paged_attention, attention_op="attention.decode_paged", block_size=8)
    job = ModelJob(
        spec=TINY,
        reps=2,
        budget_s=600,
        max_rounds=2,
        seed=0,
        l2_flush=True,
        rope=None,
        rope_min=stats.ROPE_MIN,
        mode=mode,
    )
    events = []
    task._run(TINY, [("base", k), ("head", k), ("base2", k)], job, "cpu", events.append)
    kinds = [e["event"] for e in events]
    assert kinds.count("round") == 2 and events[-1] == {**events[-1], "event": "stopped", "reason": "max-rounds"}
    parts = [e["part"] for e in events if e["event"] == "setup"]
    assert parts == (["step"] if mode == "full" else ["layers", "ends"])
    rnd = next(e for e in events if e["event"] == "round")
    assert set(rnd["times"]) == {"base", "head", "base2"} and len(rnd["times"]["head"]) == 1  # one serving point
    assert len(rnd["times"]["head"][0]) == 2 and all(t > 0 for t in rnd["times"]["head"][0])
    assert sorted(rnd["order"][0]) == [0, 1, 2] and rnd["verdict"]["verdict"] in ("equivalent", "inconclusive")

    def scaled(**kw):
        return 1.5 * _paged_attention(**kw)

    wrong = st.Kernels(attention=scaled, attention_op="attention.decode_paged", block_size=8)
    with pytest.raises(BenchAbort, match="head and base disagree on batch 3, context 21 \\(round 1"):
        task._run(TINY, [("base", k), ("head", wrong)], job, "cpu", lambda e: None)


def test_block_layers_reads_far_more_than_the_l2():
    spec = from_cli("llama-3.1-70b")
    assert st.block_layers(spec, st.layer_bytes(spec)) == 2
    assert st.block_layers(TINY, st.layer_bytes(TINY)) == 2  # capped by the model's layers
    assert st.layer_bytes(from_cli("llama-3.1-8b")) == 2 * (
        4096 * 4096 * 2 + 4096 * 1024 * 2 + 4096 * 14336 * 3 + 2 * 4096
    )


def _example_roles(head_root: Path | None = None):
    att = "kernels/paged_attention.py:decode_paged"
    return [
        Role("attention", "attention.decode_paged", "paged_attention", att, att, {"block_size": 16}),
        Role("rope", "rope", "rope", "kernels/rope.py:rope", "kernels/rope.py:rope", {"style": "neox"}),
        Role(
            "kv_append",
            "kv_append",
            "kv_append",
            "kernels/kv_cache.py:append",
            "kernels/kv_cache.py:append",
            {"block_size": 16},
        ),
    ]


def test_the_step_runs_the_example_kernels_in_the_worker_on_the_cpu():
    """Base, head and base2 each run the step once under the interpreter; nothing is timed."""
    spec = from_cli("mistral-7b")
    r = bench_model(spec, _example_roles(), str(EXAMPLE), str(EXAMPLE), "cpu")
    assert r.error is None, r.error
    assert not r.measured and r.reason == NOT_MEASURED_CPU and r.points == [] and r.verdict is None
    assert r.roles == {"attention": "paged_attention", "rope": "rope", "kv_append": "kv_append"}
    assert any("layer 0's attention outputs agree" in n for n in r.notes)
    assert "  tokens/s: not measured (no GPU: the decode step is timed on a GPU only)" in text_lines(r)


def test_a_head_kernel_that_breaks_the_step_is_caught(tmp_path):
    head = tmp_path / "head"
    shutil.copytree(EXAMPLE, head)
    rope = head / "kernels" / "rope.py"
    rope.write_text(rope.read_text().replace("(x1 * cos - x2 * sin)", "(x1 * cos + x2 * sin)"))
    roles = [r for r in _example_roles() if r.role == "rope"]
    r = bench_model(from_cli("llama-3.1-8b"), roles, str(EXAMPLE), str(head), "cpu")
    assert r.error_kind == "mismatch" and "head and base disagree" in r.error, r.error
    assert not r.measured


def test_bench_model_puts_a_fused_decode_step_in_the_step(tmp_path):
    """`bench --model --op decode_step`: the example's fused kernel in the worker, under the interpreter; a head
    that stores the new key before rotating it changes the step's attention and is caught."""
    head = tmp_path / "head"
    shutil.copytree(EXAMPLE, head, ignore=shutil.ignore_patterns("prs"))
    src = head / "kernels" / "decode_step.py"
    text = src.read_text()
    assert text.count("(k1 * cos - k2 * sin).to(") == 1 and text.count("(k2 * cos + k1 * sin).to(") == 1
    src.write_text(text.replace("(k1 * cos - k2 * sin).to(", "k1.to(").replace("(k2 * cos + k1 * sin).to(", "k2.to("))
    entry = "kernels/decode_step.py:decode_step"
    proc = subprocess.run(
        [sys.executable, "-m", "kernalin_ci", "bench", "--model", "mistral-7b", "--op", "decode_step"]
        + ["--base", entry, "--base-root", str(EXAMPLE), "--head", entry, "--head-root", str(head)]
        + ["--device", "cpu", "--json", str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    m = json.loads((tmp_path / "m.json").read_text())
    assert proc.returncode == 1 and m["kernels"] == {"decode_step": entry}, proc.stdout + proc.stderr
    assert m["error_kind"] == "mismatch" and "head and base disagree" in m["error"] and not m["measured"]


def test_kernel_pins_that_cannot_serve_the_model_are_usage_errors():
    roles = [Role("attention", "attention.decode_paged", "p", "k.py:f", "k.py:f", {"head_dim": 64})]
    with pytest.raises(UsageError, match="pins head_dim=64, the model has 128"):
        bench_model(from_cli("mistral-7b"), roles, ".", ".", "cpu")
    roles = [
        Role("attention", "attention.decode_paged", "p", "k.py:f", "k.py:f", {"block_size": 16}),
        Role("kv_append", "kv_append", "a", "k.py:g", "k.py:g", {"block_size": 32}),
    ]
    with pytest.raises(UsageError, match="must share the cache"):
        bench_model(from_cli("mistral-7b"), roles, ".", ".", "cpu")


# ---------------------------------------------------------------------------------------- gate and report


def _gate_cfg():
    return config.parse(
        (EXAMPLE / ".kernalin.yml").read_text().split("\nmodel:")[0] + "\nmodel: {preset: llama-3.1-8b}\n"
    )


def test_the_gate_reports_not_measured_on_the_cpu_and_nothing_when_the_step_is_unchanged(tmp_path):
    cfg = _gate_cfg()
    results = {k.name: KernelReport(k.name, k.op, k.entry, "unchanged") for k in cfg.kernels}
    assert check_model(cfg, results, "cpu", tmp_path, tmp_path, False) is None
    results["decode_attention"].status = "changed"  # attention.decode: not in the step (paged is)
    assert check_model(cfg, results, "cpu", tmp_path, tmp_path, False) is None
    results["rope"].status = "changed"
    m = check_model(cfg, results, "cpu", tmp_path, tmp_path, False)
    assert m.measured is False and m.reason == NOT_MEASURED_CPU and m.points == []
    results["rope"].failed_by = ["finding"]
    assert check_model(cfg, results, "cuda", tmp_path, tmp_path, False).reason == "rope failed verification"
    # only slower (the benchmark's verdict): the step is timed, its tokens/s show what that costs. Here
    # without a GPU the timing itself cannot run, which is a different reason, with the error
    results["rope"].failed_by = ["slower"]
    m = check_model(cfg, results, "cuda", tmp_path, tmp_path, False)
    assert m.reason == "the model benchmark could not run" and m.error, (m.reason, m.error)


def test_the_gate_places_a_changed_decode_step_and_says_what_it_does_not_measure(tmp_path):
    cfg = config.parse((EXAMPLE / ".kernalin.yml").read_text())
    assert cfg.model.kernels == {
        "attention": "paged_attention",
        "rope": "rope",
        "kv_append": "kv_append",
        "decode_step": "decode_step",
    }
    results = {k.name: KernelReport(k.name, k.op, k.entry, "unchanged") for k in cfg.kernels}
    results["decode_step"].status = "changed"
    m = check_model(cfg, results, "cpu", tmp_path, tmp_path, False)
    assert m.roles == {"decode_step": "decode_step"} and m.reason == NOT_MEASURED_CPU and m.notes == []
    results["paged_attention"].status = "changed"
    m = check_model(cfg, results, "cpu", tmp_path, tmp_path, False)
    assert m.roles == {"decode_step": "decode_step"}
    assert m.notes == [
        "paged_attention also changed: not measured (one decode step per report; the step with decode_step "
        "in its place was)"
    ]
    results["decode_step"].status = "unchanged"
    m = check_model(cfg, results, "cpu", tmp_path, tmp_path, False)
    assert m.roles == {"attention": "paged_attention", "rope": "rope", "kv_append": "kv_append"}
    # a kv_append kernel beside an attention.decode kernel: no place in the step, said so
    dense = config.parse(
        (EXAMPLE / ".kernalin.yml").read_text().split("\nmodel:")[0]
        + "\nmodel: {preset: llama-3.1-8b, kernels: {attention: decode_attention}}\n"
    )
    results = {k.name: KernelReport(k.name, k.op, k.entry, "unchanged") for k in dense.kernels}
    results["kv_append"].status = "changed"
    m = check_model(dense, results, "cuda", tmp_path, tmp_path, False)
    assert not m.measured and m.reason == (
        "kv_append has no place in this step: decode_attention (attention.decode) reads a contiguous cache, "
        "kv_append writes a paged one"
    )
    md = render_markdown(_report(m))
    assert "**Tokens/s:** not measured (kv\\_append has no place in this step" in md


def _measured() -> ModelResult:
    t = np.load(TRACE)["t"]
    spec = from_cli("llama-3.1-8b")
    r = ModelResult(
        spec,
        "cuda",
        roles={"attention": "paged_attention", "rope": "rope", "kv_append": "kv_append"},
        measured=True,
        mode="full",
        layers_built=32,
        rounds=200,
        stopped="budget",
    )
    for i, p in enumerate(spec.serving):
        r.points.append(
            {
                "batch": p.batch,
                "context": p.context,
                **cost.point_summary(t[:, 4 - i], t[:, 0], None, p.batch, spec.price_per_hour),
            }
        )
    return r


def _report(model: ModelResult | None) -> Report:
    return Report(
        "success",
        "1 kernel verified",
        {"ref": "main", "sha": "a" * 40},
        {"ref": "pr", "sha": "b" * 40},
        "cuda",
        {"fail_on": ["finding"]},
        kernels=[KernelReport("rope", "rope", "kernels/rope.py:rope", "changed")],
        model=model,
    )


def test_the_comment_and_report_json_show_tokens_and_cost_per_serving_point():
    m = _measured()
    r = _report(m)
    text = report_json(r)
    jsonschema.validate(json.loads(text), REPORT_SCHEMA)
    md = render_markdown(r)
    section = md[md.index("#### Decode throughput") : md.index("#### ✅ `rope`")]
    html = cmarkgfm.github_flavored_markdown_to_html(section)
    assert html.count("<tr>") == 1 + len(m.points)  # a real table: the header and a row per serving point
    for p in m.points:
        row = next(ln for ln in md.splitlines() if ln.startswith(f"| batch {p['batch']}, context {p['context']} |"))
        assert f"| {rate(p['base']['tokens_per_s'])} | {rate(p['head']['tokens_per_s'])} |" in row
        assert f"| {dollars(p['base']['usd_per_mtok'])} | {dollars(p['head']['usd_per_mtok'])} |" in row
        assert change(p["tokens_per_s_ratio"], p["tokens_per_s_ratio_hdi"]) in row and p["verdict"] in row
    assert rate(85891.4) == "85,891" and dollars(0.01134) == "$0.0113" and dollars(7.5) == "$7.50"
    assert change(1.027, (1.0261, 1.0279)) == "+2.7% (95% HDI +2.6%..+2.8%)"
    assert change(1.027, (1.0266, 1.0274)) == "+2.70% (95% HDI +2.66%..+2.74%)"
    lines = text_lines(m)
    assert sum("tokens/s" in ln and "/Mtok" in ln for ln in lines) == len(m.points)
    back = Report.from_json(json.loads(text))  # the typed model result, read back from report.json
    assert isinstance(back.model, ModelResult) and back.model.measured and back.model.mode == "full"
    assert back.model.spec.shape() == m.spec.shape() and back.model.spec.serving == m.spec.serving
    assert report_json(back) == text and render_markdown(back) == md and text_lines(back.model) == lines


def test_not_measured_says_so_and_prints_no_figure():
    m = ModelResult(from_cli("qwen2.5-7b"), "cpu", roles={"attention": "a"}, reason="no GPU")
    r = _report(m)
    text = report_json(r)
    jsonschema.validate(json.loads(text), REPORT_SCHEMA)
    assert report_json(Report.from_json(json.loads(text))) == text
    md = render_markdown(r)
    section = md[md.index("Decode throughput") :]
    assert "**Tokens/s:** not measured (no GPU)." in section and "$/Mtok" not in section
    assert "tokens/s: not measured (no GPU)" in "\n".join(text_lines(m))
    assert "Decode throughput" not in render_markdown(_report(None))


def test_the_parent_turns_timed_rounds_into_serving_points():
    """What bench_model does with the worker's rounds on a GPU: [rounds, points, reps] per instance."""
    from kernalin_ci.throughput.bench import _finish

    t = np.load(TRACE)["t"]
    spec = from_cli("llama-3.1-8b")
    r = ModelResult(spec, "cuda", rounds=200)
    r.instances = {
        "base": np.stack([t[:, 4], t[:, 3]], axis=1),
        "head": np.stack([t[:, 0], t[:, 0]], axis=1),
        "base2": np.stack([t[:, 4], t[:, 3]], axis=1)[::-1].copy(),
    }
    _finish(r, None, 0.005)
    assert r.measured and r.reason is None and r.verdict.verdict == "faster"
    assert [(p["batch"], p["context"]) for p in r.points] == [(1, 4096), (64, 4096)]
    assert r.points[1]["base"]["tokens_per_s"] == pytest.approx(64 / (r.points[1]["base"]["step_ms"] / 1e3))
    jsonschema.validate(json.loads(report_json(_report(r))), REPORT_SCHEMA)


# ---------------------------------------------------------------------------------------- GPU

SMALL = ModelSpec(
    "small",
    layers=64,
    hidden_size=1024,
    num_heads=8,
    num_kv_heads=2,
    head_dim=128,
    intermediate_size=2048,
    vocab_size=4096,
    dtype="bfloat16",
    serving=[ServingPoint(1, 512), ServingPoint(16, 256)],
)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["full", "per-layer"])
def test_on_a_gpu_tokens_per_second_is_measured_per_serving_point(mode):
    r = bench_model(SMALL, _example_roles(), str(EXAMPLE), str(EXAMPLE), "cuda", budget_s=3, mode=mode)
    assert r.error is None, r.error
    assert r.measured and r.mode == mode and r.verdict is not None and len(r.points) == 2
    for p, want in zip(r.points, SMALL.serving):
        assert (p["batch"], p["context"]) == (want.batch, want.context)
        for side in ("base", "head"):
            s = p[side]
            assert s["tokens_per_s"] > 0 and s["tokens_per_s_hdi"][0] <= s["tokens_per_s"] <= s["tokens_per_s_hdi"][1]
        assert p["verdict"] in ("equivalent", "inconclusive", "faster", "slower")
    block = st.block_layers(
        SMALL,
        st.layer_bytes(SMALL)
        + sum(st.kv_bytes(SMALL, p, st.Kernels(attention_op="attention.decode_paged")) for p in SMALL.serving),
    )
    assert 2 <= block < 64 and r.layers_built == (64 if mode == "full" else block)
    print("\n".join(text_lines(r)))


@pytest.mark.gpu
def test_on_a_gpu_a_fused_decode_step_takes_its_place():
    entry = "kernels/decode_step.py:decode_step"
    roles = [Role("decode_step", "decode_step", "decode_step", entry, entry, {"block_size": 16})]
    r = bench_model(SMALL, roles, str(EXAMPLE), str(EXAMPLE), "cuda", budget_s=3)
    assert r.error is None, r.error
    assert r.measured and r.roles == {"decode_step": "decode_step"} and len(r.points) == 2
    print("\n".join(text_lines(r)))
