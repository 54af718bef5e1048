"""Structural checks for kv_append: the write set, and 64-bit address arithmetic.

The interpreter runs every program with the capture's slot mapping (distinct
slots, padding tokens at -1) and keeps each stored lane as an affine form over
the loaded key/value elements. Then:

* every store into k_cache/v_cache lands at cache + f(slot) of the token whose
  data it carries, at that token's head and dim (`kv-slot`; `stride` for a head
  or dim mix-up), K stores carry key and V stores carry value (`kv-source`);
* nothing is written for a padding token (slot -1), anywhere (`kv-padding`);
* every token with slot >= 0 has all Hkv * D elements written in both caches
  (`kv-coverage`), and nothing else is written, in the caches or any other
  tensor (`stray-write`);
* address arithmetic that scales with the cache (anything derived from the
  slot) is 64-bit: a 32-bit multiply or add of a slot-derived offset, or a
  32-bit offset into the cache, overflows once the cache passes 2^31 elements
  (`offset-overflow`). This is a property of the IR's types, so it needs no
  2^31-element input.
"""

from __future__ import annotations

import numpy as np

from kernalin_ci.verify.structural.abstract_values import INV_MASK, FloatValue
from kernalin_ci.verify.structural.common import Analysis, StructuralFindings, kname
from kernalin_ci.verify.structural.dataflow import peel
from kernalin_ci.verify.structural.rope import stored_forms

CACHES = {"k_cache": "key", "v_cache": "value"}


class KvModel:
    linear = True

    def __init__(self, cap):
        self.cap = cap

    def label(self, info, elem, mask, inb, interp):
        return None, None


def analyze(cap, views: list, rep: StructuralFindings, model: KvModel) -> None:
    names = list(cap.tensors)
    bs = int(cap.params["block_size"])
    slots = [int(x) for x in cap.kwargs["slot_mapping"].tolist()]
    token_of_slot = {s: t for t, s in enumerate(slots) if s >= 0}
    padding = {t for t, s in enumerate(slots) if s < 0}
    key_info = cap.tensors["key"]
    T, Hkv, D = key_info.shape
    _stray_stores(cap, views, rep, names, padding)
    for cache, src in CACHES.items():
        info = cap.tensors[cache]
        forms = stored_forms(views, cache, names)
        problems: dict = {}  # (check id, bug class) -> first message, view, op and a count

        def flag(key, cls, msg, view, op):
            m, v, o, n = problems.get((key, cls), (msg, view, op, 0))
            problems[(key, cls)] = (m, v, o, n + 1)

        written = {}
        unfollowed: list = []  # stores whose value is not a single loaded element
        misplaced: set = set()  # tokens with data written to a wrong slot
        for e, (view, sop, atoms, const, lin) in forms.items():
            blk, off, g, d = info.coord(e)
            slot = blk * bs + off
            if not lin or len(atoms) != 1:
                owner = token_of_slot.get(slot)
                if owner is None:
                    flag(
                        "structural:kv-stray",
                        "stray-write",
                        f"slot {slot} of {cache}, which no token of the call owns, is written (head {g}, dim {d})",
                        view,
                        sop,
                    )
                elif _garbage(view, sop, e, info):
                    flag(
                        "structural:kv-garbage",
                        "kv-source",
                        f"{cache}[slot {slot}, head {g}, dim {d}] (token {owner}) receives data read out of bounds",
                        view,
                        sop,
                    )
                else:
                    unfollowed.append((view, sop))
                continue
            (at, ae), coef = next(iter(atoms.items()))
            if at not in ("key", "value"):
                flag("structural:kv-source", "kv-source", f"{cache} is written from {at}, not {src}", view, sop)
                continue
            tt, tg, td = cap.tensors[at].coord(ae)
            if tt in padding:
                flag(
                    "structural:kv-padding",
                    "kv-padding",
                    f"token {tt} is padding (slot -1) but its {at} is written into {cache} (slot {slot})",
                    view,
                    _guard_op(view, sop) or sop,
                )
                continue
            if at != src:
                flag(
                    "structural:kv-source",
                    "kv-source",
                    f"{cache} receives {at} data (token {tt}); it must hold {src}",
                    view,
                    sop,
                )
                continue
            if abs(coef - 1.0) > 1e-6 or abs(const) > 1e-6:
                flag(
                    "structural:kv-scaled",
                    "kv-source",
                    f"{cache} receives {coef:g} * {at} + {const:g}, not {at} itself",
                    view,
                    sop,
                )
                continue
            want_slot = slots[tt]
            if slot != want_slot:
                misplaced.add(tt)
                owner = token_of_slot.get(slot)
                if owner is None:
                    flag(
                        "structural:kv-stray",
                        "stray-write",
                        f"token {tt} (slot {want_slot}) head {tg} is written to slot {slot} of {cache} "
                        f"(block {blk}, offset {off}; block_size {bs}), which no token of the call owns",
                        view,
                        sop,
                    )
                else:
                    flag(
                        "structural:kv-slot",
                        "kv-slot",
                        f"token {tt} (slot {want_slot}) is written over token {owner}'s slot {slot} of {cache} "
                        f"(block {blk}, offset {off}; block_size {bs})",
                        view,
                        sop,
                    )
                continue
            if (tg, td) != (g, d):
                flag(
                    "structural:kv-head-dim",
                    "stride",
                    f"{cache}[slot {slot}] head {g} dim {d} receives head {tg} dim {td} of token {tt}",
                    view,
                    sop,
                )
                continue
            written[(tt, g, d)] = True
        missing = [
            (t, g, d)
            for t in range(T)
            if t not in padding
            for g in range(Hkv)
            for d in range(D)
            if (t, g, d) not in written
        ]
        if unfollowed:
            view, sop = unfollowed[0]
            rep.gap(
                f"stored values of {cache}",
                "structural:kv-values",
                f"could not verify {len(unfollowed)} stored element(s) of {cache}: the value is "
                f"not a single element of key or value",
                sop,
                view,
            )
        incomplete = bool(unfollowed)
        lost = sorted({t for t, _, _ in missing} & misplaced)
        if lost:
            view, store = views[0], _store_op(views, cache)
            rep.finding(
                "structural:kv-slot",
                "kv-slot",
                f"{kname(view)}: the slots of token(s) {lost[:4]} do not receive their {src}: it is written "
                f"elsewhere in {cache}",
                store,
                view,
            )
        missing = [m for m in missing if m[0] not in misplaced]
        if missing and not incomplete and not any(k[1] in ("kv-source", "stride") for k in problems):
            heads = sorted({g for _, g, _ in missing})
            dims = sorted({d for _, _, d in missing})
            view = views[0]
            store = _store_op(views, cache)
            rep.finding(
                "structural:kv-coverage",
                "kv-coverage",
                f"{kname(view)}: {len(missing)} of {(T - len(padding)) * Hkv * D} elements of the new "
                f"tokens are never written to {cache} (heads {heads[:4]}{'...' if len(heads) > 4 else ''},"
                f" dims {dims[0]}..{dims[-1]})",
                _mask_op(store) if store is not None else None,
                view,
                where=None if store is not None else (view.launch.path, view.launch.line),
            )
        for (key, cls), (msg, view, op, n) in problems.items():
            rep.finding(key, cls, f"{kname(view)}: {msg} ({n} element(s))", op, view)
    for view in views:
        check_widths(cap, view, rep)


def _guard_op(view, store_op):
    """The test that should skip padding tokens: the slot comparison guarding the store (scf.if or an early
    return); None when there is none."""

    def slot_test(v):
        op = peel(v).owner
        return op if op is not None and op.name == "arith.cmpi" and view.reads_int(v, "slot_mapping") else None

    b = store_op.parent
    while b is not None and b.parent is not None:
        if b.parent.name == "scf.if":
            t = slot_test(b.parent.operands[0])
            if t is not None:
                return t
        b = b.parent.parent
    for op in view.ops():
        if op.name == "cf.cond_br":
            t = slot_test(op.operands[0])
            if t is not None:
                return t
    return None


def _mask_op(store_op):
    """The op computing a store's mask, when the store has one."""

    if len(store_op.operands) < 3:
        return store_op
    m = peel(store_op.operands[2]).owner
    return m if m is not None else store_op


def _garbage(view, store_op, elem: int, info) -> bool:
    """Does the value stored at this element carry data read out of bounds or never written?"""

    for acc in view.trace.accesses:
        if acc.op is store_op and acc.kind == "store":
            hit = (acc.elem == elem) & acc.mask & acc.inb
            if hit.any() and hasattr(acc.value, "tags"):
                return bool((acc.value.tags[hit] & INV_MASK).any())
    return False


def _store_op(views, tensor):
    for view in views:
        for op, t in view.stores.items():
            if t == tensor:
                return op
    return None


def _stray_stores(cap, views, rep, names, padding) -> None:
    """Stores outside the caches' bounds, or into any other tensor."""
    for view in views:
        for acc in view.trace.accesses:
            if acc.kind != "store":
                continue
            t = names[int(np.asarray(acc.tensor).reshape(-1)[0])]
            m = acc.mask
            if not m.any():
                continue
            oob = m & ~acc.inb
            if t in CACHES and not oob.any():
                continue
            bad = oob if t in CACHES else m
            if not bad.any():
                continue
            # whose data is it?
            from_pad = _tokens_of(cap, view, acc, bad) & padding
            if from_pad:
                rep.finding(
                    "structural:kv-padding",
                    "kv-padding",
                    f"{kname(view)}: padding token(s) {sorted(from_pad)[:4]} (slot -1) are stored "
                    f"{'outside ' + t if t in CACHES else 'into ' + t}",
                    _guard_op(view, acc.op) or acc.op,
                    view,
                )
            else:
                where = f"outside {t} {list(cap.tensors[t].shape)}" if t in CACHES else f"into {t}"
                rep.finding(
                    "structural:stray-write",
                    "stray-write",
                    f"{kname(view)}: {int(bad.sum())} element(s) stored {where}",
                    acc.op,
                    view,
                )


def _tokens_of(cap, view, acc, lanes) -> set:
    val = acc.value
    out = set()
    if not isinstance(val, FloatValue):
        return out
    for bid, idx, coef in val.terms:
        bt, be, _ = view.trace.blocks[bid]
        ii = idx[lanes]
        cf = coef[lanes]
        for k in np.flatnonzero(cf != 0):
            tname = view.names[int(bt.reshape(-1)[ii[k]])]
            if tname in ("key", "value"):
                out.add(int(cap.tensors[tname].coords(np.array([int(be.reshape(-1)[ii[k]])]))[0][0]))
    return out


# --------------------------------------------------------------------------- 64-bit addressing


def check_widths(cap, view, rep: StructuralFindings) -> None:
    """A slot-derived offset into a cache computed or applied in 32 bits."""
    seen = set()
    for op in view.ops():
        if op.name != "tt.store" or view.stores.get(op) not in CACHES:
            continue
        for bad in _narrow_slot_math(view, op.operands[0]):
            if bad in seen:
                continue
            seen.add(bad)
            what = "pointer offset" if bad.name == "tt.addptr" else bad.name.split(".")[-1]
            rep.finding(
                "structural:offset-overflow",
                "offset-overflow",
                f"{kname(view)}: a slot-derived {what} into {view.stores[op]} is computed in "
                f"{_bits_of(bad)}-bit arithmetic; it overflows once the cache passes 2^31 elements "
                f"(compute the offset in int64)",
                bad,
                view,
            )


def _bits_of(op) -> int:
    v = op.operands[1] if op.name == "tt.addptr" else op.result
    return v.type.bits


_PASS = (
    "arith.addi",
    "arith.subi",
    "arith.muli",
    "arith.divsi",
    "arith.divui",
    "arith.floordivsi",
    "arith.ceildivsi",
    "arith.shli",
    "arith.shrsi",
    "arith.shrui",
    "arith.extsi",
    "arith.extui",
    "arith.trunci",
    "arith.select",
    "arith.maxsi",
    "arith.minsi",
    "tt.splat",
    "tt.broadcast",
    "tt.expand_dims",
    "tt.reshape",
    "arith.index_cast",
)


class _Scale:
    """Which integer values grow with the cache: the loaded slot and what is computed from it, except
    through a remainder or a mask (slot % block_size is bounded)."""

    def __init__(self, view):
        self.view = view
        self.memo = {}

    def grows(self, v, depth=0) -> bool:
        if v in self.memo:
            return self.memo[v]
        op = v.owner
        out = False
        if op is not None and depth < 64:
            if op.name == "tt.load":
                out = self.view.loads.get(op) == "slot_mapping"
            elif op.name in _PASS:
                out = any(self.grows(o, depth + 1) for o in op.operands)
        self.memo[v] = out
        return out

    def product(self, v, depth=0) -> bool:
        """v grows with the cache and went through a multiplication (a scaled offset)."""
        op = v.owner
        if op is None or depth > 64 or not self.grows(v):
            return False
        if op.name in ("arith.muli", "arith.shli"):
            return True
        return any(self.product(o, depth + 1) for o in op.operands)


def _narrow_slot_math(view, ptr):
    """Ops on the address path of `ptr` that handle a cache-sized offset in 32 bits or fewer."""
    sc = _Scale(view)
    out = []
    stack, seen = [ptr], set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        op = v.owner
        if op is None or op.name == "tt.load":
            continue
        if op.name == "tt.addptr":
            off = op.operands[1]
            if off.type.bits <= 32 and sc.product(off):
                out.append(op)
        elif (
            op.name in ("arith.muli", "arith.shli", "arith.addi")
            and op.result.type.bits <= 32
            and sc.product(op.result)
        ):
            out.append(op)
        elif op.name == "arith.trunci" and op.result.type.bits <= 32 and sc.product(op.operands[0]):
            out.append(op)
        stack.extend(op.operands)
    # report the first narrow op on each chain (the one to fix), not every op after it; a product of a
    # value that was truncated to 32 bits is blamed on the truncation
    firsts = [o for o in out if not any(_feeds(p, o) for p in out if p is not o)] or out
    return [_narrowing(o, sc) or o for o in firsts]


def _narrowing(op, sc, depth=0):
    """An arith.trunci of a cache-growing value feeding op (where 64 bits became 32)."""
    for o in op.operands:
        d = o.owner
        if d is None or depth > 16:
            continue
        if d.name == "arith.trunci" and sc.grows(d.operands[0]):
            return d
        if d.name in _PASS:
            hit = _narrowing(d, sc, depth + 1)
            if hit is not None:
                return hit
    return None


def _feeds(a, b, depth=0) -> bool:
    """Does op a's result flow into op b (within a few steps)?"""
    if depth > 16:
        return False
    return any(o.owner is a or (o.owner is not None and _feeds(a, o.owner, depth + 1)) for o in b.operands)


ANALYSIS = Analysis(
    KvModel,
    analyze,
    store_bounds=False,
    properties=(
        "stored values of k_cache",
        "stored values of v_cache",
        "padding skipped",
        "coverage",
        "no stray writes",
        "64-bit offsets",
    ),
)
