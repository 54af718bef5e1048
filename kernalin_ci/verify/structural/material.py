"""What the structural worker hands back: the raw material of the analyses, nothing judged.

The worker (task.py, the process that runs the PR's code) captures the entry's launches at the first
capture shape it accepts and compiles each kernel to TTIR. It writes one file, `structural.pt`, into
the directory the parent made (torch.save of tensors and plain data), and its `structural-done` event
only names that file. The parent (analyse.py), which never imports PR code, loads it with
`torch.load(weights_only=True)` (exchange.load: no symlink, a size cap), checks every field here, and
parses, interprets and analyses it itself. A file that is missing, unreadable, too large or not of this
form is a `bad-result` finding, never a pass.

The material (a dict):
  shape      int: the index, in capture.capture_cases(op, params, domain), of the shape captured at;
             None when no shape could be captured (then `refused` says why)
  refused    [str]: why each earlier shape was refused (so len(refused) == shape)
  tensors    {name: {role, dtype, shape, strides, elsize, storage (a uint8 tensor: the whole storage),
             base, init, also, origin (None or [input name, int64 tensor])}}: capture.TensorInfo
  launches   [{kernel, path, line, grid, args, signature, autotuned, ttir, block}]: capture.Launch, each
             argument {name, kind, value, tensor, byte_offset, pointee}, and its kernel's TTIR text ("" for
             a CUDA C++ kernel, whose `ptx` is its own and `block` its threads per block; [] for Triton)
  outputs    {op output name: tensor name}
  kwargs     {name: tensor or scalar}: the capture call's arguments (the analyses read kv_lens, ...)
  notes      [str]: what the capture could not follow
  twin       None, or the twin call of the PTX engine (Op.capture_twin): {tensors: {name: [shape,
             strides]}, launches: [{kernel, grid, args: {name: int}}]}; each launch then also has its
             `ptx` text ("" when the PTX engine was not asked for)
"""

from __future__ import annotations

from dataclasses import dataclass

from kernalin_ci.lazy import torch
from kernalin_ci.verify import exchange
from kernalin_ci.verify.exchange import BadResult
from kernalin_ci.verify.structural.capture import Capture, KernelArg, Launch, TensorInfo, shape_label

FILE = "structural.pt"
MAX_FILE_BYTES = 1 << 30  # the material of a capture call is a few MiB; more is not read
MAX_LAUNCHES = 256
KEYS = frozenset({"shape", "refused", "tensors", "launches", "outputs", "kwargs", "notes"})
OPTIONAL = frozenset({"twin"})  # the PTX engine's (engine "ptx")
ROLES = frozenset({"input", "written", "output", "scratch"})
ARG_KINDS = frozenset({"pointer", "int", "float", "bool", "constexpr", "none", "other"})
SCALARS = (int, float, bool, str, type(None))


@dataclass
class Material:
    """The parent's checked copy of a worker's material: the capture (None when no shape was
    captured), the TTIR text of each launch, the shape's index and label, and the refusals before it."""

    shape: int | None
    refused: list[str]
    capture: object | None  # capture.Capture
    texts: list[str]
    label: str | None = None  # the shape captured at, e.g. 'D=48 float16 Hq=6 Hkv=2'
    ptx: list[str] | None = None  # each launch's PTX text (the PTX engine), "" where not compiled
    twin: dict | None = None  # the twin call (Op.capture_twin), for the PTX engine's shape symbols


# ------------------------------------------------------------------ child side


def pack(
    shape: int | None,
    refused: list[str],
    cap=None,
    texts: list[str] | None = None,
    ptx: list[str] | None = None,
    twin: dict | None = None,
) -> dict:
    """The material of a capture (capture.Capture) at capture shape `shape`, with its launches' TTIR (and
    PTX, and the twin call, for the PTX engine)."""
    raw: dict = {"shape": shape, "refused": list(refused), "tensors": {}, "launches": [], "outputs": {}}
    raw["kwargs"], raw["notes"], raw["twin"] = {}, [], twin
    if cap is None:
        return raw
    for name, info in cap.tensors.items():
        origin = None
        if info.origin is not None:
            origin = [info.origin[0], torch.from_numpy(info.origin[1].astype("int64"))]
        raw["tensors"][name] = {
            "role": info.role,
            "dtype": info.dtype,
            "shape": [int(n) for n in info.shape],
            "strides": [int(s) for s in info.strides],
            "elsize": int(info.elsize),
            "storage": torch.from_numpy(info.storage.copy()),  # its own memory: kwargs may view the same
            "base": int(info.base),
            "init": info.init,
            "also": list(info.also),
            "origin": origin,
        }
    for i, (la, text) in enumerate(zip(cap.launches, texts or [])):
        raw["launches"].append(
            {
                "kernel": la.kernel,
                "path": la.path,
                "line": int(la.line),
                "grid": [int(g) for g in la.grid],
                "args": [
                    {
                        "name": a.name,
                        "kind": a.kind,
                        "value": a.value,
                        "tensor": a.tensor,
                        "byte_offset": int(a.byte_offset),
                        "pointee": a.pointee,
                    }
                    for a in la.args
                ],
                "signature": {str(k): str(v) for k, v in la.signature.items()},
                "autotuned": bool(la.autotuned),
                "ttir": text,
                "ptx": (ptx or [])[i] if i < len(ptx or []) else "",
                "block": [int(b) for b in la.block],
                "device_query": bool(la.device_query),
            }
        )
    raw["outputs"] = dict(cap.outputs)
    raw["kwargs"] = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in cap.kwargs.items()}
    raw["notes"] = list(cap.notes)
    return raw


def save(directory: str, raw: dict) -> str:
    """Write the material into the results directory; returns the name the event gives."""
    import os

    torch.save(raw, os.path.join(directory, FILE))
    return FILE


# ------------------------------------------------------------------ parent side


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise BadResult(f"structural material: {what}")


def _str(v, what: str, limit: int = 4096) -> str:
    _need(isinstance(v, str) and len(v) <= limit, f"{what}: expected a text")
    return v


def _int(v, what: str, lo: int = 0, hi: int = 1 << 62) -> int:
    _need(type(v) is int and lo <= v <= hi, f"{what}: expected an integer in {lo}..{hi}")
    return v


def _ints(v, what: str, lo: int = -(1 << 62)) -> tuple:
    _need(isinstance(v, list) and len(v) <= 16, f"{what}: expected a list of integers")
    return tuple(_int(x, what, lo) for x in v)


def _plain(v, depth: int = 0) -> bool:
    if isinstance(v, SCALARS):
        return True
    return isinstance(v, list) and depth < 4 and len(v) <= 64 and all(_plain(x, depth + 1) for x in v)


def load(directory: str, named, cases: list, op_name: str, params: dict) -> Material:
    """The material the worker wrote (the event must name FILE), checked field by field; BadResult for
    anything else. `cases`: the capture calls the parent would try (capture.capture_cases), in order."""

    n_shapes = len(cases)
    raw = exchange.load(directory, FILE, named, MAX_FILE_BYTES)
    _need(isinstance(raw, dict) and KEYS <= set(raw) <= KEYS | OPTIONAL, "not a dict of " + ", ".join(sorted(KEYS)))
    refused = raw["refused"]
    _need(isinstance(refused, list) and len(refused) <= n_shapes, "refused: expected a list of texts")
    refused = [_str(r, "refused") for r in refused]
    if raw["shape"] is None:
        _need(len(refused) == n_shapes, f"no shape captured, but {len(refused)} of {n_shapes} shapes refused")
        return Material(None, refused, None, [])
    shape = _int(raw["shape"], "shape", 0, n_shapes - 1)
    _need(len(refused) == shape, f"captured at shape {shape} after {len(refused)} refusals")
    tensors = _tensors(raw["tensors"])
    launches, texts, ptx = _launches(raw["launches"], tensors)
    outputs = raw["outputs"]
    _need(
        isinstance(outputs, dict)
        and all(isinstance(k, str) and isinstance(v, str) and v in tensors for k, v in outputs.items()),
        "outputs: expected tensor names by output",
    )
    kwargs = raw["kwargs"]
    _need(
        isinstance(kwargs, dict)
        and all(isinstance(k, str) and (isinstance(v, torch.Tensor) or _plain(v)) for k, v in kwargs.items()),
        "kwargs: expected tensors and scalars by name",
    )
    notes = raw["notes"]
    _need(isinstance(notes, list) and len(notes) <= 256, "notes: expected a list of texts")
    notes = [_str(n, "notes") for n in notes]

    case = cases[shape]
    cap = Capture(op_name, dict(params), case.dims, case.dtype, tensors, launches, dict(outputs), dict(kwargs), notes)
    return Material(shape, refused, cap, texts, shape_label(case), ptx, _twin(raw.get("twin")))


def _twin(t):
    if t is None:
        return None
    _need(isinstance(t, dict) and set(t) == {"tensors", "launches"}, "twin: expected tensors and launches")
    tensors = t["tensors"]
    _need(isinstance(tensors, dict) and len(tensors) <= 256, "twin: tensors")
    for name, v in tensors.items():
        _need(isinstance(name, str) and isinstance(v, list) and len(v) == 2, "twin: a tensor's shape and strides")
        _ints(v[0], "twin: shape", 0)
        _ints(v[1], "twin: strides")
    launches = t["launches"]
    _need(isinstance(launches, list) and len(launches) <= MAX_LAUNCHES, "twin: launches")
    for la in launches:
        _need(isinstance(la, dict) and set(la) == {"kernel", "grid", "args"}, "twin: a launch")
        _str(la["kernel"], "twin: kernel", 256)
        _ints(la["grid"], "twin: grid", 0)
        _need(
            isinstance(la["args"], dict)
            and all(isinstance(k, str) and type(v) in (int, bool) for k, v in la["args"].items()),
            "twin: a launch's integer arguments",
        )
    return t


def _tensors(d) -> dict:

    _need(isinstance(d, dict) and 0 < len(d) <= 256, "tensors: expected tensors by name")
    out = {}
    for name, t in d.items():
        what = f"tensor {str(name)[:40]!r}"
        _str(name, what, 64)
        _need(isinstance(t, dict), f"{what}: expected a dict")
        storage, origin = t.get("storage"), t.get("origin")
        _need(
            isinstance(storage, torch.Tensor) and storage.dtype == torch.uint8 and storage.dim() == 1,
            f"{what}: storage: expected a uint8 tensor",
        )
        _need(t.get("role") in ROLES, f"{what}: role")
        _need(isinstance(t.get("also"), list), f"{what}: also: expected a list of names")
        if origin is not None:
            _need(
                isinstance(origin, list)
                and len(origin) == 2
                and isinstance(origin[0], str)
                and isinstance(origin[1], torch.Tensor)
                and origin[1].dtype == torch.int64
                and origin[1].dim() == 1,
                f"{what}: origin: expected [input name, int64 tensor]",
            )
            origin = (origin[0], origin[1].contiguous().numpy())
        shape = _ints(t.get("shape"), f"{what}: shape", 0)
        strides = _ints(t.get("strides"), f"{what}: strides")
        _need(len(shape) == len(strides), f"{what}: as many strides as dimensions")
        out[name] = TensorInfo(
            name,
            t["role"],
            _str(t.get("dtype"), f"{what}: dtype", 32),
            shape,
            strides,
            _int(t.get("elsize"), f"{what}: elsize", 1, 16),
            storage.contiguous().numpy(),
            _int(t.get("base"), f"{what}: base", 0, storage.numel()),
            _str(t.get("init"), f"{what}: init", 128),
            tuple(_str(a, f"{what}: also", 64) for a in t["also"]),
            origin,
        )
    return out


def _launches(items, tensors: dict) -> tuple[list, list[str]]:

    _need(isinstance(items, list) and 0 < len(items) <= MAX_LAUNCHES, f"launches: expected 1..{MAX_LAUNCHES}")
    launches, texts, ptx = [], [], []
    for i, d in enumerate(items):
        what = f"launch {i}"
        _need(isinstance(d, dict), f"{what}: expected a dict")
        grid = _ints(d.get("grid"), f"{what}: grid", 0)
        _need(len(grid) == 3, f"{what}: grid: expected three sizes")
        args = d.get("args")
        _need(isinstance(args, list) and len(args) <= 1024, f"{what}: args: expected a list")
        kargs = []
        for a in args:
            _need(isinstance(a, dict) and a.get("kind") in ARG_KINDS, f"{what}: an argument of no known kind")
            tensor = a.get("tensor")
            _need(tensor is None or tensor in tensors, f"{what}: an argument points into no tensor handed back")
            _need(_plain(a.get("value")), f"{what}: an argument's value: expected a scalar")
            kargs.append(
                KernelArg(
                    _str(a.get("name"), f"{what}: argument name", 256),
                    a["kind"],
                    a.get("value"),
                    tensor,
                    _int(a.get("byte_offset"), f"{what}: byte_offset", -(1 << 62)),
                    _str(a.get("pointee"), f"{what}: pointee", 32),
                )
            )
        sig = d.get("signature")
        _need(
            isinstance(sig, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in sig.items()),
            f"{what}: signature: expected types by name",
        )
        _need(isinstance(d.get("autotuned"), bool), f"{what}: autotuned: expected true or false")
        block = _ints(d.get("block", []), f"{what}: block", 1)
        _need(len(block) in (0, 3), f"{what}: block: expected three sizes or none")
        _need(isinstance(d.get("device_query", False), bool), f"{what}: device_query: expected true or false")
        launches.append(
            Launch(
                i,
                _str(d.get("kernel"), f"{what}: kernel", 256),
                _str(d.get("path"), f"{what}: path"),
                _int(d.get("line"), f"{what}: line"),
                grid,
                kargs,
                None,
                dict(sig),
                autotuned=d["autotuned"],
                block=block,
                device_query=d.get("device_query", False),
            )
        )
        texts.append(_str(d.get("ttir"), f"{what}: ttir", MAX_FILE_BYTES))
        ptx.append(_str(d.get("ptx", ""), f"{what}: ptx", MAX_FILE_BYTES))
    return launches, texts, ptx
