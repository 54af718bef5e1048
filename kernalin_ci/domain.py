"""The shape domain: the head dims, heads, dtypes and block sizes (and the max position) a kernel is
checked at (docs/verification.md, "Shape domain").

A user declares what their model uses (`domain:` in .kernalin.yml, `--domain` on the command line;
the older pins `--param head_dim=128` etc. declare one value). Every dynamic case and the
structural capture then stay inside it, and an entry that raises at a declared shape is a finding.
Axes left undeclared are discovered: the case plan runs as usual, plus one small case at each of
the usual head dims, and a shape the kernel refuses (it raises at a cheap probe launch of that
shape) is reported as "unsupported, not checked" with the kernel's own error, never as a finding.

Plain data: a `Domain` is JSON-serialisable and travels to the worker in the job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from kernalin_ci.errors import UsageError
from kernalin_ci.findings import Coverage
from kernalin_ci.ops.base import DTYPES, Case

# the axes a case's shape is made of (op.domain_axes names the ones an op has), and the case dim of each
AXES = ("head_dim", "num_q_heads", "num_kv_heads", "dtype", "block_size")
DIM_OF = {"head_dim": "D", "num_q_heads": "Hq", "num_kv_heads": "Hkv", "block_size": "block_size"}
# the values tried when an axis is undeclared: small cases at the head dims, substitutes for the rest
USUAL = {
    "head_dim": (64, 80, 96, 128, 256),
    "num_q_heads": (8, 4, 16, 32),
    "num_kv_heads": (2, 1, 4, 8),
    "dtype": DTYPES,
    "block_size": (16, 32, 64, 128, 8),
}
SHAPE_TAG = "shape:"  # a small case that checks one value of one axis: never moved off that value


class DomainError(ValueError):
    """A bad domain value; `key` names the offending key (config.py adds file and line)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Domain:
    """Declared values per axis; an empty tuple means undeclared (discovered)."""

    head_dim: tuple[int, ...] = ()
    num_q_heads: tuple[int, ...] = ()
    num_kv_heads: tuple[int, ...] = ()
    dtype: tuple[str, ...] = ()
    block_size: tuple[int, ...] = ()
    max_position: int | None = None

    def values(self, axis: str) -> tuple:
        return getattr(self, axis)

    def declares(self, axes: tuple[str, ...], shape: dict) -> bool:
        """Every axis of the op declared and the shape inside it: an error there is a finding."""
        return all(self.values(a) and shape.get(a) in self.values(a) for a in axes)

    def to_json(self) -> dict:
        return {
            f.name: (list(v) if isinstance(v, tuple) else v)
            for f in fields(self)
            if (v := getattr(self, f.name)) not in ((), None)
        }

    @classmethod
    def from_json(cls, d: dict | None) -> Domain:
        d = d or {}
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})

    def summary(self) -> str:
        parts = [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in self.to_json().items()]
        return " ".join(parts) or "undeclared"


# ------------------------------------------------------------------------------------------ declaring


def keys_for(op) -> tuple[str, ...]:
    """The domain keys an op accepts: its axes, and max_position where the op has that param."""
    return tuple(op.domain_axes) + (("max_position",) if any(p.name == "max_position" for p in op.params) else ())


def parse(raw: dict, op) -> Domain:
    """A `domain:` mapping (or --domain values) -> Domain. Values: one or a list; DomainError if bad."""
    if not isinstance(raw, dict):
        raise DomainError("", "expected a mapping of axis: value or [values]")
    allowed = keys_for(op)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in allowed:
            raise DomainError(key, f"unknown key for op {op.name} (allowed: {', '.join(allowed) or 'none'})")
        if key == "max_position":
            out[key] = _positive_int(key, value)
            continue
        items = value if isinstance(value, list) else [value]
        if not items:
            raise DomainError(key, "expected a value or a non-empty list")
        if key == "dtype":
            bad = [v for v in items if v not in DTYPES]
            if bad:
                raise DomainError(key, f"{bad[0]!r} is not one of {', '.join(DTYPES)}")
            out[key] = tuple(dict.fromkeys(items))
        else:
            out[key] = tuple(dict.fromkeys(_positive_int(key, v) for v in items))
    dom = Domain(**out)
    _check_heads(dom)
    return dom


def _positive_int(key: str, v) -> int:
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise DomainError(key, f"{v!r} is not a positive integer")
    return v


def _check_heads(dom: Domain) -> None:
    for hq in dom.num_q_heads:
        if dom.num_kv_heads and not any(hq % k == 0 for k in dom.num_kv_heads):
            raise DomainError(
                "num_q_heads", f"{hq} is not a multiple of any num_kv_heads ({', '.join(map(str, dom.num_kv_heads))})"
            )


def parse_cli(items: list[str] | None) -> dict:
    """--domain KEY=V[,V...] (repeatable) -> the raw mapping `parse` takes."""
    raw: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise UsageError(f"domain {item!r}: expected KEY=VALUE[,VALUE...]", setting="domain")
        vals = [v.strip() for v in value.split(",")]
        raw[key.strip()] = vals if len(vals) > 1 or key.strip() not in ("max_position",) else vals[0]
    return raw


def resolve(op, raw_params: dict, raw_domain: dict | None, where: str = "domain") -> tuple[Domain, dict]:
    """The declared domain and the params the case plan uses. The op's pins (head_dim=128 ...) declare
    one value; a pin that contradicts the domain is an error."""
    try:
        dom = parse(raw_domain or {}, op)
    except DomainError as e:
        raise UsageError(f"{where}{' ' + e.key if e.key else ''}: {e}", setting=where or None) from None
    declared = {}
    known = {p.name for p in op.params}
    for axis in AXES + ("max_position",):
        if axis not in raw_params or axis not in known or raw_params[axis] is None:
            continue
        pin = raw_params[axis]
        try:
            pin = _positive_int(axis, pin)
        except DomainError:
            continue  # resolve_params reports it
        have = dom.values(axis) if axis != "max_position" else dom.max_position
        if have and (pin not in have if isinstance(have, tuple) else pin != have):
            shown = ", ".join(map(str, have)) if isinstance(have, tuple) else have
            raise UsageError(
                f"{where} {axis}: param {axis}={pin} is outside the declared domain ({shown})", setting=where or None
            )
        if not have:
            declared[axis] = (pin,) if axis != "max_position" else pin
    dom = replace(dom, **declared)
    params = dict(raw_params)
    if dom.block_size and "block_size" in known:
        params["block_size"] = dom.block_size[0]
    if dom.max_position and "max_position" in known:
        params["max_position"] = dom.max_position
    for axis in ("head_dim", "num_q_heads", "num_kv_heads"):  # one declared value pins the plan
        if axis in known and len(dom.values(axis)) == 1:
            params[axis] = dom.values(axis)[0]
    return dom, params


def one_shape(op, raw_params: dict, raw_domain: dict | None) -> tuple[dict, str | None]:
    """For checks that run one shape (the decode pipeline): the params with the first declared value of
    each axis pinned, and the first declared dtype (None: undeclared)."""
    dom, params = resolve(op, raw_params, raw_domain)
    known = {p.name for p in op.params}
    for axis in ("head_dim", "num_q_heads", "num_kv_heads", "block_size"):
        if axis in known and dom.values(axis):
            params[axis] = dom.values(axis)[0]
    return params, (dom.dtype[0] if dom.dtype else None)


# ------------------------------------------------------------------------------------------ shapes


def shape_of(op, case: Case, params: dict) -> dict:
    """The case's value on each of the op's axes."""
    out = {}
    for axis in op.domain_axes:
        if axis == "dtype":
            out[axis] = case.dtype
        elif axis == "block_size":
            out[axis] = case.dims.get("block_size", params.get("block_size"))
        else:
            out[axis] = case.dims.get(DIM_OF[axis])
    return out


def shape_text(shape: dict) -> str:
    names = {"head_dim": "D", "num_q_heads": "Hq", "num_kv_heads": "Hkv", "block_size": "block_size"}
    return " ".join(str(v) if a == "dtype" else f"{names[a]}={v}" for a, v in shape.items() if v is not None)


def key(shape: dict) -> str:
    return shape_text(shape)


def with_shape(case: Case, shape: dict, params: dict, name: str | None = None, tags: tuple = ()) -> Case:
    """The case moved to another shape: the same lengths, positions and seed, other D/heads/dtype/
    block size. The softmax scale follows D; a buffer sized past 2^31 elements stays past it."""
    dims = dict(case.dims)
    old_elems = _block_elems(dims, params)
    for axis, v in shape.items():
        if axis == "dtype":
            continue
        if axis == "head_dim" and "scale" in dims and dims.get("D"):
            dims["scale"] = dims["scale"] * math.sqrt(dims["D"] / v)
        if axis == "block_size" and v == params.get("block_size"):
            dims.pop("block_size", None)
            continue
        dims[DIM_OF[axis]] = v
    if "huge" in case.tags and "num_blocks" in dims:
        dims["num_blocks"] = -(-dims["num_blocks"] * old_elems // _block_elems(dims, params))
    return Case(name or case.name, dims, shape.get("dtype", case.dtype), case.seed, tuple(case.tags) + tags)


def _block_elems(dims: dict, params: dict) -> int:
    return (dims.get("block_size") or params.get("block_size") or 1) * dims.get("Hkv", 1) * dims.get("D", 1)


def case_params(params: dict, case: Case) -> dict:
    """The op params one case runs with (a case may carry its own block size)."""
    if "block_size" in case.dims:
        return {**params, "block_size": case.dims["block_size"]}
    return params


def _nearest(v: int, choices: tuple) -> int:
    return min(choices, key=lambda c: (abs(math.log(c / v)), -c))


def fit(op, case: Case, params: dict, dom: Domain, main_dtype: str) -> Case | None:
    """A planned case moved inside the declared domain (None: drop it, a dtype sweep case of an
    undeclared dtype). Undeclared axes keep the plan's value."""
    shape = shape_of(op, case, params)
    new = dict(shape)
    if dom.dtype and "dtype" in shape and shape["dtype"] not in dom.dtype:
        if shape["dtype"] != main_dtype:
            return None
        new["dtype"] = dom.dtype[0]
    if dom.head_dim and shape.get("head_dim"):
        new["head_dim"] = _nearest(shape["head_dim"], dom.head_dim)
    if dom.block_size and "block_size" in shape:
        new["block_size"] = _nearest(shape["block_size"], dom.block_size)
    hq, hkv = shape.get("num_q_heads"), shape.get("num_kv_heads")
    if hq and hkv:
        ratio = max(1, hq // hkv)
        if dom.num_q_heads:
            hq = _nearest(hq, dom.num_q_heads)
        if dom.num_kv_heads:
            ok = tuple(k for k in dom.num_kv_heads if hq % k == 0)
            hkv = _nearest(hkv, ok) if ok else _nearest(hkv, dom.num_kv_heads)
            if not dom.num_q_heads:
                hq = hkv * ratio
        elif hq % hkv:
            hkv = max(k for k in range(1, hkv + 1) if hq % k == 0)
        new["num_q_heads"], new["num_kv_heads"] = hq, hkv
    elif hkv and dom.num_kv_heads:
        new["num_kv_heads"] = _nearest(hkv, dom.num_kv_heads)
    if new == shape:
        return case
    return with_shape(case, {a: v for a, v in new.items() if v != shape[a]}, params)


def shape_cases(op, params: dict, dom: Domain, planned: list[Case], main_dtype: str) -> list[Case]:
    """One small case per value the plan does not reach: each declared value of each axis, and on an
    undeclared head-dim axis the usual head dims. Each keeps its axis value; other axes can move."""
    if not op.domain_axes:
        return []
    base = op.shape_case(params, main_dtype)
    base = fit(op, base, params, dom, main_dtype) or base
    seen = {a: {shape_of(op, c, params)[a] for c in planned} for a in op.domain_axes}
    # undeclared dtypes: the small cases take the plan's dtypes in turn, so on a GPU (one worker per
    # dtype) each worker compiles about as many new specialisations as the others
    turns = [d for d in DTYPES if d in {c.dtype for c in planned}] if not dom.dtype else [main_dtype]
    turns = turns[1:] + turns[:1] if len(turns) > 1 else [main_dtype]
    out: list[Case] = []
    for axis in op.domain_axes:
        values = dom.values(axis) or (USUAL[axis] if axis == "head_dim" else ())
        lo = (params.get("rotary_dim") or 1) if axis == "head_dim" else 1
        for v in values:
            if v in seen[axis] or (axis == "head_dim" and v < lo):
                continue
            shape = {axis: v}
            if axis == "num_q_heads" and base.dims.get("Hkv") and v % base.dims["Hkv"]:
                shape["num_kv_heads"] = max(
                    k for k in range(1, v + 1) if v % k == 0 and (not dom.num_kv_heads or k in dom.num_kv_heads)
                )
            if axis == "num_kv_heads" and base.dims.get("Hq") and base.dims["Hq"] % v:
                shape["num_q_heads"] = v * max(1, base.dims["Hq"] // base.dims.get("Hkv", 1))
            if axis != "dtype" and not dom.dtype:
                shape["dtype"] = turns[len(out) % len(turns)]
            label = shape_text({axis: v}).replace("=", "").replace(" ", "-")
            out.append(with_shape(base, shape, params, name=f"shape-{label}", tags=(SHAPE_TAG + axis,)))
    return out


def plan(op, params: dict, dom: Domain, cases: list[Case], main_dtype: str) -> list[Case]:
    """The op's case plan inside the declared domain, then the shape cases."""
    fitted = [c2 for c in cases if (c2 := fit(op, c, params, dom, main_dtype)) is not None]
    return fitted + shape_cases(op, params, dom, fitted, main_dtype)


# ------------------------------------------------------------------------------------------ substitutes


def alternatives(op, case: Case, params: dict, dom: Domain, main_dtype: str) -> list[dict]:
    """Shapes to run a case at when the kernel refuses its own, nearest first: one axis changed, then
    two. A shape case keeps its axis (its dtype is only the plan's turn); a dtype-sweep case keeps its dtype."""
    shape = shape_of(op, case, params)
    fixed = {t[len(SHAPE_TAG) :] for t in case.tags if t.startswith(SHAPE_TAG)}
    small = bool(fixed)  # a shape case: one other axis at a time, never the heads
    if case.dtype != main_dtype and not small:  # a sweep case is there for its dtype
        fixed.add("dtype")
    options: dict[str, list] = {}
    for axis in op.domain_axes:
        if axis in fixed or axis in ("num_q_heads", "num_kv_heads"):
            continue
        pool = dom.values(axis) or USUAL[axis]
        if axis == "head_dim":
            lo = params.get("rotary_dim") or 1
            pool = sorted((v for v in pool if v >= lo), key=lambda v: (abs(math.log(v / shape[axis])), -v))
        options[axis] = [v for v in pool if v != shape[axis]]
    heads = [] if small else _head_options(shape, dom, fixed)
    singles = [{a: v} for a, vs in options.items() for v in vs] + heads
    if small:
        return singles
    doubles = []
    axes = list(options)
    for i, a in enumerate(axes):
        for b in axes[i + 1 :]:
            doubles += [{a: v, b: w} for v in options[a] for w in options[b]]
        doubles += [{a: v, **h} for v in options[a] for h in heads]
    return singles + doubles


def _head_options(shape: dict, dom: Domain, fixed: set) -> list[dict]:
    hq, hkv = shape.get("num_q_heads"), shape.get("num_kv_heads")
    if not hkv or fixed & {"num_q_heads", "num_kv_heads"}:
        return []
    if hq is None:  # kv_append: the KV heads alone
        return [{"num_kv_heads": k} for k in (dom.num_kv_heads or USUAL["num_kv_heads"]) if k != hkv]
    qs = dom.num_q_heads or (hq,)
    ks = dom.num_kv_heads or sorted({hq, 1, *(k for k in USUAL["num_kv_heads"] if hq % k == 0)})
    out = [{"num_q_heads": q, "num_kv_heads": k} for q in qs for k in ks if q % k == 0 and (q, k) != (hq, hkv)]
    return [{a: v for a, v in o.items() if v != shape[a]} for o in out]


# ------------------------------------------------------------------------------------------ coverage


def coverage(op, cases: list[Case], params: dict):
    """The values the cases that ran actually reached (kernalin_ci.findings.Coverage)."""

    dims, heads, dtypes, blocks, lens, pos = set(), {}, {}, set(), [], []
    for c in cases:
        shape = shape_of(op, c, params)
        if shape.get("head_dim"):
            dims.add(shape["head_dim"])
        if shape.get("num_kv_heads"):
            hq = shape.get("num_q_heads")
            heads[f"{hq}/{shape['num_kv_heads']}" if hq else str(shape["num_kv_heads"])] = None
        dtypes[c.dtype] = None
        if shape.get("block_size"):
            blocks.add(shape["block_size"])
        lens += [int(x) for x in c.dims.get("kv_lens", [])]
        pos += [int(x) for x in c.dims.get("positions", [])]
    return Coverage(
        sorted(dims),
        list(heads),
        [d for d in DTYPES if d in dtypes],
        sorted(blocks),
        [min(lens), max(lens)] if lens else [],
        [min(pos), max(pos)] if pos else [],
    )
