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


def positive_seconds(text: str) -> float:
    """argparse type of a --timeout: a positive number of seconds (a bad value: argparse's one line, exit 2)."""
    import argparse
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return v


def at_least_one(text: str) -> int:
    """argparse type of a count that must be at least 1 (--reps)."""
    import argparse

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def output_dir(path: str, flag: str = "--out"):
    """The folder PATH, made if needed (before any work, so a bad --out costs nothing): a file in its
    place, or a folder that cannot be made, is a UsageError naming FLAG."""
    from pathlib import Path

    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {path}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot make the folder: {e.strerror or e}") from None
    return out


def write_text(path: str, text: str, flag: str) -> None:
    """Write TEXT to the file PATH a user named with FLAG (--markdown): an OSError is one line."""
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise UsageError(f"{flag} {path}: {e.strerror or e}") from None
