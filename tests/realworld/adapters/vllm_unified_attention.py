"""attention.decode_multi entry for vLLM's Triton unified attention (vllm 0.34.0,
vllm/v1/attention/ops/triton_unified_attention.py, with its helpers in triton_attention_helpers.py): the kernel
vLLM's Triton attention backend runs for every batch, decode, speculative verify and prefill alike. A program
takes BLOCK_Q new tokens of one sequence (found from query_start_loc by a binary search) for one KV head, and
masks each key against the token's absolute position (context length + its index among the new tokens).

Called as vLLM's backend (vllm/v1/attention/backends/triton_attn.py) calls it, in our own lines: our NHD cache and
block table as they are, query_start_loc as cu_seqlens_q, kv_lens as seqused_k, causal, no window or soft-cap,
descales of one per sequence and KV head (1: an unquantised cache), and the split-K scratch of the backend
(16 softmax segments: the launcher takes the 3D kernel plus its reduce while sequences x query blocks of
each stay within 128 // Hkv, as in a decode batch of a few sequences, else the 2D kernel). The module imports
vLLM's env flags, logger, platform object, Triton re-export, the helpers module and the KV-quantisation enum;
the stand-ins are our own lines (CUDA, not ROCm, batch invariance off).
"""

import enum

import torch
import triton
import triton.language as tl
from _source import load

_TRITON = {"vllm.triton_utils": {"tl": tl, "triton": triton}}


class _Cuda:
    @staticmethod
    def is_rocm():
        return False

    @staticmethod
    def fp8_dtype():
        return torch.float8_e4m3fn

    @staticmethod
    def is_device_capability_family(family):
        return False  # Hopper


class _Logger:
    def debug_once(self, *args, **kwargs):
        pass


class _KVQuantMode(enum.IntEnum):  # vLLM's values (vllm/v1/kv_cache_interface.py)
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


_helpers = load("vllm-0.34.0", "vllm/v1/attention/ops/triton_attention_helpers.py", stubs=_TRITON)
_m = load(
    "vllm-0.34.0",
    "vllm/v1/attention/ops/triton_unified_attention.py",
    stubs={
        **_TRITON,
        "vllm.envs": {"VLLM_BATCH_INVARIANT": False},
        "vllm.logger": {"init_logger": lambda name: _Logger()},
        "vllm.platforms": {"current_platform": _Cuda()},
        "vllm.v1.attention.ops.triton_attention_helpers": vars(_helpers),
        "vllm.v1.kv_cache_interface": {"KVQuantMode": _KVQuantMode},
    },
)
MIN_LAUNCH_GRID_SIZE_2D = 128  # the backend's constants
NUM_PAR_SOFTMAX_SEGMENTS = 16


def entry(q, k_cache, v_cache, block_tables, query_start_loc, kv_lens, scale):
    T, hq, d = q.shape
    B, hkv = kv_lens.shape[0], k_cache.shape[2]
    out = torch.empty_like(q)
    ones = torch.ones((B, hkv), dtype=torch.float32, device=q.device)
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    segm = (T, hq, NUM_PAR_SOFTMAX_SEGMENTS)
    _m.unified_attention(
        q=q, k=k_cache, v=v_cache, out=out, cu_seqlens_q=query_start_loc, max_seqlen_q=int(q_lens.max()),
        seqused_k=kv_lens, max_seqlen_k=int(kv_lens.max()), softmax_scale=scale, causal=True, window_size=(-1, -1),
        block_table=block_tables, softcap=0, q_descale=None, k_descale=ones, v_descale=ones,
        seq_threshold_3D=MIN_LAUNCH_GRID_SIZE_2D // hkv, num_par_softmax_segments=NUM_PAR_SOFTMAX_SEGMENTS,
        softmax_segm_output=torch.empty((*segm, triton.next_power_of_2(d)), dtype=torch.float32, device=q.device),
        softmax_segm_max=torch.empty(segm, dtype=torch.float32, device=q.device),
        softmax_segm_expsum=torch.empty(segm, dtype=torch.float32, device=q.device),
    )  # fmt: skip
    return out
