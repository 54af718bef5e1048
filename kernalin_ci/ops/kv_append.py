"""kv_append: write new keys and values into a paged cache, in place (docs/ops.md).

The check is exact and whole-buffer: every written slot must hold its token's
key/value bit for bit, and every other byte of both caches (canary-filled
before the call) must be unchanged.
"""

from __future__ import annotations

from typing import Any

from kernalin_ci.device import DEVICES
from kernalin_ci.findings import Finding
from kernalin_ci.lazy import torch
from kernalin_ci.ops import kv_quant, paged
from kernalin_ci.ops.base import (
    DTYPE_BYTES,
    Case,
    Expected,
    Op,
    Param,
    Params,
    Tensors,
    Traffic,
    capture_case,
    capture_head_dims,
    generator,
    positive,
    randn,
    valid_dims,
)
from kernalin_ci.ops.bench_shapes import BenchRequest
from kernalin_ci.runtime.interp_patches import lazy_zeros
from kernalin_ci.runtime.poison import bits, fill_canary, words

PARAMS = (
    Param("block_size", 16, int, "slots per cache block", check=positive),
    Param("head_dim", None, int, "pin D for every case (default: 64 and 128)", check=positive),
    Param("num_kv_heads", None, int, "pin Hkv", check=positive),
    paged.LAYOUT,
) + kv_quant.KV_PARAMS

HUGE_ELEMENTS = 2**31  # one cache past 2^31 elements: 32-bit offsets overflow
CHUNK_BLOCKS = 2048


class KvAppend(Op):
    name = "kv_append"
    params = PARAMS
    written = ("k_cache", "v_cache")
    decode_role = "kv_append"
    paged_cache = True
    appends = True
    padding_slots = True
    cache_copies = {"k_cache": "key", "v_cache": "value"}
    domain_axes = ("head_dim", "num_kv_heads", "dtype", "block_size")
    exact = True  # `check`: the whole caches, bit for bit
    structural = "kv_append"

    @staticmethod
    def check_params(params: Params) -> str | None:
        return kv_quant.check_params(params, token_head=True)

    def written_names(self, params: Params) -> tuple[str, ...]:
        """Per-token-head FP8 scales: the kernel also writes the scale caches."""
        q = kv_quant.spec_of(params)
        return self.written + (("k_scale", "v_scale") if q and q.per_token_head else ())

    def unanalysed(self, params: Params) -> list[str]:
        return kv_quant.unanalysed(params)

    def redraws(self, params: Params) -> bool:
        """An FP8 cache and its positive scales are not redrawn (standard normal): each round builds them anew."""
        return self.redraw_inputs and not kv_quant.spec_of(params)

    def _dims(
        self, params: Params, T: int, Hkv: int, D: int, num_blocks: int, padding: int, **extra: Any
    ) -> dict[str, Any]:
        # at least two free slots per token, whatever the block size (block_size 1: a token-level pool)
        num_blocks = max(num_blocks, -(-2 * T // params["block_size"]) + 2)
        return {
            "T": T,
            "Hkv": params.get("num_kv_heads") or Hkv,
            "D": params.get("head_dim") or D,
            "num_blocks": num_blocks,
            "padding": padding,
            **extra,
        }

    def cases(self, params: Params, device: str, dtype: str | None) -> list[Case]:
        main = dtype or "float32"
        cases = [
            Case("slots", self._dims(params, 37, 2, 64, 23, 5), main, 1),
            Case("heads", self._dims(params, 29, 8, 128, 11, 3), main, 2),
            Case("all-padding-but-one", self._dims(params, 7, 4, 64, 5, 6), main, 3),
            Case("fresh-inputs", self._dims(params, 37, 2, 64, 23, 5), main, 4, ("repeat-of:slots",)),
            # Hkv * D = 480 and D = 80 are no powers of two: a tile rounded up and left unmasked writes
            # past its row or head into the next slot
            Case("odd-heads", self._dims(params, 19, 6, 80, 13, 2), main, 6),
            # slot 0 and the rest of blocks 0 and 1 free (canary): a kernel that sends padding tokens to
            # slot 0 (a clamp of -1, a masked slot load with other=0) and writes there is seen, whatever
            # the order of its programs
            Case("free-low-slots", self._dims(params, 23, 2, 64, 13, 6, free_low=2), main, 7),
        ]
        quant = kv_quant.spec_of(params)
        if quant and not quant.per_token_head:  # the format's largest and smallest normals, subnormals, ties
            hkv = params.get("num_kv_heads") or 4
            cases.append(Case("fp8-edges", self._dims(params, 17, hkv, 64, 7, 2), main, 8, ("fp8-edges",)))
        if dtype is None:
            for i, dt in enumerate(("float16", "bfloat16")):
                cases.append(Case(f"slots-{dt}", self._dims(params, 37, 2, 64, 23, 5), dt, 10 + i))
        huge_dt = "float32" if main == "float32" else main
        hkv, d = params.get("num_kv_heads") or 8, params.get("head_dim") or 128
        per_block = params["block_size"] * hkv * d
        nb = HUGE_ELEMENTS // per_block + 2
        cases.append(
            Case(
                "past-2^31-elements",
                self._dims(params, 6, hkv, d, nb, 1, high_slots=True),
                "float16" if huge_dt == "float32" else huge_dt,
                5,
                ("huge",),
            )
        )
        return cases

    def probe(self, params: Params, dtype: str | None) -> Case:
        dims = self._dims(params, 1, 2, 64, 4, 0, slots=[0])
        return Case("pos0-probe", dims, dtype or "float32", 0, ("probe",))

    def slot_mapping(self, case: Case, params: Params, g: Any) -> list[int]:
        d = case.dims
        if "slots" in d:
            return list(d["slots"])
        bs, T, nb, pad = params["block_size"], d["T"], d["num_blocks"], d["padding"]
        n = nb * bs
        want = T - pad
        low = d.get("free_low", 0) * bs  # slots 0 .. low-1 stay free
        if d.get("high_slots"):  # slots whose element offset passes 2^31, and slot 0
            special = [n - 1, n - bs, n - bs - 1, 0]
        else:  # first and last slot overall, last slot of a block, first of the next
            special = [0, n - 1, bs - 1, bs, (nb // 2) * bs + bs - 1]
        special = [s for s in dict.fromkeys(special) if s >= low][:want]  # distinct (block_size 1)
        perm = (low + torch.randperm(n - low, generator=g)).tolist()
        rest = [s for s in perm[: want + len(special)] if s not in special]
        slots = (special + rest)[:want]
        slots += [-1] * pad
        order = torch.randperm(T, generator=g).tolist()
        return [slots[i] for i in order]

    def shape_case(self, params: Params, dtype: str) -> Case:
        return Case("shape", self._dims(params, 7, 2, 64, 5, 2), dtype, 40, ("shape",))

    def inputs(self, case: Case, params: Params, device: str, poison: bool = True) -> Tensors:
        d = case.dims
        g = generator(case.seed)
        T, Hkv, D, nb, bs = d["T"], d["Hkv"], d["D"], d["num_blocks"], params["block_size"]
        slots = self.slot_mapping(case, params, g)
        key = randn((T, Hkv, D), g, case.dtype, "cpu")
        value = randn((T, Hkv, D), g, case.dtype, "cpu")
        quant = kv_quant.spec_of(params)
        scales = kv_quant.scales(quant, case.tags, Hkv, 1.0, device) if quant and not quant.per_token_head else {}
        if quant and quant.per_token_head:  # the scale caches the kernel writes
            scales = kv_quant.scale_caches((nb, bs, Hkv), poison and "huge" not in case.tags, device)
        if quant and "fp8-edges" in case.tags:
            kv_quant.place_edges(key, scales["k_scale"], quant)
            kv_quant.place_edges(value, scales["v_scale"], quant)
        key, value = key.to(device), value.to(device)
        cache_dtype = quant.dtype if quant else key.dtype
        shape = paged.shape(nb, bs, Hkv, D, paged.layout_of(params))
        if "huge" in case.tags:  # zeros, lazily allocated on the CPU: never resident as a whole
            if not DEVICES[device].gpu:
                k_cache, v_cache = lazy_zeros(shape, cache_dtype), lazy_zeros(shape, cache_dtype)
            else:
                k_cache = torch.zeros(shape, dtype=cache_dtype, device=device)
                v_cache = torch.zeros(shape, dtype=cache_dtype, device=device)
        else:
            k_cache = torch.empty(shape, dtype=cache_dtype, device=device)
            v_cache = torch.empty(shape, dtype=cache_dtype, device=device)
            if poison:
                fill_canary(k_cache), fill_canary(v_cache)
            else:
                k_cache.zero_(), v_cache.zero_()
        return {
            "key": key,
            "value": value,
            "k_cache": k_cache,
            "v_cache": v_cache,
            "slot_mapping": torch.tensor(slots, dtype=torch.int64, device=device),
            **scales,
        }

    def outputs(self, ret: Any, kw: Tensors) -> Tensors:
        return {"k_cache": kw["k_cache"], "v_cache": kw["v_cache"]}

    def reference(self, kw: Tensors, params: Params) -> Expected:
        raise NotImplementedError("kv_append is checked exactly, by check()")

    def check(self, case: Case, before: Tensors, kw: Tensors, outs: Tensors, params: Params) -> list[Finding]:
        """Written slots hold their token's data; nothing else in either cache changed."""
        lay = paged.layout_of(params)
        before = {k: (paged.nhd(v, lay) if k in self.written and v is not None else v) for k, v in before.items()}
        outs = {k: paged.nhd(v, lay) for k, v in outs.items()}
        findings = []
        bs = params["block_size"]
        slots = before["slot_mapping"].tolist()
        tok = [t for t, s in enumerate(slots) if s >= 0]
        pads = [t for t, s in enumerate(slots) if s < 0]
        idx = torch.tensor([slots[t] for t in tok], dtype=torch.int64)
        sources = {"k_cache": ("key", "value"), "v_cache": ("value", "key")}
        quant = kv_quant.spec_of(params)
        for name, (src, other) in sources.items():
            cache = outs[name]
            dev = cache.device
            b_idx, o_idx = (idx // bs).to(dev), (idx % bs).to(dev)
            got = cache[b_idx, o_idx]  # [n, Hkv, D]
            if quant and quant.per_token_head:
                found = self._token_head_mismatch(name, got, before, kw, src, tok, slots, bs, quant)
                findings += found
            elif quant:
                bad = self._quantised_mismatch(got, before, src, tok, quant)
                if bool(bad.any()):
                    findings.append(self._explain_quantised(name, got, bad, before, src, other, tok, slots, quant))
            else:
                want = before[src].to(dev)[tok]
                bad = bits(got) != bits(want)
                if bool(bad.any()):
                    findings.append(self._explain_slots(name, got, want, bad, before, src, other, tok, slots))
            # restore the written slots to their previous contents, then the whole cache must match
            if before.get(name) is not None:
                cache[b_idx, o_idx] = before[name].to(dev)[b_idx, o_idx]
                changed = bits(cache) != bits(before[name].to(dev))
            else:  # lazily allocated zero cache: scan it in chunks, never materialise it whole
                cache[b_idx, o_idx] = 0
                changed = None
                for start in range(0, cache.shape[0], CHUNK_BLOCKS):
                    part = cache[start : start + CHUNK_BLOCKS]
                    if bool((words(part) != 0).any()):
                        changed = torch.zeros(cache.shape[:1], dtype=torch.bool, device=dev)
                        findings.append(
                            Finding(
                                "kv-whole-cache",
                                "stray-write",
                                f"{name}: elements outside the written slots changed, first in blocks "
                                f"{start}..{start + part.shape[0] - 1} of {cache.shape[0]}",
                            )
                        )
                        break
                continue
            if bool(changed.any()):
                pad_rows = before[src][pads]
                if quant and quant.per_token_head and pads:  # the row with its own scale
                    pad_x = pad_rows.to("cpu", torch.float64)
                    pad_s = kv_quant.broadcast(kv_quant.token_head_scales(pad_x, quant), pad_x)
                    pad_rows = kv_quant.round_to(pad_x / pad_s, quant).to(dev)
                elif quant and pads:  # a padding token's row as a kernel that writes it would store it
                    pad_rows = kv_quant.quantise(pad_rows, before[self._scale_of(name)], quant, 1).to(dev)
                findings.append(self._explain_stray(name, cache, changed, pad_rows, pads, bs))
        return findings

    def _token_head_mismatch(
        self,
        name: str,
        got: Any,
        before: Tensors,
        kw: Tensors,
        src: str,
        tok: list[int],
        slots: list[int],
        bs: int,
        quant: Any,
    ) -> list[Finding]:
        """Per-token-head scales: each written slot's scale entries hold its rows' scales (kv_quant.
        token_head_scales, to SCALE_EPS), its bytes the rows quantised with the scales stored beside them
        (kv_append's FP8 contract), and nothing else in the scale cache changed."""
        sname, oname = self._scale_of(name), "v_scale" if name == "k_cache" else "k_scale"
        idx = torch.tensor([slots[t] for t in tok], dtype=torch.int64)
        after_s = kw[sname].to("cpu")
        got_s = after_s[idx // bs, idx % bs]  # [n, Hkv]
        x = before[src].to("cpu", torch.float64)[tok]
        want_s = kv_quant.token_head_scales(x, quant)
        findings = []
        bad_s = ~((got_s.double() - want_s.double()).abs() <= kv_quant.SCALE_EPS * want_s.double())
        if bool(bad_s.any()):
            i, h = (int(v) for v in bad_s.nonzero()[0])
            findings.append(
                Finding(
                    "kv-written-slots",
                    "kv-scale",
                    f"{sname}: {int(bad_s.sum())} of {bad_s.numel()} (token, head) scales wrong; e.g. token {tok[i]} "
                    f"(slot {slots[tok[i]]}) head {h} holds {float(got_s[i, h])!r}, expected max |{src}| / "
                    f"{quant.max:g} = {float(want_s[i, h])!r}",
                )
            )
        lo, hi = kv_quant.expected_bytes(x, got_s, quant)
        g = bits(got.cpu())
        bad = (g != lo) & (g != hi)
        if bool(bad.any()) and not findings:
            other_s = kw[oname].to("cpu")[idx // bs, idx % bs]
            olo, ohi = kv_quant.expected_bytes(x, other_s, quant)
            cls, what = "kv-slot", f"do not hold their token's {src} quantised with the scale stored beside it"
            if bool(((g == olo) | (g == ohi) | ~bad).all()):
                cls, what = "kv-scale", f"hold {src} quantised with the {oname} stored beside it, not the {sname}"
            i = int(bad.flatten(1).any(1).nonzero()[0])
            findings.append(
                Finding(
                    "kv-written-slots",
                    cls,
                    f"{name}: {int(bad.flatten(1).any(1).sum())} of {len(tok)} written slots {what} ({quant.label}); "
                    f"e.g. token {tok[i]} (slot {slots[tok[i]]})",
                )
            )
        prev = before.get(sname)
        if prev is not None:  # the scale cache: only the written slots change
            after_s = after_s.clone()
            after_s[idx // bs, idx % bs] = prev.to("cpu")[idx // bs, idx % bs]
            changed = bits(after_s) != bits(prev.to("cpu"))
            if bool(changed.any()):
                blk, off, h = (int(v) for v in changed.nonzero()[0])
                findings.append(
                    Finding(
                        "kv-whole-cache",
                        "stray-write",
                        f"{sname}: {int(changed.sum())} scales outside the written slots changed; first at block "
                        f"{blk}, slot {off} (slot index {blk * bs + off}), head {h}",
                    )
                )
        return findings

    @staticmethod
    def _scale_of(cache: str) -> str:
        return "k_scale" if cache == "k_cache" else "v_scale"

    def _quantised_mismatch(self, got: Any, before: Tensors, src: str, tok: list[int], quant: Any) -> Any:
        """Elements of the written slots [n, Hkv, D] that hold neither FP8 value a correct kernel may store."""
        x = before[src].to("cpu", torch.float64)[tok]
        scale = before["k_scale" if src == "key" else "v_scale"]
        lo, hi = kv_quant.expected_bytes(x, scale, quant)
        g = bits(got.cpu())
        return ((g != lo) & (g != hi)).to(got.device)

    def _explain_quantised(
        self,
        name: str,
        got: Any,
        bad: Any,
        before: Tensors,
        src: str,
        other: str,
        tok: list[int],
        slots: list[int],
        quant: Any,
    ) -> Finding:
        """Name what an FP8 cache's wrong slots hold: unwritten, the other input, a wrong scale, or no
        saturation (every wrong element one whose quotient lies past the largest normal)."""
        g, bad_cpu = bits(got.cpu()), bad.cpu()
        bad_tok = bad_cpu.flatten(1).any(1)
        i = int(bad_tok.nonzero()[0])
        where = f"token {tok[i]} (slot {slots[tok[i]]})"
        n_bad = int(bad_tok.sum())
        x = before[src].to("cpu", torch.float64)[tok]
        scale, other_scale = before[self._scale_of(name)], before["v_scale" if name == "k_cache" else "k_scale"]
        prev = before.get(name)
        if prev is not None:
            s = torch.tensor([slots[t] for t in tok])
            bs = prev.shape[1]
            untouched = g == bits(prev.cpu()[s // bs, s % bs])
            if bool((untouched | ~bad_cpu).all()):
                return Finding(
                    "kv-written-slots",
                    "kv-coverage",
                    f"{name}: {n_bad} of {len(tok)} tokens not fully written; e.g. {where}: part of it still holds "
                    "the previous contents",
                )
        xo = before[other].to("cpu", torch.float64)[tok]
        for s_ in (scale, other_scale):  # the other input, divided by either scale
            lo, hi = kv_quant.expected_bytes(xo, s_, quant)
            if not bool(((g == lo) | (g == hi) | ~bad_cpu).all()):
                continue
            return Finding(
                "kv-written-slots", "kv-source", f"{name}: written from {other!r} instead of {src!r} ({n_bad} tokens)"
            )
        for what, alt in kv_quant.wrong_scales(x, scale, other_scale, quant):
            if bool(((g == alt) | ~bad_cpu).all()):
                return Finding(
                    "kv-written-slots",
                    "kv-scale",
                    f"{name}: {n_bad} of {len(tok)} tokens quantised with {what} ({quant.label}; e.g. {where})",
                )
        sat = kv_quant.saturating(x, scale, quant)
        if bool((sat | ~bad_cpu).all()):
            first = int(bad_cpu.nonzero()[0][0])
            return Finding(
                "kv-written-slots",
                "kv-saturation",
                f"{name}: {int(bad_cpu.sum())} values past the {quant.kv_dtype} largest normal ({quant.max:g}) are "
                f"not saturated to it; e.g. token {tok[first]}: stored {got.cpu()[bad_cpu][0].item()!r}",
            )
        return Finding(
            "kv-written-slots",
            "kv-slot",
            f"{name}: {n_bad} of {len(tok)} written slots do not hold their token's {src} quantised to "
            f"{quant.kv_dtype} (satfinite_rn({src} / {self._scale_of(name)})); e.g. {where}",
        )

    def guard_class(self, name: str, side: str, before: Tensors) -> str | None:
        """A write just before a cache, with padding tokens present, is slot -1 written."""
        if name in self.written and side == "before" and bool((before["slot_mapping"] < 0).any()):
            return "kv-padding"
        return None

    def _explain_slots(
        self,
        name: str,
        got: Any,
        want: Any,
        bad: Any,
        before: Tensors,
        src: str,
        other: str,
        tok: list[int],
        slots: list[int],
    ) -> Finding:
        bad_tok = bad.flatten(1).any(1)
        n_bad = int(bad_tok.sum())
        i = int(bad_tok.nonzero()[0])
        where = f"token {tok[i]} (slot {slots[tok[i]]})"
        heads_bad = bad[i].any(-1).nonzero().flatten().tolist()
        prev = before.get(name)
        if prev is not None:
            bs = prev.shape[1]
            s = torch.tensor([slots[t] for t in tok])
            untouched = bits(got) == bits(prev.to(got.device)[s // bs, s % bs])
        else:
            untouched = bits(got) == 0
        from_other = bits(got[bad_tok]) == bits(before[other].to(got.device)[tok][bad_tok])
        if bool((untouched | ~bad).all()):
            return Finding(
                "kv-written-slots",
                "kv-coverage",
                f"{name}: {n_bad} of {len(tok)} tokens not fully written; e.g. {where}: "
                f"heads {heads_bad} of {got.shape[1]} still hold the previous contents",
            )
        if bool(from_other.all()):
            return Finding(
                "kv-written-slots",
                "kv-source",
                f"{name}: written from {other!r} instead of {src!r} ({n_bad} tokens, e.g. {where})",
            )
        return Finding(
            "kv-written-slots",
            "kv-slot",
            f"{name}: {n_bad} of {len(tok)} written slots do not hold their token's {src}; "
            f"e.g. {where}, heads {heads_bad}",
        )

    def _explain_stray(self, name: str, cache: Any, changed: Any, pad_rows: Any, pads: list[int], bs: int) -> Finding:
        n = int(changed.sum())
        first = [int(x) for x in changed.nonzero()[0]]
        blk, off = first[0], first[1]
        msg = (
            f"{name}: {n} elements outside the written slots changed; first at block {blk}, slot {off} "
            f"(slot index {blk * bs + off}), head {first[2]}, dim {first[3]}"
        )
        cls = "stray-write"
        if pads:
            pad_vals = pad_rows.to(cache.device)  # [P, Hkv, D]
            rows = cache[changed.any(-1).any(-1)]  # changed slots [m, Hkv, D]
            for r in rows[:64]:
                if any(bool((bits(r) == bits(p)).all()) for p in pad_vals):
                    cls = "kv-padding"
                    msg = f"{name}: a padding token (slot -1) was written, at slot index {blk * bs + off}"
                    break
        return Finding("kv-whole-cache", cls, msg)

    def validate_case(self, case: Case) -> str | None:
        d = case.dims
        problem = valid_dims(d, ("T", "Hkv", "D", "num_blocks"))
        pad = d.get("padding")
        if problem is None and "slots" not in d and not (isinstance(pad, int) and 0 <= pad <= d["T"]):
            return "padding must be an integer from 0 to T (or give slots)"
        return problem

    def bench_cases(self, params: Params, device: str, request: BenchRequest) -> list[Case]:
        _, hkv, D = request.heads(params)
        bs = params.get("block_size", 16)
        cases = []
        for i, s in enumerate(request.token_shapes(self.name)):
            nb = max(request.model["num_blocks"], -(-2 * s["tokens"] // bs))
            dims = {"T": s["tokens"], "Hkv": hkv, "D": D, "num_blocks": nb, "padding": 0}
            cases.append(
                Case(
                    f"T={s['tokens']} Hkv={hkv} D={D} {request.dtype} ({nb} blocks of {bs})",
                    dims,
                    request.dtype,
                    1000 + i,
                    ("bench",),
                )
            )
        return cases

    def traffic(self, case: Case, params: Params) -> Traffic | None:
        """key, value and the int64 slot mapping read; one cache row per non-padding token written to each
        cache; no arithmetic."""
        d = case.dims
        row = int(d["Hkv"]) * int(d["D"]) * DTYPE_BYTES[case.dtype]
        q = kv_quant.spec_of(params)
        cache_row = row if not q else int(d["Hkv"]) * (int(d["D"]) + (4 if q.per_token_head else 0))  # FP8: a byte
        T, pad = int(d["T"]), int(d.get("padding", 0))
        return Traffic(2 * T * row + 8 * T, 2 * (T - pad) * cache_row, 0)

    def capture_cases(self, params: Params) -> list[Case]:
        """Several tokens, two of them padding, in a cache of several blocks."""
        hkv = params.get("num_kv_heads") or 2
        return [
            capture_case({"T": 5, "Hkv": hkv, "D": D, "num_blocks": 7, "padding": 2}) for D in capture_head_dims(params)
        ]

    def capture_twin(self, dims: dict[str, Any]) -> dict[str, Any] | None:
        """Two more tokens, two more cache blocks."""
        return {**dims, "T": dims["T"] + 2, "num_blocks": dims["num_blocks"] + 2}

    def counterexample_case(
        self, case: Case, params: Params, shape: dict[str, int], index: dict[str, dict[tuple[int, ...], int]]
    ) -> Case | None:
        """T tokens in NB blocks, the counterexample's slots where it names them, distinct free slots (from
        the top of the cache) for the other tokens."""
        T, nb = int(shape.get("T", case.dims["T"])), int(shape.get("NB", case.dims["num_blocks"]))
        named = {t[0]: int(v) for t, v in index.get("slot_mapping", {}).items() if 0 <= t[0] < T}
        capacity = nb * params["block_size"]
        if T > 4096 or nb * case.dims["Hkv"] * case.dims["D"] * params["block_size"] > HUGE_ELEMENTS:
            return None  # a counterexample this large is not run here
        used = {v for v in named.values() if v >= 0}
        free = (s for s in range(capacity - 1, -1, -1) if s not in used)
        slots = [named[t] if t in named else next(free) for t in range(T)]
        dims = {k: v for k, v in case.dims.items() if k not in ("padding", "free_low", "high_slots")}
        return Case("ptx-counterexample", {**dims, "T": T, "num_blocks": nb, "slots": slots}, case.dtype, case.seed)


OP_CLASS = KvAppend
