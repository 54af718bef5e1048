"""attention.decode_mla, multi-head latent attention decode (docs/ops.md): the float64 reference by hand and
against the weight-absorbed form written as torch's attention, the inputs, the structural status, the benchmark
shapes, and the catalogue's kernels (real Triton kernels under the interpreter): the correct one passes, each
bug is named with its class and missed by the probe."""

import json

import pytest
import torch
from conftest import CHECKS

from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Case, resolve_params
from kernalin_ci.ops.bench_shapes import BenchRequest
from kernalin_ci.verify import verify

OP = "attention.decode_mla"
FOLDER = CHECKS / "attention_decode_mla"
PARAMS = {"block_size": 16}


def _op_params(raw=None):
    op = get_op(OP)
    return op, resolve_params(OP, op.params, raw or {})


def _kw(lens, H=3, rank=6, rope=2, seed=0):
    """A call by hand: block size 2, sequence b's blocks in order."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-L // 2) for L in lens]
    tables = torch.zeros(len(lens), max(need), dtype=torch.int32)
    first = 0
    for b, n in enumerate(need):
        tables[b, :n] = torch.arange(first, first + n)
        first += n
    return {
        "q_nope": torch.randn(len(lens), H, rank, generator=g, dtype=torch.float64),
        "q_pe": torch.randn(len(lens), H, rope, generator=g, dtype=torch.float64),
        "kv_cache": torch.randn(sum(need), 2, rank + rope, generator=g, dtype=torch.float64),
        "block_tables": tables,
        "kv_lens": torch.tensor(lens, dtype=torch.int32),
        "scale": 0.4,
    }


def _rows(kw, b, L):
    j = torch.arange(L)
    return kw["kv_cache"][kw["block_tables"][b, j // 2].long(), j % 2]  # [L, rank + rope]


def test_reference_by_hand_zero_queries_average_the_latents():
    op, params = _op_params({"kv_lora_rank": 6, "rope_dim": 2})
    kw = _kw([3, 1])
    kw["q_nope"].zero_()
    kw["q_pe"].zero_()
    out = op.reference(kw, params).tensors["out"]
    for b, L in enumerate([3, 1]):
        assert torch.allclose(out[b], _rows(kw, b, L)[:, :6].mean(0).expand(3, -1), atol=1e-12)


def test_reference_is_mqa_over_the_latent_rows_with_the_latent_as_value():
    """DeepSeek-V2's absorbed decode: attention of [q_nope, q_pe] over [c, r], values c, every head one cache."""
    op, params = _op_params({"kv_lora_rank": 6, "rope_dim": 2})
    kw = _kw([5, 2, 4], seed=2)
    out = op.reference(kw, params).tensors["out"]
    for b, L in enumerate([5, 2, 4]):
        rows = _rows(kw, b, L)
        q = torch.cat([kw["q_nope"][b], kw["q_pe"][b]], -1)[:, None]  # [H, 1, rank + rope]
        want = torch.nn.functional.scaled_dot_product_attention(
            q, rows.expand(3, -1, -1), rows[:, :6].expand(3, -1, -1), scale=0.4
        )
        assert torch.allclose(out[b], want[:, 0], atol=1e-12), b
    # the RoPE part counts: without it the output differs
    no_rope = op._attend({**kw, "q_pe": kw["q_pe"] * 0}, 0.4)
    assert not torch.allclose(out, no_rope, atol=1e-3)


def test_inputs_and_shape_rules():
    op, params = _op_params()
    case = next(c for c in op.cases(params, "cpu", "float32") if c.name == "stale-tail")
    kw = op.inputs(case, params, "cpu")
    assert list(kw) == ["q_nope", "q_pe", "kv_cache", "block_tables", "kv_lens", "scale"]
    assert kw["q_nope"].shape == (4, 16, 512) and kw["q_pe"].shape == (4, 16, 64)
    assert kw["kv_cache"].shape[1:] == (16, 576) and kw["scale"] == pytest.approx(192**-0.5)
    bad = Case("by-hand", {**case.dims, "Hkv": 2})
    assert op.validate_case(bad) == "Hkv must be 1 (every head reads the one latent cache)"
    for c in [*op.cases(params, "cuda", None), op.probe(params, None), op.shape_case(params, "float16")]:
        assert op.validate_case(c) is None, c.name


def test_bench_shapes_and_traffic():
    op, params = _op_params()
    cases = op.bench_cases(params, "cuda", BenchRequest("cuda", {}))
    assert {c.dims["Hq"] for c in cases} == {128} and all(c.dims["D"] == 576 for c in cases)
    small = Case("s", {"Hq": 2, "Hkv": 1, "D": 8, "kv_lens": [3, 1], "scale": 1.0}, "float16")
    t = op.traffic(small, {**params, "rope_dim": 2})
    assert t.flops == 2 * 2 * (8 + 6) * 4 and t.bytes_written == 2 * 2 * 6 * 2


def test_the_structural_status_says_not_analysed():
    r = verify(OP, f"{FOLDER / 'correct_latent_online.py'}:entry", PARAMS, "cpu", only="structural", progress=False)
    assert r.structural.status == "not-analysed" and not r.findings
    assert r.structural.cause.startswith("not analysed for multi-head latent attention")


KERNELS = [
    ("correct_latent_online", None),
    ("bug_rope_key_wrong_columns", "mla-rope"),
    ("bug_scale_from_latent_dim", "scale"),
]


@pytest.mark.parametrize("name, cls", KERNELS, ids=[k[0] for k in KERNELS])
def test_catalogue_kernel_at_stale_tail(name, cls):
    op, params = _op_params(PARAMS)
    case = next(c for c in op.cases(params, "cpu", "float32") if c.name == "stale-tail")
    r = verify(OP, f"{FOLDER / name}.py:entry", PARAMS, "cpu", case_json=json.dumps(case.to_json()), progress=False)
    assert r.cases_run == 1
    if cls is None:
        assert not r.findings, [f.message for f in r.findings]
    else:
        assert cls in {f.bug_class for f in r.findings}, [(f.bug_class, f.message) for f in r.findings]


@pytest.mark.parametrize("name", [k[0] for k in KERNELS if k[1]])
def test_the_probe_misses_each_bug(name):
    r = verify(OP, f"{FOLDER / name}.py:entry", PARAMS, "cpu", probe=True, progress=False)
    assert r.cases_run == 1 and not r.findings, [f.message for f in r.findings]
