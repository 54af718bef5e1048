"""attention.decode: one query token per sequence, contiguous KV cache (docs/ops.md)."""

from __future__ import annotations

from typing import Any

from kernalin_ci.findings import Finding
from kernalin_ci.lazy import torch
from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops import attention_features as af
from kernalin_ci.ops import kv_quant
from kernalin_ci.ops.base import Case, Expected, Params, Tensors, generator, randn
from kernalin_ci.runtime.poison import fill_canary


class AttentionDecode(ac.AttentionOp):
    name = "attention.decode"
    params = ac.SHAPE_PARAMS + ac.FEATURE_PARAMS
    written = ()
    # the contiguous caches are [B, Hkv, S, D]: one row of blocks per sequence, S slots each
    shape_symbols = {("k_cache", 0): "B", ("v_cache", 0): "B", ("k_cache", 2): "S", ("v_cache", 2): "S"}
    domain_axes = ("head_dim", "num_q_heads", "num_kv_heads", "dtype")

    def cases(self, params: Params, device: str, dtype: str | None) -> list[Case]:
        return ac.plan(params, device, dtype)

    def probe(self, params: Params, dtype: str | None) -> Case:
        return Case("pos0-probe", ac.probe_dims(params), dtype or "float32", 0, ("probe",))

    def shape_case(self, params: Params, dtype: str) -> Case:
        return Case("shape", ac.shape_dims(params), dtype, 40, ("shape",))

    def inputs(self, case: Case, params: Params, device: str, poison: bool = True) -> Tensors:
        d = case.dims
        g = generator(case.seed)
        lens = d["kv_lens"]
        B, Hq, Hkv, D = len(lens), d["Hq"], d["Hkv"], d["D"]
        S = d.get("S") or max(lens) + 13
        std = d.get("qk_std", 1.0)
        q = randn((B, Hq, D), g, case.dtype, "cpu", std)
        k = randn((B, Hkv, S, D), g, case.dtype, "cpu", std)
        v = randn((B, Hkv, S, D), g, case.dtype, "cpu")
        _fill_tails(k, v, lens, d.get("tail", "nan"), g, poison)
        quant = kv_quant.spec_of(params)
        scales = {}
        if quant:  # the caches quantised on write, as kv_append stores them (NaN canaries stay canaries)
            scales = kv_quant.scales(quant, case.tags, Hkv, std, device)
            if "fp8-edges" in case.tags:
                for b in range(B):
                    kv_quant.place_edges(k[b].permute(1, 0, 2), scales["k_scale"], quant)
                    kv_quant.place_edges(v[b].permute(1, 0, 2), scales["v_scale"], quant)
            k = kv_quant.quantise(k, scales["k_scale"], quant, 1)
            v = kv_quant.quantise(v, scales["v_scale"], quant, 1)
        return {
            "q": q.to(device),
            "k_cache": k.to(device),
            "v_cache": v.to(device),
            "kv_lens": torch.tensor(lens, dtype=torch.int32, device=device),
            "scale": float(d["scale"]),
            **af.extra_inputs(case, params, Hq, device),
            **scales,
        }

    def outputs(self, ret: Any, kw: Tensors) -> Tensors:
        return {"out": ret}

    def reference(self, kw: Tensors, params: Params) -> Expected:
        lens = kw["kv_lens"].tolist()
        q = kw["q"]
        Hkv = kw["k_cache"].shape[1]
        ks, vs = kw.get("k_scale"), kw.get("v_scale")
        K = [kv_quant.dequantise(kw["k_cache"][b, :, :L], ks) for b, L in enumerate(lens)]
        V = [kv_quant.dequantise(kw["v_cache"][b, :, :L], vs) for b, L in enumerate(lens)]
        feat = af.Features.of(params, kw)
        out, slack, tf32 = ac.reference_out(q, K, V, kw["scale"], Hkv, feat, quantised=ks is not None)
        return Expected({"out": out}, row_slack=slack, tf32_slack=tf32)

    def fingerprints(self, kw: Tensors, params: Params, case: Case) -> list[tuple[str, Tensors]]:
        S = kw["k_cache"].shape[2]
        q = kw["q"]
        ks, vs = kw.get("k_scale"), kw.get("v_scale")
        quant = kv_quant.spec_of(params)
        fps = []
        if quant:
            fps = ac.fp8_fingerprints(
                q,
                lambda b, L, s: kv_quant.dequantise(kw["k_cache"][b, :, : min(L, S)], s),
                lambda b, L, s: kv_quant.dequantise(kw["v_cache"][b, :, : min(L, S)], s),
                kw["kv_lens"].tolist(),
                kw["scale"],
                q.shape[1],
                kw["k_cache"].shape[1],
                quant,
                {"k_scale": ks, "v_scale": vs},
                af.Features.of(params, kw),
            )
        return fps + ac.fingerprints(
            q,
            lambda b, L: kv_quant.dequantise(kw["k_cache"][b, :, : min(L, S)], ks),
            lambda b, L: kv_quant.dequantise(kw["v_cache"][b, :, : min(L, S)], vs),
            kw["kv_lens"].tolist(),
            kw["scale"],
            q.shape[1],
            kw["k_cache"].shape[1],
            q.shape[2],
            tail_finite=case.dims.get("tail", "nan") != "nan",
            feat=af.Features.of(params, kw),
        )

    def properties(self, case: Case, kw: Tensors, outs: Tensors, params: Params) -> list[Finding]:
        return []

    def row_label(self, case: Case, kw: Tensors, name: str, row: int) -> str:
        return ac.row_label(case.dims, row)


def _fill_tails(k: Any, v: Any, lens: list[int], tail: str, g: Any, poison: bool) -> None:
    """Cache entries at j >= kv_len: NaN canary (default), stale finite data, or zeros (probe)."""
    for b, L in enumerate(lens):
        for t in (k, v):
            part = t[b, :, L:]
            if tail == "zeros" or not poison:
                part.zero_()
            elif tail == "stale":
                part.copy_(torch.randn(part.shape, generator=g, dtype=torch.float64).mul_(3.0).to(part.dtype))
            else:
                fill_canary(part)


OP_CLASS = AttentionDecode
