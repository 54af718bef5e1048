"""Capture: record every Triton kernel an entry launches, with its exact specialization, without a GPU.

Runs in the worker child with TRITON_INTERPRET off, so `@triton.jit` gives real
`JITFunction`s. During one small call of the entry, `JITFunction.run` is
replaced by a recorder that binds the arguments with Triton's own binder for
an sm_90 backend (the same code path, hence the same signature, constexprs and
divisibility hints, a GPU launch would compile), resolves the grid, and
returns without launching. Nothing is computed; the analyses never need the
kernel's results, only its structure and the launch parameters.

CUDA C++ kernels launched through `kernalin_ci.cuda.nvrtc` are recorded the same way (`nvrtc.recording`):
the source is compiled to PTX on the CPU and each call's grid, block and arguments are kept (pointers,
and the C types of the scalars: a Python int is an `int`, a float a `float`, a ctypes value its own type).

Every pointer argument is mapped back to the tensor it points into: an op
argument (q, k_cache, slot_mapping, ...; a pointer into the middle of a tensor
still belongs to it), the tensor the entry returns (the output), or a scratch
tensor the entry allocated. Allocations made by the entry are poisoned with
canaries, so a scratch tensor's initial content is known ("uninitialized",
"zeros", "copy of q").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kernalin_ci.domain import Domain
from kernalin_ci.ops import get_op
from kernalin_ci.ops.paged import layout_of, nhd
from kernalin_ci.runtime.poison import is_canary, poisoned_allocations

if TYPE_CHECKING:
    from kernalin_ci.ops.base import Case, Op

TARGET = ("cuda", 90, 32)


# --------------------------------------------------------------------------- data


@dataclass(eq=False)
class TensorInfo:
    """One tensor a kernel can address: an op argument, the output, or a scratch buffer."""

    name: str  # "q", "k_cache", "out", "q_out", "scratch0"
    role: str  # "input" | "written" (an op input the op may write) | "output" | "scratch"
    dtype: str  # torch dtype name without "torch."
    shape: tuple
    strides: tuple  # in elements
    elsize: int
    storage: np.ndarray  # the whole storage, as uint8 (a view: no copy)
    base: int  # byte offset of element 0 in the storage
    init: str = "input"  # scratch/output content at its first launch: "uninitialized", "zeros", "copy:q",
    #                           "gather:key" (elements of key moved on the host, see host.py), "data"
    also: tuple = ()  # other names of the same storage (an in-place output is also an input)
    origin: tuple | None = None  # copy/gather: (input name, per element offset from element 0: the input's element
    #                              offset it holds, -1 where none)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith(("float", "bfloat"))

    def read(self, byte_offsets: np.ndarray, np_dtype) -> tuple[np.ndarray, np.ndarray]:
        """Values at byte offsets from element 0 (as the kernel's pointee type); and which were in the storage."""
        size = np.dtype(np_dtype).itemsize
        pos = self.base + byte_offsets.astype(np.int64)
        ok = (pos >= 0) & (pos + size <= self.storage.size)
        out = np.zeros(byte_offsets.shape, dtype=np_dtype)
        if ok.any():
            idx = pos[ok]
            raw = np.stack([self.storage[idx + k] for k in range(size)], axis=-1)
            out[ok] = raw.view(np_dtype).reshape(-1)
        return out, ok

    def coords(self, elem: np.ndarray) -> np.ndarray:
        """Element offsets (from element 0) -> index tuples [..., ndim], for a tensor with these strides.

        Works for any non-overlapping strides (dims sorted by stride, largest first)."""
        elem = np.asarray(elem, dtype=np.int64)
        out = np.zeros(elem.shape + (len(self.shape),), dtype=np.int64)
        rest = elem.copy()
        order = sorted(range(len(self.shape)), key=lambda d: -self.strides[d])
        for d in order:
            s = max(int(self.strides[d]), 1)
            out[..., d] = np.floor_divide(rest, s)
            rest = rest - out[..., d] * s
        return out

    def coord(self, elem: int) -> tuple:
        """One element offset -> its index tuple (pure Python, for per-element loops)."""
        out = [0] * len(self.shape)
        rest = int(elem)
        for d in sorted(range(len(self.shape)), key=lambda d: -self.strides[d]):
            s = max(int(self.strides[d]), 1)
            out[d], rest = divmod(rest, s)
        return tuple(out)

    def in_bounds(self, elem: np.ndarray) -> np.ndarray:
        c = self.coords(elem)
        ok = np.ones(elem.shape, dtype=bool)
        flat = np.zeros(elem.shape, dtype=np.int64)
        for d, n in enumerate(self.shape):
            ok &= (c[..., d] >= 0) & (c[..., d] < n)
            flat += c[..., d] * self.strides[d]
        return ok & (flat == elem)


@dataclass
class KernelArg:
    name: str
    kind: str  # "pointer" | "int" | "float" | "bool" | "constexpr" | "none" | "other"
    value: Any = None  # scalars and constexprs
    tensor: str | None = None  # pointers: the TensorInfo name
    byte_offset: int = 0  # pointers: where into that tensor
    pointee: str = ""  # pointers: the kernel's element type ("fp16", "i32", ...)


@dataclass(eq=False)
class Launch:
    index: int
    kernel: str
    path: str  # the kernel's source file
    line: int  # its `def` line
    grid: tuple
    args: list  # list[KernelArg], every parameter in order
    jit: Any = None  # the JITFunction (in-process only)
    signature: dict = field(default_factory=dict)
    constexprs: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    options: Any = None
    autotuned: bool = False
    ptx: str = ""  # a CUDA C++ kernel (recorded through kernalin_ci.cuda.nvrtc): its PTX; Triton's: ""
    block: tuple = ()  # a CUDA C++ kernel's threads per block (x, y, z); Triton's: ()
    device_query: bool = False  # the entry asked the device for its properties before this launch

    def arg(self, name: str) -> KernelArg | None:
        return next((a for a in self.args if a.name == name), None)

    @property
    def runtime_args(self) -> list:
        """The parameters that remain function arguments in the IR (not constexpr, not None)."""
        return [a for a in self.args if self.signature.get(a.name) not in ("constexpr", None)]


@dataclass
class Capture:
    op: str
    params: dict
    dims: dict
    dtype: str
    tensors: dict  # name -> TensorInfo
    launches: list  # list[Launch]
    outputs: dict  # op output name ("out", "q", "k", "k_cache") -> TensorInfo name
    kwargs: dict  # the op's keyword arguments (tensors and scalars), for the analyses
    notes: list = field(default_factory=list)  # things the capture could not follow


class CaptureError(Exception):
    """The entry could not be run for capture (it raised, or launched nothing we can follow)."""


# --------------------------------------------------------------------------- the capture shapes


MAX_CANDIDATES = 10


def capture_cases(op: Op, params: dict, domain=None) -> list[Case]:
    """The capture calls to try, in order, until one captures and compiles: the op's capture call
    (`Op.capture_cases`) at each candidate shape. The declared domain first (its head dims, dtypes,
    heads); undeclared, a head dim that leaves a tail under its power-of-two block (48), then the
    usual head dims for kernels that need a power of two or one head dim, in the op's capture dtype,
    then the other dtypes for kernels that refuse it. Nearest the first choice first."""
    from dataclasses import replace

    domain = domain or Domain()
    pinned = params.get("head_dim")
    head_dims = list(domain.head_dim) or ([pinned] if pinned else [48, 64, 128, 256, 80, 96])
    p = dict(params)
    for axis in ("num_q_heads", "num_kv_heads"):
        if domain.values(axis):
            p[axis] = domain.values(axis)[0]
    first = op.capture_cases(p)
    own = first[0].dtype if first else "float16"  # the op's own choice of capture dtype comes first
    dtypes = list(domain.dtype) or [own] + [d for d in ("float16", "bfloat16", "float32") if d != own]
    pairs = sorted(((i, j) for i in range(len(head_dims)) for j in range(len(dtypes))), key=lambda ij: (sum(ij), ij[1]))
    out: list[Case] = []
    for i, j in pairs:
        for case in op.capture_cases({**p, "head_dim": head_dims[i]})[:1]:
            case = replace(case, dtype=dtypes[j])
            if not any(c.dims == case.dims and c.dtype == case.dtype for c in out):
                out.append(case)
    return out[:MAX_CANDIDATES]


def shape_label(case: Case) -> str:
    """A capture call's shape, e.g. 'D=48 float16 Hq=6 Hkv=2'."""
    d = case.dims
    return f"D={d.get('D')} {case.dtype}" + (f" Hq={d['Hq']}" if "Hq" in d else "") + f" Hkv={d.get('Hkv')}"


# --------------------------------------------------------------------------- tensors


def _storage_bytes(t) -> tuple[np.ndarray, int]:
    import torch

    u8 = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return u8.numpy(), t.storage_offset() * t.element_size()


def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


class TensorRegistry:
    def __init__(self):
        self.infos: dict[str, TensorInfo] = {}
        self.by_storage: dict[int, list[tuple[Any, TensorInfo]]] = {}
        self.n_scratch = 0

    def add(self, name: str, t, role: str, init: str = "input") -> TensorInfo:
        storage, base = _storage_bytes(t)
        info = TensorInfo(
            name, role, _dtype_name(t), tuple(t.shape), tuple(t.stride()), t.element_size(), storage, base, init
        )
        self.infos[name] = info
        self.by_storage.setdefault(t.untyped_storage().data_ptr(), []).append((t, info))
        return info

    def find(self, t) -> tuple[TensorInfo | None, int]:
        """The registered tensor whose memory holds t's first element, and the byte offset into it."""
        key = t.untyped_storage().data_ptr()
        ptr = t.data_ptr()
        for owner, info in self.by_storage.get(key, []):
            lo = owner.data_ptr()
            span = _extent_bytes(owner)
            if lo <= ptr < lo + max(span, 1):
                return info, ptr - lo
        return None, 0


def _extent_bytes(t) -> int:
    if t.numel() == 0:
        return 0
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


def _initial_content(t, kw: dict) -> str:
    import torch

    if t.numel() == 0:
        return "zeros"
    if t.dtype.is_floating_point:
        can = is_canary(t)
        if bool(can.all()):
            return "uninitialized"
        if bool(can.any()):
            return "partly-uninitialized"
    for name, v in kw.items():
        if isinstance(v, torch.Tensor) and v.shape == t.shape and torch.equal(v.to(t.dtype), t):
            return f"copy:{name}"  # a copy, possibly in another float type (q.float())
    if not t.dtype.is_floating_point and int(t.reshape(-1)[0]) == 0x5A5A5A5A and bool((t == t.reshape(-1)[0]).all()):
        return "uninitialized"
    if bool((t == 0).all()):
        return "zeros"
    return "data"


# --------------------------------------------------------------------------- recording launches


class LaunchRecorder:
    """Replaces JITFunction.run (and Autotuner.run) while the entry runs."""

    def __init__(self, registry: TensorRegistry, kw: dict, moves=None, all_configs: bool = False):
        os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default; silences 3.9's warning
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend

        self.registry = registry
        self.kw = kw
        self.moves = moves  # host.HostMoves: where the host took a scratch tensor's elements from
        self.target = GPUTarget(*TARGET)
        self.backend = make_backend(self.target)
        self.binders: dict[int, Any] = {}
        self.launches: list[Launch] = []
        self.notes: list[str] = []
        self.all_configs = all_configs  # autotuned kernels: record every config (kernalin_ci.explain)
        self.device_asked = False  # the entry asked the device (answered as DEVICE): later grids are symbols

    def binder(self, jit):
        import triton.runtime.jit as J

        b = self.binders.get(id(jit))
        if b is None:
            b = J.create_function_from_signature(jit.signature, jit.params, self.backend)
            self.binders[id(jit)] = b
        return b

    def record(self, jit, args, kwargs, grid, autotuned=False):
        if self.moves is None:
            return self._record(jit, args, kwargs, grid, autotuned)
        with self.moves.paused():
            return self._record(jit, args, kwargs, grid, autotuned)

    def _record(self, jit, args, kwargs, grid, autotuned=False):
        import inspect

        import torch

        kwargs = {k: v for k, v in kwargs.items() if k not in ("warmup",)}
        bound, specialization, opts = self.binder(jit)(*args, **kwargs)
        options, signature, constexprs, attrs = jit._pack_args(self.backend, kwargs, bound, specialization, opts)
        if callable(grid):
            grid = grid(bound)
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        kargs = []
        for name, value in bound.items():
            sig = signature.get(name)
            if sig == "constexpr":
                v = value.value if hasattr(value, "value") and not isinstance(value, (int, float, bool)) else value
                kargs.append(KernelArg(name, "constexpr", _plain(v)))
            elif isinstance(value, torch.Tensor):
                info, off = self.registry.find(value)
                if info is not None and value.element_size() != info.elsize:
                    raise CaptureError(
                        f"kernel {jit.fn.__name__} reads {info.name} ({info.dtype}) through argument {name} as "
                        f"{_dtype_name(value)}: memory reinterpreted with another element size is not followed"
                    )
                if info is None:
                    self.registry.n_scratch += 1
                    nm = f"scratch{self.registry.n_scratch}"
                    info = self.registry.add(nm, value, "scratch", _initial_content(value, self.kw))
                    self._set_origin(info, value)
                    off = 0
                kargs.append(
                    KernelArg(name, "pointer", tensor=info.name, byte_offset=int(off), pointee=str(sig).lstrip("*"))
                )
            elif value is None:
                kargs.append(KernelArg(name, "none"))
            elif isinstance(value, bool):
                kargs.append(KernelArg(name, "bool", bool(value)))
            elif isinstance(value, int):
                kargs.append(KernelArg(name, "int", int(value)))
            elif isinstance(value, float):
                kargs.append(KernelArg(name, "float", float(value)))
            else:
                kargs.append(KernelArg(name, "other", repr(value)[:80]))
        fn = jit.fn
        try:
            path = os.path.realpath(inspect.getsourcefile(fn) or "")
            lines, line = inspect.getsourcelines(fn)
            line += next((k for k, t in enumerate(lines) if t.lstrip().startswith("def ")), 0)  # past decorators
        except (OSError, TypeError):
            path, line = "", 0
        self.launches.append(
            Launch(
                len(self.launches),
                fn.__name__,
                path,
                line,
                grid,
                kargs,
                jit,
                signature,
                constexprs,
                attrs,
                options,
                autotuned,
                device_query=self.device_asked,
            )
        )

    def record_cuda(self, rec) -> None:
        """A CUDA C++ launch (nvrtc.RecordedLaunch): its arguments in the kernel's order, named arg0, arg1, ..."""
        if self.moves is None:
            return self._record_cuda(rec)
        with self.moves.paused():
            return self._record_cuda(rec)

    def _record_cuda(self, rec) -> None:
        import ctypes

        import torch

        if not rec.ptx:
            raise CaptureError(f"kernel {rec.kernel}: not in the PTX of {rec.source.name}")
        kargs, signature = [], {}
        for i, value in enumerate(rec.args):
            name = f"arg{i}"
            if isinstance(value, torch.Tensor):
                info, off = self.registry.find(value)
                if info is None:
                    self.registry.n_scratch += 1
                    info = self.registry.add(
                        f"scratch{self.registry.n_scratch}", value, "scratch", _initial_content(value, self.kw)
                    )
                    self._set_origin(info, value)
                    off = 0
                signature[name] = "*" + _dtype_name(value)
                kargs.append(
                    KernelArg(name, "pointer", tensor=info.name, byte_offset=int(off), pointee=signature[name][1:])
                )
                continue
            if isinstance(value, ctypes._SimpleCData):
                kind = "float" if isinstance(value, (ctypes.c_float, ctypes.c_double)) else "int"
                signature[name] = type(value).__name__
                value = value.value
            elif isinstance(value, bool):
                kind, signature[name] = "bool", "c_bool"
            elif isinstance(value, int):
                kind, signature[name] = "int", "c_int"
            elif isinstance(value, float):
                kind, signature[name] = "float", "c_float"
            else:
                raise CaptureError(f"kernel {rec.kernel}: argument {i} is a {type(value).__name__}, not followed")
            kargs.append(KernelArg(name, kind, bool(value) if kind == "bool" else value))
        self.launches.append(
            Launch(
                len(self.launches),
                rec.kernel,
                str(rec.source),
                rec.line,
                rec.grid,
                kargs,
                signature=signature,
                ptx=rec.ptx,
                block=rec.block,
                device_query=self.device_asked,
            )
        )

    def _set_origin(self, info: TensorInfo, t) -> None:
        """A scratch tensor the host filled with an input's elements: a copy, or a gather (host.py)."""
        # deferred: host.py imports torch: only the capture itself needs it
        from kernalin_ci.verify.structural.host import identity_origin

        if info.init.startswith("copy:") and info.init[5:] in self.registry.infos:
            info.origin = identity_origin(info, self.registry.infos[info.init[5:]])
        elif info.init == "data" and self.moves is not None:
            info.origin = self.moves.origin(t)
            if info.origin is not None:
                info.init = f"gather:{info.origin[0]}"

    def install(self):
        from triton.runtime.jit import JITFunction

        recorder = self
        saved = [(JITFunction, "run", JITFunction.run)]

        def run(jit, *args, grid, warmup, **kwargs):
            if warmup:
                return None
            recorder.record(jit, args, kwargs, grid)
            return None

        JITFunction.run = run
        try:
            from triton.runtime.autotuner import Autotuner

            saved.append((Autotuner, "run", Autotuner.run))

            def tuned_run(tuner, *args, **kwargs):
                if recorder.all_configs:
                    for config in tuner.configs:
                        extra = config.all_kwargs() if hasattr(config, "all_kwargs") else dict(config.kwargs)
                        n = len(recorder.launches)
                        tuner.fn.run(*args, **kwargs, **extra)
                        for la in recorder.launches[n:]:
                            la.autotuned = True
                    return None
                # no GPU to benchmark on: the first config is the one checked
                config = tuner.configs[0]
                recorder.notes.append(
                    f"autotuned kernel {tuner.fn.__name__ if hasattr(tuner.fn, '__name__') else ''}"
                    f": checked with its first config only"
                )
                extra = config.all_kwargs() if hasattr(config, "all_kwargs") else dict(config.kwargs)
                return tuner.fn.run(*args, **kwargs, **extra)

            Autotuner.run = tuned_run
        except ImportError:
            pass
        return saved

    @staticmethod
    def uninstall(saved):
        for cls, name, fn in saved:
            setattr(cls, name, fn)


def _plain(v):
    """A constexpr as builtin data the parent can load (torch.load weights_only): an enum member as its
    value, a subclass of int, float or str (IntEnum, a str enum) as the builtin, anything else as its repr."""
    import enum

    if isinstance(v, enum.Enum):
        return _plain(v.value)
    if v is None or type(v) in (int, float, bool, str):
        return v
    for kind in (bool, int, float, str):
        if isinstance(v, kind):
            return kind(v)
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return repr(v)


# --------------------------------------------------------------------------- entry point


def capture(op_name: str, entry_fn, params: dict, domain=None) -> Capture:
    """Run the entry once on the first capture call it accepts and record its launches."""

    op = get_op(op_name)
    cases = capture_cases(op, params, domain)
    if not cases:
        raise CaptureError(f"no structural capture for op {op_name}")
    first_error = None
    for case in cases:
        try:
            return _capture_once(op, entry_fn, params, case)
        except CaptureError as e:
            first_error = first_error or e
    raise first_error


def capture_at(
    op: Op, entry_fn, params: dict, case: Case, *, inputs: dict | None = None, all_configs: bool = False
) -> Capture:
    """Run the entry once on one capture call and record its launches (CaptureError if refused).
    inputs: the call's arguments (default: the op's capture inputs); all_configs: an autotuned kernel
    records one launch per config (kernalin_ci.explain compares them all)."""
    return _capture_once(op, entry_fn, params, case, inputs, all_configs)


def _capture_once(
    op: Op, entry_fn, params: dict, case: Case, inputs: dict | None = None, all_configs: bool = False
) -> Capture:
    import torch

    # deferred: host.py imports torch: only the capture itself needs it
    from kernalin_ci.cuda import nvrtc
    from kernalin_ci.verify.structural.host import HostMoves

    kw = op.capture_inputs(case, params) if inputs is None else inputs
    registry = TensorRegistry()
    writable = set(op.written_names(params))
    for name, v in kw.items():
        if isinstance(v, torch.Tensor):
            registry.add(name, _logical(op, params, name, v), "written" if name in writable else "input")
    snapshot = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    moves = HostMoves({k: v for k, v in kw.items() if isinstance(v, torch.Tensor)})
    recorder = LaunchRecorder(registry, snapshot, moves, all_configs)
    saved = recorder.install()
    try:
        with poisoned_allocations(), moves, nvrtc.recording(recorder.record_cuda), device_answers(recorder):
            ret = entry_fn(**kw)
    except Exception as e:  # the user's code: report, never crash
        msg = " ".join(str(e).split())[:300]
        raise CaptureError(f"the entry raised {type(e).__name__} during the capture call: {msg}") from None
    finally:
        LaunchRecorder.uninstall(saved)
    try:
        outs = op.outputs(ret, kw)
    except TypeError as e:
        raise CaptureError(str(e)) from None
    outputs = {}
    for oname, t in outs.items():
        if not isinstance(t, torch.Tensor):
            continue
        info, off = registry.find(t)
        if info is None:
            # returned but never passed to a kernel: written by host code only
            info = registry.add(f"{oname}_out" if oname in kw else oname, t, "output", "host")
        elif info.role == "scratch":
            new = oname if oname not in kw else f"{oname}_out"
            _rename(registry, recorder.launches, info, new)
            info.role = "output"
        else:
            info.also = tuple(set(info.also) | {f"{oname}_out"}) if oname not in ("k_cache", "v_cache") else info.also
        outputs[oname] = info.name
    logical = {k: _logical(op, params, k, v) for k, v in kw.items()}
    return Capture(
        op.name,
        dict(params),
        case.dims,
        case.dtype,
        registry.infos,
        recorder.launches,
        outputs,
        logical,
        recorder.notes,
    )


@dataclass(frozen=True)
class DeviceProperties:
    """What the capture answers an entry that asks the GPU (there is none): the target the PTX is compiled
    for (sm_90: an H100 SXM). A launch made after the question has its grid as a symbol G (ptx_facts.py):
    a persistent kernel sized by `multi_processor_count` is proved for every grid, not for this answer's."""

    name: str = "NVIDIA H100 80GB HBM3 (the capture's target, sm_90; no GPU asked)"
    major: int = 9
    minor: int = 0
    multi_processor_count: int = 132
    total_memory: int = 80 * (1 << 30)
    warp_size: int = 32
    max_threads_per_multi_processor: int = 2048
    regs_per_multiprocessor: int = 65536
    shared_memory_per_block: int = 48 * 1024
    shared_memory_per_block_optin: int = 227 * 1024
    shared_memory_per_multiprocessor: int = 228 * 1024
    L2_cache_size: int = 50 * (1 << 20)
    is_integrated: bool = False
    is_multi_gpu_board: bool = False


DEVICE = DeviceProperties()


@contextmanager
def device_answers(recorder: LaunchRecorder) -> Iterator[None]:
    """While the capture call runs: `torch.cuda.get_device_properties` and `get_device_capability` answer
    DEVICE's, and the recorder notes that the entry asked."""
    import torch

    saved = torch.cuda.get_device_properties, torch.cuda.get_device_capability

    def properties(device=None) -> DeviceProperties:
        recorder.device_asked = True
        return DEVICE

    def capability(device=None) -> tuple[int, int]:
        recorder.device_asked = True
        return DEVICE.major, DEVICE.minor

    torch.cuda.get_device_properties, torch.cuda.get_device_capability = properties, capability
    try:
        yield
    finally:
        torch.cuda.get_device_properties, torch.cuda.get_device_capability = saved


def _logical(op: Op, params: dict, name: str, v):
    """The analyses see a paged cache in nhd order whatever its layout: a permuted view of the same memory."""
    if op.paged_cache and name in ("k_cache", "v_cache"):
        return nhd(v, layout_of(params))
    return v


def _rename(registry: TensorRegistry, launches: list, info: TensorInfo, new: str) -> None:
    old = info.name
    registry.infos.pop(old, None)
    info.name = new
    registry.infos[new] = info
    for la in launches:
        for a in la.args:
            if a.tensor == old:
                a.tensor = new
