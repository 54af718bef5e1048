"""Entries over real cache layouts, for the layout tests.

`token_pool`: a token-level decode kernel in the style of SGLang/LightLLM, which
keeps K/V in a pool [num_tokens, Hkv, D] and finds token j of request b at
req_to_token[b, j]. Its adapter is the paged op with block_size 1: the cache is
viewed as the pool and the block table is the request-to-token table (views,
no copies).

`hnd_attention`, `hnd_kv_append`: the catalogue's correct kernels, which take
every stride from the tensors, given an hnd cache [num_blocks, Hkv, block_size, D]
through a permuted view.
"""
import importlib.util
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernalin_ci import current_params

CHECKS = Path(__file__).resolve().parents[2] / "checks"


def _load(rel):
    spec = importlib.util.spec_from_file_location(rel.replace("/", "_")[:-3], CHECKS / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@triton.jit
def _token_decode(Q, K, V, Out, ReqToToken, Lens, sm_scale, s_qb, s_qh, s_kt, s_kh, s_vt, s_vh, s_rb, s_ob, s_oh,
                  GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    n = tl.load(Lens + b)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + b * s_qb + h * s_qh + d, mask=dm, other=0.0).to(tl.float32)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, n, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        jm = j < n
        tok = tl.load(ReqToToken + b * s_rb + j, mask=jm, other=0).to(tl.int64)
        mask = jm[:, None] & dm[None, :]
        k = tl.load(K + tok[:, None] * s_kt + g * s_kh + d[None, :], mask=mask, other=0.0).to(tl.float32)
        s = tl.where(jm, tl.sum(k * q[None, :], 1) * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(V + tok[:, None] * s_vt + g * s_vh + d[None, :], mask=mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(Out + b * s_ob + h * s_oh + d, (acc / l_i).to(Out.dtype.element_ty), mask=dm)


def token_pool(q, k_cache, v_cache, block_tables, kv_lens, scale):
    assert current_params()["block_size"] == 1 and current_params()["layout"] == "nhd"
    k_buffer = k_cache.view(-1, k_cache.shape[2], k_cache.shape[3])  # [num_tokens, Hkv, D]
    v_buffer = v_cache.view(-1, v_cache.shape[2], v_cache.shape[3])
    assert k_buffer.data_ptr() == k_cache.data_ptr() and v_buffer.data_ptr() == v_cache.data_ptr()
    req_to_token = block_tables  # [B, max_len]: token j of request b is pool row req_to_token[b, j]
    B, Hq, D = q.shape
    out = torch.empty_like(q)
    _token_decode[(B, Hq)](q, k_buffer, v_buffer, out, req_to_token, kv_lens, scale,
                           q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
                           v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
                           out.stride(0), out.stride(1), GROUP=Hq // k_buffer.shape[1], D=D, BLOCK_N=32,
                           BLOCK_D=triton.next_power_of_2(D))
    return out


def hnd_attention(q, k_cache, v_cache, block_tables, kv_lens, scale):
    assert current_params()["layout"] == "hnd" and k_cache.shape[2] == current_params()["block_size"]
    mod = _load("attention_decode_paged/correct_online_paged.py")
    return mod.entry(q, k_cache.permute(0, 2, 1, 3), v_cache.permute(0, 2, 1, 3), block_tables, kv_lens, scale)


def hnd_kv_append(key, value, k_cache, v_cache, slot_mapping):
    assert current_params()["layout"] == "hnd" and k_cache.shape[2] == current_params()["block_size"]
    mod = _load("kv_append/correct_per_token.py")
    mod.entry(key, value, k_cache.permute(0, 2, 1, 3), v_cache.permute(0, 2, 1, 3), slot_mapping)


def nhd_kv_append_given_hnd(key, value, k_cache, v_cache, slot_mapping):
    """A kernel that assumes nhd, handed an hnd cache: writes the wrong elements."""
    mod = _load("kv_append/correct_per_token.py")
    mod.entry(key, value, k_cache, v_cache, slot_mapping)


def attention_writes_cache(q, k_cache, v_cache, block_tables, kv_lens, scale):
    """A correct paged attention that then adds 1 to the first slot of sequence 0's first block."""
    out = _load("attention_decode_paged/correct_online_paged.py").entry(q, k_cache, v_cache, block_tables, kv_lens,
                                                                         scale)
    k_cache[int(block_tables[0, 0]), 0] += 1.0
    return out
