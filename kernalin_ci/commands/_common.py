"""Argument helpers shared by subcommands."""

from __future__ import annotations

import ctypes
import json
import sys

from kernalin_ci.errors import UsageError


def parse_params(items: list[str] | None) -> dict:
    """--param K=V ...: values stay strings unless they are JSON lists/objects (ops coerce them)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--param {item!r}: expected KEY=VALUE")
        v = value.strip()
        if v[:1] in "[{":
            try:
                value = json.loads(v)
            except json.JSONDecodeError as e:
                raise UsageError(f"--param {key}: not valid JSON: {e}") from None
        out[key] = value
    return out


def resolve_device(requested: str | None) -> str:
    """Default: cuda when a GPU is visible, else cpu. --device cuda without a GPU is exit 2."""
    if requested == "cpu":
        return "cpu"
    has_gpu = visible_gpus() > 0
    if requested == "cuda" and not has_gpu:
        raise UsageError("--device cuda: no CUDA GPU is visible")
    return "cuda" if has_gpu else "cpu"


def visible_gpus() -> int:
    """CUDA devices the driver reports (CUDA_VISIBLE_DEVICES applies), asked of libcuda directly:
    importing torch for this would cost the CLI process about 3 s; only the workers need torch."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    n = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return 0
    return n.value


def write_json(obj, dest: str | None) -> None:
    """--json PATH writes a file, --json - writes stdout."""
    if dest is None:
        return
    text = json.dumps(obj, indent=2) + "\n"
    if dest == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:
            with open(dest, "w") as f:
                f.write(text)
        except OSError as e:
            raise UsageError(f"--json {dest}: {e.strerror}") from None
