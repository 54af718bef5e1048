"""Structural checks of attention read from the abstract interpretation's memory accesses (index
arithmetic only): the length masks (`kv-mask`, `unmasked-load`), the K/V addressing (`gqa-mapping`,
`stride`, `paged-index`) and the output's coverage. attention.analyze runs them."""

from __future__ import annotations

import math

import numpy as np

from kernalin_ci.verify.structural.abstract_values import INV_MASK, PID, POS
from kernalin_ci.verify.structural.attention_values import Exps, dims
from kernalin_ci.verify.structural.common import StructuralFindings, kname, op_of
from kernalin_ci.verify.structural.dataflow import KernelView, line_of, peel
from kernalin_ci.verify.structural.ir import IROp

# --------------------------------------------------------------------------- interpreter model


class AttentionModel:
    """Which K/V cache elements are valid positions: j < kv_len of the sequence that owns them."""

    linear = False

    def __init__(self, cap, lens: list | None = None):
        self.cap = cap
        self.paged = op_of(cap).paged_cache
        self.lens = lens if lens is not None else [int(x) for x in cap.kwargs["kv_lens"].tolist()]
        if self.paged:
            self.bs = int(cap.params["block_size"])
            tables = cap.kwargs["block_tables"].tolist()
            self.owner = {}  # block -> (b, i): block i of sequence b
            self.tail = set()  # blocks the tables name past a sequence's last block
            for b, row in enumerate(tables):
                need = -(-self.lens[b] // self.bs)
                for i, blk in enumerate(row):
                    if i < need:
                        self.owner[int(blk)] = (b, i)
                    else:
                        self.tail.add(int(blk))

    def decode(self, info, elem):
        """K/V element offsets -> (sequence, kv head, position) arrays; position -1 where unowned."""
        co = info.coords(elem)
        if not self.paged:
            return co[..., 0], co[..., 1], co[..., 2]
        blk, off, g = co[..., 0], co[..., 1], co[..., 2]
        seq = np.full(blk.shape, -1, dtype=np.int64)
        pos = np.full(blk.shape, -1, dtype=np.int64)
        for k, (b, i) in self.owner.items():
            hit = blk == k
            seq[hit] = b
            pos[hit] = i * self.bs + off[hit]
        return seq, g, pos

    def overrun(self, info, elem, b: int, g: int) -> np.ndarray:
        """Lanes whose offset, taken from the start of the row of (sequence b, KV head g), lies past
        kv_len[b] (contiguous) or past the head dim of the slot it starts in (paged)."""
        elem = np.asarray(elem, dtype=np.int64)
        st = info.strides
        if not self.paged:
            rel = elem - (b * st[0] + g * st[1])
            return (rel >= 0) & (np.floor_divide(rel, max(st[2], 1)) >= self.lens[b])
        co = info.coords(elem)
        rel = elem - (co[..., 0] * st[0] + co[..., 1] * st[1] + g * st[2])
        return (rel >= info.shape[3]) & (co[..., 2] != g)

    def valid(self, info, elem):
        seq, g, pos = self.decode(info, elem)
        lens = np.array(self.lens + [0], dtype=np.int64)
        L = lens[np.where(seq >= 0, seq, len(self.lens))]
        return (seq >= 0) & (pos >= 0) & (pos < L)

    def label(self, info, elem, mask, inb, interp):
        if info.name not in ("k_cache", "v_cache"):
            return None, None
        ok = self.valid(info, elem) & inb
        return ~ok, ~ok


# --------------------------------------------------------------------------- masks (interpreter)


def _mask_op(view: KernelView, exp_op: IROp) -> IROp:
    """The line to blame for an unmasked score: the select that masks the scores, else the exp."""
    g = view.graph
    seen = 0
    stack = [exp_op.operands[0]]
    while stack and seen < 200:
        v = peel(stack.pop())
        seen += 1
        op = v.owner
        if op is None:
            continue
        if op.name == "arith.select":
            for o in op.operands[1:]:
                if g.const(peel(o)) == -math.inf:
                    cm = peel(op.operands[0]).owner
                    return cm if cm is not None else op
        if op.name in ("arith.addf", "arith.subf", "arith.mulf"):
            stack.extend(op.operands)
    return exp_op


def check_masks(view: KernelView, exps: Exps, rep: StructuralFindings) -> None:
    """Softmax weights at positions >= kv_len must be exactly 0 where they are summed (the running sum, P @ V)."""
    name = kname(view)
    score_ops = {op for op, _ in exps.of("score")}
    if not score_ops:
        return
    g = view.graph
    feeds = {}
    for ev in view.trace.sums:
        if ev.op not in feeds:
            feeds[ev.op] = g.reaches(ev.operand, lambda o: o in score_ops)
        if not feeds[ev.op]:
            continue
        pos = (ev.value.tags & np.uint64(POS)) != 0
        garbage = (ev.value.tags & INV_MASK) != 0  # values read past kv_len: check_garbage reports them
        bad = pos & ~garbage & ~(ev.value.known() & (ev.value.c == 0))
        if bad.any():
            exp_op = next(iter(score_ops))
            rep.finding(
                "structural:kv-mask",
                "kv-mask",
                f"{name}: {int(bad.sum())} softmax weight(s) at positions >= kv_len are not 0 where they "
                f"are summed (program {ev.program}): the length mask is missing or off by one",
                _mask_op(view, exp_op),
                view,
            )


def check_garbage(cap, views: list, rep: StructuralFindings, out_name: str) -> None:
    """Garbage (data past kv_len, out of bounds, never written) that reaches the output."""
    names = list(cap.tensors)
    hits: dict = {}
    for view in views:
        for acc in view.accesses("store", out_name):
            tags = acc.value.tags[acc.mask & acc.inb] if hasattr(acc.value, "tags") else np.zeros(0, np.uint64)
            if not tags.size:
                continue
            inv = int(np.bitwise_or.reduce(tags))
            for t, tname in enumerate(names):
                if inv >> (32 + t) & 1:
                    hits.setdefault(tname, (view, acc))
    for tname, (view, acc) in hits.items():
        src = _first_bad_load(views, tname)
        sview, sop = src if src else (view, acc.op)
        if tname == "k_cache":
            rep.finding(
                "structural:kv-mask",
                "kv-mask",
                f"{kname(sview)}: keys past kv_len are loaded unmasked and reach the output",
                _length_test(sview, sop),
                sview,
            )
        elif tname == "v_cache":
            if rep.has("kv-mask"):
                continue  # the same length mask lets the values in: one finding is enough
            rep.finding(
                "structural:kv-mask-v",
                "unmasked-load",
                f"{kname(sview)}: values past kv_len are loaded unmasked; their weight is 0 but 0 * NaN "
                f"is NaN, so garbage reaches the output",
                sop,
                sview,
            )
        else:
            rep.finding(
                "structural:garbage",
                "unmasked-load",
                f"{kname(sview)}: elements of {tname} that are out of range or never written reach the output",
                sop,
                sview,
            )


def _length_test(view: KernelView, load_op: IROp) -> IROp:
    """The comparison in a load's mask that depends on data (the kv_len test), else the load."""
    if len(load_op.operands) < 2:
        return load_op
    g = view.graph
    stack, seen = [load_op.operands[1]], 0
    while stack and seen < 64:
        v = peel(stack.pop())
        seen += 1
        op = v.owner
        if op is None:
            continue
        if op.name == "arith.cmpi" and not g.static(v):
            return op
        if op.name in ("arith.andi", "arith.ori"):
            stack.extend(op.operands)
    return load_op


def _first_bad_load(views: list, tname: str):
    for view in views:
        for acc in view.accesses("load", tname):
            bad = (
                acc.mask & (((acc.value.tags if hasattr(acc.value, "tags") else 0) >> np.uint64(32)) != 0)
                if hasattr(acc.value, "tags")
                else None
            )
            if bad is not None and np.any(bad):
                return view, acc.op
    return None


# --------------------------------------------------------------------------- addressing (interpreter)


def check_addressing(cap, views: list, rep: StructuralFindings, model: AttentionModel) -> bool:
    """Each program's K/V reads belong to its own sequence and KV head and cover every position once.

    Returns True when a read of the wrong sequence or head was found (later findings would be echoes)."""
    B, Hq, Hkv, D = dims(cap)
    ratio = Hq // Hkv
    lens = model.lens
    qinfo = cap.tensors["q"]
    reads: dict = {}  # (b, h, tensor) -> {load op: [element offsets]}
    positions: dict = {}  # (b, h, tensor) -> set of positions
    wrong = False
    for view in views:
        progs: dict = {}
        for acc in view.trace.accesses:
            if acc.kind != "load":
                continue
            t = view.names[int(np.asarray(acc.tensor).reshape(-1)[0])]
            if t in ("q", "k_cache", "v_cache"):
                progs.setdefault(acc.program, []).append((t, acc))
        for pid, accs in progs.items():
            qrows = set()
            for t, acc in accs:
                if t == "q":
                    m = acc.mask & acc.inb
                    co = qinfo.coords(acc.elem[m])
                    qrows |= {(int(b), int(h)) for b, h in co[:, :2]}
            if not qrows:
                continue
            seqs = {b for b, _ in qrows}
            if len(seqs) != 1:
                rep.gap(
                    "KV addressing",
                    "structural:kv-addressing",
                    f"{kname(view)}: could not verify the KV addressing of a program that serves several sequences",
                    where=(view.launch.path, view.launch.line),
                )
                continue
            (b,) = seqs
            heads = sorted({h for _, h in qrows})
            wrong |= _check_index_rows(cap, view, pid, b, rep)
            for t, acc in accs:
                if t == "q":
                    continue
                info = cap.tensors[t]
                m = acc.mask & acc.inb
                if not m.any():
                    continue
                elem = acc.elem[m]
                # lanes that run past kv_len of the program's own (sequence, head) row and wrap into the next
                # row are a length-mask problem (checked elsewhere), not a wrong head or sequence
                elem = elem[~model.overrun(info, elem, b, heads[0] // ratio)]
                if not elem.size:
                    continue
                seq, gg, pos = model.decode(info, elem)
                read = {int(x) for x in gg}
                expect = {h // ratio for h in heads}
                if len(read) == 1:
                    (g_read,) = read
                    bad = [h for h in heads if h // ratio != g_read]
                    if bad:
                        wrong = True
                        rep.finding(
                            "structural:gqa-mapping",
                            "gqa-mapping",
                            f"{kname(view)}: query head(s) {bad[:4]} of sequence {b} read {t} head {g_read}; "
                            f"expected h // (Hq/Hkv) = h // {ratio} = {sorted({h // ratio for h in bad})[:4]}",
                            _head_index_op(view, acc.op),
                            view,
                        )
                elif read - expect:
                    wrong = True
                    rep.finding(
                        "structural:gqa-mapping",
                        "gqa-mapping",
                        f"{kname(view)}: query head(s) {heads[:4]} of sequence {b} read {t} head(s) "
                        f"{sorted(read - expect)[:4]}, expected {sorted(expect)}",
                        acc.op,
                        view,
                    )
                elif len(expect) > 1:
                    rep.gap(
                        "KV addressing",
                        "structural:kv-addressing",
                        f"{kname(view)}: could not verify which query head reads which KV "
                        f"head in a program that serves several KV heads",
                        acc.op,
                        view,
                    )
                other_seq = (seq != b) & (seq >= 0)
                if other_seq.any():
                    wrong = True
                    cls = "paged-index" if model.paged else "stride"
                    what = "blocks of sequence" if model.paged else "batch row"
                    rep.finding(
                        "structural:kv-sequence",
                        cls,
                        f"{kname(view)}: sequence {b} reads {t} {what} {sorted({int(x) for x in seq[other_seq]})[:4]}",
                        _address_op(acc.op),
                        view,
                    )
                if model.paged:
                    blk = info.coords(elem)[..., 0]
                    stray = (seq < 0) & ~np.isin(blk, list(model.tail))
                    if stray.any():
                        wrong = True
                        rep.finding(
                            "structural:kv-block",
                            "paged-index",
                            f"{kname(view)}: sequence {b} reads {t} block(s) "
                            f"{sorted({int(x) for x in blk[stray]})[:4]} that no block-table entry names",
                            _address_op(acc.op),
                            view,
                        )
                ok = (seq == b) & (pos >= 0) & (pos < lens[b])
                for h in heads:
                    sel = ok & (gg == h // ratio)
                    reads.setdefault((b, h, t), {}).setdefault(acc.op, []).extend(elem[sel].tolist())
                    positions.setdefault((b, h, t), set()).update(pos[sel].tolist())
    for (b, h, t), per_op in reads.items():
        # every element of the row read: lanes that read one twice are head-dim padding (`offs_d % D` with the
        # padding masked elsewhere), harmless
        complete = (
            np.unique(np.concatenate([np.asarray(e, dtype=np.int64) for e in per_op.values()])).size >= lens[b] * D
        )
        for op, elems in per_op.items():
            arr = np.array(elems, dtype=np.int64)
            if arr.size and np.unique(arr).size != arr.size and not complete:
                view = _view_of(views, op)
                wrong = True
                rep.finding(
                    "structural:kv-positions",
                    "paged-index" if model.paged else "stride",
                    f"{kname(view)}: sequence {b} head {h} reads some {t} elements more than once "
                    f"(and so misses others)",
                    _address_op(op),
                    view,
                )
        L = lens[b]
        missing = sorted(set(range(L)) - positions.get((b, h, t), set()))
        if missing and not wrong:
            op = next(iter(per_op))
            view = _view_of(views, op)
            tail = missing == list(range(L - len(missing), L))
            cls = "kv-mask" if tail else ("paged-index" if model.paged else "stride")
            rep.finding(
                "structural:kv-positions",
                cls,
                f"{kname(view)}: sequence {b} (kv_len {L}) never reads {t} position(s) "
                f"{missing[:4]}{'...' if len(missing) > 4 else ''}",
                op,
                view,
            )
    return wrong


def _address_op(load_op: IROp) -> IROp:
    """Where a load's address is computed: the offset's own line when it is not the load's line."""

    ptr = load_op.operands[0]
    here = line_of(load_op, None)
    stack, seen = [ptr], 0
    while stack and seen < 64:
        v = stack.pop()
        seen += 1
        op = v.owner
        if op is None:
            continue
        if op.name == "tt.addptr":
            off = op.operands[1].owner
            if (
                off is not None
                and off.name not in ("tt.splat", "tt.broadcast", "tt.expand_dims")
                and line_of(off, None) not in (None, here)
            ):
                return off
            stack.extend(op.operands)
        elif op.name in ("tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape"):
            stack.extend(op.operands)
    return load_op


def _head_index_op(view: KernelView, load_op: IROp) -> IROp:
    """The line that computes the KV head index of a K/V load: the division or remainder of a program id on
    its address path (else the load itself)."""

    pid_bits = PID[0] | PID[1] | PID[2]
    stack, seen = [load_op.operands[0]], set()
    while stack:
        v = stack.pop()
        if id(v) in seen or v.owner is None:
            continue
        seen.add(id(v))
        op = v.owner
        if (
            op.name in ("arith.divsi", "arith.divui", "arith.remsi", "arith.remui", "arith.floordivsi")
            and view.trace.int_tags.get(op.result, 0) & pid_bits
            and not view.trace.int_tags.get(op.result, 0) & ~np.uint64(pid_bits) & np.uint64(0xFFFFFF00)
        ):
            return op
        if op.name != "tt.load":
            stack.extend(op.operands)
    return load_op


def _check_index_rows(cap, view, pid, b: int, rep: StructuralFindings) -> bool:
    """A program serving sequence b reads kv_lens[b] and block_tables[b, :], nothing else."""
    wrong = False
    for acc in view.trace.accesses:
        if acc.kind != "load" or acc.program != pid:
            continue
        t = view.names[int(np.asarray(acc.tensor).reshape(-1)[0])]
        if t not in ("kv_lens", "block_tables"):
            continue
        m = acc.mask & acc.inb
        if not m.any():
            continue
        rows = cap.tensors[t].coords(acc.elem[m])[..., 0]
        if (rows != b).any():
            wrong = True
            what = "entry" if t == "kv_lens" else "row"
            rep.finding(
                "structural:index-rows",
                "stride",
                f"{kname(view)}: sequence {b} reads {t} {what} {sorted({int(r) for r in rows[rows != b]})[:4]} "
                f"(a wrong stride or index into {t})",
                acc.op,
                view,
            )
    return wrong


def _view_of(views, op):
    for v in views:
        if op in v.loads or op in v.stores:
            return v
    return views[0]


def check_output_coverage(cap, views: list, rep: StructuralFindings, out_name: str) -> None:
    info = cap.tensors[out_name]
    written = np.zeros(info.numel, dtype=bool)
    last = None
    for view in views:
        for acc in view.accesses("store", out_name):
            m = acc.mask & acc.inb
            e = acc.elem[m]
            written[np.clip(e, 0, info.numel - 1)] = True
            last = (view, acc.op)
    if last is None:
        rep.gap("output coverage", "structural:output", "could not verify the output: no kernel stores to it")
        return
    if not written.all():
        co = info.coords(np.flatnonzero(~written))
        view, op = last
        rep.finding(
            "structural:output-coverage",
            "unwritten-output",
            f"{kname(view)}: {int((~written).sum())} of {info.numel} output elements are never written "
            f"(first at index {tuple(int(x) for x in co[0])})",
            op,
            view,
        )
