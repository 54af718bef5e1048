"""The build caches of CUDA code, kept where the worker sandbox keeps Triton's (sandbox.compile_cache): one
folder per worker view (what the worker sees: base and head see different checkouts, so they never share a
build directory), shared by every worker of that view in the run, seeded into each and copied back after it.

torch.utils.cpp_extension builds into TORCH_EXTENSIONS_DIR, CuPy into CUPY_CACHE_DIR, and kernalin-ci's own
builds (PTX, NVRTC: build.py, nvrtc.py) into KERNALIN_CUDA_CACHE; each keys its builds by the source's hash."""

from __future__ import annotations

import os

ENV_CACHE = "KERNALIN_CUDA_CACHE"


def cache_env(folder: str) -> dict[str, str]:
    """The environment that puts every CUDA build cache of a worker under FOLDER."""
    return {
        "TORCH_EXTENSIONS_DIR": os.path.join(folder, "torch_extensions"),
        "CUPY_CACHE_DIR": os.path.join(folder, "cupy"),
        ENV_CACHE: os.path.join(folder, "kernalin-cuda"),
    }


def cache_dir() -> str:
    """kernalin-ci's own CUDA build cache in this process (a worker's is set by its parent)."""
    path = os.environ.get(ENV_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernalin-ci", "cuda"
    )
    os.makedirs(path, exist_ok=True)
    return path
