"""Argument helpers shared by subcommands."""

from __future__ import annotations

import ctypes
import json
import sys

from kernalin_ci.bench.stats import ROPE_MIN
from kernalin_ci.device import CPU, CUDA, DEVICES
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
    """The name of the run's Device (kernalin_ci/device.py). Default: the GPU when one is visible, else the
    CPU. An unknown name, or a GPU device without a visible GPU, is exit 2."""
    if requested is not None and requested not in DEVICES:
        raise UsageError(f"--device {requested}: expected one of {', '.join(DEVICES)}")
    if requested is not None and not DEVICES[requested].gpu:
        return requested
    has_gpu = visible_gpus() > 0
    if requested is not None and not has_gpu:
        raise UsageError(f"--device {requested}: no CUDA GPU is visible")
    return requested or (CUDA if has_gpu else CPU).name


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


def add_margin_arguments(p, fixed_help: str = "") -> None:
    """--margin and --margin-min: the equivalence margin of the benchmark verdicts (the statistics' region of
    practical equivalence, docs/statistics.md), and their old names --rope / --rope-min, which still work
    with one warning on stderr."""
    import argparse

    p.add_argument(
        "--margin",
        metavar="FRACTION",
        help="fix the equivalence margin: a change of head/base within +-FRACTION counts as equivalent "
        "(0.01 = +-1%%)" + fixed_help,
    )
    p.add_argument("--margin-min", metavar="FRACTION", help="smallest equivalence margin (default 0.005 = +-0.5%%)")

    class Deprecated(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            new = "--margin" if self.dest == "margin" else "--margin-min"
            print(
                f"{parser.prog}: warning: {option_string} is deprecated: use {new} (the equivalence margin)",
                file=sys.stderr,
            )
            setattr(namespace, self.dest, values)

    p.add_argument("--rope", dest="margin", metavar="FRACTION", action=Deprecated, help=argparse.SUPPRESS)
    p.add_argument("--rope-min", dest="margin_min", metavar="FRACTION", action=Deprecated, help=argparse.SUPPRESS)


def margins(args) -> tuple[float | None, float]:
    """(--margin or None, --margin-min or the default) as fractions: the `rope` and `rope_min` of the
    statistics (kernalin_ci.bench.stats)."""

    return (
        fraction(args.margin, "margin") if args.margin is not None else None,
        fraction(args.margin_min, "margin_min") if args.margin_min is not None else ROPE_MIN,
    )


def fraction(text: str, setting: str) -> float:
    """A margin as written: a fraction in [0, 1) (UsageError naming SETTING otherwise)."""
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"{setting} {text}: expected a fraction such as 0.01", setting=setting) from None
    if not 0.0 <= v < 1.0:
        raise UsageError(f"{setting} {text}: expected a fraction in [0, 1), e.g. 0.01 for +-1%", setting=setting)
    return v
