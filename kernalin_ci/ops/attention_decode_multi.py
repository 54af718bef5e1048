"""attention.decode_multi: several new query tokens per sequence over a paged KV cache (docs/ops.md).

A speculative-decoding verify step (the drafts plus the token before them) or a multi-token decode step: a
ragged batch whose tokens are the rows of q, sequence b's at rows query_start_loc[b] .. query_start_loc[b+1]
- 1, its new tokens already appended to the cache. New token i of sequence b (q_len = its token count) sits
at position p = kv_lens[b] - q_len + i and attends the cache up to p, its own key included: causal among
the new tokens. Everything else is attention.decode_paged, per token.

Its bugs are where one token per sequence hides them: a draft that sees the drafts after it, a position off
by one, a token taken as another sequence's (the wrong row of query_start_loc), a causal bound taken from the
batch's longest query. None shows at the pos-0 probe (one sequence, one token). A unified kernel (param
`prefill_chunk`) also takes a mixed batch: one sequence's prefill chunk of hundreds of new tokens beside
one-token decodes, where a kernel sized for drafts (q_len within one tile) leaves the chunk's later tokens out.
"""

from __future__ import annotations

import math
from typing import Any

from kernalin_ci.lazy import torch
from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops import paged
from kernalin_ci.ops.attention_decode_paged import caches, gather, paged_inputs
from kernalin_ci.ops.base import DTYPE_BYTES, Case, Expected, Op, Param, Params, Tensors, Traffic, positive
from kernalin_ci.ops.bench_shapes import BenchRequest, len_label, ragged_lens

MAX_QUERY_LEN = Param(
    "max_query_len",
    4,
    int,
    "the most new tokens of one sequence in a call (draft tokens + 1); cases use 1 to this many",
    check=positive,
)
PREFILL_CHUNK = Param(
    "prefill_chunk",
    None,
    int,
    "a unified kernel: the cases add a mixed batch where one sequence's prefill chunk of this many new tokens "
    "(over its cached prefix) sits beside one-token decodes",
    check=positive,
)
UNANALYSED = "several query tokens per sequence (the analysis models one query token)"
PREFILL_PREFIX = 37  # the chunk's cached prefix: the chunk starts mid-block, and crosses blocks and tiles


def positions(q_lens: list[int], kv_lens: list[int]) -> list[tuple[int, int, int]]:
    """(sequence b, index i among its new tokens, position p) of every q row, in row order."""
    return [(b, i, L - n + i) for b, (n, L) in enumerate(zip(q_lens, kv_lens)) for i in range(n)]


def query_start_loc(q_lens: list[int]) -> list[int]:
    """[0, q_lens[0], q_lens[0] + q_lens[1], ...]: B + 1 offsets."""
    out = [0]
    for n in q_lens:
        out.append(out[-1] + n)
    return out


def _q_lens(lens: list[int], pattern: list[int], most: int) -> list[int]:
    """q_len per sequence: `pattern` cycled, at most `most` and at most the sequence's kv_len."""
    return [max(1, min(pattern[b % len(pattern)], most, L)) for b, L in enumerate(lens)]


class AttentionDecodeMulti(Op):
    name = "attention.decode_multi"
    params = (
        (Param("block_size", 16, int, "tokens per KV-cache block", check=positive),)
        + ac.SHAPE_PARAMS
        + (paged.LAYOUT, MAX_QUERY_LEN, PREFILL_CHUNK)
    )
    written = ()
    paged_cache = True
    attends = True
    domain_axes = ("head_dim", "num_q_heads", "num_kv_heads", "dtype", "block_size")

    # ------------------------------------------------------------------ cases

    def cases(self, params: Params, device: str, dtype: str | None) -> list[Case]:
        main = dtype or "float32"
        most = int(params["max_query_len"])
        bs = int(params["block_size"])
        D64 = params.get("head_dim") or 64
        D128 = params.get("head_dim") or 128

        def dims(hq: int, hkv: int, D: int, lens: list[int], pattern: list[int], **extra: Any) -> dict[str, Any]:
            hq = params.get("num_q_heads") or hq
            hkv = params.get("num_kv_heads") or hkv
            if params.get("num_q_heads") and not params.get("num_kv_heads"):
                hkv = hkv if hq % hkv == 0 else 1
            q_lens = _q_lens(lens, pattern, most)
            return {"Hq": hq, "Hkv": hkv, "D": D, "kv_lens": list(lens), "q_lens": q_lens, "scale": D**-0.5, **extra}

        long = ac.long_length(device)
        tiles = [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129, 300]
        cases = [
            # q_len 1 beside q_len `most` in one ragged batch; a sequence made only of new tokens (its first draft
            # at position 0); the first and last draft of each
            Case("mixed-q-lens", dims(8, 2, D64, [most, 37, 1, 130, 9], [most, 1, 1, most, 2]), main, 1, ("drafts",)),
            # drafts that cross a cache block and a 32/64-key tile: the first draft in one, the last in the next
            Case(
                "block-crossing",
                dims(8, 2, D64, [bs + 2, 2 * bs + 1, 66, 33], [most, 3, most, 2]),
                main,
                2,
                ("drafts",),
            ),
            Case("tiles", dims(8, 2, D64, tiles, list(range(1, most + 1))), main, 3, ("tiles",)),
            Case("gqa-1", dims(4, 4, D128, [1, 33, 64, 200], [1, most, 2, most], scale=0.7 * D128**-0.5), main, 4),
            Case("gqa-6", dims(12, 2, D64, [2, 63, 65, 257], [2, most, 1, 3]), main, 5),
            Case(
                "large-scores",
                dims(8, 2, D64, [2, 16, 100, 257], [2, most, 3, 1], qk_std=6.5),
                main,
                6,
                ("large-scores",),
            ),
            Case("stale-tail", dims(4, 4, D128, [3, 31, 64, 190], [3, most, 1, 2], tail="stale"), main, 7),
            Case(
                "fresh-inputs",
                dims(4, 4, D128, [1, 33, 64, 200], [1, most, 2, most], scale=0.7 * D128**-0.5),
                main,
                8,
                ("repeat-of:gqa-1",),
            ),
            Case("long", dims(8, 2, D64, [long, long * 3 // 5 + 3], [most, 1]), main, 9, ("long",)),
        ]
        base = cases[0].dims
        low = sorted({1, 3, bs - 1 or 1, bs + 1, 3 * bs + 5, 100})
        cases.append(
            Case(
                "free-low-blocks",
                {**dims(base["Hq"], base["Hkv"], base["D"], low, [1, most, 2]), "free_low": 3, "table_pad": 0},
                main,
                10,
                ("free-low-blocks",),
            )
        )
        chunk = params.get("prefill_chunk")
        if chunk:
            # a unified kernel's mixed batch: a decode with kv_len 1, the chunk (its first new token at position
            # PREFILL_PREFIX, its last at kv_len - 1), a decode right after it in query_start_loc, a longer decode
            d = dims(8, 2, D64, [1, PREFILL_PREFIX + chunk, 2, 130], [1])
            d["q_lens"] = [1, chunk, 1, 1]
            cases.append(Case("prefill-chunk", d, main, 11, ("prefill",)))
        if dtype is None:
            for i, dt in enumerate(("float16", "bfloat16")):
                cases.append(Case(f"mixed-q-lens-{dt}", dict(cases[0].dims), dt, 20 + i, ("drafts",)))
        return cases

    def probe(self, params: Params, dtype: str | None) -> Case:
        dims = {**ac.probe_dims(params), "q_lens": [1], "arange_tables": True}
        return Case("pos0-probe", dims, dtype or "float32", 0, ("probe",))

    def shape_case(self, params: Params, dtype: str) -> Case:
        dims = ac.shape_dims(params)
        return Case(
            "shape",
            {**dims, "q_lens": _q_lens(dims["kv_lens"], [1, 3], int(params["max_query_len"]))},
            dtype,
            40,
            ("shape",),
        )

    def validate_case(self, case: Case) -> str | None:
        problem = ac.validate_dims(case.dims)
        if problem:
            return problem
        q_lens, lens = case.dims.get("q_lens"), case.dims["kv_lens"]
        if not isinstance(q_lens, list) or len(q_lens) != len(lens):
            return "q_lens must be a list with one length per sequence (as kv_lens)"
        if not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= L for n, L in zip(q_lens, lens)):
            return "q_lens[b] must be an integer from 1 to kv_lens[b]"
        return None

    def unanalysed(self, params: Params) -> list[str]:
        return [UNANALYSED]

    # ------------------------------------------------------------------ one call

    def inputs(self, case: Case, params: Params, device: str, poison: bool = True) -> Tensors:
        q_lens = case.dims["q_lens"]
        kw = paged_inputs(case, params, device, poison, q_rows=sum(q_lens))
        starts = torch.tensor(query_start_loc(q_lens), dtype=torch.int32, device=device)
        order = ("q", "k_cache", "v_cache", "block_tables")
        return {
            **{k: kw[k] for k in order},
            "query_start_loc": starts,
            **{k: v for k, v in kw.items() if k not in order},
        }

    def outputs(self, ret: Any, kw: Tensors) -> Tensors:
        return {"out": ret}

    @staticmethod
    def _rows(kw: Tensors) -> list[tuple[int, int, int]]:
        starts = kw["query_start_loc"].tolist()
        q_lens = [starts[b + 1] - starts[b] for b in range(len(starts) - 1)]
        return positions(q_lens, kw["kv_lens"].tolist())

    def reference(self, kw: Tensors, params: Params) -> Expected:
        """Per q row: attention.decode_paged's definition over its sequence's first p + 1 keys."""
        kc, vc = caches(kw, params)
        tb, q = kw["block_tables"], kw["q"]
        rows = self._rows(kw)
        K = [gather(kc, tb, b, p + 1) for b, _, p in rows]
        V = [gather(vc, tb, b, p + 1) for b, _, p in rows]
        return Expected({"out": ac.attend(q, K, V, kw["scale"], ac.head_map(q.shape[1], kc.shape[2]))})

    def fingerprints(self, kw: Tensors, params: Params, case: Case) -> list[tuple[str, Tensors]]:
        """The drafts' own bugs first (each row's keys cut where the bug cuts them), then attention.decode's
        fingerprints per row (GQA, normalisation, scale, kv_len, another sequence's cache)."""
        kc, vc = caches(kw, params)
        tb, q, scale = kw["block_tables"], kw["q"], kw["scale"]
        Hq, Hkv, D, bs = q.shape[1], kc.shape[2], q.shape[2], kc.shape[1]
        hm = ac.head_map(Hq, Hkv)
        lens = kw["kv_lens"].tolist()
        starts = kw["query_start_loc"].tolist()
        q_lens = [starts[b + 1] - starts[b] for b in range(len(lens))]
        rows = positions(q_lens, lens)
        most = max(q_lens)

        def attend_rows(keys: list[tuple[int, int]]) -> Tensors:
            """(sequence, key count) per q row -> the output."""
            K = [gather(kc, tb, b, max(n, 1)) for b, n in keys]
            V = [gather(vc, tb, b, max(n, 1)) for b, n in keys]
            return {"out": ac.attend(q, K, V, scale, hm)}

        right = [(b, p + 1) for b, _, p in rows]
        variants: list[tuple[str, list[tuple[int, int]]]] = [
            ("causal-mask", [(b, lens[b]) for b, _, _ in rows]),  # no causal mask: every draft sees them all
            ("causal-mask", [(b, min(p + 2, lens[b])) for b, _, p in rows]),  # sees the next draft
            ("causal-mask", [(b, p) for b, _, p in rows]),  # misses its own key
            ("causal-mask", [(b, i + 1) for b, i, _ in rows]),  # the square mask's top-left corner: position i
            # the position from the batch's longest query: kv_len - max q_len + i
            ("causal-mask", [(b, min(lens[b] - most + i + 1, lens[b])) for b, i, _ in rows]),
            # the key loop bounded by the first draft's last block: a later draft in the next block misses keys
            ("causal-mask", [(b, min(p + 1, -(-(lens[b] - q_lens[b] + 1) // bs) * bs)) for b, _, p in rows]),
        ]
        # the wrong row of query_start_loc: the first token of sequence b > 0 taken as one more token of b - 1
        # (a search with < where <= belongs: it attends all of b - 1), or the last token of b as a token of b + 1
        # before its first (it attends b + 1's cache up to that sequence's first new token, exclusive)
        first = {starts[b] for b in range(1, len(lens))}
        last = {starts[b + 1] - 1: b + 1 for b in range(len(lens) - 1)}
        variants.append(
            ("query-start", [(b - 1, lens[b - 1]) if t in first else right[t] for t, (b, _, _) in enumerate(rows)])
        )
        variants.append(
            (
                "query-start",
                [(last[t], lens[last[t]] - q_lens[last[t]]) if t in last else right[t] for t in range(len(rows))],
            )
        )
        fps = [(cls, attend_rows(keys)) for cls, keys in variants if keys != right]
        fps += ac.fingerprints(
            q,
            lambda t, n: gather(kc, tb, rows[t][0], n),
            lambda t, n: gather(vc, tb, rows[t][0], n),
            [p + 1 for _, _, p in rows],
            scale,
            Hq,
            Hkv,
            D,
            tail_finite=case.dims.get("tail", "nan") != "nan",
        )
        return fps

    def row_label(self, case: Case, kw: Tensors, name: str, row: int) -> str:
        d = case.dims
        t, h = divmod(row, d["Hq"])
        rows = positions(d["q_lens"], d["kv_lens"])
        if t >= len(rows):
            return f"{name} row {row}"
        b, i, p = rows[t]
        n = d["q_lens"][b]
        return f"t={t} h={h} (sequence {b}, new token {i + 1} of {n} at position {p}, kv_len={d['kv_lens'][b]})"

    # ------------------------------------------------------------------ benchmark

    def bench_cases(self, params: Params, device: str, request: BenchRequest) -> list[Case]:
        """attention.decode_paged's shapes, each sequence with max_query_len new tokens (a speculative step
        with max_query_len - 1 drafts everywhere)."""
        hq, hkv, D = request.heads(params)
        n = int(params["max_query_len"])
        cases = []
        for i, s in enumerate(request.attention_shapes()):
            lens = [max(L, n) for L in ragged_lens(s["batch"], s["kv_len"], ragged=not s.get("explicit"))]
            dims = {"Hq": hq, "Hkv": hkv, "D": D, "kv_lens": lens, "q_lens": [n] * len(lens), "scale": D**-0.5}
            name = f"B={s['batch']} q_len={n} kv_len={len_label(lens)} Hq={hq} Hkv={hkv} D={D} {request.dtype}"
            cases.append(Case(name, dims, request.dtype, 1000 + i, ("bench",)))
        return cases

    def traffic(self, case: Case, params: Params) -> Traffic | None:
        """q read and out written once per new token, each sequence's K and V rows read once per KV head,
        the index inputs read; 4·D FLOPs per (query head, key a token attends)."""
        d = case.dims
        e = DTYPE_BYTES[case.dtype]
        lens, q_lens = [int(x) for x in d["kv_lens"]], [int(x) for x in d["q_lens"]]
        T, Hq, Hkv, D = sum(q_lens), int(d["Hq"]), int(d["Hkv"]), int(d["D"])
        bs = int(params["block_size"])
        read = T * Hq * D * e + 2 * sum(lens) * Hkv * D * e + 4 * (2 * len(lens) + 1)
        read += 4 * sum(math.ceil(L / bs) for L in lens)
        attended = sum(p + 1 for _, _, p in positions(q_lens, lens))
        return Traffic(read, T * Hq * D * e, 4 * Hq * D * attended)


OP_CLASS = AttentionDecodeMulti
