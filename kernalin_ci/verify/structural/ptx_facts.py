"""The PTX engine's launch facts from a structural capture (parent side: plain data in, plain data out).

The capture records one call at concrete sizes; the worker also records a *twin* call whose batch and
cache sizes differ (`TWINS`: a third sequence or more tokens, a larger cache) while head count, head dim
and dtype stay, so the kernels compile the same. A tensor dimension that differs between the two calls is
a shape symbol (B, T, S, NB, W); every other size is a constant of the compiled kernel. Each integer
launch argument and grid size is then an expression over the symbols that gives its value in both calls
(a stride `Hkv * S * D`, a grid `B`), or a constant when both calls passed the same value; one that no
expression explains makes the facts fail (the kernel is then not analysed by the PTX engine).
"""

from __future__ import annotations

import math
from dataclasses import replace

from kernalin_ci.ops.base import Op
from kernalin_ci.ptx.context import Contract
from kernalin_ci.ptx.facts import Expr, LaunchFacts, ParamFacts, ShapeSymbol, TensorFacts
from kernalin_ci.verify.structural import trig_tables

MAX_POSITION = 131072
INDEX = ("kv_lens", "block_tables", "slot_mapping", "positions")
HOST_FILLED = ("data", "copy:", "gather:")  # a scratch tensor's initial content the host put there (capture.py)
# (tensor, dim) -> the symbol's usual name, where an op's contract names it (an op may name some otherwise:
# Op.shape_symbols)
SYMBOLS = {
    ("q", 0): "B",
    ("key", 0): "T",
    ("k", 0): "B",
    ("positions", 0): "B",
    ("slot_mapping", 0): "T",
    ("kv_lens", 0): "B",
    ("block_tables", 0): "B",
    ("block_tables", 1): "W",
    ("k_cache", 0): "NB",
    ("v_cache", 0): "NB",
}
RANGES = {"B": (1, 4096), "T": (1, 65536), "NB": (1, 1 << 21)}


class FactsError(Exception):
    """The capture does not give this kernel's launch facts (one line: why)."""


def _symbol_name(op: Op, tensor: str, dim: int) -> str:
    return op.shape_symbols.get((tensor, dim)) or SYMBOLS.get((tensor, dim), f"{tensor}.shape[{dim}]")


def _strides(shape: tuple[Expr, ...], captured: tuple[int, ...], strides: tuple[int, ...]) -> tuple[Expr, ...] | None:
    """Symbolic strides when the tensor is a (permuted) contiguous layout of its shape, else None."""
    order = sorted(range(len(strides)), key=lambda d: (-strides[d], -d))
    out: list[Expr] = [Expr.of(0)] * len(strides)
    acc, acc_v = Expr.of(1), 1
    for d in reversed(order):
        if strides[d] != acc_v and captured[d] != 1:
            return None
        out[d] = acc
        acc, acc_v = acc * shape[d], acc_v * captured[d]
    return tuple(out)


def build(op: Op, op_params: dict, cap, launch, twin: dict | None, n_params: int, max_position: int | None):
    """(LaunchFacts, Contract) of one captured launch. When the twin call does not explain a launch
    argument or the grid (an entry passing a size computed its own way), the facts are those of the
    capture call alone: every size a constant, the domain saying so."""
    try:
        return _build(op, op_params, cap, launch, twin, n_params, max_position)
    except FactsError as e:
        if twin is None:
            raise
        facts, contract = _build(op, op_params, cap, launch, None, n_params, max_position)
        facts.note = f"at the capture call's sizes only ({e})"
        return facts, contract


def _build(op: Op, op_params: dict, cap, launch, twin: dict | None, n_params: int, max_position: int | None):
    max_pos = int(max_position or op_params.get("max_position") or MAX_POSITION)
    bs = int(op_params.get("block_size") or 16)
    twin_t = (twin or {}).get("tensors", {})
    pairs: dict[tuple[int, int], str] = {}
    values1: dict[str, int] = {}
    values2: dict[str, int] = {}
    tensors: dict[str, TensorFacts] = {}
    for name, info in cap.tensors.items():
        other = twin_t.get(name)
        shape: list[Expr] = []
        for d, n in enumerate(info.shape):
            m = other[0][d] if other and len(other[0]) == len(info.shape) else n
            if m == n:
                shape.append(Expr.of(int(n)))
                continue
            sym = pairs.setdefault((int(n), int(m)), _symbol_name(op, name, d))
            values1[sym], values2[sym] = int(n), int(m)
            shape.append(Expr.of(sym))
        strides = _strides(tuple(shape), info.shape, info.strides)
        if strides is None:
            if other and tuple(other[1]) != tuple(info.strides):
                raise FactsError(f"tensor {name}: its strides do not follow its shape")
            strides = tuple(Expr.of(int(s)) for s in info.strides)
        initial = 0 if info.init == "zeros" else None  # a counter the entry zeroed (a work queue)
        tensors[name] = TensorFacts(
            name, info.dtype, info.elsize, tuple(shape), strides, role=info.role, initial=initial
        )
    symbols = {}
    for s, v in values1.items():
        lo, hi = RANGES.get(s, (1, 1 << 16))
        if s == "S":
            hi = max_pos
        elif s == "W":
            hi = -(-max_pos // bs)
        symbols[s] = ShapeSymbol(s, lo, hi, v)
    _index_ranges(op, tensors, bs, max_pos)
    for name in host_filled(cap):  # its integers (a batch id per program) are symbols, unbounded: a counter-
        if tensors[name].dtype.startswith(("int", "uint")):  # example through them names them (ptx_run.py)
            tensors[name] = replace(tensors[name], index=True)
    if op.rotates:  # cos and sin tables the entry filled, recognised on the capture's data
        for name, trig in trig_tables.identify(op_params, cap).items():
            tensors[name] = replace(tensors[name], trig=trig)
    if op.appends:  # the contract of an op that appends: slot offsets in 64-bit (offset-overflow)
        for name in ("k_cache", "v_cache"):
            if name in tensors:
                tensors[name] = replace(tensors[name], max_elements=1 << 36)
    candidates = _candidates(tensors)
    args = [a for a in launch.args if launch.signature.get(a.name) not in ("constexpr", None)]
    twin_args = _twin_launch(twin, launch)
    params: list[ParamFacts] = []
    for a in args:
        if a.kind == "pointer":
            params.append(ParamFacts("pointer", a.tensor, Expr.of(int(a.byte_offset)), name=a.name))
        elif a.kind in ("int", "bool"):
            v1 = int(a.value)
            v2 = twin_args.get(a.name, v1) if twin_args is not None else v1
            params.append(ParamFacts("int", value=_explain(a.name, v1, v2, candidates, values1, values2), name=a.name))
        elif a.kind == "float":
            params.append(ParamFacts("float", value=float(a.value), name=a.name))
        else:
            params.append(ParamFacts("unknown", name=a.name))
    while len(params) < n_params:
        params.append(ParamFacts("unknown"))
    grid2 = twin_args.get("__grid") if twin_args is not None else None
    grid = tuple(
        _explain("the grid", int(g), int(grid2[i]) if grid2 else int(g), candidates, values1, values2, grid=True)
        if i or not launch.device_query
        else Expr.of("G")
        for i, g in enumerate(launch.grid)
    )
    if launch.device_query:  # sized from the device's answer (capture.DEVICE): proved for every grid
        symbols["G"] = ShapeSymbol("G", 1, (1 << 31) - 1, int(launch.grid[0]))
    # A cache capacity (S, W) multiplies the batch index in the kernel's offsets: kept symbolic it makes
    # every query non-linear. It is held at the domain's largest value, so that kv_len still takes every
    # value up to max_position; the domain says so.
    pinned = {s: symbols[s].hi for s in ("S", "W") if s in symbols}
    if pinned:
        tensors = {
            n: replace(
                t,
                shape=tuple(e.pin(pinned) for e in t.shape),
                strides=tuple(e.pin(pinned) for e in t.strides),
                value_range=tuple(e.pin(pinned) for e in t.value_range) if t.value_range else None,
            )
            for n, t in tensors.items()
        }
        params = [replace(p, value=p.value.pin(pinned)) if isinstance(p.value, Expr) else p for p in params]
        grid = tuple(g.pin(pinned) for g in grid)
        symbols = {n: (replace(s, lo=s.hi) if n in pinned else s) for n, s in symbols.items()}
    block = tuple(launch.block)
    if block and block[1:] != (1, 1):  # the executor enumerates the lanes of tid.x only
        raise FactsError(f"a block of {block[0]}x{block[1]}x{block[2]} threads (only tid.x is followed)")
    threads = block[0] if block else 0  # Triton's PTX declares its own (.reqntid)
    facts = LaunchFacts(
        launch.kernel, params, grid, tensors, symbols, distinct=("slot_mapping",), block_threads=threads
    )
    contract = Contract(op.name, block_size=bs, slots="slot_mapping" if "slot_mapping" in tensors else "")
    if op.cache_copies:
        contract.caches = dict(op.cache_copies)
    if op.attends and "q" in cap.tensors:
        hq = cap.tensors["q"].shape[1]
        hkv = cap.tensors["k_cache"].shape[2 if op.paged_cache else 1]
        contract.query, contract.kcache, contract.vcache, contract.lens = "q", "k_cache", "v_cache", "kv_lens"
        contract.table = "block_tables" if "block_tables" in tensors else ""
        contract.group = max(hq // max(hkv, 1), 1)
        contract.output = cap.outputs.get("out", "")
        scale = cap.kwargs.get("scale")
        contract.scale = float(scale) if isinstance(scale, (int, float)) else 0.0
    if op.attends and op.appends and op.rotates and {"k", "v", "positions"} <= set(tensors):  # a decode step
        contract.new_key, contract.new_value, contract.positions = "k", "v", "positions"
    rotations = {cap.outputs[x]: x for x in ("q", "k") if x in cap.outputs and x in tensors}
    if op.rotates and rotations:  # rope hands the rotated q and k back; a decode step keeps them inside
        contract.rotations = rotations
        contract.rotary_dim = int(op_params.get("rotary_dim") or cap.tensors["q"].shape[-1])
        contract.style = str(op_params.get("style") or "neox")
        contract.positions = "positions" if "positions" in tensors else ""
        contract.base = float(op_params.get("base") or 10000.0)
        if str(op_params.get("scaling") or "none") != "none":
            contract.angle_skip = f"{op_params['scaling']}-scaled frequencies"
        elif op_params.get("mrope_section") or op_params.get("sections"):
            contract.angle_skip = "M-RoPE sections"
    return facts, contract


def host_filled(cap) -> set[str]:
    """The scratch tensors whose content the entry made on the host (a copy or gather of its inputs, a
    host-built index): nothing relates their sizes or elements to the op's inputs."""
    return {n for n, i in cap.tensors.items() if i.role == "scratch" and i.init.startswith(HOST_FILLED)}


def _index_ranges(op: Op, tensors: dict[str, TensorFacts], bs: int, max_pos: int) -> None:
    cache = tensors.get("k_cache")
    for name in INDEX:
        t = tensors.get(name)
        if t is None:
            continue
        lo, hi, neg = Expr.of(0), None, False
        if name == "kv_lens":
            lo = Expr.of(1)
            if not op.paged_cache and cache is not None:  # a contiguous cache: its capacity S
                hi = cache.shape[2]
            elif "block_tables" in tensors:
                hi = tensors["block_tables"].shape[1] * bs
        elif name == "block_tables" and cache is not None:
            hi = cache.shape[0] + (-1)
        elif name == "slot_mapping" and cache is not None:
            hi = cache.shape[0] * bs + (-1)
            neg = op.padding_slots
        elif name == "positions":
            hi = Expr.of(max_pos - 1)
            if "block_tables" in tensors:  # the new token's position in a paged cache (decode_step)
                hi = tensors["block_tables"].shape[1] * bs + (-1)
        tensors[name] = replace(t, index=True, value_range=(lo, hi) if hi is not None else None, allow_negative_one=neg)


def _candidates(tensors: dict[str, TensorFacts]) -> list[Expr]:
    out: list[Expr] = []
    for t in tensors.values():
        for e in (*t.shape, *t.strides):
            if e.constant is None and e not in out:
                out.append(e)
    return out


def _explain(what: str, v1: int, v2: int, cands: list[Expr], s1: dict, s2: dict, grid: bool = False) -> Expr:
    if v1 == v2:
        return Expr.of(v1)
    for e in cands:
        if e.at(s1) == v1 and e.at(s2) == v2:
            return e
    if grid:
        for e in cands:
            for c in (2, 4, 8, 16, 32, 64, 128):
                if math.ceil(e.at(s1) / c) == v1 and math.ceil(e.at(s2) / c) == v2:
                    raise FactsError(f"{what}: a grid of cdiv({e}, {c}) programs is not followed yet")
    raise FactsError(f"launch argument {what} ({v1}, then {v2} in the twin call) is no size of the tensors")


def _twin_launch(twin: dict | None, launch) -> dict | None:
    if not twin:
        return None
    launches = twin.get("launches", [])
    if launch.index >= len(launches):
        return None
    t = launches[launch.index]
    if t.get("kernel") != launch.kernel:
        return None
    return dict(t.get("args", {})) | {"__grid": list(t.get("grid", []))}
