"""attention.decode_mla entry for vLLM's Triton MLA decode (vllm 0.34.0,
vllm/v1/attention/ops/triton_decode_attention.py, called as vLLM's Triton MLA backend calls it): the grouped
split-KV stage 1 with IS_MLA over one shared latent cache, then the log-sum-exp combine of stage 2.

What vLLM's backend (vllm/v1/attention/backends/mla/triton_mla.py, forward_mqa) does before the call, in our own
lines: q is [q_nope, q_pe] concatenated on the last dim (576 wide for DeepSeek's 512 + 64: the kernel's
BLOCK_DMODEL 512 and BLOCK_DPE 64 read the two parts), the key buffer is the latent cache with a head dim of
one ([num_blocks, block_size, 1, kv_lora_rank + rope_dim]) and the value buffer its first kv_lora_rank columns
(a view: IS_MLA reuses the key tile as V). The number of KV splits is the backend's rule (the next power of two
of max_kv_len // 512, at most twice an H100's 132 SMs); the scratch is [B, H, splits, kv_lora_rank + 1]. The
module imports vLLM's platform object and its Triton re-export; the stand-ins are our own lines (CUDA, not ROCm).
"""

import torch
import triton
import triton.language as tl
from _source import load


class _Cuda:
    @staticmethod
    def is_rocm():
        return False


_m = load(
    "vllm-0.34.0",
    "vllm/v1/attention/ops/triton_decode_attention.py",
    stubs={"vllm.platforms": {"current_platform": _Cuda()}, "vllm.triton_utils": {"tl": tl, "triton": triton}},
)
H100_SMS = 132


def num_kv_splits(max_kv_len: int) -> int:
    return min(triton.next_power_of_2(max(1, max_kv_len // 512)), 2 * H100_SMS)


def entry(q_nope, q_pe, kv_cache, block_tables, kv_lens, scale):
    B, H, rank = q_nope.shape
    q = torch.cat([q_nope, q_pe], dim=-1)
    o = torch.zeros(B, H, rank, dtype=q.dtype, device=q.device)
    lse = torch.zeros(B, H, dtype=q.dtype, device=q.device)
    splits = num_kv_splits(int(kv_lens.max()))
    attn_logits = torch.empty((B, H, splits, rank + 1), dtype=torch.float32, device=q.device)
    kv = kv_cache.unsqueeze(2)
    _m.decode_attention_fwd(
        q, kv, kv[..., :rank], o, lse, block_tables, kv_lens, attn_logits, splits, scale, kv_cache.shape[1],
        is_mla=True,
    )  # fmt: skip
    return o
