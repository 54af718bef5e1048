"""attention.decode_paged: one query token per sequence, paged KV cache (docs/ops.md)."""

from __future__ import annotations

from typing import Any

from kernalin_ci.findings import Finding
from kernalin_ci.lazy import torch
from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops import attention_features as af
from kernalin_ci.ops import kv_quant, paged
from kernalin_ci.ops.base import Case, Expected, Param, Params, Tensors, generator, positive, randn
from kernalin_ci.runtime.poison import fill_canary


class AttentionDecodePaged(ac.AttentionOp):
    name = "attention.decode_paged"
    params = (
        (Param("block_size", 16, int, "tokens per KV-cache block", check=positive),)
        + ac.SHAPE_PARAMS
        + (paged.LAYOUT,)
        + ac.FEATURE_PARAMS
    )
    written = ()
    paged_cache = True
    flashinfer_bench = "gqa_paged"
    domain_axes = ("head_dim", "num_q_heads", "num_kv_heads", "dtype", "block_size")

    def cases(self, params: Params, device: str, dtype: str | None) -> list[Case]:
        cases = ac.plan(params, device, dtype)
        # Block 0 and the next low blocks free and poisoned, table entries past a sequence's blocks 0 (as
        # serving stacks pad them): a kernel that sends its padded lanes to block 0 (a masked table load
        # with other=0) and loads K/V there without a mask reads NaN. Random tables almost always hand
        # block 0 to a sequence, where the same lanes read finite data and 0 * finite hides the bug.
        base = cases[0].dims
        bs = params["block_size"]
        lens = sorted({1, 3, bs - 1 or 1, bs + 1, 3 * bs + 5, 100, 129})
        dims = {k: base[k] for k in ("Hq", "Hkv", "D", "scale")}
        cases.append(
            Case(
                "free-low-blocks",
                {**dims, "kv_lens": lens, "free_low": 3, "table_pad": 0},
                cases[0].dtype,
                9,
                ("free-low-blocks",),
            )
        )
        return cases

    def probe(self, params: Params, dtype: str | None) -> Case:
        return Case("pos0-probe", {**ac.probe_dims(params), "arange_tables": True}, dtype or "float32", 0, ("probe",))

    def shape_case(self, params: Params, dtype: str) -> Case:
        return Case("shape", ac.shape_dims(params), dtype, 40, ("shape",))

    def inputs(self, case: Case, params: Params, device: str, poison: bool = True) -> Tensors:
        return paged_inputs(case, params, device, poison)

    def outputs(self, ret: Any, kw: Tensors) -> Tensors:
        return {"out": ret}

    def reference(self, kw: Tensors, params: Params) -> Expected:
        lens = kw["kv_lens"].tolist()
        q, tb = kw["q"], kw["block_tables"]
        kc, vc = caches(kw, params)
        Hkv = kc.shape[2]
        ks, vs = kw.get("k_scale"), kw.get("v_scale")
        K = [kv_quant.dequantise(gather(kc, tb, b, L), ks) for b, L in enumerate(lens)]
        V = [kv_quant.dequantise(gather(vc, tb, b, L), vs) for b, L in enumerate(lens)]
        feat = af.Features.of(params, kw)
        out, slack, tf32 = ac.reference_out(q, K, V, kw["scale"], Hkv, feat, quantised=ks is not None)
        return Expected({"out": out}, row_slack=slack, tf32_slack=tf32)

    def fingerprints(self, kw: Tensors, params: Params, case: Case) -> list[tuple[str, Tensors]]:
        q, tb = kw["q"], kw["block_tables"]
        kc, vc = caches(kw, params)
        ks, vs = kw.get("k_scale"), kw.get("v_scale")
        quant = kv_quant.spec_of(params)
        fps = []
        if quant:
            fps = ac.fp8_fingerprints(
                q,
                lambda b, L, s: kv_quant.dequantise(gather(kc, tb, b, L), s),
                lambda b, L, s: kv_quant.dequantise(gather(vc, tb, b, L), s),
                kw["kv_lens"].tolist(),
                kw["scale"],
                q.shape[1],
                kc.shape[2],
                quant,
                {"k_scale": ks, "v_scale": vs},
                af.Features.of(params, kw),
            )
        fps += ac.fingerprints(
            q,
            lambda b, L: kv_quant.dequantise(gather(kc, tb, b, L), ks),
            lambda b, L: kv_quant.dequantise(gather(vc, tb, b, L), vs),
            kw["kv_lens"].tolist(),
            kw["scale"],
            q.shape[1],
            kc.shape[2],
            q.shape[2],
            tail_finite=case.dims.get("tail", "nan") != "nan",
            feat=af.Features.of(params, kw),
        )
        # the block size confused with another power of two (a tile size)
        bs = kc.shape[1]
        lens = kw["kv_lens"].tolist()
        for wrong in (8, 16, 32, 64):
            if wrong == bs:
                continue
            K, V = [], []
            ok = True
            for b, L in enumerate(lens):
                j = torch.arange(L)
                col = j // wrong
                if int(col.max()) >= tb.shape[1]:
                    ok = False
                    break
                blk = tb[b, col].long()
                if int(blk.min()) < 0 or int(blk.max()) >= kc.shape[0]:
                    ok = False
                    break
                K.append(kv_quant.dequantise(kc[blk, j % bs].permute(1, 0, 2), ks))
                V.append(kv_quant.dequantise(vc[blk, j % bs].permute(1, 0, 2), vs))
            if ok:
                hm = ac.head_map(q.shape[1], kc.shape[2])
                feat = af.Features.of(params, kw)
                fps.append(("paged-index", {"out": ac.attend(q, K, V, kw["scale"], hm, feat=feat)}))
        return fps

    def properties(self, case: Case, kw: Tensors, outs: Tensors, params: Params) -> list[Finding]:
        return []

    def row_label(self, case: Case, kw: Tensors, name: str, row: int) -> str:
        return ac.row_label(case.dims, row)

    def capture_cases(self, params: Params) -> list[Case]:
        cases = super().capture_cases(params)
        for c in cases:
            c.dims["free_blocks"] = 12
        return cases

    def capture_inputs(self, case: Case, params: Params) -> Tensors:
        """Table entries past a sequence's blocks point at free blocks nobody owns, so that reading them
        is recognisably "past kv_len" rather than "another sequence's data"."""
        kw = self.inputs(case, params, "cpu", poison=False)
        bs = params["block_size"]
        tables = kw["block_tables"]
        need = [-(-L // bs) for L in case.dims["kv_lens"]]
        used = {int(x) for b, n in enumerate(need) for x in tables[b, :n].tolist()}
        nb = kw["k_cache"].shape[0]
        free = [x for x in range(nb) if x not in used]
        k = 0
        for b, n in enumerate(need):
            for j in range(n, tables.shape[1]):
                tables[b, j] = free[k % len(free)]
                k += 1
        kw["block_tables"] = tables.to(torch.int32)
        return kw


def gather(cache: Any, tables: Any, b: int, L: int) -> Any:
    """The first L tokens of sequence b of an nhd cache, read through its block table: [Hkv, L, D]."""
    bs = cache.shape[1]
    L = min(L, tables.shape[1] * bs)
    j = torch.arange(L)
    blk = tables[b, j // bs].long().clamp(0, cache.shape[0] - 1)
    return cache[blk, j % bs].permute(1, 0, 2)


def caches(kw: Tensors, params: Params) -> tuple[Any, Any]:
    """The nhd views of the call's k_cache and v_cache."""
    lay = paged.layout_of(params)
    return paged.nhd(kw["k_cache"], lay), paged.nhd(kw["v_cache"], lay)


def paged_inputs(case: Case, params: Params, device: str, poison: bool, q_rows: int | None = None) -> Tensors:
    """The paged op's keyword arguments for `case`: block tables, caches holding each sequence's kv_lens[b]
    tokens, q [q_rows (default B), Hq, D]. attention.decode_multi's q has one row per new token."""
    d = case.dims
    g = generator(case.seed)
    bs = params["block_size"]
    lens = d["kv_lens"]
    B, Hq, Hkv, D = len(lens), d["Hq"], d["Hkv"], d["D"]
    std = d.get("qk_std", 1.0)
    tail = d.get("tail", "nan") if poison else "zeros"
    need = [-(-L // bs) for L in lens]
    max_blocks = max(need) + 2
    low = d.get("free_low", 0)  # blocks 0 .. low-1 stay free
    num_blocks = sum(need) + max(d.get("free_blocks", 7), low + 1)
    if d.get("arange_tables"):
        ids = torch.arange(num_blocks)
    else:
        ids = low + torch.randperm(num_blocks - low, generator=g)
        last = sum(need) - 1  # make the highest block id one that is read
        j = int((ids == num_blocks - 1).nonzero()[0])
        ids[j], ids[last] = ids[last].clone(), ids[j].clone()
    if "table_pad" in d:
        tables = torch.full((B, max_blocks), int(d["table_pad"]), dtype=torch.int32)
    else:
        tables = torch.randint(0, num_blocks, (B, max_blocks), generator=g, dtype=torch.int32)
    pos = 0
    for b, n in enumerate(need):
        tables[b, :n] = ids[pos : pos + n].to(torch.int32)
        pos += n
    q = randn((q_rows or B, Hq, D), g, case.dtype, "cpu", std)
    k = torch.empty((num_blocks, bs, Hkv, D), dtype=q.dtype)
    v = torch.empty_like(k)
    for t in (k, v):  # free blocks and slots past kv_len
        if tail == "zeros":
            t.zero_()
        elif tail == "stale":
            t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float64).mul_(3.0).to(t.dtype))
        else:
            fill_canary(t)
    quant = kv_quant.spec_of(params)
    scales = kv_quant.scales(quant, case.tags, Hkv, std, device) if quant else {}
    for b, L in enumerate(lens):
        kb = randn((L, Hkv, D), g, case.dtype, "cpu", std)
        vb = randn((L, Hkv, D), g, case.dtype, "cpu")
        if quant and "fp8-edges" in case.tags:
            kv_quant.place_edges(kb, scales["k_scale"], quant)
            kv_quant.place_edges(vb, scales["v_scale"], quant)
        j = torch.arange(L)
        blk = tables[b, j // bs].long()
        k[blk, j % bs] = kb
        v[blk, j % bs] = vb
    if quant:  # the caches quantised on write, as kv_append stores them (NaN canaries stay canaries)
        k = kv_quant.quantise(k, scales["k_scale"], quant, 2)
        v = kv_quant.quantise(v, scales["v_scale"], quant, 2)
    lay = paged.layout_of(params)
    return {
        "q": q.to(device),
        "k_cache": paged.from_nhd(k, lay).to(device),
        "v_cache": paged.from_nhd(v, lay).to(device),
        "block_tables": tables.to(device),
        "kv_lens": torch.tensor(lens, dtype=torch.int32, device=device),
        "scale": float(d["scale"]),
        **af.extra_inputs(case, params, Hq, device),
        **scales,
    }


OP_CLASS = AttentionDecodePaged
