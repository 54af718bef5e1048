"""Structural checks for decode_step: the rotation, the cache store and the softmax of a whole decode step,
found in the entry's kernels (one fused kernel or several) and each judged by its own op's analysis.

The interpreter runs every program with the capture's positions, slot mapping, block tables and kv_lens,
keeping stored lanes as affine forms over the loaded elements (RoPE's model) and labelling K/V cache lanes
past kv_len (attention's model). Then, with source lines:

* the parts: a cos/sin of the positions (rotation), stores into k_cache/v_cache (cache store), an exp of
  scores read from k_cache (softmax); a part that is not found is `not analysed (reason)`, never a pass;
* the cache store, per stored lane: only this step's slots are written, each with data of the token that
  owns the slot and of the head it lands in (`stray-write` otherwise, e.g. a padded tile spilling into
  the next head or the next slot); v_cache holds v itself (`rope-value` when it holds a rotation of v,
  `kv-source` for any other source); every element of the new tokens is written (`kv-coverage`); slot
  offsets are 64-bit (kv_append's `offset-overflow` check);
* the rotation: k_cache's new slots hold R(positions[b]) k[b] (RoPE's per-element check of pairing, sign,
  angle, passthrough; `kv-unrotated` when they hold k itself); the angle's precision (RoPE's check);
* the order: every read of a new token's slot comes after its write, in the same program or in a later
  launch (`step-order`: before it, or in another program of the same launch, which no barrier orders);
* the softmax and the K/V addressing: attention's analyses over the kernels that read k_cache
  (softmax-no-max, scale, online-rescale, softmax-no-normalize, kv-mask, gqa-mapping, paged-index, ...);
  a score computed from the new key in registers while the cache read also covers the new token's slot
  is `new-token-twice`.

Not analysed, said as a notice: q's rotation when the rotated q is never stored (it feeds the scores
inside the kernel, where no linear form of it survives).
"""

from __future__ import annotations

import numpy as np

from kernalin_ci.verify.structural import attention, rope
from kernalin_ci.verify.structural.abstract_values import FloatValue
from kernalin_ci.verify.structural.common import Analysis, StructuralFindings, kname
from kernalin_ci.verify.structural.dataflow import KernelView, link_views
from kernalin_ci.verify.structural.kv_append import check_widths

CACHES = {"k_cache": "k", "v_cache": "v"}


class DecodeStepModel(attention.AttentionModel):
    """Attention's validity labels for K/V cache lanes, with RoPE's linear forms of stored values."""

    linear = True


def analyze(cap, views: list, rep: StructuralFindings, model: DecodeStepModel) -> None:
    names = list(cap.tensors)
    bs = int(cap.params["block_size"])
    slots = [int(x) for x in cap.kwargs["slot_mapping"].tolist()]
    positions = [int(x) for x in cap.kwargs["positions"].tolist()]
    parts = _parts(views)
    for part, why in (
        ("rotation", "no cos/sin of the positions in any kernel"),
        ("cache store", "no store into k_cache or v_cache"),
        ("softmax", "no exp of scores read from k_cache"),
    ):
        if not parts[part]:
            rep.gap(
                part,
                "structural:decode-step",
                f"{part}: not analysed ({why})",
                where=(views[0].launch.path, views[0].launch.line),
            )
    if parts["cache store"]:
        _check_stores(cap, views, rep, names, bs, slots)
        for view in views:
            check_widths(cap, view, rep)
        _check_order(cap, views, rep, bs, slots)
    if parts["rotation"]:
        for view in views:
            op = rope._low_precision_angle(view)
            if op is not None:
                rep.finding(
                    "structural:rope-precision",
                    "precision",
                    f"{kname(view)}: the rotation angle is computed in {op.result.type.elem}",
                    op,
                    view,
                )
        if parts["cache store"]:
            _check_rotated_keys(cap, views, rep, names, bs, slots, positions)
    q_rot = _rotated_q(cap, views, names)
    if q_rot is not None and parts["rotation"]:
        forms = rope.stored_forms(views, q_rot, names)
        info = cap.tensors[q_rot]
        rows = {info.coord(e): forms.get(e) for e in range(info.numel)}
        rope.check_rotation(
            cap,
            views,
            rep,
            "q",
            rows,
            info.shape,
            False,
            cap.params.get("style", "neox"),
            float(cap.params.get("base", 10000.0)),
            positions,
            skip_angles=rep.has("precision"),
        )
    else:
        rep.gap(
            "rotation of q",
            "structural:decode-step",
            "q's rotation: not analysed (the rotated q is never stored: it feeds the "
            "scores inside the kernel, where no linear form of it survives; the dynamic "
            "loop checks it)",
            where=(views[0].launch.path, views[0].launch.line),
        )
    if parts["softmax"]:
        if _check_new_token_twice(cap, views, rep, bs, slots) == "registers":
            # the new token's score comes from registers, its slot is never read back: the cache part of the
            # attention covers the kv_len - 1 tokens before it
            model = DecodeStepModel(cap, [L - 1 for L in model.lens])
        main = [v for v in views if v.loads_of("k_cache")]
        if q_rot is not None and not any(v.loads_of("q") for v in main):
            # the attention kernels read the rotated copy: it is their query (its rotation is checked above)
            cap, views = _as_query(cap, views, q_rot)
        attention.analyze(cap, views, rep, model)


def _rotated_q(cap, views, names) -> str | None:
    """The tensor the entry stores the rotated q into (a scratch of q's shape whose stored values are
    linear forms of q), or None."""
    shape = tuple(cap.tensors["q"].shape)
    for name, info in cap.tensors.items():
        if name in ("q", "k", "v", "k_cache", "v_cache") or tuple(info.shape) != shape:
            continue
        forms = rope.stored_forms(views, name, names)
        if any(a == "q" for f in forms.values() for a, _ in f[2]):
            return name
    return None


def _as_query(cap, views, q_rot: str):
    """The capture and views with `q_rot` named q, for attention's analyses."""
    from dataclasses import replace

    # both are "q" to the analyses: q_rot is the query the attention reads, and a value followed back into
    # the kernel that stored q_rot is a form of q itself (the scale check asks for a product of q and k)
    rename = {q_rot: "q"}
    tensors = {rename.get(n, n): i for n, i in cap.tensors.items() if n != "q"}
    kwargs = dict(cap.kwargs, q=cap.kwargs["q"])
    cap2 = replace(cap, tensors=tensors, kwargs=kwargs)
    views2 = [KernelView(v.launch, v.module, v.trace, cap2, [rename.get(n, n) for n in v.names]) for v in views]
    link_views(views2)
    return cap2, views2


def _parts(views: list) -> dict:
    out: dict = {"rotation": [], "cache store": [], "softmax": []}
    for view in views:
        if rope._cos_sin_ops(view):
            out["rotation"].append(view)
        if view.loads is not None and any(t in CACHES for t in view.stores.values()):
            out["cache store"].append(view)
        if attention.exps_of(view).of("score"):
            out["softmax"].append(view)
    return out


def _slot_elems(info, slot: int, bs: int) -> np.ndarray:
    """Element offsets of one slot (all heads and dims) of an nhd cache."""
    blk, off = divmod(slot, bs)
    st = info.strides
    H, D = info.shape[2], info.shape[3]
    g, d = np.meshgrid(np.arange(H), np.arange(D), indexing="ij")
    return (blk * st[0] + off * st[1] + g * st[2] + d * st[3]).reshape(-1)


def _lane_atoms(view, acc, k: int) -> list:
    """[(tensor name, element)] the stored value of lane k (flat index) is a linear form of."""
    val = acc.value
    out = []
    if not isinstance(val, FloatValue):
        return out
    for bid, idx, coef in val.terms:
        if coef.reshape(-1)[k] == 0:
            continue
        bt, be, _ = view.trace.blocks[bid]
        i = int(idx.reshape(-1)[k])
        out.append((view.names[int(bt.reshape(-1)[i])], int(be.reshape(-1)[i])))
    return out


def _check_stores(cap, views, rep, names, bs, slots) -> None:
    """Each stored cache lane: a slot of this step, data of the token owning it and of the head it lands in."""
    token_of_slot = {s: t for t, s in enumerate(slots) if s >= 0}
    for view in views:
        for acc in view.accesses("store", *CACHES):
            cache = view.names[int(np.asarray(acc.tensor).reshape(-1)[0])]
            info = cap.tensors[cache]
            m = (acc.mask & acc.inb).reshape(-1)
            if not m.any():
                continue
            elems = acc.elem.reshape(-1)
            lin = getattr(acc.value, "lin", None)
            for k in np.flatnonzero(m):
                blk, off, g, d = info.coord(int(elems[k]))
                slot = blk * bs + off
                t = token_of_slot.get(slot)
                if t is None:
                    rep.finding(
                        "structural:decode-store",
                        "stray-write",
                        f"{kname(view)}: program {acc.program} stores into {cache} slot {slot} (block {blk}, "
                        f"offset {off}, head {g}, dim {d}), which is no slot of this step (slots {slots})",
                        acc.op,
                        view,
                    )
                    break
                atoms = _lane_atoms(view, acc, int(k))
                if lin is not None and not bool(np.asarray(lin).reshape(-1)[k]):
                    continue  # an opaque value: the element checks below say what they can
                foreign = [a for a in atoms if a[0] not in ("k", "v") or cap.tensors[a[0]].coord(a[1])[:2] != (t, g)]
                if not atoms or foreign:
                    if not atoms:
                        what = "a constant"
                    else:
                        tensor, index = foreign[0]
                        coord = list(cap.tensors[tensor].coord(index)) if tensor in cap.tensors else ""
                        what = f"{tensor}{coord}"
                    rep.finding(
                        "structural:decode-store",
                        "stray-write",
                        f"{kname(view)}: program {acc.program} stores {what} into {cache}[slot {slot}, head "
                        f"{g}, dim {d}], which must hold token {t}'s head {g} (a write outside the token's "
                        f"own elements, e.g. a padded tile spilling into the next head or slot)",
                        acc.op,
                        view,
                    )
                    break


def _check_rotated_keys(cap, views, rep, names, bs, slots, positions) -> None:
    """k_cache's new slots against R(positions[b]) k[b]; v_cache's against v[b]."""
    style = cap.params.get("style", "neox")
    base = float(cap.params.get("base", 10000.0))
    for cache, src in CACHES.items():
        info = cap.tensors[cache]
        forms = rope.stored_forms(views, cache, names)
        rows = {}
        for t, s in enumerate(slots):
            if s < 0:
                continue
            for e in _slot_elems(info, s, bs):
                _, _, g, d = info.coord(int(e))
                rows[(t, g, d)] = forms.get(int(e))
        if src == "k":
            if _holds_source(cap, rows, "k", positions):
                view, op = _first_store(views, cache)
                rep.finding(
                    "structural:decode-rotation",
                    "kv-unrotated",
                    f"{kname(view)}: the new slots of k_cache hold k itself, not k rotated at its position "
                    f"(positions {positions})",
                    op,
                    view,
                )
                continue
            rope.check_rotation(
                cap,
                views,
                rep,
                "k",
                rows,
                cap.tensors["k"].shape,
                False,
                style,
                base,
                positions,
                skip_angles=rep.has("precision"),
                unwritten="kv-coverage",
            )
        else:
            _check_values(cap, views, rep, rows, positions)


def _holds_source(cap, rows: dict, src: str, positions: list) -> bool:
    """Every element of a token at a non-zero position is exactly src[t, g, d] (1 * one atom)."""
    seen = False
    for (t, g, d), form in rows.items():
        if form is None or positions[t] == 0:
            continue
        _, _, atoms, const, lin = form
        if not lin or len(atoms) != 1 or abs(const) > 1e-9:
            return False
        (a, e), c = next(iter(atoms.items()))
        if a != src or tuple(cap.tensors[a].coord(e)) != (t, g, d) or abs(c - 1.0) > 1e-6:
            return False
        seen = True
    return seen


def _check_values(cap, views, rep, rows: dict, positions: list) -> None:
    missing = 0
    for (t, g, d), form in rows.items():
        if form is None:
            missing += 1
            continue
        view, sop, atoms, const, lin = form
        if not lin:
            continue
        if len(atoms) == 1 and abs(const) < 1e-9:
            (a, e), c = next(iter(atoms.items()))
            if a == "v" and tuple(cap.tensors[a].coord(e)) == (t, g, d) and abs(c - 1.0) < 1e-6:
                continue
        srcs = {a for a, _ in atoms}
        if srcs == {"v"} and len(atoms) == 2 and positions[t] != 0:
            rep.finding(
                "structural:decode-values",
                "rope-value",
                f"{kname(view)}: v_cache[token {t}, head {g}, dim {d}] holds a rotation of v (a cos/sin "
                f"combination of two of its dims), not v itself",
                attention_value_op(sop),
                view,
            )
            return
        rep.finding(
            "structural:decode-values",
            "kv-source",
            f"{kname(view)}: v_cache[token {t}, head {g}, dim {d}] holds {sorted(srcs) or 'a constant'} data, "
            f"not v[{t}, {g}, {d}]",
            sop,
            view,
        )
        return
    if missing:
        view, op = _first_store(views, "v_cache")
        rep.finding(
            "structural:decode-values",
            "kv-coverage",
            f"{kname(view)}: {missing} element(s) of the new tokens are never written to v_cache",
            op,
            view,
        )


def attention_value_op(store_op):
    return rope._value_op(store_op)


def _first_store(views, tensor):
    for view in views:
        for op, t in view.stores.items():
            if t == tensor:
                return view, op
    return views[0], None


def _check_order(cap, views, rep, bs, slots) -> None:
    """Every read of a new slot after its write: later in the same program, or in a later launch."""
    for cache in CACHES:
        info = cap.tensors[cache]
        new = np.concatenate([_slot_elems(info, s, bs) for s in slots if s >= 0])
        written: dict = {}  # element -> (launch index, program)
        for li, view in enumerate(views):
            for acc in view.trace.accesses:
                t = view.names[int(np.asarray(acc.tensor).reshape(-1)[0])] if np.asarray(acc.tensor).size else None
                if t != cache:
                    continue
                m = (acc.mask & acc.inb).reshape(-1)
                e = acc.elem.reshape(-1)[m]
                hit = np.isin(e, new)
                if not hit.any():
                    continue
                if acc.kind == "store":
                    for x in e[hit]:
                        written.setdefault(int(x), (li, acc.program))
                    continue
                for x in e[hit]:
                    w = written.get(int(x))
                    if w is not None and (w[0] < li or w == (li, acc.program)):
                        continue
                    blk, off, g, d = info.coord(int(x))
                    why = (
                        "before any write of it"
                        if w is None
                        else f"in program {acc.program}, while program {w[1]} of the same launch writes it (no "
                        f"barrier orders two programs)"
                    )
                    rep.finding(
                        "structural:decode-order",
                        "step-order",
                        f"{kname(view)}: {cache} slot {blk * bs + off} (head {g}), the new token's, is read "
                        f"{why}: the attention sees the slot's old contents",
                        acc.op,
                        view,
                    )
                    return


def _check_new_token_twice(cap, views, rep, bs, slots) -> str | None:
    """A score from the new key in registers, in a kernel whose cache reads also cover the new token's slot.
    Returns "registers" when the new token's score comes from registers and its slot is never read back."""
    path = None
    for view in views:

        def from_k(op, view=view):
            return op.name == "tt.load" and view.loads.get(op) == "k"

        twice = [op for op, _ in attention.exps_of(view).of("score") if view.graph.reaches(op.operands[0], from_k)]
        if not twice:
            continue
        info = cap.tensors["k_cache"]
        new = np.concatenate([_slot_elems(info, s, bs) for s in slots if s >= 0])
        reads_new = any(np.isin(acc.elem[acc.mask & acc.inb], new).any() for acc in view.accesses("load", "k_cache"))
        if reads_new:
            rep.finding(
                "structural:decode-new-token",
                "new-token-twice",
                f"{kname(view)}: a score is computed from the new key k in registers while the kernel also "
                f"reads the new token's slot of k_cache (kv_len includes it): the new token enters the "
                f"softmax twice",
                twice[0],
                view,
            )
        else:
            path = "registers"
    return path


ANALYSIS = Analysis(
    DecodeStepModel,
    analyze,
    store_bounds=True,
    properties=("rotation", "rotation of q", "cache store", "step order", "softmax"),
)
