"""A decode step of a model's shape, with random weights, built with torch around the gated kernels.

Runs inside the worker (kernalin_ci.throughput.task), never in the gate process. Per layer:

    x -> RMSNorm -> q, k, v GEMMs -> rope -> kv_append -> attention -> o GEMM -> + x
      -> RMSNorm -> gate|up GEMM -> SiLU(gate) * up -> down GEMM -> + residual

with the embedding lookup before the first layer and RMSNorm + LM head after the last (the LM head
reads the embedding matrix: tied, which changes nothing read per step). The GEMMs are cuBLAS through
torch.mm; the norms and the activation are torch ops. The rope, kv_append and attention places take
the configured kernels (each op's contract, docs/ops.md: contiguous q, k, v; positions and slots
int64; kv_lens and block tables int32); a place without a kernel takes a torch implementation. A
decode_step kernel takes all three at once: it gets q, k, v before rotation and returns the attention.

Every sequence of a serving point holds `context` tokens and decodes token `context` (position
`context`, attention over context + 1 keys). Caches are paged (block_size and layout from the
kernel's params) for an `attention.decode_paged` or `decode_step` kernel, or a kv_append kernel with the
torch attention, contiguous [B, Hkv, S, D] otherwise; blocks are assigned in a random order, as a serving
engine's pool hands them out.
The model's attention features (window, logit_cap, sinks, kv_dtype: docs/tokens.md) are each layer's op
params for its kernels while they run, with the sinks and FP8 scales as arguments; the torch places do them too.
Weights are N(0, 1/fan_in) so activations stay bounded through any depth; the KV caches hold
N(0, 1) keys and values. Nothing here reads the kernels' outputs except the agreement check.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernalin_ci.device import DEVICES
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import torch_dtype
from kernalin_ci.ops.kv_quant import FORMATS
from kernalin_ci.throughput.spec import ModelSpec, ServingPoint

RMS_EPS = 1e-5


@dataclass
class Kernels:
    """One instance's kernels by role (None: the torch implementation) and how the cache is laid out."""

    attention: object | None = None
    rope: object | None = None
    kv_append: object | None = None
    decode_step: object | None = None  # the fused place: rope, kv_append and attention in one entry
    attention_op: str | None = None  # the attention kernel's op (attention.decode_paged or .decode); None: torch
    block_size: int = 16
    layout: str = "nhd"
    params: dict = field(default_factory=dict)  # the kernels' op params; each layer adds the model's features

    @property
    def paged(self) -> bool:
        """A paged cache for a paged attention kernel, a decode_step kernel, or a kv_append kernel with the torch
        attention."""
        if self.attention_op is not None:
            return get_op(self.attention_op).paged_cache
        return self.kv_append is not None or self.decode_step is not None


@dataclass
class Layer:
    attn_norm: torch.Tensor
    wq: torch.Tensor  # [H, Hq*D]
    wk: torch.Tensor  # [H, Hkv*D]
    wv: torch.Tensor
    wo: torch.Tensor  # [Hq*D, H]
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor  # [H, 2I]
    w_down: torch.Tensor  # [I, H]


@dataclass
class Weights:
    embed: torch.Tensor  # [V, H]; the LM head is embed.T
    final_norm: torch.Tensor
    layers: list[Layer] = field(default_factory=list)


def layer_bytes(spec: ModelSpec) -> int:
    H, D, I = spec.hidden_size, spec.head_dim, spec.intermediate_size
    n = H * spec.num_heads * D * 2 + H * spec.num_kv_heads * D * 2 + H * 2 * I + I * H + 2 * H
    return n * torch_dtype(spec.dtype).itemsize


def ends_bytes(spec: ModelSpec) -> int:
    return (spec.vocab_size * spec.hidden_size + spec.hidden_size) * torch_dtype(spec.dtype).itemsize


def cache_blocks(point: ServingPoint, block_size: int) -> tuple[int, int]:
    """(blocks per sequence, blocks in the pool) of a paged cache for this point."""
    per_seq = -(-(point.context + 1) // block_size)
    return per_seq, point.batch * per_seq + 1


def cache_dtype(spec: ModelSpec) -> torch.dtype:
    """The KV caches' dtype: the FP8 format of `kv_dtype`, else the model's."""
    return getattr(torch, FORMATS[spec.kv_dtype]) if spec.kv_dtype else torch_dtype(spec.dtype)


def kv_bytes(spec: ModelSpec, point: ServingPoint, kernels: Kernels) -> int:
    """Both caches of one layer at this point (a byte an element in an FP8 cache)."""
    slots = (
        cache_blocks(point, kernels.block_size)[1] * kernels.block_size
        if kernels.paged
        else point.batch * (point.context + 1)
    )
    return 2 * slots * spec.num_kv_heads * spec.head_dim * cache_dtype(spec).itemsize


def _randn(shape, gen, dtype, device, scale=1.0) -> torch.Tensor:
    t = torch.randn(*shape, generator=gen, device=device, dtype=dtype if DEVICES[device].gpu else torch.float32)
    if scale != 1.0:
        t.mul_(scale)
    return t.to(dtype)


def build_weights(spec: ModelSpec, n_layers: int, device: str, seed: int) -> Weights:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dt = torch_dtype(spec.dtype)
    H, D, I = spec.hidden_size, spec.head_dim, spec.intermediate_size
    ones = torch.ones(H, dtype=dt, device=device)
    w = Weights(embed=_randn((spec.vocab_size, H), gen, dt, device), final_norm=ones)
    for _ in range(n_layers):
        w.layers.append(
            Layer(
                attn_norm=ones,
                wq=_randn((H, spec.num_heads * D), gen, dt, device, H**-0.5),
                wk=_randn((H, spec.num_kv_heads * D), gen, dt, device, H**-0.5),
                wv=_randn((H, spec.num_kv_heads * D), gen, dt, device, H**-0.5),
                wo=_randn((spec.num_heads * D, H), gen, dt, device, (spec.num_heads * D) ** -0.5),
                mlp_norm=ones,
                w_gate_up=_randn((H, 2 * I), gen, dt, device, H**-0.5),
                w_down=_randn((I, H), gen, dt, device, I**-0.5),
            )
        )
    return w


@dataclass
class Caches:
    """One layer's KV caches at one serving point."""

    k: torch.Tensor
    v: torch.Tensor


@dataclass
class PointInputs:
    """What one serving point's step reads besides the weights (shared by every instance: each writes the
    new token's keys and values into the same slots before it reads them)."""

    point: ServingPoint
    tokens: torch.Tensor  # [B] int64
    hidden: torch.Tensor  # [B, H]: the input of the per-layer block
    positions: torch.Tensor  # [B] int64
    slots: torch.Tensor  # [B] int64 (paged)
    block_tables: torch.Tensor | None  # [B, blocks per sequence] int32 (paged)
    kv_lens: torch.Tensor  # [B] int32
    cos: torch.Tensor  # [D/2] float32: the torch rope's angles at this position
    sin: torch.Tensor
    sinks: torch.Tensor | None = None  # [Hq] float32: the sink logits (model.sinks), shared by the layers
    k_scale: torch.Tensor | None = None  # [1] or [Hkv] (kv_scale: per-head) float32: the FP8 caches' scales
    v_scale: torch.Tensor | None = None
    caches: list[Caches] = field(default_factory=list)  # one per built layer


def build_point(
    spec: ModelSpec, point: ServingPoint, kernels: Kernels, n_layers: int, device: str, seed: int
) -> PointInputs:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    dgen = torch.Generator(device=device)
    dgen.manual_seed(seed + 1)
    dt = torch_dtype(spec.dtype)
    B, L, Hkv, D = point.batch, point.context, spec.num_kv_heads, spec.head_dim
    positions = torch.full((B,), L, dtype=torch.int64)
    if kernels.paged:
        bs = kernels.block_size
        per_seq, pool = cache_blocks(point, bs)
        tables = torch.randperm(pool, generator=gen)[: B * per_seq].reshape(B, per_seq).to(torch.int32)
        slots = tables[:, L // bs].to(torch.int64) * bs + L % bs
        shape = (pool, bs, Hkv, D) if kernels.layout == "nhd" else (pool, Hkv, bs, D)
    else:
        tables, slots = None, torch.zeros(B, dtype=torch.int64)
        shape = (B, Hkv, L + 1, D)
    inv = spec_rope_base() ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = float(L) * inv
    pi = PointInputs(
        point=point,
        tokens=torch.randint(0, spec.vocab_size, (B,), generator=gen).to(device),
        hidden=_randn((B, spec.hidden_size), dgen, dt, device),
        positions=positions.to(device),
        slots=slots.to(device),
        block_tables=tables.to(device) if tables is not None else None,
        kv_lens=torch.full((B,), L + 1, dtype=torch.int32, device=device),
        cos=ang.cos().float().to(device),
        sin=ang.sin().float().to(device),
    )
    if spec.sinks:
        pi.sinks = torch.randn(spec.num_heads, generator=gen).to(device)
    cdt = cache_dtype(spec)
    if spec.kv_dtype:  # N(0, 1) keys and values stored with scale 1 (the FP8 formats hold them)
        n = Hkv if kernels.params.get("kv_scale") == "per-head" else 1
        pi.k_scale = torch.ones(n, dtype=torch.float32, device=device)
        pi.v_scale = torch.ones(n, dtype=torch.float32, device=device)
    for _ in range(n_layers):
        pi.caches.append(Caches(_randn(shape, dgen, dt, device).to(cdt), _randn(shape, dgen, dt, device).to(cdt)))
    return pi


def spec_rope_base() -> float:
    return 10000.0  # the torch rope's base (timing only: the angles' values do not change the work)


# ------------------------------------------------------------------------------------------ the step


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, RMS_EPS)


def torch_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h].float(), x[..., h:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@contextmanager
def op_params(params: dict) -> Iterator[None]:
    """The op params the kernels called inside read (kernalin_ci.current_params()); the previous ones after."""
    before = os.environ.get("KERNALIN_PARAMS")
    os.environ["KERNALIN_PARAMS"] = json.dumps(params)
    try:
        yield
    finally:
        if before is None:
            del os.environ["KERNALIN_PARAMS"]
        else:
            os.environ["KERNALIN_PARAMS"] = before


def attention_block(
    spec: ModelSpec, index: int, layer: Layer, cache: Caches, pi: PointInputs, k: Kernels, x: torch.Tensor
) -> torch.Tensor:
    """The attention half of layer INDEX up to (not including) the o projection: [B, Hq*D]. The kernels get the
    layer's attention features as op params (ModelSpec.attention_params) and their extra arguments."""
    with op_params(k.params | spec.attention_params(index)):
        return _attention(spec, index, layer, cache, pi, k, x)


def _attention(
    spec: ModelSpec, index: int, layer: Layer, cache: Caches, pi: PointInputs, k: Kernels, x: torch.Tensor
) -> torch.Tensor:
    B, Hq, Hkv, D = pi.point.batch, spec.num_heads, spec.num_kv_heads, spec.head_dim
    xn = rms_norm(x, layer.attn_norm)
    q = torch.mm(xn, layer.wq).view(B, Hq, D)
    key = torch.mm(xn, layer.wk).view(B, Hkv, D)
    value = torch.mm(xn, layer.wv).view(B, Hkv, D)
    scale = D**-0.5
    feats = spec.attention_params(index)
    extra: dict = {}  # the features' arguments (docs/ops.md)
    if pi.sinks is not None:
        extra["sinks"] = pi.sinks
    quant: dict = {} if pi.k_scale is None else {"k_scale": pi.k_scale, "v_scale": pi.v_scale}
    if k.decode_step is not None:  # the whole attention step in one entry (docs/ops.md, decode_step)
        o = k.decode_step(
            q=q,
            k=key,
            v=value,
            positions=pi.positions,
            k_cache=cache.k,
            v_cache=cache.v,
            slot_mapping=pi.slots,
            block_tables=pi.block_tables,
            kv_lens=pi.kv_lens,
            scale=scale,
            **extra,
            **quant,
        )
        return o.reshape(B, Hq * D)
    if k.rope is not None:
        q, key = k.rope(q=q, k=key, positions=pi.positions)
    else:
        q, key = torch_rope(q, pi.cos, pi.sin), torch_rope(key, pi.cos, pi.sin)
    if k.paged:
        if k.kv_append is not None:
            k.kv_append(key=key, value=value, k_cache=cache.k, v_cache=cache.v, slot_mapping=pi.slots, **quant)
        else:
            bs = k.block_size
            blk, off = pi.slots // bs, pi.slots % bs
            kq, vq = quantise(key, cache.k, pi.k_scale), quantise(value, cache.v, pi.v_scale)
            if k.layout == "nhd":
                cache.k[blk, off], cache.v[blk, off] = kq, vq
            else:
                cache.k[blk, :, off], cache.v[blk, :, off] = kq, vq
        if k.attention is not None:
            o = k.attention(
                q=q, k_cache=cache.k, v_cache=cache.v, block_tables=pi.block_tables, kv_lens=pi.kv_lens, scale=scale,
                **extra, **quant,
            )  # fmt: skip
        else:
            o = torch_attention(q, *gather_paged(cache, pi, k.layout), pi, feats, scale)
    else:
        L = pi.point.context
        cache.k[:, :, L].copy_(quantise(key, cache.k, pi.k_scale))
        cache.v[:, :, L].copy_(quantise(value, cache.v, pi.v_scale))
        if k.attention is not None:
            o = k.attention(q=q, k_cache=cache.k, v_cache=cache.v, kv_lens=pi.kv_lens, scale=scale, **extra, **quant)
        else:
            o = torch_attention(q, cache.k, cache.v, pi, feats, scale)
    return o.reshape(B, Hq * D)


def quantise(x: torch.Tensor, cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """x as the cache stores it: divided by the scale and cast to the FP8 format (saturating), or unchanged."""
    if scale is None:
        return x
    info = torch.finfo(cache.dtype)
    return (x.float() / scale.view(-1, 1)).clamp(info.min, info.max).to(cache.dtype)


def gather_paged(cache: Caches, pi: PointInputs, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's context + 1 keys and values of a paged cache, through its block table: [B, Hkv, n, D]."""
    n = pi.point.context + 1
    tables = pi.block_tables.long()

    def gather(c: torch.Tensor) -> torch.Tensor:
        g = c[tables]  # nhd [B, blocks, bs, Hkv, D]; hnd [B, blocks, Hkv, bs, D]
        if layout != "nhd":
            g = g.transpose(2, 3)
        return g.flatten(1, 2)[:, :n].transpose(1, 2)  # [B, Hkv, n, D]

    return gather(cache.k), gather(cache.v)


def torch_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pi: PointInputs, feats: dict, scale: float
) -> torch.Tensor:
    """The torch attention (no attention kernel configured) over [B, Hkv, n, D] keys and values, with the layer's
    features (docs/ops.md): dequantised FP8 caches, the soft-cap, the window, the sinks. Without any: SDPA."""
    if pi.k_scale is not None:
        ks, vs = pi.k_scale.view(-1, 1, 1), pi.v_scale.view(-1, 1, 1)
        keys, values = (keys.float() * ks).to(q.dtype), (values.float() * vs).to(q.dtype)
    gqa = q.shape[1] != keys.shape[1]
    if not ({"window", "logit_cap", "sinks"} & feats.keys()):
        return F.scaled_dot_product_attention(q[:, :, None], keys, values, scale=scale, enable_gqa=gqa)[:, :, 0]
    group = q.shape[1] // keys.shape[1]
    kf = keys.float().repeat_interleave(group, dim=1)  # [B, Hq, n, D]
    vf = values.float().repeat_interleave(group, dim=1)
    s = torch.einsum("bhd,bhnd->bhn", q.float(), kf) * scale
    if "logit_cap" in feats:
        s = feats["logit_cap"] * torch.tanh(s / feats["logit_cap"])
    n = s.shape[-1]  # every sequence's p is n - 1
    if "window" in feats:
        s[..., : max(n - feats["window"], 0)] = -math.inf
    m = s.amax(-1, keepdim=True)
    if pi.sinks is not None:
        m = torch.maximum(m, pi.sinks[None, :, None])
    p = torch.exp(s - m)
    den = p.sum(-1)
    if pi.sinks is not None:
        den = den + torch.exp(pi.sinks[None, :] - m[..., 0])
    return (torch.einsum("bhn,bhnd->bhd", p, vf) / den[..., None]).to(q.dtype)


def layer_forward(
    spec: ModelSpec, index: int, layer: Layer, cache: Caches, pi: PointInputs, k: Kernels, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (the layer's output, its attention output [B, Hq*D])."""
    attn = attention_block(spec, index, layer, cache, pi, k, x)
    h = x + torch.mm(attn, layer.wo)
    gu = torch.mm(rms_norm(h, layer.mlp_norm), layer.w_gate_up)
    inter = spec.intermediate_size
    act = F.silu(gu[:, :inter]) * gu[:, inter:]
    return h + torch.mm(act, layer.w_down), attn


def embed(w: Weights, pi: PointInputs) -> torch.Tensor:
    return F.embedding(pi.tokens, w.embed)


def lm_head(w: Weights, x: torch.Tensor) -> torch.Tensor:
    return torch.mm(rms_norm(x, w.final_norm), w.embed.t())


def full_step(spec: ModelSpec, w: Weights, pi: PointInputs, k: Kernels) -> dict:
    """Embedding, every layer, the LM head: one decode step. -> {"attn0", "logits"}."""
    x = embed(w, pi)
    attn0 = None
    for i, layer in enumerate(w.layers):
        x, attn = layer_forward(spec, i, layer, pi.caches[i], pi, k, x)
        attn0 = attn if i == 0 else attn0
    return {"attn0": attn0, "logits": lm_head(w, x)}


def layers_part(spec: ModelSpec, w: Weights, pi: PointInputs, k: Kernels) -> dict:
    """The per-layer estimate's block: the built layers in a row, from a fixed hidden state."""
    x = pi.hidden
    attn0 = None
    for i, layer in enumerate(w.layers):
        x, attn = layer_forward(spec, i, layer, pi.caches[i], pi, k, x)
        attn0 = attn if i == 0 else attn0
    return {"attn0": attn0, "hidden": x}


def ends_part(spec: ModelSpec, w: Weights, pi: PointInputs, k: Kernels) -> dict:
    """The per-layer estimate's rest: the embedding lookup, the final norm and the LM head."""
    return {"logits": lm_head(w, embed(w, pi))}


def block_layers(spec: ModelSpec, per_layer_bytes: int, target_bytes: int = 512 << 20) -> int:
    """Layers in the per-layer estimate's block: at least 2, enough that one pass reads `target_bytes` (many
    times the L2), so no layer of the block finds the previous one's weights or caches in the L2."""
    return max(2, min(spec.layers, math.ceil(target_bytes / max(per_layer_bytes, 1))))
