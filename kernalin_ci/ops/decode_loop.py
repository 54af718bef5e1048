"""The decode loop (docs/ops.md): what it is, with no process side. Many steps on several sequences of
different lengths over one paged cache; each step appends one token per sequence (its key rotated when
the step rotates) and attends over each sequence's whole history. With an FP8 cache (param kv_dtype,
docs/ops.md "FP8 KV caches") the append quantises each token on write with the loop's scales and attention
dequantises: the history is then the stored bytes read with those scales.

The loop's model, shared by its two front doors (docs/architecture.md, "The decode loop"):
- the `decode_step` op (ops/decode_step.py): one entry does the whole step, called with `step_arguments`;
- the decode pipeline check (`pipeline_cases`): rope -> kv_append -> attention.decode_paged, three
  entries, each member's own output also checked inside the step.

Here: a loop's shape and case (`LoopShape`, `DecodeLoop`), where it stands between steps (`LoopState`: both
caches and the float64 history), each step's inputs drawn again from the seed (`next_step`), the float64
reference of a step (`rotated`, `advance`, `attend_history`: with the loop's attention features, as the
attention ops define them), what a step must write into each cache
(`Written`, `step_writes`) and the outputs a step-level bug would produce (`output_fingerprints`).
verify/loop_drive.py runs the loop in the worker; verify/loop_judge.py judges its steps in the parent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernalin_ci.lazy import torch
from kernalin_ci.ops import attention_common as ac
from kernalin_ci.ops import attention_features as af
from kernalin_ci.ops import kv_quant, paged
from kernalin_ci.ops.base import Case, generator, randn, torch_dtype
from kernalin_ci.ops.rope import PARAMS as ROPE_PARAMS
from kernalin_ci.ops.rope import spec_of
from kernalin_ci.runtime.poison import bits, fill_canary
from kernalin_ci.runtime.rows import row_errors

# the arguments of a step by the decode_step contract (docs/ops.md) that the step must leave unchanged
STEP_INPUTS = ("q", "k", "v", "positions", "slot_mapping", "block_tables", "kv_lens")


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
class DecodeLoop:
    """One loop case: its shape, dtype, seed and number of steps; `rope`: the rope params when the step
    rotates q and k (None: it does not); `padding`: tokens per step at slot -1, which must change nothing;
    `features`: the attention feature params switched on (docs/ops.md, "Attention features"; none: plain
    attention), each step's attention as the attention ops define it, with their extra inputs; `q_std` and
    `sink_shift` put the scores where a feature matters (a saturated soft-cap, a dominating sink: the
    attention ops' `cap-saturation` and `sink-dominates`, attention_features.plan_cases)."""

    shape: LoopShape
    dtype: str
    seed: int
    steps: int
    rope: dict[str, Any] | None
    padding: int = 0
    features: dict[str, Any] = field(default_factory=dict)
    kv: kv_quant.KvQuant | None = None  # an FP8 cache (None: the caches are in the loop's dtype)
    q_std: float = 1.0  # the queries' standard deviation: |scale * q.k| about 0.9 q_std
    sink_shift: float = 0.0  # added to every sink logit (attention_features.inputs_of)


@dataclass
class LoopState:
    """Where a loop stands between steps: the sequences' lengths, their block tables, both caches (in the
    shape's layout, on the loop's device) and the float64 history of each sequence ([Hkv, L, D]); with an FP8
    cache its format `kv` and scales `kv_scales` (k_scale, v_scale on the loop's device; else empty)."""

    shape: LoopShape
    g: torch.Generator  # draws every step's inputs, in order
    lens: list[int]
    tables: torch.Tensor  # [B, blocks per sequence] int32, on the loop's device
    tables_cpu: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    ref_k: list[torch.Tensor]
    ref_v: list[torch.Tensor]
    scale: float
    extra: dict[str, torch.Tensor]  # the features' extra inputs (alibi_slopes, sinks), on the loop's device
    feat: af.Features  # the features of each step's attention, with those inputs in float64
    kv: kv_quant.KvQuant | None = None
    kv_scales: dict[str, torch.Tensor] = field(default_factory=dict)
    q_std: float = 1.0  # DecodeLoop.q_std

    def stored(self, rows: torch.Tensor, cache: str) -> torch.Tensor:
        """Rows [n, Hkv, D] as the cache `cache` ('k' or 'v') stores them: quantised with its scale (FP8),
        else unchanged. On the CPU."""
        if self.kv is None:
            return rows
        return kv_quant.quantise(rows, self.kv_scales[f"{cache}_scale"], self.kv, 1)

    def history(self, rows: torch.Tensor, cache: str) -> torch.Tensor:
        """Stored rows [n, Hkv, D] as float64 history [Hkv, n, D]: dequantised with the cache's scale (FP8)."""
        t = rows.to("cpu").permute(1, 0, 2)
        scale = self.kv_scales.get(f"{cache}_scale") if self.kv is not None else None
        return kv_quant.dequantise(t, scale).to(torch.float64)


@dataclass
class Step:
    """One step's inputs (CPU tensors, in the loop's dtype) and where they go."""

    index: int
    q: torch.Tensor  # [n, Hq, D]
    k: torch.Tensor  # [n, Hkv, D]
    v: torch.Tensor  # [n, Hkv, D]
    positions: list[int]  # [n]
    slots: list[int]  # [n], -1 for padding
    kv_lens: list[int]  # [B], including this step's token


@dataclass
class Written:
    """What a step must have written into one cache: per token, the row its slot must hold, either bit for
    bit (`exact`) or within the tolerance of a float64 row; with an FP8 cache (`kv`, `scale`) the row
    quantised on write with `scale` (kv_quant.holds: exact is kv_append's contract, else the tolerance is
    an error before quantising). `alternatives`: (bug class, what) a known bug would have written instead;
    `note`: what that bug did, when its class alone does not say."""

    rows: torch.Tensor
    exact: bool
    alternatives: list[tuple[str, Written]] = field(default_factory=list)
    kv: kv_quant.KvQuant | None = None
    scale: torch.Tensor | None = None
    note: str = ""

    def holds(self, t: int, got: torch.Tensor, tol: float) -> bool:
        """Whether `got` (one slot, [Hkv, D] as the cache stores it) holds token t's row."""
        want = self.rows[t]
        if self.kv is not None:
            assert self.scale is not None
            x = want.to(torch.float64)[None]
            slack = None if self.exact else tol * x.abs().amax(-1, keepdim=True)
            return kv_quant.holds(got[None], x, self.scale, self.kv, slack)
        if self.exact:
            return not bool((bits(got) != bits(want.to(got.device, got.dtype))).any())
        err = row_errors(got.detach().to("cpu", torch.float64), want.to(torch.float64))
        return bool((err <= tol).all())

    def with_scale_bugs(self, other: torch.Tensor | None) -> Written:
        """With an FP8 cache: also the rows quantised with each known wrong scale (kv_quant.write_scale_bugs,
        `other`: the other cache's scale) as kv-scale alternatives."""
        if self.kv is None or self.scale is None or other is None:
            return self
        alts = [
            ("kv-scale", Written(self.rows, self.exact, kv=self.kv, scale=s, note=f"quantised with {what}"))
            for what, s in kv_quant.write_scale_bugs(self.scale, other, self.kv)
        ]
        return Written(self.rows, self.exact, self.alternatives + alts, self.kv, self.scale)


def init_state(loop: DecodeLoop, device: str) -> LoopState:
    """Block tables, caches holding each sequence's prefill, and the float64 history. With an FP8 cache: its
    scales (kv_quant.scales: calibrated, per head different; 1 without poison, as the pos-0 probe passes them),
    the prefill and stale data quantised as kv_append stores them, the history what they dequantise to."""
    shape, dtype = loop.shape, loop.dtype
    g = generator(loop.seed)
    bs, D, Hkv = shape.block_size, shape.D, shape.Hkv
    lens = list(shape.start_lens)
    B = len(lens)
    per_seq = -(-(max(lens) + loop.steps) // bs)
    num_blocks = B * per_seq + shape.free_blocks
    perm = torch.randperm(num_blocks, generator=g)
    tables = perm[: B * per_seq].reshape(B, per_seq).to(torch.int32)
    kv_scales = {}
    if loop.kv is not None:
        kv_scales = kv_quant.scales(loop.kv, () if shape.poison else ("probe",), Hkv, 1.0, "cpu")
    cshape = (num_blocks, bs, Hkv, D)
    cache_dtype = loop.kv.dtype if loop.kv is not None else torch_dtype(dtype)
    k_cache = torch.empty(cshape, dtype=cache_dtype)
    v_cache = torch.empty(cshape, dtype=cache_dtype)
    for t in (k_cache, v_cache):
        if shape.poison:
            fill_canary(t)
        else:
            t.zero_()
    extra = af.inputs_of(loop.features, shape.Hq, loop.seed, device, loop.sink_shift)  # a generator of their own
    s = LoopState(
        shape,
        g,
        lens,
        tables.to(device),
        tables,
        k_cache,
        v_cache,
        [],
        [],
        0.9 * D**-0.5,
        extra,
        af.Features.of(loop.features, extra),
        loop.kv,
        kv_scales,
        loop.q_std,
    )
    if shape.stale:  # the sequences' own blocks: finite data left by an earlier request
        own = tables.reshape(-1).long()
        for t, c in ((k_cache, "k"), (v_cache, "v")):
            old = (torch.randn((len(own) * bs, Hkv, D), generator=g, dtype=torch.float64) * 2.0).to(torch_dtype(dtype))
            t[own] = s.stored(old, c).reshape(len(own), bs, Hkv, D)
    for b, L in enumerate(lens):  # the prefill: history already in the cache
        kb, vb = randn((L, Hkv, D), g, dtype, "cpu"), randn((L, Hkv, D), g, dtype, "cpu")
        j = torch.arange(L)
        blk = tables[b, j // bs].long()
        k_cache[blk, j % bs] = kst = s.stored(kb, "k")
        v_cache[blk, j % bs] = vst = s.stored(vb, "v")
        s.ref_k.append(s.history(kst, "k"))
        s.ref_v.append(s.history(vst, "v"))
    s.k_cache = paged.from_nhd(k_cache, shape.layout).to(device)
    s.v_cache = paged.from_nhd(v_cache, shape.layout).to(device)
    s.kv_scales = {k: v.to(device) for k, v in kv_scales.items()}
    return s


def next_step(s: LoopState, index: int, dtype: str, padding: int = 0) -> Step:
    """The step's random q, k, v (plus `padding` tokens at slot -1) at the sequences' current lengths."""
    sh = s.shape
    g, bs, lens, tables = s.g, sh.block_size, s.lens, s.tables_cpu
    n = len(lens) + padding
    q = randn((n, sh.Hq, sh.D), g, dtype, "cpu", s.q_std)
    k = randn((n, sh.Hkv, sh.D), g, dtype, "cpu")
    v = randn((n, sh.Hkv, sh.D), g, dtype, "cpu")
    slots = [int(tables[b, L // bs]) * bs + L % bs for b, L in enumerate(lens)] + [-1] * padding
    return Step(index, q, k, v, list(lens) + [0] * padding, slots, [L + 1 for L in lens])


def step_arguments(s: LoopState, st: Step, device: str) -> dict[str, Any]:
    """The step's arguments by the decode_step contract (docs/ops.md), the caches as the loop left them."""
    return {
        "q": st.q.to(device),
        "k": st.k.to(device),
        "v": st.v.to(device),
        "positions": torch.tensor(st.positions, dtype=torch.int64, device=device),
        "k_cache": s.k_cache,
        "v_cache": s.v_cache,
        "slot_mapping": torch.tensor(st.slots, dtype=torch.int64, device=device),
        "block_tables": s.tables,
        "kv_lens": torch.tensor(st.kv_lens, dtype=torch.int32, device=device),
        "scale": s.scale,
        **s.extra,  # the attention features' inputs (alibi_slopes, sinks), as the attention ops take them
        **s.kv_scales,  # an FP8 cache's k_scale and v_scale
    }


def step_writes(s: LoopState, st: Step, rope: dict[str, Any], D: int) -> tuple[Written, Written]:
    """What a whole step (rotate, then append) writes at its slots of k_cache and v_cache: the new keys
    rotated at their positions and the new values (with an FP8 cache quantised with the loop's scales); and
    what a known bug writes instead (the key not rotated, the value rotated, the key written as the value,
    a wrong scale)."""
    spec = spec_of(rope, D)
    pos = torch.tensor(st.positions, dtype=torch.int64)
    k_rot = spec.rotate(st.k, pos)
    v_rot = spec.rotate(st.v, pos)
    ks, vs = s.kv_scales.get("k_scale"), s.kv_scales.get("v_scale")
    k_rows = Written(k_rot, False, [("kv-unrotated", Written(st.k, True, kv=s.kv, scale=ks))], s.kv, ks)
    v_alts = [
        ("rope-value", Written(v_rot, False, kv=s.kv, scale=vs)),
        ("kv-source", Written(k_rot, False, kv=s.kv, scale=vs)),
    ]
    v_rows = Written(st.v, True, v_alts, s.kv, vs)
    return k_rows.with_scale_bugs(vs), v_rows.with_scale_bugs(ks)


# --------------------------------------------------------------------------- the float64 reference of a step


def rotated(st: Step, B: int, rope: dict[str, Any] | None, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's q and k of the B sequences in float64, rotated at their positions when the step rotates."""
    if rope is None:
        return st.q[:B].to(torch.float64), st.k[:B].to(torch.float64)
    pos = torch.tensor(st.positions[:B], dtype=torch.int64)
    spec = spec_of(rope, D)
    return spec.rotate(st.q[:B], pos), spec.rotate(st.k[:B], pos)


def new_rows(s: LoopState, st: Step, k_ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 keys and values [B, Hkv, D] the step adds to the history: `k_ref` (rotated) and the new
    values; with an FP8 cache, what the slots hold once the step wrote them (s.k_cache and s.v_cache, which
    the cache check found right), dequantised: attention reads those bytes."""
    B = len(st.kv_lens)
    if s.kv is None:
        return k_ref[:B], st.v[:B].to(torch.float64)
    bs = s.shape.block_size
    slot = torch.tensor(st.slots[:B], dtype=torch.int64)
    kc, vc = paged.nhd(s.k_cache, s.shape.layout).to("cpu"), paged.nhd(s.v_cache, s.shape.layout).to("cpu")
    rows = [s.history(c[slot // bs, slot % bs], n).permute(1, 0, 2) for c, n in ((kc, "k"), (vc, "v"))]
    return rows[0], rows[1]


def advance(
    s: LoopState, st: Step, k_new: torch.Tensor, v_new: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The step's tokens appended to the float64 history (their keys `k_new` and values `v_new`: `new_rows`),
    each sequence one longer; returns the history before the step."""
    old_k, old_v = [x.clone() for x in s.ref_k], [x.clone() for x in s.ref_v]
    for b in range(len(st.kv_lens)):
        s.ref_k[b] = torch.cat([s.ref_k[b], k_new[b][:, None, :]], dim=1)
        s.ref_v[b] = torch.cat([s.ref_v[b], v_new[b][:, None, :]], dim=1)
    s.lens = list(st.kv_lens)
    return old_k, old_v


def attend_history(s: LoopState, q_ref: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of the step's queries over each sequence's float64 history (the step's token included),
    with the loop's attention features, each output row's slack and its TF32 slack (attention_common.
    reference_out, as the attention ops define them: with sinks the underflow in `dtype`, with an FP8 cache the
    rounding of the dequantised values to it; with sinks in float32 what TF32 operands of q.k move a row)."""
    out, slack, tf32 = ac.reference_out(
        q_ref, s.ref_k, s.ref_v, s.scale, s.shape.Hkv, s.feat, s.kv is not None, torch_dtype(dtype)
    )
    none = torch.zeros(out.shape[0] * out.shape[1], dtype=torch.float64)
    return out, slack.get("out", none), tf32.get("out", none)


def output_fingerprints(
    s: LoopState,
    st: Step,
    q_ref: torch.Tensor,
    old_k: list[torch.Tensor],
    old_v: list[torch.Tensor],
    kb: torch.Tensor,
    vb: torch.Tensor,
    rope: dict[str, Any] | None,
) -> list[tuple[str, torch.Tensor]]:
    """Outputs a step-level bug would produce (`s` advanced past the step, `old_k`/`old_v` its history before,
    `kb`/`vb` the caches before): the new token attended from the slot's contents before this step's write
    (`step-order`), the new token counted twice (`new-token-twice`), then the attention fingerprints
    (kv-mask, scale, gqa-mapping, ...) over the reference history."""
    sh = s.shape
    B = len(st.kv_lens)
    bs = sh.block_size
    hmap = ac.head_map(sh.Hq, sh.Hkv)
    kprev, vprev = paged.nhd(kb, sh.layout).to("cpu"), paged.nhd(vb, sh.layout).to("cpu")
    stale_k, stale_v, twice_k, twice_v = [], [], [], []
    for b in range(B):
        blk, off = divmod(st.slots[b], bs)
        stale_k.append(torch.cat([old_k[b], s.history(kprev[blk, off][None], "k")], dim=1))
        stale_v.append(torch.cat([old_v[b], s.history(vprev[blk, off][None], "v")], dim=1))
        twice_k.append(torch.cat([s.ref_k[b], s.ref_k[b][:, -1:]], dim=1))
        twice_v.append(torch.cat([s.ref_v[b], s.ref_v[b][:, -1:]], dim=1))
    scale, feat = s.scale, s.feat
    fps = [
        ("step-order", ac.attend(q_ref, stale_k, stale_v, scale, hmap, feat=feat)),
        ("new-token-twice", ac.attend(q_ref, twice_k, twice_v, scale, hmap, feat=feat)),
    ]
    if s.kv is not None:  # the caches read with a wrong scale: the history rescaled
        right = {n: kv_quant.per_head(s.kv_scales[n], sh.Hkv).reshape(-1, 1, 1) for n in ("k_scale", "v_scale")}

        def rescaled(hist: list[torch.Tensor], n: str) -> Any:
            return lambda b, L, sc: hist[b][:, :L] / right[n] * kv_quant.per_head(sc, sh.Hkv).reshape(-1, 1, 1)

        for cls, alt in ac.fp8_fingerprints(
            q_ref,
            rescaled(s.ref_k, "k_scale"),
            rescaled(s.ref_v, "v_scale"),
            st.kv_lens,
            scale,
            sh.Hq,
            sh.Hkv,
            s.kv,
            s.kv_scales,
            feat,
        ):
            fps.append((cls, alt["out"]))
    if rope is not None:  # q left unrotated, or rotated at position 0
        q0 = st.q[:B].to(torch.float64)
        fps.append(("rope-position", ac.attend(q0, s.ref_k, s.ref_v, scale, hmap, feat=feat)))
    for cls, alt in ac.fingerprints(
        q_ref,
        lambda b, L: s.ref_k[b][:, :L],
        lambda b, L: s.ref_v[b][:, :L],
        st.kv_lens,
        scale,
        sh.Hq,
        sh.Hkv,
        sh.D,
        tail_finite=False,
        feat=feat,
    ):
        fps.append((cls, alt["out"]))
    return fps


def rope_params(params: dict[str, Any]) -> dict[str, Any]:
    """The rope params of a loop, a scaled frequency table included (M-RoPE is refused by `pipeline_params`)."""
    return {p.name: params.get(p.name, p.default) for p in ROPE_PARAMS}


# --------------------------------------------------------------------------- the decode pipeline's loops

START_LENGTHS = (1, 9, 30, 47)
WINDOW_CROSSING_STEP = 3  # with a sliding window: the step at which one more sequence first passes it
USUAL_HEAD_DIMS = (64, 128, 80, 96, 256)  # the main loop's D first (unpinned), then the short loops'
SHAPE_STEPS = 2  # steps of the short loop at each other usual head dim


def crossing_window(lens: list[int], params: dict[str, Any], steps: int) -> list[int]:
    """`lens` (a loop's start lengths) and, with a sliding window, one more sequence whose kv_len first passes
    the window at step WINDOW_CROSSING_STEP (the last step of a shorter loop): a window bug heals nothing,
    and it shows only from the step where kv_len > window on."""
    w = params.get("window")
    if not w:
        return list(lens)
    crossing = max(int(w) - min(WINDOW_CROSSING_STEP, steps - 1), 0)  # kv_len at step i: length + i + 1
    return list(lens) + ([] if crossing in lens else [crossing])


def start_lengths(params: dict[str, Any], steps: int) -> list[int]:
    """The pipeline's start lengths: START_LENGTHS, and a sequence crossing the window (`crossing_window`)."""
    return crossing_window(list(START_LENGTHS), params, steps)


def pipeline_heads(params: dict[str, Any]) -> tuple[int, int]:
    return params.get("num_q_heads") or 4, params.get("num_kv_heads") or 2


def pipeline_shape(params: dict[str, Any], steps: int, D: int | None = None) -> LoopShape:
    return LoopShape(
        *pipeline_heads(params),
        D or params.get("head_dim") or USUAL_HEAD_DIMS[0],
        start_lengths(params, steps),
        params["block_size"],
        paged.layout_of(params),
    )


def pipeline_loop(
    params: dict[str, Any], dtype: str, seed: int, steps: int, rope: bool, D: int | None = None
) -> DecodeLoop:
    """The pipeline's loop at head dim D: one padding token per step; rotated when a rope entry is given; the
    attention features of the params."""
    return DecodeLoop(
        pipeline_shape(params, steps, D),
        dtype,
        seed,
        steps,
        rope_params(params) if rope else None,
        padding=1,
        features=af.of_params(params),
        kv=kv_quant.spec_of(params),
    )


def pipeline_cases(params: dict[str, Any], steps: int, dtype: str, seed: int) -> list[Case]:
    """The pipeline's shape domain (docs/ops.md): the decode loop at the pinned head dim, else at D 64 with
    the other usual head dims, nearest first, as the shapes it moves to when an entry refuses D 64, and a
    short loop at each of those. A pinned head dim is declared: an entry's error there is a finding."""
    pinned = params.get("head_dim")
    main = pinned or USUAL_HEAD_DIMS[0]
    others = [] if pinned else sorted(USUAL_HEAD_DIMS[1:], key=lambda d: (abs(d - main), d))
    cases = [
        Case(
            "decode-loop",
            {"steps": steps, "start_lengths": start_lengths(params, steps), "D": main, "instead": others},
            dtype,
            seed,
        )
    ]
    short = min(SHAPE_STEPS, steps)
    cases += [
        Case(
            f"shape-D{d}",
            {"steps": short, "start_lengths": start_lengths(params, short), "D": d, "instead": []},
            dtype,
            seed,
            ("shape",),
        )
        for d in USUAL_HEAD_DIMS[1:]
        if not pinned
    ]
    return cases


def pipeline_shape_text(params: dict[str, Any], D: int, dtype: str) -> str:
    hq, hkv = pipeline_heads(params)
    return f"D={D} Hq={hq} Hkv={hkv} {dtype} block_size={params['block_size']}"
