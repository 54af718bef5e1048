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

from kernalin_ci.lazy import torch

from kernalin_ci.findings import Finding
from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops import paged
from kernalin_ci.ops.base import TOLERANCE, generator, randn, torch_dtype
from kernalin_ci.ops.rope import rotate
from kernalin_ci.verify import exchange
from kernalin_ci.verify.compare import row_errors
from kernalin_ci.verify.exchange import BadResult, plain
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


def _draw(g, B: int, Hq: int, Hkv: int, D: int, dtype: str):
    """One step's tokens: B decode tokens plus one padding token (slot -1) that must change nothing."""
    return randn((B + 1, Hq, D), g, dtype, "cpu"), randn((B + 1, Hkv, D), g, dtype, "cpu"), \
        randn((B + 1, Hkv, D), g, dtype, "cpu")


def _slots(lens: list[int], tables, bs: int) -> list[int]:
    return [int(tables[b, L // bs]) * bs + L % bs for b, L in enumerate(lens)] + [-1]


def drive(fns: dict, params: dict, dtype: str, device: str, seed: int, steps: int, emit, results: str) -> None:
    """In the worker: run the steps and hand back, per step, what the entries produced (a part file:
    the rope outputs, both caches after kv_append and after attention, the attention output).
    Nothing is judged here (PipelineReader, in the parent). An entry that raises ends the loop."""
    s = _init(params, dtype, device, seed, steps)
    g, D, Hq, Hkv = s["g"], s["D"], s["Hq"], s["Hkv"]
    lens, tables = s["lens"], s["tables_cpu"]
    B = len(lens)
    rope_fn = fns.get("rope")
    for step in range(steps):
        t0 = time.perf_counter()
        q, k, v = _draw(g, B, Hq, Hkv, D, dtype)
        pos = torch.tensor(lens + [0], dtype=torch.int64)
        raw: dict = {}
        q_in, k_in = q.to(device), k.to(device)
        if rope_fn is not None:
            q_in, k_in = rope_fn(q=q_in, k=k_in, positions=pos.to(device))
            _sync(device)
            raw["q"], raw["k"] = plain(q_in), plain(k_in)
        slots = _slots(lens, tables, s["bs"])
        fns["kv_append"](key=k_in, value=v.to(device), k_cache=s["k_cache"], v_cache=s["v_cache"],
                         slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device))
        _sync(device)
        raw["k_cache_append"], raw["v_cache_append"] = plain(s["k_cache"]), plain(s["v_cache"])
        lens = [L + 1 for L in lens]
        out = fns["attention.decode_paged"](
            q=q_in[:B], k_cache=s["k_cache"], v_cache=s["v_cache"], block_tables=s["tables"],
            kv_lens=torch.tensor(lens, dtype=torch.int32, device=device), scale=s["scale"])
        _sync(device)
        raw["k_cache_attention"], raw["v_cache_attention"] = plain(s["k_cache"]), plain(s["v_cache"])
        raw["out"] = plain(out)
        emit({"event": "case-part", "index": 0, "part": step, "seconds": time.perf_counter() - t0,
              "file": exchange.save(results, exchange.part_name(0, step), raw)})


class PipelineReader:
    """In the parent: replays the pipeline's inputs from the seed, keeps the float64 reference history,
    and judges each step the worker hands back as it arrives (the first failure is the finding)."""

    def __init__(self, params: dict, dtype: str, seed: int, steps: int, device: str, rope: bool, on_step=None):
        self.params, self.dtype, self.steps, self.on_step = params, dtype, steps, on_step
        self.device, self.rope, self.seed = device, rope, seed
        self.s: dict = {}  # _init's state on the CPU, made at the first step (torch is imported by then)
        self.prev: tuple = ()  # the caches before this step's kv_append
        self.lens: list[int] = []
        self.step = 0
        self.found: list[Finding] = []

    def part(self, index: int, case, ev: dict, results: str) -> None:
        step = self.step
        if ev.get("part") != step:
            raise BadResult(f"step {str(ev.get('part'))[:20]} handed back where step {step} was due")
        raw = exchange.load(results, exchange.part_name(index, step), ev.get("file"))
        if not isinstance(raw, dict):
            raise BadResult(f"step {step}: not a raw result")
        self.step += 1
        if not self.found:
            try:
                f = self._judge(step, raw)
            except BadResult:
                raise
            except Exception as e:  # a result the comparison cannot use: never a pass
                raise BadResult(f"step {step}: the result cannot be compared ({type(e).__name__}: "
                                f"{' '.join(str(e).split())[:200]})") from None
            if f is not None:
                self.found.append(f)
        if self.on_step:
            self.on_step(step)

    def __call__(self, index: int, case, ev: dict, results: str):
        from kernalin_ci.verify.judge import CaseResult, _text

        status = ev.get("status")
        if status == "not-run" and isinstance(ev.get("not_checked"), dict) and self.step == 0:
            nc = ev["not_checked"]
            if nc.get("reason") != "interpreter" or self.device != "cpu":
                raise BadResult(f"'not checked ({_text(nc.get('reason'))[:20]})' claimed on {self.device}")
            return CaseResult(None, [], [], {"reason": "interpreter", "error": _text(nc.get("error"))})
        if self.found:
            return CaseResult(case, self.found)
        if status == "raised":
            return CaseResult(case, [Finding("pipeline", "entry-error", f"an entry raised {_text(ev.get('error'))}")])
        if status == "ok" and self.step == self.steps:
            return CaseResult(case, [])
        raise BadResult(f"the pipeline ended after {self.step} of {self.steps} steps (status {_text(status)[:40]!r})")

    def _judge(self, step: int, raw: dict) -> Finding | None:
        if not self.s:
            self.s = _init(self.params, self.dtype, "cpu", self.seed, self.steps)
            self.prev = (self.s["k_cache"], self.s["v_cache"])
            self.lens = list(self.s["lens"])
        s, params, dtype = self.s, self.params, self.dtype
        g, bs, D, Hq, Hkv = s["g"], s["bs"], s["D"], s["Hq"], s["Hkv"]
        lens, tables = self.lens, s["tables_cpu"]
        B = len(lens)
        tol = 2 * TOLERANCE[dtype]  # rounded rotated keys enter the cache: errors compound once
        q, k, v = _draw(g, B, Hq, Hkv, D, dtype)
        pos = torch.tensor(lens + [0], dtype=torch.int64)
        q_ref, k_ref = q[:B].to(torch.float64), k[:B].to(torch.float64)
        k_in = k
        want_keys = {"k_cache_append", "v_cache_append", "k_cache_attention", "v_cache_attention", "out"}
        if self.rope:
            want_keys |= {"q", "k"}
        if set(raw) != want_keys or not all(isinstance(t, torch.Tensor) for t in raw.values()):
            raise BadResult(f"step {step}: handed back {sorted(map(str, raw))}, expected {sorted(want_keys)}")
        for name in ("k_cache_append", "v_cache_append", "k_cache_attention", "v_cache_attention"):
            exchange.like(f"step {step} {name}", raw[name], s["k_cache"])
        if "q" in raw:
            for name, src in (("q", q), ("k", k)):
                if tuple(raw[name].shape) != tuple(src.shape):
                    raise BadResult(f"step {step}: rope {name} of shape {tuple(raw[name].shape)}, "
                                    f"expected {tuple(src.shape)}")
            r = params.get("rotary_dim") or D
            q_full = rotate(q, pos, params["style"], params["base"], r)
            k_full = rotate(k, pos, params["style"], params["base"], r)
            q_ref, k_ref = q_full[:B], k_full[:B]
            for name, want in (("q", q_full), ("k", k_full)):
                err = row_errors(raw[name].to(torch.float64), want)
                if not bool((err <= tol).all()):
                    return Finding("pipeline-rope", "wrong-output",
                                   f"step {step}: rope {name} off the reference (worst relative error "
                                   f"{float(err.nan_to_num(float('inf')).max()):.3g}, tolerance {tol:g})")
            k_in = raw["k"]
        slots = _slots(lens, tables, bs)
        for name, before, after, src in (("k_cache", self.prev[0], raw["k_cache_append"], k_in),
                                         ("v_cache", self.prev[1], raw["v_cache_append"], v)):
            f = _cache_diff(name, paged.nhd(before, s["layout"]), paged.nhd(after, s["layout"]),
                            [(sl, src[t]) for t, sl in enumerate(slots) if sl >= 0], step, bs)
            if f:
                return f
        for b in range(B):
            s["ref_k"][b] = torch.cat([s["ref_k"][b], k_ref[b][:, None, :]], dim=1)
            s["ref_v"][b] = torch.cat([s["ref_v"][b], v[b].to(torch.float64)[:, None, :]], dim=1)
        self.lens = lens = [L + 1 for L in lens]
        for name in ("k_cache", "v_cache"):
            if bool((bits(raw[f"{name}_attention"]) != bits(raw[f"{name}_append"])).any()):
                return Finding("pipeline-attention", "input-modified", f"step {step}: the attention entry changed {name}")
        self.prev = (raw["k_cache_attention"], raw["v_cache_attention"])
        out = raw["out"]
        if tuple(out.shape) != (B, Hq, D):
            return Finding("pipeline-attention", "wrong-output",
                           f"step {step}: attention output of shape {tuple(out.shape)}, expected {(B, Hq, D)}")
        want = ac.attend(q_ref, s["ref_k"], s["ref_v"], s["scale"], ac.head_map(Hq, Hkv))
        if bool(is_canary(out).any()):
            return Finding("pipeline-attention", "unwritten-output", f"step {step}: attention output not written")
        err = row_errors(out.to(torch.float64), want)
        if not bool((err <= tol).all()):
            row = int(err.nan_to_num(float("inf")).argmax())
            b, h = divmod(row, Hq)
            return Finding("pipeline-attention", "wrong-output",
                           f"step {step}: attention output off the reference at b={b} h={h} (kv_len={lens[b]}): "
                           f"relative error {float(err[row]):.3g}, tolerance {tol:g}")
        return None


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run_job(job: dict, emit) -> None:
    """Worker task 'verify-pipeline': one case, handed back one step at a time (case-part events)."""
    from kernalin_ci.entry import load_entry
    from kernalin_ci.verify.dynamic import Interpreter

    fns = {role: load_entry(spec, job.get("root")) for role, spec in job["entries"].items() if spec}
    interp = Interpreter(job["device"] == "cpu")
    emit({"event": "case-start", "index": 0})
    t0 = time.perf_counter()
    unfaithful = interp.cannot_run(job["dtype"])
    if unfaithful:
        emit({"event": "case-done", "index": 0, "seconds": 0.0, "status": "not-run", **unfaithful})
        return
    ev: dict = {"status": "ok"}
    try:
        drive(fns, job["params"], job["dtype"], job["device"], job["seed"], job["steps"], emit, job["results"])
    except Exception as e:
        ev = {"status": "raised", "error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
    unfaithful = interp.after_case()
    emit({"event": "case-done", "index": 0, "seconds": time.perf_counter() - t0,
          **({"status": "not-run", **unfaithful} if unfaithful else ev)})
