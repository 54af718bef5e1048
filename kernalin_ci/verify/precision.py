"""The precision a launched kernel computes in, read from its compiled IR: float32 `tl.dot` on TF32.

Triton's default input precision for a float32 `tl.dot` is TF32 on NVIDIA GPUs: the operands keep
10 bits of mantissa, so a correct kernel's float32 outputs are off by far more than float32's own
rounding. The dynamic worker records the compiled kernels an entry launches (every JIT launch asks
its `CompiledKernel` for launch metadata; recording that call sees each launched kernel, autotuned
or not) and hands their TTIR texts back; the parent reads `tt.dot ... inputPrecision = tf32` on
float32 operands from them (`tf32_notice`, one rule for a single call and for each step of a decode
loop). What a dot computes in a float32 case on a GPU is then judged at TF32_TOLERANCE, with a notice
naming the dot's file:line. Under the interpreter (the CPU) dots are computed in float32 and nothing is
recorded.

The worker hands back texts, never a verdict, and the parent bounds what they can do: only on a GPU
(the parent's own device), only for a float32 case, only where a text it parses itself holds a TF32
dot on float32 operands, only for the outputs a dot computes (the attention output of a decode step,
never its caches or its rotated q/k), never below the tolerance the case had (`max`), and always with
the notice in the report. Texts missing or empty: the float32 tolerance.
"""

from __future__ import annotations

import contextlib
import functools
import os

from kernalin_ci.device import DEVICES
from kernalin_ci.findings import Location, Notice
from kernalin_ci.verify.exchange import BadResult
from kernalin_ci.verify.structural.ir_parser import parse_module

# Row error of a correct attention kernel whose q.k and p.v dots both run on TF32 (operands truncated
# to 10 mantissa bits), emulated over the default attention cases: 2.3e-3 at most, 1.1e-2 in the
# large-scores case (scores up to +-150: a 2^-10 error of a score moves its weight by ~10%).
# Rounding instead of truncating halves both. 1.5e-2 covers the worst with a margin.
TF32_TOLERANCE = 1.5e-2


@functools.lru_cache(maxsize=256)
def tf32_dots(ttir: str) -> tuple[Location, ...]:
    """Source locations of the float32 tl.dot ops that take TF32 inputs in one kernel's TTIR."""

    module = parse_module(ttir)
    found = []
    for fn in module.functions.values():
        for op in module.walk(fn):
            if op.name != "tt.dot" or op.attrs.get("inputPrecision") != "tf32":
                continue
            if not all(v.type.elem == "f32" for v in op.operands[:2]):
                continue
            frame = op.loc.user_frame()
            loc = Location(frame.path, frame.line) if frame else None
            if loc not in found:
                found.append(loc)
    return tuple(found)


@contextlib.contextmanager
def recorded_launches():
    """Yield a list that collects each compiled kernel launched inside the block (once each).

    Yields None when this Triton has no launch-metadata call to record (nothing can be said)."""
    try:
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        yield None
        return
    original = getattr(CompiledKernel, "launch_metadata", None)
    if original is None:
        yield None
        return
    kernels: list = []

    def record(self, *args, **kwargs):
        if not any(k is self for k in kernels):
            kernels.append(self)
        return original(self, *args, **kwargs)

    CompiledKernel.launch_metadata = record
    try:
        yield kernels
    finally:
        CompiledKernel.launch_metadata = original


def launched_ttir(kernels) -> list[str]:
    """The TTIR text of each recorded kernel (in the worker; the parent reads it: tf32_locations)."""
    out = []
    for k in kernels or ():
        ttir = getattr(k, "asm", {}).get("ttir") if hasattr(k, "asm") else None
        if ttir and isinstance(ttir, str):
            out.append(ttir)
    return out


def tf32_locations(ttirs: list[str]) -> list[Location | None]:
    """The TF32 dots of the launched kernels (their TTIR texts), in launch order."""
    out: list = []
    for ttir in ttirs:
        for loc in tf32_dots(ttir):
            if loc not in out:
                out.append(loc)
    return out


def where(loc: Location | None) -> str:
    return f"{loc.path}:{loc.line}" if loc else "an unknown line"


def tf32_notice(ttir: object, device: str, dtype: str, root: str | None, what: str = "float32") -> Notice | None:
    """In the parent: the notice that `what` (the outputs a dot computes) is judged at TF32_TOLERANCE, or
    None when it is not: `ttir` is what the worker handed back (the TTIR texts of the kernels the call
    launched), `device` and `dtype` the parent's own. Paths under `root` are made relative. BadResult
    (verify/exchange.py) when `ttir` is neither absent nor a list of texts."""

    texts = [] if ttir is None else ttir
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadResult("ttir: expected a list of texts")
    if not DEVICES[device].gpu or dtype != "float32" or not texts:
        return None
    found = tf32_locations(texts)
    if not found:
        return None
    loc = found[0]
    base = os.path.realpath(root or os.getcwd()) + os.sep
    if loc is not None and os.path.realpath(loc.path).startswith(base):
        loc = Location(os.path.realpath(loc.path)[len(base) :], loc.line)
    return Notice(
        "tf32",
        f"{what} judged at TF32 tolerance ({TF32_TOLERANCE:g}): tl.dot input precision tf32 at {where(loc)}",
        loc,
        kind="dynamic",
    )
