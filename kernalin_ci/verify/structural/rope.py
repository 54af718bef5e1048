"""Structural checks for rope.

RoPE is linear in q and k for fixed positions, so the interpreter keeps every
output lane as an affine form over the loaded elements, with the cos/sin
coefficients computed exactly as the kernel computes them (angles are data-free:
positions are index data, frequencies come from constants or a table the entry
built). Each output element is then compared with the definition:

* out[i] = x[i] cos a - x[p] sin a (first of a pair) / x[i] cos a + x[p] sin a
  (second), with p the partner of the configured style (`rope-pairing`) and
  the signs of the definition (`rope-sign`);
* a = positions[t] * theta_j, the op's own rotation (docs/ops.md: base^(-2j/r), or
  its scaled table; with M-RoPE each frequency's position row): an angle that
  matches another position (a program id, the first token) is `rope-position`,
  any other mismatch is `rope-frequency`, and angles computed in float16/bfloat16
  are `precision` (with a scaled table or M-RoPE the angles are not compared, but
  the sign is judged against the true angle, never the plain table's);
* dims >= rotary_dim are x[i] itself (or left untouched in a tensor that
  already holds x) (`rope-passthrough`);
* each output element reads its own token and head of its own tensor (`stride`),
  and a cos/sin table is read at row positions[t] (`stride` for a wrong row pitch).
"""

from __future__ import annotations

import math

import numpy as np

from kernalin_ci.lazy import torch
from kernalin_ci.ops.rope import PARAMS, spec_of
from kernalin_ci.verify.structural.abstract_values import PID, FloatValue, src_bit
from kernalin_ci.verify.structural.common import LOW, Analysis, StructuralFindings, kname
from kernalin_ci.verify.structural.dataflow import KernelView, peel

TOL = 3e-3
# the check id of each kind of problem `flag` collects (its key up to the first "-")
CHECK_IDS = {
    "angle": "structural:rope-angle",
    "foreign": "structural:rope-foreign",
    "pairing": "structural:rope-pairing",
    "passthrough": "structural:rope-passthrough",
    "sign": "structural:rope-sign",
    "unwritten": "structural:rope-unwritten",
}


class RopeModel:
    linear = True
    host_tables = True  # a cos/sin table built by the entry is read with its values

    def __init__(self, cap):
        self.cap = cap

    def label(self, info, elem, mask, inb, interp):
        return None, None


# --------------------------------------------------------------------------- expected forms


def partner(i: np.ndarray, r: int, style: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(partner index, sign of the partner's sin coefficient, frequency index) for dims i < r."""
    half = r // 2
    if style == "neox":
        first = i < half
        p = np.where(first, i + half, i - half)
        j = np.where(first, i, i - half)
    else:
        first = i % 2 == 0
        p = np.where(first, i + 1, i - 1)
        j = i // 2
    return p, np.where(first, -1.0, 1.0), j


def _cos_sin_ops(view: KernelView):
    out = []
    for op in view.ops():
        sym = op.attrs.get("symbol", "") if op.name == "tt.extern_elementwise" else ""
        if op.name in ("math.cos", "math.sin") or any(k in sym for k in ("cos", "sin")):
            out.append(op)
    return out


def _low_precision_angle(view: KernelView):
    """The first float16/bfloat16 op on the way to a cos/sin."""
    for cs in _cos_sin_ops(view):
        stack, seen = [cs.operands[0]], set()
        while stack:
            v = stack.pop()
            if id(v) in seen or v.owner is None:
                continue
            seen.add(id(v))
            op = v.owner
            if (
                op.name.startswith(("arith.", "math."))
                and op.name not in ("arith.constant",)
                and op.result.type.elem in LOW
                and op.name not in ("arith.truncf",)
            ):
                return op
            if op.name == "arith.truncf" and op.result.type.elem in LOW:
                return op
            stack.extend(op.operands)
    return None


def _angle_op(view: KernelView, part: str = "angle"):
    """The op computing the angle (the cos operand), or its position / frequency factor, for locations."""

    ops = _cos_sin_ops(view)
    if not ops:
        return None
    angle = peel(ops[0].operands[0])
    op = angle.owner
    if part == "angle" or op is None or op.name != "arith.mulf":
        return op or ops[0]
    names = view.names
    pos_bits = (src_bit(names.index("positions")) if "positions" in names else 0) | PID[0] | PID[1] | PID[2]

    def tags(v):
        rv = view.trace.values.get(v)
        t = getattr(rv, "tags", None)
        return int(np.bitwise_or.reduce(np.asarray(t).reshape(-1))) if t is not None and np.asarray(t).size else 0

    a, b = op.operands
    pos_side = a if tags(a) & pos_bits else b
    other = b if pos_side is a else a
    pick = pos_side if part == "position" else other
    return peel(pick).owner or op


# --------------------------------------------------------------------------- gathering the stored forms


def stored_forms(views: list, tensor: str, names: list):
    """{element: (view, store op, {(atom tensor, atom element): coef}, const, linear)} for one output tensor."""
    out = {}
    for view in views:
        blocks = view.trace.blocks
        for acc in view.accesses("store", tensor):
            m = acc.mask & acc.inb
            if not m.any():
                continue
            val = acc.value
            if not isinstance(val, FloatValue):
                continue
            elems = acc.elem[m]
            lin = val.lin[m]
            const = val.c[m]
            per_lane = [dict() for _ in range(elems.size)]
            for bid, idx, coef in val.terms:
                bt, be, _ = blocks[bid]
                ii = idx[m]
                cf = coef[m]
                at = bt.reshape(-1)[ii]
                ae = be.reshape(-1)[ii]
                for k in np.flatnonzero(cf != 0):
                    key = (names[int(at[k])], int(ae[k]))
                    per_lane[k][key] = per_lane[k].get(key, 0.0) + float(cf[k])
            for k in range(elems.size):
                out[int(elems[k])] = (
                    view,
                    acc.op,
                    {a: c for a, c in per_lane[k].items() if c != 0.0},
                    float(const[k]),
                    bool(lin[k]),
                )
    return out


def _load_op_for(views, tensor_name):
    for view in views:
        for op, t in view.loads.items():
            if t == tensor_name:
                return view, op
    return None, None


# --------------------------------------------------------------------------- the checks


def analyze(cap, views: list, rep: StructuralFindings, model: RopeModel) -> None:
    params = cap.params
    style = params.get("style", "neox")
    base = float(params.get("base", 10000.0))
    names = list(cap.tensors)
    pos = cap.kwargs["positions"]
    positions = [int(x) for x in (pos if pos.dim() == 1 else pos[0]).tolist()]
    unanalysed = not_analysed(params)
    if unanalysed:
        rep.gap(
            "angles (positions, frequencies)",
            "structural:rope",
            f"not analysed for {unanalysed}: the angles are not compared with the definition "
            "(the pairing, signs, pass-through and addressing are)",
        )
    low = None
    for view in views:
        low = low or (_low_precision_angle(view), view)
        op = _low_precision_angle(view)
        if op is not None:
            rep.finding(
                "structural:rope-precision",
                "precision",
                f"{kname(view)}: the rotation angle is computed in {op.result.type.elem} "
                f"(positions up to {max(positions)} need float32)",
                op,
                view,
            )
    _low_precision_table(cap, views, rep)
    table_wrong = False if params.get("mrope_section") else _check_tables(cap, views, rep, positions)
    if table_wrong or rep.has("precision"):
        rep.gap(
            "angles (positions, frequencies)",
            "structural:rope",
            "the angles were not compared with the definition: the cos/sin table or the angle's precision is "
            "already wrong (a finding)",
        )
    for src in ("q", "k"):
        out_name = cap.outputs.get(src)
        if out_name is None:
            rep.gap(f"rotation values of {src}", "structural:rope", f"could not verify rope output {src}")
            continue
        _check_output(
            cap,
            views,
            rep,
            src,
            out_name,
            names,
            style,
            base,
            positions,
            skip_angles=table_wrong or rep.has("precision") or bool(unanalysed),
            section_positions=pos if pos.dim() == 2 else None,
        )


def not_analysed(params) -> str:
    """The rope features whose angles this analysis does not follow ('' for none)."""
    parts = []
    if (params.get("scaling") or "none") != "none":
        parts.append(f"scaled frequency tables (scaling={params['scaling']})")
    if params.get("mrope_section"):
        parts.append("M-RoPE sections")
    return " and ".join(parts)


def _low_precision_table(cap, views, rep) -> None:
    """A cos/sin table the entry built, held in float16/bfloat16 while q and k are float32: every entry is off
    by up to 2^-11 (2^-8) of itself, far above float32 rope's accuracy."""
    if cap.dtype != "float32":
        return
    for view in views:
        for acc in view.trace.accesses:
            if acc.kind != "load":
                continue
            info = cap.tensors[view.names[int(np.asarray(acc.tensor).reshape(-1)[0])]]
            if info.role == "scratch" and info.init == "data" and info.dtype in ("float16", "bfloat16"):
                rep.finding(
                    "structural:rope-precision",
                    "precision",
                    f"{kname(view)}: q and k are float32 but the table {list(info.shape)} they are rotated "
                    f"with is held in {info.dtype}",
                    acc.op,
                    view,
                )
                return


def _check_tables(cap, views, rep, positions) -> bool:
    """A table the entry built (cos/sin cache, inverse frequencies) read at row positions[t] by token t."""
    wrong = False
    for view in views:
        token_of = {}
        for acc in view.trace.accesses:
            if acc.kind != "load":
                continue
            t = view.names[int(np.asarray(acc.tensor).reshape(-1)[0])]
            if t in ("q", "k", "positions"):
                m = acc.mask & acc.inb
                if m.any():
                    co = cap.tensors[t].coords(acc.elem[m])
                    token_of.setdefault(acc.program, set()).update(int(x) for x in co[..., 0].reshape(-1))
        for acc in view.trace.accesses:
            if acc.kind != "load":
                continue
            t = view.names[int(np.asarray(acc.tensor).reshape(-1)[0])]
            info = cap.tensors[t]
            if info.role != "scratch" or info.init != "data" or len(info.shape) != 2:
                continue
            if info.shape[0] < max(positions) + 1:
                continue  # not indexed by position (an inverse-frequency vector, for example)
            toks = token_of.get(acc.program, set())
            if len(toks) != 1:
                continue
            (tok,) = toks
            m = acc.mask & acc.inb
            if not m.any():
                continue
            rows = info.coords(acc.elem[m])[..., 0]
            want = positions[tok]
            if (rows != want).any() and not wrong:
                wrong = True
                got = sorted({int(r) for r in rows.reshape(-1)})[:3]
                if set(got) == {tok} and tok != want:
                    rep.finding(
                        "structural:rope-position",
                        "rope-position",
                        f"{kname(view)}: token {tok} reads table row {tok} (its index), not its position {want}",
                        acc.op,
                        view,
                    )
                else:
                    rep.finding(
                        "structural:rope-table",
                        "stride",
                        f"{kname(view)}: token {tok} at position {want} reads table row(s) {got} of "
                        f"{t} {list(info.shape)} (a wrong row stride or index)",
                        acc.op,
                        view,
                    )
    return wrong


def _check_output(
    cap, views, rep, src, out_name, names, style, base, positions, skip_angles, section_positions=None
) -> None:
    oinfo = cap.tensors[out_name]
    shape = tuple(oinfo.shape)
    lead = len(shape) - 3  # an output allocated with leading unit dims ([1, T, H, D]) and returned as [T, H, D]
    if lead < 0 or any(n != 1 for n in shape[:lead]):
        rep.gap(
            f"rotation values of {src}", "structural:rope", f"rope output {src} is shaped {list(shape)}, not [T, H, D]"
        )
        return
    forms = stored_forms(views, out_name, names)
    rows = {oinfo.coord(e)[lead:]: forms.get(e) for e in range(oinfo.numel)}
    in_place = out_name == src or oinfo.init == f"copy:{src}"
    check_rotation(
        cap,
        views,
        rep,
        src,
        rows,
        shape[lead:],
        in_place,
        style,
        base,
        positions,
        skip_angles,
        section_positions=section_positions,
    )


def check_rotation(
    cap,
    views,
    rep,
    src,
    rows: dict,
    shape: tuple,
    in_place: bool,
    style: str,
    base: float,
    positions: list,
    skip_angles: bool,
    unwritten: str = "unwritten-output",
    section_positions=None,
) -> None:
    """Judge the stored form of every element (t, h, i) of the rotated `src` (`rows`: (t, h, i) -> the form
    `stored_forms` gives, or None where nothing was stored) against the definition. `unwritten`: the class
    of a rotated element never stored. `section_positions`: M-RoPE's [S, T] positions (`positions` is then
    their first row)."""
    T, H, D = shape
    theta, angle = expected_angles(cap.params, style, base, D, positions, section_positions)
    r = 2 * theta.size
    src_info = cap.tensors[src]
    problems: dict = {}  # (key, bug class) -> first message, view, op and a count; CHECK_IDS names the key

    def flag(key, cls, msg, view, op):
        problems.setdefault((key, cls), (msg, view, op, 0))
        m, v, o, n = problems[(key, cls)]
        problems[(key, cls)] = (m, v, o, n + 1)

    opaque = 0
    angles: dict = {}  # token -> [(dim, frequency index, angle found, view)]
    for (t, h, i), form in rows.items():
        if form is None:
            if i >= r and in_place:
                continue
            if i >= r:
                flag(
                    "passthrough-unwritten",
                    "rope-passthrough",
                    f"dims {r}..{D - 1} of {src} (past rotary_dim {r}) are never written to the output, which "
                    f"does not already hold {src}",
                    None,
                    None,
                )
            else:
                flag("unwritten", unwritten, f"rotated dims of {src} are never written", None, None)
            continue
        view, sop, atoms, const, lin = form
        if not lin:
            opaque += 1
            continue
        # wrong tensor / token / head
        foreign = [a for a in atoms if a[0] != src or not _same_row(src_info, a[1], t, h)]
        if foreign:
            a = foreign[0]
            co = cap.tensors[a[0]].coord(a[1]) if a[0] in cap.tensors else ()
            bview, bop = _block_op(views, a)
            flag(
                "foreign",
                "stride",
                f"{src}_out[{t}, {h}, {i}] is computed from {a[0]}{list(int(x) for x in co)} instead of "
                f"{src}[{t}, {h}, ...]: wrong tensor, token or head (stride)",
                bview or view,
                bop or sop,
            )
            continue
        dims = {cap.tensors[a[0]].coord(a[1])[2]: c for a, c in atoms.items()}
        if i >= r:
            if not (len(dims) == 1 and i in dims and abs(dims[i] - 1.0) < TOL and abs(const) < TOL):
                flag(
                    "passthrough",
                    "rope-passthrough",
                    f"{src} dim {i} (past rotary_dim {r}) is not passed through unchanged",
                    view,
                    _value_op(sop),
                )
            continue
        p, s, j = partner(np.array(i), r, style)
        p, s, j = int(p), float(s), int(j)
        others = [d for d in dims if d not in (i, p)]
        if others or i not in dims:
            got = sorted(int(d) for d in dims if d != i)
            if r < D and got == [int(partner(np.array(i), D, style)[0])]:
                flag(
                    "passthrough-whole",
                    "rope-passthrough",
                    f"{src} dim {i} is paired with dim {got[0]} as if rotary_dim were the head dim {D}: "
                    f"rotary_dim {r} is ignored",
                    view,
                    _partner_load(views, atoms, src, i) or sop,
                )
                continue
            flag(
                "pairing",
                "rope-pairing",
                f"{src} dim {i} is rotated with dim(s) {got}, but {style} pairs it with dim {p}",
                view,
                _partner_load(views, atoms, src, i) or sop,
            )
            continue
        a = float(angle[t, j])
        cs, cp = dims.get(i, 0.0), dims.get(p, 0.0)
        want_c, want_p = math.cos(a), s * math.sin(a)
        if abs(cs - want_c) < TOL and abs(cp - want_p) < TOL:
            continue
        if abs(cs - want_c) < TOL and abs(cp + want_p) < TOL:
            flag(
                "sign",
                "rope-sign",
                f"{src} dim {i}: the sin term has the wrong sign ({'+' if cp > 0 else '-'}x[{p}] sin a)",
                view,
                _value_op(sop),
            )
            continue
        if skip_angles:
            continue
        angles.setdefault(t, []).append((i, j, math.atan2(cp * s, cs), view))
    for t, lanes in angles.items():
        cls, why = _explain_angles(lanes, positions, t, theta, r)
        flag("angle-" + cls, cls, f"{src}[{t}]: {why}", lanes[0][3], None)
    if opaque:
        rep.gap(
            f"rotation values of {src}",
            "structural:rope-values",
            f"could not verify {opaque} element(s) of {src}'s output: their value is not "
            f"a linear form of the input the analysis can follow",
        )
    for (key, cls), (msg, view, op, n) in problems.items():
        if view is None:
            view = views[0]
        if op is None and key.startswith("angle"):
            op = (
                _angle_op(view, "position" if cls == "rope-position" else "frequency")
                or _load_op_for(views, "positions")[1]
            )
        where = None if op is not None else (view.launch.path, view.launch.line)
        unit = "token(s)" if key.startswith("angle") else "element(s)"
        rep.finding(CHECK_IDS[key.split("-")[0]], cls, f"{kname(view)}: {msg} ({n} {unit})", op, view, where=where)


def expected_angles(params, style: str, base: float, D: int, positions, section_positions=None):
    """(theta [r/2], angle [T, r/2]) of the op's rotation at head dim D (ops/rope.py's spec: the scaled table,
    M-RoPE's row per frequency from `section_positions` [S, T]), as float64 numpy arrays."""
    full = {p.name: p.default for p in PARAMS} | dict(params) | {"style": style, "base": base}
    spec = spec_of(full, D)
    pos = section_positions if section_positions is not None else torch.tensor(positions, dtype=torch.int64)
    return spec.theta.numpy(), spec.angles(pos).numpy()


def _same_row(info, elem: int, t: int, h: int) -> bool:
    co = info.coord(elem)
    return co[0] == t and co[1] == h


def _value_op(store_op):
    v = peel(store_op.operands[1])
    return v.owner or store_op


def _block_op(views, atom):
    for view in views:
        for acc in view.trace.accesses:
            if acc.kind == "load" and view.names[int(np.asarray(acc.tensor).reshape(-1)[0])] == atom[0]:
                if (acc.elem == atom[1]).any():
                    return view, acc.op
    return None, None


def _partner_load(views, atoms, src, i):
    """The load that brings the partner element(s) of dim i (for locations)."""
    for a in atoms:
        if a[0] == src and cap_dim(views, a) != i:
            view, op = _block_op(views, a)
            if op is not None:
                return op
    return None


def cap_dim(views, atom) -> int:
    return views[0].capture.tensors[atom[0]].coord(atom[1])[-1]


def _explain_angles(lanes, positions, t, theta, r) -> tuple[str, str]:
    """rope-position when every wrong angle of token t is some other position's, rope-frequency otherwise."""

    def same(a, b):
        d = (a - b + math.pi) % (2 * math.pi) - math.pi
        return abs(d) < 5e-3

    cands = [(t, "the token index"), (0, "position 0")] + [
        (p, f"the position of token {k}") for k, p in enumerate(positions) if k != t
    ]
    for cand, what in cands:
        if cand != positions[t] and all(same(got, cand * theta[j]) for _, j, got, _ in lanes):
            return "rope-position", f"the angle is {what} ({cand}) times theta, not position {positions[t]}"
    i, j, got, _ = lanes[0]
    want = positions[t] * theta[j]
    return "rope-frequency", (
        f"dim {i}: the angle is {got:.5f} (mod 2 pi) but position {positions[t]} * "
        f"theta_{j} (base^(-2*{j}/{r}) with its scaling) = {(want + math.pi) % (2 * math.pi) - math.pi:.5f}"
    )


ANALYSIS = Analysis(
    RopeModel,
    analyze,
    properties=(
        "rotation values of q",
        "rotation values of k",
        "angles (positions, frequencies)",
        "passthrough",
        "addressing",
        "output coverage",
    ),
)
