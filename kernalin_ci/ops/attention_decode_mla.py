"""attention.decode_mla: multi-head latent attention decode over a paged latent cache (docs/ops.md).

DeepSeek-V2's MLA as serving stacks run its decode step (the data-movement friendly form: W_UK absorbed into
the query, W_UV applied after): every token's cache row is one latent vector c_j (kv_lora_rank wide) followed by
its decoupled RoPE key r_j (rope_dim wide, rotated before it was cached); all heads share it. Per sequence b
and head h:

    s_j = scale * (<q_nope[b,h], c_j> + <q_pe[b,h], r_j>)        j < kv_lens[b]
    out[b,h] = sum_j softmax(s)_j c_j                              the latent is the value

The scale is the model's, 1/sqrt(qk_nope_head_dim + rope_dim), not the latent width.
"""

from __future__ import annotations

from typing import Any

from kernalin_ci.device import DEVICES
from kernalin_ci.lazy import torch
from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops.attention_decode_paged import gather, paged_inputs
from kernalin_ci.ops.base import DTYPE_BYTES, Case, Expected, Op, Param, Params, Tensors, Traffic, positive
from kernalin_ci.ops.bench_shapes import BenchRequest, len_label, ragged_lens

UNANALYSED = "multi-head latent attention (the analysis models separate K and V caches per KV head)"
QK_NOPE_HEAD_DIM = 128  # DeepSeek-V2/V3: the per-head no-RoPE query/key width the scale is taken from


class AttentionDecodeMla(Op):
    name = "attention.decode_mla"
    params = (
        Param("block_size", 16, int, "tokens per latent-cache block", check=positive),
        Param("kv_lora_rank", 512, int, "the latent width (DeepSeek-V2/V3: 512)", check=positive),
        Param("rope_dim", 64, int, "the decoupled RoPE width (DeepSeek-V2/V3: 64)", check=positive),
        Param("num_heads", None, int, "pin the query heads (default: cases use 16 and 128)", check=positive),
    )
    written = ()
    paged_cache = True
    attends = True
    domain_axes = ("dtype", "block_size")

    # ------------------------------------------------------------------ cases

    def cases(self, params: Params, device: str, dtype: str | None) -> list[Case]:
        main = dtype or "float32"
        rank, rope = int(params["kv_lora_rank"]), int(params["rope_dim"])

        def dims(heads: int, lens: list[int], **extra: Any) -> dict[str, Any]:
            h = params.get("num_heads") or heads
            scale = (QK_NOPE_HEAD_DIM + rope) ** -0.5
            return {"Hq": h, "Hkv": 1, "D": rank + rope, "kv_lens": list(lens), "scale": scale, **extra}

        long = ac.long_length(device)
        cases = [
            Case("tiles", dims(16, [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129, 300]), main, 1, ("tiles",)),
            Case("heads-128", dims(128, [3, 40]), main, 2),  # DeepSeek-V3's 128 heads on one GPU
            Case("large-scores", dims(16, [2, 16, 100, 257], qk_std=2.5), main, 3, ("large-scores",)),
            Case("stale-tail", dims(16, [3, 31, 64, 190], tail="stale"), main, 4, ("stale-tail",)),
            Case("fresh-inputs", dims(16, [3, 31, 64, 190], tail="stale"), main, 5, ("repeat-of:stale-tail",)),
            Case("long", dims(4, [long, long * 3 // 5 + 3]), main, 6, ("long",)),
        ]
        if dtype is None:
            for i, dt in enumerate(("float16", "bfloat16")):
                cases.append(Case(f"large-scores-{dt}", dict(cases[2].dims), dt, 20 + i, ("large-scores",)))
        return cases

    def probe(self, params: Params, dtype: str | None) -> Case:
        rank, rope = int(params["kv_lora_rank"]), int(params["rope_dim"])
        dims = {
            "Hq": params.get("num_heads") or 16,
            "Hkv": 1,
            "D": rank + rope,
            "kv_lens": [1],
            "scale": (QK_NOPE_HEAD_DIM + rope) ** -0.5,
            "tail": "zeros",
            "arange_tables": True,
        }
        return Case("pos0-probe", dims, dtype or "float32", 0, ("probe",))

    def shape_case(self, params: Params, dtype: str) -> Case:
        case = self.probe(params, dtype)
        dims = {k: v for k, v in case.dims.items() if k not in ("tail", "arange_tables")}
        return Case("shape", {**dims, "kv_lens": [1, 19]}, dtype, 40, ("shape",))

    def validate_case(self, case: Case) -> str | None:
        if case.dims.get("Hkv") != 1:
            return "Hkv must be 1 (every head reads the one latent cache)"
        return ac.validate_dims(case.dims)

    def unanalysed(self, params: Params) -> list[str]:
        return [UNANALYSED]

    # ------------------------------------------------------------------ one call

    def inputs(self, case: Case, params: Params, device: str, poison: bool = True) -> Tensors:
        """attention.decode_paged's inputs with one KV head of width kv_lora_rank + rope_dim: its k_cache is the
        latent cache, its q split into the no-RoPE and the RoPE part."""
        rank = case.dims["D"] - int(params["rope_dim"])
        kw = paged_inputs(case, {**params, "layout": "nhd"}, device, poison)
        q = kw["q"]
        return {
            "q_nope": q[..., :rank].contiguous(),
            "q_pe": q[..., rank:].contiguous(),
            "kv_cache": kw["k_cache"][:, :, 0].contiguous(),
            "block_tables": kw["block_tables"],
            "kv_lens": kw["kv_lens"],
            "scale": kw["scale"],
        }

    def outputs(self, ret: Any, kw: Tensors) -> Tensors:
        return {"out": ret}

    @staticmethod
    def _attend(
        kw: Tensors, scale: float, lens: list[int] | None = None, q_pe: Any = None, normalize: bool = True
    ) -> Any:
        """The definition in float64 over each sequence's first lens[b] tokens (default kv_lens)."""
        q_nope = kw["q_nope"].to(torch.float64)
        q_pe = (kw["q_pe"] if q_pe is None else q_pe).to(torch.float64)
        rank = q_nope.shape[-1]
        cache = kw["kv_cache"].unsqueeze(2)  # [num_blocks, block_size, 1, rank + rope]
        lens = kw["kv_lens"].tolist() if lens is None else lens
        out = torch.empty_like(q_nope)
        for b, L in enumerate(lens):
            rows = gather(cache, kw["block_tables"], b, max(L, 1))[0].to(torch.float64)  # [L, rank + rope]
            c, r = rows[:, :rank], rows[:, rank:]
            s = scale * (q_nope[b] @ c.T + q_pe[b] @ r.T)  # [H, L]
            p = torch.softmax(s, -1) if normalize else torch.exp(s - s.max(-1, keepdim=True).values)
            out[b] = p @ c
        return out

    def reference(self, kw: Tensors, params: Params) -> Expected:
        return Expected({"out": self._attend(kw, kw["scale"])})

    def fingerprints(self, kw: Tensors, params: Params, case: Case) -> list[tuple[str, Tensors]]:
        """MLA's own bugs first (the RoPE part of the score dropped, or taken against the latent's first
        columns), then the scale from a width (the latent's, the whole row's) and the attention bugs."""
        scale, lens = kw["scale"], kw["kv_lens"].tolist()
        rank, rope = kw["q_nope"].shape[-1], kw["q_pe"].shape[-1]
        fps: list[tuple[str, Tensors]] = [("mla-rope", {"out": self._attend(kw, scale, q_pe=kw["q_pe"] * 0)})]
        if rope <= rank:  # q_pe against c_j[:rope]: the RoPE key read at column 0, not at kv_lora_rank
            wrong = torch.cat([kw["kv_cache"][..., :rank], kw["kv_cache"][..., :rope]], -1)
            fps.append(("mla-rope", {"out": self._attend({**kw, "kv_cache": wrong}, scale)}))
        for wrong_scale in (1.0, scale * scale, (rank + rope) ** -0.5, rank**-0.5):
            fps.append(("scale", {"out": self._attend(kw, wrong_scale)}))
        fps.append(("softmax-no-normalize", {"out": self._attend(kw, scale, normalize=False)}))
        if case.dims.get("tail", "nan") != "nan":
            fps.append(("kv-mask", {"out": self._attend(kw, scale, [L + 1 for L in lens])}))
        fps.append(("kv-mask", {"out": self._attend(kw, scale, [max(L - 1, 1) for L in lens])}))
        return fps

    def row_label(self, case: Case, kw: Tensors, name: str, row: int) -> str:
        b, h = divmod(row, case.dims["Hq"])
        return f"b={b} h={h} (kv_len={case.dims['kv_lens'][b]})"

    # ------------------------------------------------------------------ benchmark

    def bench_cases(self, params: Params, device: str, request: BenchRequest) -> list[Case]:
        """attention.decode_paged's batch and length regimes, at the latent cache's width and DeepSeek-V3's
        heads per GPU (128; num_heads where pinned)."""
        rank, rope = int(params["kv_lora_rank"]), int(params["rope_dim"])
        heads = int(params.get("num_heads") or (128 if DEVICES[device].gpu else 4))
        cases = []
        for i, s in enumerate(request.attention_shapes()):
            lens = ragged_lens(s["batch"], s["kv_len"], ragged=not s.get("explicit"))
            dims = {
                "Hq": heads,
                "Hkv": 1,
                "D": rank + rope,
                "kv_lens": lens,
                "scale": (QK_NOPE_HEAD_DIM + rope) ** -0.5,
            }
            name = f"B={s['batch']} kv_len={len_label(lens)} H={heads} latent={rank}+{rope} {request.dtype}"
            cases.append(Case(name, dims, request.dtype, 1000 + i, ("bench",)))
        return cases

    def traffic(self, case: Case, params: Params) -> Traffic | None:
        """q read, each token's latent row read once (shared by every head), the index inputs read, out
        written; 2·(rank + rope) FLOPs per (head, key) for the score and 2·rank for p·c."""
        d = case.dims
        e = DTYPE_BYTES[case.dtype]
        lens = [int(x) for x in d["kv_lens"]]
        B, H, W = len(lens), int(d["Hq"]), int(d["D"])
        rank = W - int(params["rope_dim"])
        bs = int(params["block_size"])
        read = B * H * W * e + sum(lens) * W * e + 4 * B + 4 * sum(-(-L // bs) for L in lens)
        return Traffic(read, B * H * rank * e, 2 * H * (W + rank) * sum(lens))


OP_CLASS = AttentionDecodeMla
