# kv_append through cuda-python directly: NVRTC compiles the catalogue's kv_append.cu for this GPU, the
# driver API loads the cubin and launches it on torch's stream (docs/cuda.md, "NVRTC through cuda-python").
import ctypes
import functools
from pathlib import Path

import torch
from cuda.bindings import driver, nvrtc

CUDA = Path(__file__).resolve().parents[2] / "checks" / "cuda"


def _ok(result):
    err, *rest = result
    assert int(err) == 0, f"CUDA error {err}"
    return rest[0] if len(rest) == 1 else rest


@functools.cache
def _functions():
    major, minor = torch.cuda.get_device_capability()
    src = (CUDA / "kv_append" / "kv_append.cu").read_bytes()
    prog = _ok(nvrtc.nvrtcCreateProgram(src, b"kv_append.cu", 0, [], []))
    opts = [f"--gpu-architecture=sm_{major}{minor}".encode(), f"-I{CUDA / 'common'}".encode()]
    _ok(nvrtc.nvrtcCompileProgram(prog, len(opts), opts))
    cubin = b" " * _ok(nvrtc.nvrtcGetCUBINSize(prog))
    _ok(nvrtc.nvrtcGetCUBIN(prog, cubin))
    torch.cuda.init()
    module = _ok(driver.cuModuleLoadData(cubin))
    return {n: _ok(driver.cuModuleGetFunction(module, n.encode())) for n in ("kv_append32", "kv_append16")}


def entry(key, value, k_cache, v_cache, slot_mapping):
    T, Hkv, D = key.shape
    fn = _functions()["kv_append32" if key.element_size() == 4 else "kv_append16"]
    ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    values = (
        key.data_ptr(),
        value.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        slot_mapping.data_ptr(),
        Hkv,
        D,
        k_cache.shape[1],
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
    )
    types = (ptr,) * 5 + (i32,) * 3 + (i64,) * 7
    stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
    _ok(driver.cuLaunchKernel(fn, T, 1, 1, 128, 1, 1, 0, stream, (values, types), 0))
