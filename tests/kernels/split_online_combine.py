"""Decode attention split over NUM_SPLITS ranges, combined by an online softmax over the splits in a loop
the compiler unrolls (SGLang's stage 2, decode_attention.py `_fwd_kernel_stage2`): the running max e_max,
acc and e_sum rescaled by exp(e_max - n_e_max) at every split. Stage 1 is the catalogue's
checks/attention_decode/correct_split_kv.py partial kernel.

`entry` rescales; `entry_no_rescale` does not (SGLang's stage-2 mutant: `old_scale = 1.0`), which is wrong
whenever a later split's log-sum-exp is larger than an earlier one's."""
import importlib.util
from pathlib import Path

import torch
import triton
import triton.language as tl

CATALOGUE = {"op": "attention.decode", "bug_class": None, "pos0": None, "params": {}, "modelled_on": None}

_spec = importlib.util.spec_from_file_location(
    "_catalogue_split_kv", Path(__file__).resolve().parents[2] / "checks/attention_decode/correct_split_kv.py"
)
_split_kv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_split_kv)
NUM_SPLITS = _split_kv.NUM_SPLITS


@triton.jit
def _online_combine(MidO, MidLse, Out, s_mb, s_mh, s_ms, s_md, s_lb, s_lh, s_ls, s_ob, s_oh, s_od,
                    D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, RESCALE: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    e_max = -float("inf")
    e_sum = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        lse = tl.load(MidLse + b * s_lb + h * s_lh + s * s_ls)
        o = tl.load(MidO + b * s_mb + h * s_mh + s * s_ms + offs_d * s_md, mask=d_mask, other=0.0)
        n_e_max = tl.maximum(lse, e_max)
        if RESCALE:
            old_scale = tl.exp(e_max - n_e_max)
        else:
            old_scale = 1.0
        p = tl.exp(lse - n_e_max)
        acc = acc * old_scale + p * o
        e_sum = e_sum * old_scale + p
        e_max = n_e_max
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, (acc / e_sum).to(Out.dtype.element_ty), mask=d_mask)


def _attention(q, k_cache, v_cache, kv_lens, scale, rescale):
    B, Hq, D = q.shape
    BLOCK_D = triton.next_power_of_2(D)
    mid_o = torch.empty((B, Hq, NUM_SPLITS, D), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((B, Hq, NUM_SPLITS), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _split_kv._split_partial[(B, Hq, NUM_SPLITS)](
        q, k_cache, v_cache, mid_o, mid_lse, kv_lens, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *mid_o.stride(), *mid_lse.stride(),
        GROUP=Hq // k_cache.shape[1], D=D, NUM_SPLITS=NUM_SPLITS, BLOCK_N=64, BLOCK_D=BLOCK_D)
    _online_combine[(B, Hq)](
        mid_o, mid_lse, out, *mid_o.stride(), *mid_lse.stride(), *out.stride(),
        D=D, NUM_SPLITS=NUM_SPLITS, BLOCK_D=BLOCK_D, RESCALE=rescale)
    return out


def entry(q, k_cache, v_cache, kv_lens, scale):
    return _attention(q, k_cache, v_cache, kv_lens, scale, True)


def entry_no_rescale(q, k_cache, v_cache, kv_lens, scale):
    return _attention(q, k_cache, v_cache, kv_lens, scale, False)
