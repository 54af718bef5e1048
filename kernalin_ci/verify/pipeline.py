"""The decode loop (docs/ops.md): many steps on several sequences of different lengths, with the
outputs and the whole caches compared with an independent float64 reference after every step.

One loop serves two ways of doing a step:
- the decode pipeline check: rope -> kv_append -> attention.decode_paged, three entries
  (`run_pipeline`), where each member's own output is also checked inside the step;
- the `decode_step` op: one entry that does the whole step, fused or not (`run_decode_step`).

This is where a stray KV write that heals itself a step later, or surfaces in
another sequence's block many steps on, is caught: nothing in either cache may
change except the slots written this step, every written slot must hold its
token's key (rotated) and value, and every step's attention output must match
attention over the reference's own history.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

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


@dataclass
class LoopShape:
    """The sequences and heads of one decode loop. `start_lens`: the prefill lengths (0: the first step
    writes position 0). `stale`: the free slots of the sequences' own blocks hold finite stale data (a
    block recycled from a finished request) instead of the canary; free blocks always hold the canary.
    `poison` False: zeros everywhere outside the history (the pos-0 probe)."""

    Hq: int
    Hkv: int
    D: int
    start_lens: list[int]
    block_size: int
    layout: str = "nhd"
    free_blocks: int = 5
    stale: bool = False
    poison: bool = True


@dataclass
class Step:
    """One step's inputs (CPU tensors, in the loop's dtype) and where they go."""

    index: int
    q: torch.Tensor          # [n, Hq, D]
    k: torch.Tensor          # [n, Hkv, D]
    v: torch.Tensor          # [n, Hkv, D]
    positions: list[int]     # [n]
    slots: list[int]         # [n], -1 for padding
    kv_lens: list[int]       # [B], including this step's token


@dataclass
class Written:
    """What a step must have written into one cache: per token, the row its slot must hold, either bit for
    bit (`exact`) or within the tolerance of a float64 row; `alternatives`: (bug class, rows) a known
    bug would have written instead."""

    rows: torch.Tensor
    exact: bool
    alternatives: list[tuple[str, torch.Tensor, bool]] = field(default_factory=list)


@dataclass
class StepResult:
    findings: list[Finding]
    out: Any = None
    k_rows: Written | None = None
    v_rows: Written | None = None


def init_state(shape: LoopShape, dtype: str, device: str, seed: int, steps: int) -> dict[str, Any]:
    """Block tables, caches holding each sequence's prefill, and the float64 history."""
    g = generator(seed)
    bs, D, Hkv = shape.block_size, shape.D, shape.Hkv
    lens = list(shape.start_lens)
    B = len(lens)
    per_seq = -(-(max(lens) + steps) // bs)
    num_blocks = B * per_seq + shape.free_blocks
    perm = torch.randperm(num_blocks, generator=g)
    tables = perm[: B * per_seq].reshape(B, per_seq).to(torch.int32)
    cshape = (num_blocks, bs, Hkv, D)
    k_cache = torch.empty(cshape, dtype=torch_dtype(dtype))
    v_cache = torch.empty(cshape, dtype=torch_dtype(dtype))
    for t in (k_cache, v_cache):
        if shape.poison:
            fill_canary(t)
        else:
            t.zero_()
    if shape.stale:  # the sequences' own blocks: finite data left by an earlier request
        own = tables.reshape(-1).long()
        for t in (k_cache, v_cache):
            t[own] = (torch.randn((len(own), bs, Hkv, D), generator=g, dtype=torch.float64) * 2.0).to(t.dtype)
    ref_k = []
    ref_v = []
    for b, L in enumerate(lens):  # the prefill: history already in the cache
        kb, vb = randn((L, Hkv, D), g, dtype, "cpu"), randn((L, Hkv, D), g, dtype, "cpu")
        j = torch.arange(L)
        blk = tables[b, j // bs].long()
        k_cache[blk, j % bs] = kb
        v_cache[blk, j % bs] = vb
        ref_k.append(kb.to(torch.float64).permute(1, 0, 2))
        ref_v.append(vb.to(torch.float64).permute(1, 0, 2))
    return {
        "g": g, "shape": shape, "lens": lens, "tables": tables.to(device), "tables_cpu": tables,
        "k_cache": paged.from_nhd(k_cache, shape.layout).to(device),
        "v_cache": paged.from_nhd(v_cache, shape.layout).to(device),
        "ref_k": ref_k, "ref_v": ref_v, "scale": 0.9 * D ** -0.5,
    }


def next_step(s: dict[str, Any], index: int, dtype: str, padding: int = 0) -> Step:
    """The step's random q, k, v (plus `padding` tokens at slot -1) at the sequences' current lengths."""
    sh: LoopShape = s["shape"]
    g, bs, lens, tables = s["g"], sh.block_size, s["lens"], s["tables_cpu"]
    n = len(lens) + padding
    q = randn((n, sh.Hq, sh.D), g, dtype, "cpu")
    k = randn((n, sh.Hkv, sh.D), g, dtype, "cpu")
    v = randn((n, sh.Hkv, sh.D), g, dtype, "cpu")
    slots = [int(tables[b, L // bs]) * bs + L % bs for b, L in enumerate(lens)] + [-1] * padding
    return Step(index, q, k, v, list(lens) + [0] * padding, slots, [L + 1 for L in lens])


def _slot_name(slot: int, s: dict[str, Any]) -> str:
    """'slot 37 (sequence 1, position 12)' or 'slot 37 (a free block)'."""
    bs = s["shape"].block_size
    blk, off = divmod(slot, bs)
    hit = (s["tables_cpu"] == blk).nonzero()
    if hit.numel():
        b, i = (int(x) for x in hit[0])
        return f"slot {slot} (sequence {b}, position {i * bs + off}; {s['lens'][b]} tokens before this step)"
    return f"slot {slot} (block {blk}, which no sequence owns)"


def _cache_diff(name: str, before: torch.Tensor, after: torch.Tensor, slots: list[int], want: Written,
                step: int, s: dict[str, Any], tol: float, check: str) -> list[Finding]:
    """Whole-buffer diff: each of this step's slots must hold its token's row, and nothing else may differ.
    Both are reported when both fail (a padded tile can spoil its own slot and spill past it)."""
    bs = s["shape"].block_size
    changed = bits(after) != bits(before)
    found = []
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        b, o = divmod(slot, bs)
        got = after[b, o]
        if not found and not _holds(got, want.rows[t], want.exact, tol):
            cls, why = "kv-slot", "does not hold the token appended to it"
            if not bool((bits(got) != bits(before[b, o])).any()):
                cls, why = "kv-coverage", "was not written (it still holds its previous contents)"
            else:
                for alt_cls, rows, exact in want.alternatives:
                    if _holds(got, rows[t], exact, tol):
                        cls, why = alt_cls, f"holds what a {alt_cls} bug writes"
                        break
            found.append(Finding(check, cls, f"step {step}: {name} {_slot_name(slot, s)} {why}"))
        changed[b, o] = False
    if bool(changed.any()):
        n = int(changed.sum())
        blk, off, h, d = [int(x) for x in changed.nonzero()[0]]
        found.append(Finding(check, "stray-write",
                             f"step {step}: {n} elements of {name} outside this step's slots changed; first at "
                             f"{_slot_name(blk * bs + off, s)}, head {h}, dim {d}"))
    return found


def _holds(got: torch.Tensor, want: torch.Tensor, exact: bool, tol: float) -> bool:
    if exact:
        return not bool((bits(got) != bits(want.to(got.device, got.dtype))).any())
    err = row_errors(got.detach().to("cpu", torch.float64), want.to(torch.float64))
    return bool((err <= tol).all())


def decode_loop(s: dict[str, Any], do_step: Callable[[Step], StepResult], dtype: str, steps: int,
                emit: Callable[[dict[str, Any]], None], rope: dict[str, Any] | None, padding: int = 0,
                fingerprints: bool = False, check: str = "pipeline") -> list[Finding]:
    """Run `steps` steps; the first divergence is the finding, with its step. `rope`: the rope params
    (style, base, rotary_dim) when q and k are rotated in the step; None: they are not. `check`: the
    prefix of the findings' check names."""
    sh: LoopShape = s["shape"]
    Hq, Hkv = sh.Hq, sh.Hkv
    tol = 2 * TOLERANCE[dtype]  # rounded rotated keys enter the cache: errors compound once
    for index in range(steps):
        t0 = time.perf_counter()
        st = next_step(s, index, dtype, padding)
        B = len(s["lens"])
        q_ref, k_ref = st.q[:B].to(torch.float64), st.k[:B].to(torch.float64)
        if rope is not None:
            pos = torch.tensor(st.positions[:B], dtype=torch.int64)
            r = rope.get("rotary_dim") or sh.D
            q_ref = rotate(st.q[:B], pos, rope["style"], rope["base"], r)
            k_ref = rotate(st.k[:B], pos, rope["style"], rope["base"], r)
        kb, vb = s["k_cache"].clone(), s["v_cache"].clone()
        res = do_step(st)
        if res.findings:
            return res.findings
        _sync(s["k_cache"].device.type)
        found = []
        for name, before, after, want in (("k_cache", kb, s["k_cache"], res.k_rows),
                                          ("v_cache", vb, s["v_cache"], res.v_rows)):
            assert want is not None
            found += _cache_diff(name, paged.nhd(before, sh.layout), paged.nhd(after, sh.layout), st.slots, want,
                                 index, s, tol, f"{check}-cache")
        if found:
            return found
        old_k, old_v = [x.clone() for x in s["ref_k"]], [x.clone() for x in s["ref_v"]]
        for b in range(B):
            s["ref_k"][b] = torch.cat([s["ref_k"][b], k_ref[b][:, None, :]], dim=1)
            s["ref_v"][b] = torch.cat([s["ref_v"][b], st.v[b].to(torch.float64)[:, None, :]], dim=1)
        s["lens"] = list(st.kv_lens)
        hmap = ac.head_map(Hq, Hkv)
        want_out = ac.attend(q_ref, s["ref_k"], s["ref_v"], s["scale"], hmap)
        out = res.out
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(want_out.shape):
            got_shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return [Finding(f"{check}-attention", "wrong-output",
                            f"step {index}: the output is {got_shape}, expected {tuple(want_out.shape)}")]
        if bool(is_canary(out).any()):
            return [Finding(f"{check}-attention", "unwritten-output", f"step {index}: attention output not written")]
        got = out.detach().to("cpu", torch.float64)
        err = row_errors(got, want_out)
        if not bool((err <= tol).all()):
            row = int(err.nan_to_num(float("inf")).argmax())
            b, h = divmod(row, Hq)
            cls, why = "wrong-output", ""
            finite_ref = bool(torch.isfinite(want_out).all())
            if finite_ref and not bool(torch.isfinite(got).all()):
                cls = "non-finite"
            if fingerprints:
                bad = ~(err <= tol)
                for fp_cls, alt in _output_fingerprints(s, st, q_ref, k_ref, old_k, old_v, kb, vb, hmap, rope):
                    if bool((row_errors(got, alt)[bad] <= tol).all()):
                        cls, why = fp_cls, f"; it matches what a {fp_cls} bug produces"
                        break
            return [Finding(f"{check}-attention", cls,
                            f"step {index}: attention output off the reference at b={b} h={h} (kv_len="
                            f"{s['lens'][b]}): relative error {float(err[row]):.3g}, tolerance {tol:g}{why}")]
        emit({"event": "step", "step": index, "seconds": time.perf_counter() - t0})
    return []


def _output_fingerprints(s: dict[str, Any], st: Step, q_ref: torch.Tensor, k_ref: torch.Tensor,
                         old_k: list[torch.Tensor], old_v: list[torch.Tensor], kb: torch.Tensor, vb: torch.Tensor,
                         hmap: list[int], rope: dict[str, Any] | None) -> list[tuple[str, torch.Tensor]]:
    """Outputs a step-level bug would produce: the new token attended from the slot's contents before this
    step's write (`step-order`), the new token counted twice (`new-token-twice`), then the attention
    fingerprints (kv-mask, scale, gqa-mapping, ...) over the reference history."""
    sh: LoopShape = s["shape"]
    B = len(st.kv_lens)
    bs = sh.block_size
    kprev, vprev = paged.nhd(kb, sh.layout).to("cpu"), paged.nhd(vb, sh.layout).to("cpu")
    stale_k, stale_v, twice_k, twice_v = [], [], [], []
    for b in range(B):
        blk, off = divmod(st.slots[b], bs)
        sk = kprev[blk, off].to(torch.float64)[:, None, :]
        sv = vprev[blk, off].to(torch.float64)[:, None, :]
        stale_k.append(torch.cat([old_k[b], sk], dim=1))
        stale_v.append(torch.cat([old_v[b], sv], dim=1))
        twice_k.append(torch.cat([s["ref_k"][b], k_ref[b][:, None, :]], dim=1))
        twice_v.append(torch.cat([s["ref_v"][b], st.v[b].to(torch.float64)[:, None, :]], dim=1))
    scale = s["scale"]
    fps = [("step-order", ac.attend(q_ref, stale_k, stale_v, scale, hmap)),
           ("new-token-twice", ac.attend(q_ref, twice_k, twice_v, scale, hmap))]
    if rope is not None:  # q left unrotated, or rotated at position 0
        fps.append(("rope-position", ac.attend(st.q[:B].to(torch.float64), s["ref_k"], s["ref_v"], scale, hmap)))
    for cls, alt in ac.fingerprints(q_ref, lambda b, L: s["ref_k"][b][:, :L], lambda b, L: s["ref_v"][b][:, :L],
                                    st.kv_lens, scale, sh.Hq, sh.Hkv, sh.D, tail_finite=False):
        fps.append((cls, alt["out"]))
    return fps


# --------------------------------------------------------------------------- the decode pipeline check

def run_pipeline(fns: dict, params: dict, dtype: str, device: str, seed: int, steps: int, emit) -> list[Finding]:
    shape = LoopShape(params.get("num_q_heads") or 4, params.get("num_kv_heads") or 2, params.get("head_dim") or 64,
                      list(START_LENGTHS), params["block_size"], paged.layout_of(params))
    s = init_state(shape, dtype, device, seed, steps)
    tol = 2 * TOLERANCE[dtype]
    rope_fn = fns.get("rope")
    rope = {k: params.get(k) for k in ("style", "base", "rotary_dim")} if rope_fn is not None else None

    def do_step(st: Step) -> StepResult:
        # B decode tokens plus one padding token (slot -1) that must change nothing
        B = len(st.kv_lens)
        q_in, k_in = st.q.to(device), st.k.to(device)
        if rope_fn is not None:
            pos = torch.tensor(st.positions, dtype=torch.int64)
            q_in, k_in = rope_fn(q=q_in, k=k_in, positions=pos.to(device))
            _sync(device)
            r = params.get("rotary_dim") or shape.D
            for name, got, src in (("q", q_in, st.q), ("k", k_in, st.k)):
                err = row_errors(got.detach().to("cpu", torch.float64),
                                 rotate(src, pos, params["style"], params["base"], r))
                if not bool((err <= tol).all()):
                    return StepResult([Finding("pipeline-rope", "wrong-output",
                                               f"step {st.index}: rope {name} off the reference (worst relative "
                                               f"error {float(err.nan_to_num(float('inf')).max()):.3g}, tolerance "
                                               f"{tol:g})")])
        fns["kv_append"](key=k_in, value=st.v.to(device), k_cache=s["k_cache"], v_cache=s["v_cache"],
                         slot_mapping=torch.tensor(st.slots, dtype=torch.int64, device=device))
        _sync(device)
        kb, vb = s["k_cache"].clone(), s["v_cache"].clone()
        out = fns["attention.decode_paged"](
            q=q_in[:B], k_cache=s["k_cache"], v_cache=s["v_cache"], block_tables=s["tables"],
            kv_lens=torch.tensor(st.kv_lens, dtype=torch.int32, device=device), scale=s["scale"])
        _sync(device)
        for name, before, after in (("k_cache", kb, s["k_cache"]), ("v_cache", vb, s["v_cache"])):
            if bool((bits(after) != bits(before)).any()):
                return StepResult([Finding("pipeline-attention", "input-modified",
                                           f"step {st.index}: the attention entry changed {name}")])
        return StepResult([], out, Written(k_in.detach(), exact=True), Written(st.v, exact=True))

    return decode_loop(s, do_step, dtype, steps, emit, rope, padding=1)


# --------------------------------------------------------------------------- the decode_step op

def run_decode_step(fn: Callable[..., Any], shape: LoopShape, params: dict[str, Any], dtype: str, device: str,
                    seed: int, steps: int, emit: Callable[[dict[str, Any]], None]) -> list[Finding]:
    """The `decode_step` op's dynamic check: one entry does the whole step; q, k, v must stay unchanged."""
    s = init_state(shape, dtype, device, seed, steps)
    rope = {k: params.get(k) for k in ("style", "base", "rotary_dim")}
    r = params.get("rotary_dim") or shape.D

    def do_step(st: Step) -> StepResult:
        pos = torch.tensor(st.positions, dtype=torch.int64)
        kw = {"q": st.q.to(device), "k": st.k.to(device), "v": st.v.to(device), "positions": pos.to(device),
              "k_cache": s["k_cache"], "v_cache": s["v_cache"],
              "slot_mapping": torch.tensor(st.slots, dtype=torch.int64, device=device),
              "block_tables": s["tables"], "kv_lens": torch.tensor(st.kv_lens, dtype=torch.int32, device=device),
              "scale": s["scale"]}
        keep = {n: kw[n].clone() for n in ("q", "k", "v", "positions", "slot_mapping", "block_tables", "kv_lens")}
        out = fn(**kw)
        _sync(device)
        for n, old in keep.items():
            if bool((bits(kw[n]) != bits(old)).any()):
                return StepResult([Finding("decode-step-inputs", "input-modified",
                                           f"step {st.index}: the entry changed {n} (the contract does not let it "
                                           f"write it)")])
        k_rot = rotate(st.k, pos, rope["style"], rope["base"], r)
        v_rot = rotate(st.v, pos, rope["style"], rope["base"], r)
        k_rows = Written(k_rot, exact=False, alternatives=[("kv-unrotated", st.k, True)])
        v_rows = Written(st.v, exact=True, alternatives=[("rope-value", v_rot, False), ("kv-source", k_rot, False)])
        return StepResult([], out, k_rows, v_rows)

    return decode_loop(s, do_step, dtype, steps, emit, rope, fingerprints=True, check="decode-step")


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
