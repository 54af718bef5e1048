"""FlashInfer's CUDA kernels behind our own launchers (flashinfer_decode.cu, flashinfer_rope.cu): built with nvcc
for this GPU against the headers of the fetched distribution (the mutant's when the adapter runs from a mutant
tree: _source.source_root()), once per source hash (kernalin_ci.cuda.build.build_shared), and called through
ctypes on torch's current stream."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from _source import source_root

from kernalin_ci.cuda.build import build_shared

HERE = Path(__file__).resolve().parent
DIST = "flashinfer-python-0.7.2.post1"
FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr")


def include_dir() -> Path:
    return source_root() / DIST / "flashinfer" / "data" / "include"


@functools.cache
def library(source: str) -> ctypes.CDLL:
    return ctypes.CDLL(build_shared([HERE / source], (*FLAGS, f"-I{include_dir()}")))


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
