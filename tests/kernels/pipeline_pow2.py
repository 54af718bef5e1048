"""Correct pipeline members that, like most production kernels, take only power-of-two head dims: the
catalogue's split-KV paged attention and per-token kv_append behind launchers that refuse any other D,
as serving stacks' launchers do (`assert head_dim in (64, 128, 256)`)."""
import importlib.util
from pathlib import Path

_checks = Path(__file__).resolve().parents[2] / "checks"


def _load(rel):
    spec = importlib.util.spec_from_file_location("_pipeline_pow2_" + Path(rel).stem, _checks / rel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_attention = _load("attention_decode_paged/correct_split_paged.py")
_append = _load("kv_append/correct_per_token.py")


def _pow2(D):
    assert D & (D - 1) == 0, f"head_dim {D} is not supported (a power of two is required)"


def attention(q, k_cache, v_cache, block_tables, kv_lens, scale):
    _pow2(q.shape[-1])
    return _attention.entry(q, k_cache, v_cache, block_tables, kv_lens, scale)


def kv_append(key, value, k_cache, v_cache, slot_mapping):
    _pow2(key.shape[-1])
    return _append.entry(key, value, k_cache, v_cache, slot_mapping)

