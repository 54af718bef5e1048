"""Benchmark shapes: realistic decode defaults per op, overrides from --param / .kernalin.yml."""

import pytest

from kernalin_ci.bench.shapes import bench_cases, split_params
from kernalin_ci.errors import UsageError
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params
from kernalin_ci.ops.bench_shapes import ragged_lens


def cases(op, raw, device="cuda"):
    op_params, bench = split_params(raw)
    return bench_cases(op, resolve_params(op, get_op(op).params, op_params), device, bench)


def test_attention_defaults_on_a_gpu_are_llama_like_decode_shapes():
    cs = cases("attention.decode", {})
    assert [len(c.dims["kv_lens"]) for c in cs] == [1, 16, 128]
    assert [max(c.dims["kv_lens"]) for c in cs] == [32768, 4096, 512]
    for c in cs:
        assert (c.dims["Hq"], c.dims["Hkv"], c.dims["D"], c.dtype) == (32, 8, 128, "bfloat16")
        assert c.dims["scale"] == pytest.approx(128**-0.5)
    assert min(cs[1].dims["kv_lens"]) == 2048  # batched sequences are ragged: kv_len/2 .. kv_len


def test_cpu_defaults_are_tiny_float32():
    for op in ("attention.decode", "attention.decode_paged", "rope", "kv_append"):
        for c in cases(op, {}, "cpu"):
            assert c.dtype == "float32" and c.dims.get("D") == 32


def test_batch_and_kv_len_overrides_make_a_grid_of_exact_lengths():
    cs = cases(
        "attention.decode_paged", {"batch": "[1, 64]", "kv_len": "8192", "num_q_heads": "16", "block_size": "32"}
    )
    assert [c.dims["kv_lens"] for c in cs] == [[8192], [8192] * 64]
    assert all(c.dims["Hq"] == 16 and c.dims["Hkv"] == 8 for c in cs)
    one = cases("attention.decode", {"batch": 64})  # batch alone: every default length
    assert sorted({max(c.dims["kv_lens"]) for c in one}) == [512, 4096, 32768]


def test_explicit_shape_list_and_dtype():
    cs = cases(
        "attention.decode", {"shapes": '[{"batch": 2, "kv_len": 100}, {"batch": 1, "kv_len": 7}]', "dtype": "float16"}
    )
    assert [c.dims["kv_lens"] for c in cs] == [[100, 100], [7]]
    assert {c.dtype for c in cs} == {"float16"}


def test_token_ops():
    rope = cases("rope", {"tokens": "[1, 256]", "head_dim": "64"})
    assert [(c.dims["T"], c.dims["D"]) for c in rope] == [(1, 64), (256, 64)]
    kv = cases("kv_append", {"tokens": 300, "block_size": "16"})
    assert kv[0].dims["T"] == 300 and kv[0].dims["num_blocks"] * 16 >= 600 and kv[0].dims["padding"] == 0


def test_ragged_lengths():
    assert ragged_lens(1, 100, True) == [100]
    lens = ragged_lens(5, 100, True)
    assert lens[0] == 50 and lens[-1] == 100 and lens == sorted(lens)
    assert ragged_lens(3, 100, False) == [100, 100, 100]


@pytest.mark.parametrize(
    "raw",
    [
        {"batch": "0"},
        {"kv_len": "[1, -2]"},
        {"dtype": "int8"},
        {"shapes": '[{"batch": 1, "heads": 3}]'},
        {"shapes": "[]"},
        {"num_q_heads": "12", "num_kv_heads": "8"},
    ],
)
def test_bad_shape_params_are_usage_errors(raw):
    with pytest.raises(UsageError):
        cases("attention.decode", raw)


def test_rope_shape_needs_tokens():
    with pytest.raises(UsageError, match="tokens"):
        cases("rope", {"shapes": '[{"batch": 4}]'})
