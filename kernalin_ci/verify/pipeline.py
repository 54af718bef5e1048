"""The decode pipeline check (docs/ops.md): rope -> kv_append -> attention.decode_paged,
many steps on several sequences of different lengths, with the outputs and the
whole caches compared with an independent float64 reference after every step.

This is where a stray KV write that heals itself a step later, or surfaces in
another sequence's block many steps on, is caught: nothing in either cache may
change except the slots written this step, and every step's attention output
must match attention over the reference's own history.
"""
from __future__ import annotations

import time

import torch

from kernalin_ci.findings import Finding
from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops import paged
from kernalin_ci.ops.base import TOLERANCE, generator, randn, torch_dtype
from kernalin_ci.ops.rope import rotate
from kernalin_ci.verify.compare import row_errors
from kernalin_ci.verify.poison import bits, fill_canary, is_canary

ROLES = ("kv_append", "attention.decode_paged", "rope")
START_LENGTHS = (1, 9, 30, 47)


def _init(params, dtype, device, seed, steps):
    g = generator(seed)
    bs = params["block_size"]
    D = params.get("head_dim") or 64
    Hq = params.get("num_q_heads") or 4
    Hkv = params.get("num_kv_heads") or 2
    lens = list(START_LENGTHS)
    B = len(lens)
    per_seq = -(-(max(lens) + steps) // bs)
    num_blocks = B * per_seq + 5
    perm = torch.randperm(num_blocks, generator=g)
    tables = perm[: B * per_seq].reshape(B, per_seq).to(torch.int32)
    shape = (num_blocks, bs, Hkv, D)
    k_cache = fill_canary(torch.empty(shape, dtype=torch_dtype(dtype)))
    v_cache = fill_canary(torch.empty(shape, dtype=torch_dtype(dtype)))
    ref_k = [torch.empty((Hkv, 0, D), dtype=torch.float64) for _ in range(B)]
    ref_v = [torch.empty((Hkv, 0, D), dtype=torch.float64) for _ in range(B)]
    for b, L in enumerate(lens):  # the prefill: history already in the cache
        kb, vb = randn((L, Hkv, D), g, dtype, "cpu"), randn((L, Hkv, D), g, dtype, "cpu")
        j = torch.arange(L)
        blk = tables[b, j // bs].long()
        k_cache[blk, j % bs] = kb
        v_cache[blk, j % bs] = vb
        ref_k[b] = kb.to(torch.float64).permute(1, 0, 2)
        ref_v[b] = vb.to(torch.float64).permute(1, 0, 2)
    return {
        "g": g, "bs": bs, "D": D, "Hq": Hq, "Hkv": Hkv, "lens": lens, "tables": tables.to(device),
        "tables_cpu": tables, "layout": paged.layout_of(params),
        "k_cache": paged.from_nhd(k_cache, paged.layout_of(params)).to(device),
        "v_cache": paged.from_nhd(v_cache, paged.layout_of(params)).to(device),
        "ref_k": ref_k, "ref_v": ref_v, "scale": 0.9 * D ** -0.5,
    }


def _cache_diff(name, before, after, written, step, bs) -> Finding | None:
    """Whole-buffer diff: only `written` slots may differ, and must hold the given rows."""
    changed = bits(after) != bits(before)
    for slot, row in written:
        b, o = divmod(slot, bs)
        if bool((bits(after[b, o]) != bits(row)).any()):
            return Finding("pipeline-cache", "kv-slot", f"step {step}: {name} slot {slot} does not hold the token "
                                                        f"appended to it")
        changed[b, o] = False
    if bool(changed.any()):
        n = int(changed.sum())
        blk, off, h, d = [int(x) for x in changed.nonzero()[0]]
        return Finding("pipeline-cache", "stray-write",
                       f"step {step}: {n} elements of {name} outside this step's slots changed; first at block "
                       f"{blk} slot {off} (slot index {blk * bs + off}) head {h} dim {d}")
    return None


def run_pipeline(fns: dict, params: dict, dtype: str, device: str, seed: int, steps: int, emit) -> list[Finding]:
    s = _init(params, dtype, device, seed, steps)
    g, bs, D, Hq, Hkv = s["g"], s["bs"], s["D"], s["Hq"], s["Hkv"]
    lens, tables = s["lens"], s["tables_cpu"]
    B = len(lens)
    tol = 2 * TOLERANCE[dtype]  # rounded rotated keys enter the cache: errors compound once
    rope_fn = fns.get("rope")
    for step in range(steps):
        t0 = time.perf_counter()
        # B decode tokens plus one padding token (slot -1) that must change nothing
        q = randn((B + 1, Hq, D), g, dtype, "cpu")
        k = randn((B + 1, Hkv, D), g, dtype, "cpu")
        v = randn((B + 1, Hkv, D), g, dtype, "cpu")
        pos = torch.tensor(lens + [0], dtype=torch.int64)
        q_ref, k_ref = q[:B].to(torch.float64), k[:B].to(torch.float64)
        q_in, k_in = q.to(device), k.to(device)
        if rope_fn is not None:
            q_in, k_in = rope_fn(q=q_in, k=k_in, positions=pos.to(device))
            _sync(device)
            r = params.get("rotary_dim") or D
            q_full = rotate(q, pos, params["style"], params["base"], r)
            k_full = rotate(k, pos, params["style"], params["base"], r)
            q_ref, k_ref = q_full[:B], k_full[:B]
            for name, got, want in (("q", q_in, q_full), ("k", k_in, k_full)):
                err = row_errors(got.detach().to("cpu", torch.float64), want)
                if not bool((err <= tol).all()):
                    return [Finding("pipeline-rope", "wrong-output",
                                    f"step {step}: rope {name} off the reference (worst relative error "
                                    f"{float(err.nan_to_num(float('inf')).max()):.3g}, tolerance {tol:g})")]
        slots = [int(tables[b, L // bs]) * bs + L % bs for b, L in enumerate(lens)] + [-1]
        kb, vb = s["k_cache"].clone(), s["v_cache"].clone()
        fns["kv_append"](key=k_in, value=v.to(device), k_cache=s["k_cache"], v_cache=s["v_cache"],
                         slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device))
        _sync(device)
        for name, before, after, src in (("k_cache", kb, s["k_cache"], k_in), ("v_cache", vb, s["v_cache"], v)):
            src = src.to(device)
            f = _cache_diff(name, paged.nhd(before, s["layout"]), paged.nhd(after, s["layout"]),
                            [(sl, src[t]) for t, sl in enumerate(slots) if sl >= 0], step, bs)
            if f:
                return [f]
        for b in range(B):
            s["ref_k"][b] = torch.cat([s["ref_k"][b], k_ref[b][:, None, :]], dim=1)
            s["ref_v"][b] = torch.cat([s["ref_v"][b], v[b].to(torch.float64)[:, None, :]], dim=1)
        lens = [L + 1 for L in lens]
        kb, vb = s["k_cache"].clone(), s["v_cache"].clone()
        out = fns["attention.decode_paged"](
            q=q_in[:B], k_cache=s["k_cache"], v_cache=s["v_cache"], block_tables=s["tables"],
            kv_lens=torch.tensor(lens, dtype=torch.int32, device=device), scale=s["scale"])
        _sync(device)
        for name, before, after in (("k_cache", kb, s["k_cache"]), ("v_cache", vb, s["v_cache"])):
            if bool((bits(after) != bits(before)).any()):
                return [Finding("pipeline-attention", "input-modified",
                                f"step {step}: the attention entry changed {name}")]
        want = ac.attend(q_ref, s["ref_k"], s["ref_v"], s["scale"], ac.head_map(Hq, Hkv))
        got = out.detach().to("cpu", torch.float64)
        if bool(is_canary(out).any()):
            return [Finding("pipeline-attention", "unwritten-output", f"step {step}: attention output not written")]
        err = row_errors(got, want)
        if not bool((err <= tol).all()):
            row = int(err.nan_to_num(float("inf")).argmax())
            b, h = divmod(row, Hq)
            return [Finding("pipeline-attention", "wrong-output",
                            f"step {step}: attention output off the reference at b={b} h={h} (kv_len={lens[b]}): "
                            f"relative error {float(err[row]):.3g}, tolerance {tol:g}")]
        emit({"event": "step", "step": step, "seconds": time.perf_counter() - t0})
    return []


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run_job(job: dict, emit) -> None:
    """Worker task 'verify-pipeline'."""
    from kernalin_ci.entry import load_entry
    from kernalin_ci.verify.dynamic import Interpreter

    fns = {role: load_entry(spec, job.get("root")) for role, spec in job["entries"].items() if spec}
    interp = Interpreter(job["device"] == "cpu")
    emit({"event": "case-start", "index": 0})
    t0 = time.perf_counter()
    unfaithful = interp.cannot_run(job["dtype"])
    if unfaithful:
        emit({"event": "case-done", "index": 0, "seconds": 0.0, "findings": [], **unfaithful})
        return
    try:
        found = run_pipeline(fns, job["params"], job["dtype"], job["device"], job["seed"], job["steps"], emit)
    except Exception as e:
        msg = " ".join(str(e).split())[:400]
        found = [Finding("pipeline", "entry-error", f"an entry raised {type(e).__name__}: {msg}")]
    unfaithful = interp.after_case()
    emit({"event": "case-done", "index": 0, "seconds": time.perf_counter() - t0,
          "findings": [] if unfaithful else [f.to_json() for f in found], **unfaithful})
