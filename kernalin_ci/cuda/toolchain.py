"""Where the CUDA tools are. The compiler: KERNALIN_NVCC, else the `nvidia-cuda-nvcc` package's (pip install
'kernalin-ci[cuda]': it needs no GPU), else CUDA_HOME's, else `nvcc` on PATH. Compute Sanitizer:
KERNALIN_COMPUTE_SANITIZER, else `compute-sanitizer` on PATH, else CUDA_HOME's or /usr/local/cuda's."""

from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

ENV_NVCC = "KERNALIN_NVCC"
ENV_SANITIZER = "KERNALIN_COMPUTE_SANITIZER"
# where the CUDA wheels put their binaries, below a site-packages folder (CUDA 13: nvidia/cu13; 12: per package)
WHEEL_BIN = ("nvidia/cu13/bin", "nvidia/cuda_nvcc/bin")


def _site_dirs() -> list[str]:
    dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # a virtualenv's old site module
        pass
    return list(dict.fromkeys(dirs))


def _cuda_homes() -> list[Path]:
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    return [Path(h) for h in homes if h] + [Path("/usr/local/cuda")]


def nvcc() -> str | None:
    """The CUDA compiler to build with, or None."""
    env = os.environ.get(ENV_NVCC, "").strip()
    if env:
        return env if os.access(env, os.X_OK) else None
    for d in _site_dirs():
        for sub in WHEEL_BIN:
            p = Path(d) / sub / "nvcc"
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    for home in _cuda_homes()[:-1]:
        p = home / "bin" / "nvcc"
        if p.is_file():
            return str(p)
    found = shutil.which("nvcc")
    if found:
        return found
    default = _cuda_homes()[-1] / "bin" / "nvcc"
    return str(default) if default.is_file() else None


@functools.lru_cache(maxsize=8)
def nvcc_version(path: str) -> str:
    """`nvcc --version`'s last line ('Build cuda_13.0.r13.0/compiler.36424714_0'): part of a build's key."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown"


def compute_sanitizer() -> str | None:
    """The compute-sanitizer binary, or None."""
    env = os.environ.get(ENV_SANITIZER, "").strip()
    if env:
        return env if os.access(env, os.X_OK) else None
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in _cuda_homes():
        for p in (home / "compute-sanitizer" / "compute-sanitizer", home / "bin" / "compute-sanitizer"):
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    return None


def install_dir(binary: str) -> str:
    """The folder a tool's installation lives in (bound read-only into the worker sandbox with it)."""
    real = Path(os.path.realpath(binary)).parent
    return str(real.parent if real.name == "bin" else real)
