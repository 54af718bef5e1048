"""Compile a CUDA C++ source at run time with NVRTC and launch its kernels on torch's current stream, through
cuda-python (`pip install 'kernalin-ci[cuda]'`, or cuda-bindings and nvidia-cuda-nvrtc): one way an entry can
build and call a CUDA kernel (docs/cuda.md), and the way the CUDA catalogue (checks/cuda/) does.

    from kernalin_ci.cuda import nvrtc
    mod = nvrtc.load("csrc/rope.cu", options=["-DBLOCK=128"], include_dirs=["csrc/include"])
    mod.kernel("rope_neox")((blocks,), (128,), [q, k, positions, ctypes.c_int64(q.stride(0)), ...])

The compiled code (a cubin for the GPU in use) is cached on disk by the hash of the source, every repository
header it includes, the options and the NVRTC version (caches.py: one cache per worker view, shared by the run's
workers), and per process. `compile_source` needs no GPU: with a virtual architecture (compute_80) it gives PTX.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from pathlib import Path

from kernalin_ci.cuda.caches import cache_dir
from kernalin_ci.cuda.includes import INCLUDE

_modules: dict[str, CudaModule] = {}
_lock = threading.Lock()


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


def load(path: str | Path, options=(), include_dirs=()) -> CudaModule:
    """The module of the source at PATH compiled for the current GPU: from this process's memory, else the disk
    cache, else NVRTC."""
    import torch

    path = Path(path).resolve()
    dirs = [Path(d).resolve() for d in include_dirs]
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
