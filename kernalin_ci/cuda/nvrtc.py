"""Compile a CUDA C++ source at run time with NVRTC and launch its kernels on torch's current stream, through
cuda-python (`pip install 'kernalin-ci[cuda]'`, or cuda-bindings and nvidia-cuda-nvrtc): one way an entry can
build and call a CUDA kernel (docs/cuda.md), and the way the CUDA catalogue (checks/cuda/) does.

    from kernalin_ci.cuda import nvrtc
    mod = nvrtc.load("csrc/rope.cu", options=["-DBLOCK=128"], include_dirs=["csrc/include"])
    mod.kernel("rope_neox")((blocks,), (128,), [q, k, positions, ctypes.c_int64(q.stride(0)), ...])

The compiled code (a cubin for the GPU in use) is cached on disk by the hash of the source, every repository
header it includes, the options and the NVRTC version (caches.py: one cache per worker view, shared by the run's
workers), and per process. `compile_source` needs no GPU: with a virtual architecture (compute_80) it gives PTX.

`recording(on_launch)` is the structural capture's way in (verify/structural/capture.py): while it is active,
`load` compiles PTX for RECORD_ARCH on the CPU (no GPU, no cubin) and calling a kernel hands a `RecordedLaunch`
(the kernel's own PTX, grid, block and arguments as given) to ON_LAUNCH instead of launching it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kernalin_ci.cuda.caches import cache_dir
from kernalin_ci.cuda.includes import INCLUDE

_modules: dict[str, CudaModule] = {}
_lock = threading.Lock()
RECORD_ARCH = "compute_90"  # the PTX a recorded launch carries (the structural engines' target: sm_90)
_recorder: Callable[[RecordedLaunch], None] | None = None
_recorded: dict[str, PtxModule] = {}


class CudaError(RuntimeError):
    """A CUDA driver call failed (its name says how: CUDA_ERROR_ILLEGAL_ADDRESS, ...)."""


def _check(result, what: str):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CudaError(f"CUDA error: {what}: {getattr(err, 'name', err)}")
    return rest[0] if len(rest) == 1 else rest


def _headers(path: Path, include_dirs: list[Path]) -> list[Path]:
    """The files PATH includes with #include "..." (transitively), found in its folder or INCLUDE_DIRS."""
    seen: list[Path] = []
    todo = [path]
    while todo:
        p = todo.pop()
        for name in INCLUDE.findall(p.read_text(errors="replace")):
            for folder in [p.parent, *include_dirs]:
                cand = (folder / name).resolve()
                if cand.is_file():
                    if cand not in seen:
                        seen.append(cand)
                        todo.append(cand)
                    break
    return seen


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    return ".".join(map(str, _check(nvrtc.nvrtcVersion(), "nvrtcVersion")))


def compile_source(path: str | Path, arch: str, options=(), include_dirs=()) -> bytes:
    """NVRTC: the source at PATH for ARCH (sm_90: a cubin; compute_80: PTX). Raises CudaError with the
    compiler's log when it does not compile."""
    from cuda.bindings import nvrtc

    path = Path(path).resolve()
    dirs = [Path(d).resolve() for d in include_dirs]
    opts = [f"--gpu-architecture={arch}", "--std=c++17", f"-I{path.parent}", *(f"-I{d}" for d in dirs), *options]
    prog = _check(nvrtc.nvrtcCreateProgram(path.read_bytes(), str(path).encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if int(err) != 0:
            size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CudaError(f"{path.name} does not compile (NVRTC, {arch}): {log.decode(errors='replace').strip()}")
        if arch.startswith("sm_"):
            size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            out = b" " * size
            _check(nvrtc.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN")
        else:
            size = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            out = b" " * size
            _check(nvrtc.nvrtcGetPTX(prog, out), "nvrtcGetPTX")
        return out
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def load(path: str | Path, options=(), include_dirs=()) -> CudaModule | PtxModule:
    """The module of the source at PATH compiled for the current GPU: from this process's memory, else the disk
    cache, else NVRTC. While `recording`: its PTX, whose kernels record their launches."""
    path = Path(path).resolve()
    dirs = [Path(d).resolve() for d in include_dirs]
    if _recorder is not None:
        return _ptx_module(path, list(options), dirs)
    import torch

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    h = hashlib.sha256(f"{nvrtc_version()}\0{arch}\0{list(options)}".encode())
    for f in [path, *_headers(path, dirs)]:
        h.update(str(f).encode() + b"\0" + f.read_bytes())
    key = h.hexdigest()
    with _lock:
        if key in _modules:
            return _modules[key]
        folder = Path(cache_dir()) / "nvrtc"
        cached = folder / f"{key[:32]}.cubin"
        if cached.is_file():
            image = cached.read_bytes()
        else:
            image = compile_source(path, arch, options, dirs)
            folder.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(image)
            os.replace(tmp, cached)
        _modules[key] = CudaModule(image)
        return _modules[key]


class CudaModule:
    """A loaded cubin (in torch's CUDA context)."""

    def __init__(self, image: bytes):
        import torch
        from cuda.bindings import driver

        torch.cuda.init()
        _check(driver.cuInit(0), "cuInit")
        ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if not int(ctx):  # torch made the primary context; this thread may not have it current yet
            dev = _check(driver.cuDeviceGet(torch.cuda.current_device()), "cuDeviceGet")
            _check(driver.cuCtxSetCurrent(_check(driver.cuDevicePrimaryCtxRetain(dev), "retain")), "cuCtxSetCurrent")
        self.handle = _check(driver.cuModuleLoadData(image), "cuModuleLoadData")
        self._kernels: dict[str, CudaKernel] = {}

    def kernel(self, name: str) -> CudaKernel:
        if name not in self._kernels:
            from cuda.bindings import driver

            self._kernels[name] = CudaKernel(name, _check(driver.cuModuleGetFunction(self.handle, name.encode()), name))
        return self._kernels[name]


class CudaKernel:
    """A kernel of a CudaModule: call it with the grid, the block and its arguments (tensors are passed as their
    data pointers, ints as int32, floats as float32; a ctypes value, e.g. ctypes.c_int64(n), as its own type)."""

    def __init__(self, name: str, handle):
        self.name, self.handle = name, handle

    def __call__(self, grid, block, args, shared: int = 0, cooperative: bool = False) -> None:
        import torch
        from cuda.bindings import driver

        values, types = [], []
        for a in args:
            if isinstance(a, torch.Tensor):
                values.append(a.data_ptr())
                types.append(ctypes.c_void_p)
            elif isinstance(a, ctypes._SimpleCData):
                values.append(a.value)
                types.append(type(a))
            elif isinstance(a, bool):
                values.append(a)
                types.append(ctypes.c_bool)
            elif isinstance(a, int):
                values.append(a)
                types.append(ctypes.c_int)
            elif isinstance(a, float):
                values.append(a)
                types.append(ctypes.c_float)
            else:
                raise TypeError(f"kernel {self.name}: cannot pass {type(a).__name__} {a!r}")
        g = tuple(grid) + (1,) * (3 - len(grid))
        b = tuple(block) + (1,) * (3 - len(block))
        stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
        params = (tuple(values), tuple(types))
        if cooperative:
            _check(driver.cuLaunchCooperativeKernel(self.handle, *g, *b, shared, stream, params), self.name)
        else:
            _check(driver.cuLaunchKernel(self.handle, *g, *b, shared, stream, params, 0), self.name)


# ------------------------------------------------------------------ recording (the structural capture)


@dataclass
class RecordedLaunch:
    """One kernel call made while `recording`: nothing ran."""

    kernel: str
    source: Path  # the .cu file
    line: int  # the line of the kernel's name in it (0 when not found)
    ptx: str  # the module's PTX reduced to this kernel's `.entry` (with the module's declarations)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: list  # as the entry passed them: tensors, ctypes values, bools, ints, floats
    shared: int
    cooperative: bool


@contextmanager
def recording(on_launch: Callable[[RecordedLaunch], None]) -> Iterator[None]:
    """While active, `load` gives PTX modules and their kernels call ON_LAUNCH instead of launching."""
    global _recorder
    saved, _recorder = _recorder, on_launch
    try:
        yield
    finally:
        _recorder = saved


def _ptx_module(path: Path, options: list[str], dirs: list[Path]) -> PtxModule:
    key = f"{path}\0{options}\0{dirs}"
    if key not in _recorded:
        text = compile_source(path, RECORD_ARCH, ["-lineinfo", *options], dirs)
        _recorded[key] = PtxModule(path, text.rstrip(b"\0").decode(errors="replace"))
    return _recorded[key]


class PtxModule:
    """A source compiled to PTX on the CPU, while `recording`."""

    def __init__(self, path: Path, ptx: str):
        self.path, self.ptx = path, ptx

    def kernel(self, name: str) -> RecordedKernel:
        return RecordedKernel(name, self)


class RecordedKernel:
    """A kernel of a PtxModule: called like a CudaKernel, it records the launch."""

    def __init__(self, name: str, module: PtxModule):
        self.name, self.module = name, module

    def __call__(self, grid, block, args, shared: int = 0, cooperative: bool = False) -> None:
        g = tuple(int(x) for x in grid) + (1,) * (3 - len(grid))
        b = tuple(int(x) for x in block) + (1,) * (3 - len(block))
        source = self.module.path.read_text(errors="replace")
        at = re.search(rf"__global__[^;{{]*?\b{re.escape(self.name)}\s*\(", source)
        line = source.count("\n", 0, at.end()) + 1 if at else 0
        launch = RecordedLaunch(
            self.name,
            self.module.path,
            line,
            entry_ptx(self.module.ptx, self.name),
            g,
            b,
            list(args),
            shared,
            cooperative,
        )
        if _recorder is not None:
            _recorder(launch)


_ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$]+)", re.M)


def entry_ptx(text: str, name: str) -> str:
    """The PTX module TEXT with only kernel NAME's `.entry` (the declarations before the first kernel, and
    every `.file` line, kept); "" when the module has no such kernel."""
    starts = [(m.start(), m.group(1)) for m in _ENTRY.finditer(text)]
    for i, (at, n) in enumerate(starts):
        if n == name:
            end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
            head = text[: starts[0][0]]
            files = "".join(ln + "\n" for ln in text[end:].splitlines() if ln.lstrip().startswith(".file"))
            return head + text[at:end] + files
    return ""
