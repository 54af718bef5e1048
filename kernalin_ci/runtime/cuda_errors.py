"""A CUDA error, recognised in an exception's type name and message: it poisons the context, so the
worker reports it (a `cuda-error` finding) and exits instead of running the next case."""

from __future__ import annotations

import re

CUDA_ERROR = re.compile(
    r"CUDA error|illegal memory access|unspecified launch failure|misaligned address|"
    r"device-side assert|AcceleratorError|cudaErrorIllegalAddress",
    re.I,
)
