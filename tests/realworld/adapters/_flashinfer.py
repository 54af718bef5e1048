"""FlashInfer's CUDA kernels behind our own launchers (flashinfer_decode.cu, flashinfer_rope.cu): built with nvcc
for this GPU against the headers of the fetched distribution (the mutant's when the adapter runs from a mutant
tree: _source.source_root()), once per source hash (kernalin_ci.cuda.build.build_shared), and called through
ctypes on torch's current stream.

FlashInfer builds against the CCCL it ships (flashinfer/data/cccl), searched before the toolkit's (its JIT puts
it first with -I): its headers use what the toolkit's CCCL may not have yet (`cuda::fast_mod_div` is in CCCL 3.5
and 3.6, not in nvcc 13.0's CCCL 3.0), so we do the same (manifest `vendored_include`)."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from _source import originals_root, source_root

from kernalin_ci.cuda.build import build_shared

HERE = Path(__file__).resolve().parent
DIST = "flashinfer-python-0.7.2.post1"
FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr")
VENDORED = ("flashinfer/data/cccl/libcudacxx/include",)  # the manifest's vendored_include


def include_dir() -> Path:
    return source_root() / DIST / "flashinfer" / "data" / "include"


def include_flags() -> tuple[str, ...]:
    """-I of the vendored CCCL (first: ahead of the toolkit's), then of FlashInfer's headers."""
    return (*(f"-I{originals_root() / DIST / v}" for v in VENDORED), f"-I{include_dir()}")


@functools.cache
def library(source: str) -> ctypes.CDLL:
    return ctypes.CDLL(build_shared([HERE / source], (*FLAGS, *include_flags())))


def ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def call(fn, *args) -> None:
    """FN(*ARGS, stream, err, size); a failure is raised with FlashInfer's own message."""
    err = ctypes.create_string_buffer(1024)
    if fn(*args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), err, len(err)) != 0:
        raise RuntimeError(err.value.decode(errors="replace"))


def half_only(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype != torch.float16:
            raise TypeError(f"this build of the kernel takes float16, not {t.dtype}")
