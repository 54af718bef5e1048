"""The model's decode-path features (docs/tokens.md "Attention features"): the `model:` keys, the presets that
carry them, and the step handing them to the attention kernel as its op params."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernalin_ci import config
from kernalin_ci.errors import UsageError
from kernalin_ci.report.tokens import shape_text
from kernalin_ci.throughput import step as st
from kernalin_ci.throughput.bench import Role, bench_model, check_roles
from kernalin_ci.throughput.result import ModelResult
from kernalin_ci.throughput.spec import PRESETS, SHAPE_KEYS, ModelSpec, ServingPoint, from_cli

REPO = Path(__file__).resolve().parent.parent
KERNELS = "kernels:\n  - {name: dense, op: attention.decode, entry: k.py:f}\n"


@pytest.mark.parametrize(
    "text, where, message",
    [
        ("model: {preset: mistral-7b, window: 0}", "model.window", "positive integer"),
        ("model: {preset: mistral-7b, window: 4.5}", "model.window", "positive integer"),
        ("model: {preset: mistral-7b, window: 8, window_layers: odd}", "model.window_layers", "must be one of"),
        ("model: {preset: mistral-7b, window_layers: even}", "model.window_layers", "needs window"),
        ("model: {preset: mistral-7b, logit_cap: -1}", "model.logit_cap", "positive number"),
        ("model: {preset: mistral-7b, logit_cap: .inf}", "model.logit_cap", "finite"),
        ("model: {preset: mistral-7b, sinks: 1}", "model.sinks", "true or false"),
        ("model: {preset: mistral-7b, kv_dtype: fp8}", "model.kv_dtype", "must be one of"),
    ],
)
def test_a_bad_feature_is_one_line_naming_file_line_and_key(text, where, message):
    with pytest.raises(UsageError) as e:
        config.parse(KERNELS + text + "\n", "cfg.yml")
    assert str(e.value).startswith(f"cfg.yml:3: {where}: ") and message in str(e.value) and "\n" not in str(e.value)


def test_a_bad_feature_in_a_model_file_exits_2_with_one_line(tmp_path):
    (tmp_path / "m.yml").write_text("preset: gemma-2-2b\nkv_dtype: int4\n")
    proc = subprocess.run(
        [sys.executable, "-m", "kernalin_ci", "bench", "--model", "m.yml", "--op", "rope"]
        + ["--base", "a.py:f", "--head", "a.py:f", "--device", "cpu"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 2 and "kv_dtype: must be one of" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_presets_carry_the_cited_features_layer_by_layer():
    gemma, mistral = from_cli("gemma-2-2b"), from_cli("mistral-7b-v0.1")
    assert (gemma.layers, gemma.num_heads, gemma.num_kv_heads, gemma.head_dim) == (26, 8, 4, 256)
    assert gemma.dtype == "bfloat16"  # the model: default (Gemma2Config names none)
    assert gemma.attention_params(0) == {"window": 4096, "logit_cap": 50.0}  # sliding layers 0, 2, ...
    assert gemma.attention_params(1) == {"logit_cap": 50.0}  # the others attend everything
    assert mistral.vocab_size == 32000 and all(mistral.attention_params(i) == {"window": 4096} for i in (0, 1))
    assert from_cli("llama-3.1-8b").features() == {} and from_cli("llama-3.1-8b").attention_params(0) == {}
    for name in ("gemma-2-2b", "mistral-7b-v0.1"):
        assert "transformers 4.56.2" in PRESETS[name]["source"]
        assert name in (REPO / "docs" / "tokens.md").read_text()
    fp8 = from_cli("llama-3.1-8b-fp8-kv")  # the model card's FP8 cache, per-tensor scales, over llama-3.1-8b's shapes
    assert fp8.features() == {"kv_dtype": "fp8_e4m3"} and fp8.attention_params(0) == {"kv_dtype": "fp8_e4m3"}
    assert "amd/Llama-3.1-8B-Instruct-FP8-KV model card" in PRESETS["llama-3.1-8b-fp8-kv"]["source"]
    assert "amd/Llama-3.1-8B-Instruct-FP8-KV" in (REPO / "docs" / "tokens.md").read_text()
    base = from_cli("llama-3.1-8b")
    assert [getattr(fp8, k) for k in SHAPE_KEYS] == [getattr(base, k) for k in SHAPE_KEYS]
    modified = config.parse(KERNELS + "model: {preset: gemma-2-2b, kv_dtype: fp8_e4m3, sinks: true}\n").model
    assert modified.name == "gemma-2-2b (modified)" and modified.features() == {
        "window": 4096, "window_layers": "even", "logit_cap": 50.0, "sinks": True, "kv_dtype": "fp8_e4m3"
    }  # fmt: skip
    # the cache traffic is sized by the cache's dtype: an FP8 cache is half a bfloat16 one
    p, k = ServingPoint(4, 1000), st.Kernels()
    assert 2 * st.kv_bytes(modified, p, k) == st.kv_bytes(from_cli("gemma-2-2b"), p, k)
    shown = shape_text(ModelResult.from_json(ModelResult(modified, "cpu").to_json()))  # through report.json
    assert shown.endswith("bfloat16, window 4096 (layers 0, 2, ...), logit cap 50, sinks, KV cache fp8_e4m3")


def test_a_kernel_whose_features_are_not_the_models_is_a_usage_error():
    att = Role("attention", "attention.decode", "w40", "k.py:f", "k.py:f", {"window": 40})
    with pytest.raises(UsageError, match="w40 has window=40, the model has window=4096"):
        check_roles(from_cli("mistral-7b-v0.1"), [att])
    with pytest.raises(UsageError, match="w40 has window=40, the model has no window"):
        check_roles(from_cli("llama-3.1-8b"), [att])
    same = Role("attention", "attention.decode", "w", "k.py:f", "k.py:f", {"window": 4096})
    assert "window" not in check_roles(from_cli("mistral-7b-v0.1"), [same])[0]  # the model's, layer by layer
    scales = Role("attention", "attention.decode", "s", "k.py:f", "k.py:f", {"kv_scale": "per-head"})
    with pytest.raises(UsageError, match="s has kv_scale=per-head, the model has no kv_dtype"):
        check_roles(from_cli("gemma-2-2b"), [scales])
    token_head = Role("kv_append", "kv_append", "t", "k.py:f", "k.py:f", {"kv_scale": "per-token-head"})
    with pytest.raises(UsageError, match="t has kv_scale=per-token-head; the step's attention reads given"):
        check_roles(from_cli("llama-3.1-8b-fp8-kv"), [token_head])
    step = Role("decode_step", "decode_step", "fused", "k.py:f", "k.py:f", {})
    with pytest.raises(UsageError, match=r"fused \(decode_step\) takes no attention features; the model sets window"):
        check_roles(from_cli("gemma-2-2b"), [step])


def test_a_decode_step_kernel_takes_the_models_features_its_params_declare():
    """A fused step serves a model with features when its params (those it is verified with) set each one to
    the model's value; one it leaves out is named, with the same line."""
    both = Role("decode_step", "decode_step", "fused", "k.py:f", "k.py:f", {"window": 4096, "logit_cap": 50.0})
    params, layout = check_roles(from_cli("gemma-2-2b"), [both])
    assert "window" not in params and "logit_cap" not in params and layout["block_size"] == 16
    half = Role("decode_step", "decode_step", "fused", "k.py:f", "k.py:f", {"window": 4096})
    with pytest.raises(UsageError, match=r"fused \(decode_step\) takes no logit_cap=50.0; the model sets window"):
        check_roles(from_cli("gemma-2-2b"), [half])
    fp8 = Role("decode_step", "decode_step", "fused", "k.py:f", "k.py:f", {"window": 4096})
    with pytest.raises(
        UsageError, match=r"takes no kv_dtype=fp8_e4m3; the model sets window=4096, window_layers=all, kv_dtype"
    ):
        check_roles(dataclasses.replace(from_cli("mistral-7b-v0.1"), kv_dtype="fp8_e4m3"), [fp8])


TINY = ModelSpec(
    name="t", layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
    vocab_size=50, dtype="float32", serving=[ServingPoint(2, 11)], window=4, window_layers="even",
    logit_cap=2.0, sinks=True, kv_dtype="fp8_e4m3",
)  # fmt: skip


def test_the_torch_attention_applies_the_layers_features():
    """No attention kernel: the torch attention dequantises the FP8 cache, caps, masks the window on layer 0
    only, and adds the sinks; layer 0's output by hand in float64."""
    k = st.Kernels()
    w = st.build_weights(TINY, 2, "cpu", 0)
    pi = st.build_point(TINY, TINY.serving[0], k, 2, "cpu", 1)
    assert pi.caches[0].k.dtype == torch.float8_e4m3fn and pi.sinks.shape == (4,)
    x = torch.nn.functional.embedding(pi.tokens, w.embed)
    out0 = st.attention_block(TINY, 0, w.layers[0], pi.caches[0], pi, k, x)
    lw, B, D, n = w.layers[0], 2, 8, 12
    xn = st.rms_norm(x, lw.attn_norm)
    q = st.torch_rope((xn @ lw.wq).view(B, 4, D), pi.cos, pi.sin).double()
    keys, vals = pi.caches[0].k.double(), pi.caches[0].v.double()  # [B, Hkv, n, D], scale 1
    for b in range(B):
        for h in range(4):
            s = 2.0 * torch.tanh(keys[b, h // 2] @ q[b, h] * D**-0.5 / 2.0)
            s[: n - 4] = -math.inf
            e = torch.exp(s)
            ref = e @ vals[b, h // 2] / (e.sum() + math.exp(float(pi.sinks[h])))
            assert torch.allclose(out0[b, h * D : (h + 1) * D].double(), ref, atol=1e-5)
    assert "window" not in TINY.attention_params(1)
    assert "KERNALIN_PARAMS" not in os.environ  # the layer's params are the kernels' only while they run


@pytest.mark.parametrize(
    "role, op, kernel, params",
    [
        ("attention", "attention.decode", REPO / "checks" / "attention_decode" / "correct_features.py", {}),
        (
            "attention",
            "attention.decode_paged",
            REPO / "checks" / "attention_decode_paged" / "correct_features_paged.py",
            {},
        ),
        ("decode_step", "decode_step", REPO / "checks" / "decode_step" / "correct_features_step.py", {"window": 4096}),
    ],
)
def test_a_model_window_reaches_a_real_triton_kernel_in_the_step(tmp_path, role, op, kernel, params):
    """The catalogue's feature kernel in the attention place (or the fused place, its params declaring the
    window), in the worker under the interpreter: with the model's window it agrees with itself, and a head
    that ignores the window disagrees, so the base masked."""
    spec = from_cli("mistral-7b-v0.1")  # window 4096 -> 8 keys of the tiny step's 21
    src = kernel.read_text()
    assert src.count('USE_WINDOW=bool(prm.get("window"))') == 1
    for side, text in (("base", src), ("head", src.replace('USE_WINDOW=bool(prm.get("window"))', "USE_WINDOW=False"))):
        (tmp_path / side).mkdir()
        (tmp_path / side / "k.py").write_text(text)
    roles = [Role(role, op, "features", "k.py:entry", "k.py:entry", params)]
    base = str(tmp_path / "base")
    same = bench_model(spec, roles, base, base, "cpu")
    assert same.error is None, same.error
    r = bench_model(spec, roles, base, str(tmp_path / "head"), "cpu")
    assert r.error_kind == "mismatch" and "head and base disagree" in r.error, r.error


def test_an_fp8_model_gives_a_real_fp8_kernel_its_cache_and_scales(tmp_path):
    """kv_dtype: the catalogue's FP8 decode attention (k_scale, v_scale per KV head) runs the step on FP8
    caches under the interpreter, and the report names the cache."""
    shutil.copy(REPO / "checks" / "attention_decode" / "correct_fp8_cache.py", tmp_path / "k.py")
    doc = "preset: llama-3.1-8b\nkv_dtype: fp8_e4m3\n"
    (tmp_path / "m.yml").write_text(doc)
    roles = [Role("attention", "attention.decode", "fp8", "k.py:entry", "k.py:entry", {"kv_scale": "per-head"})]
    r = bench_model(from_cli(str(tmp_path / "m.yml")), roles, str(tmp_path), str(tmp_path), "cpu")
    assert r.error is None and "KV cache fp8_e4m3" in shape_text(r), r.error
