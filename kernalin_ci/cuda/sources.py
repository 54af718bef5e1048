"""A kernel's CUDA C++ sources and build flags: `cuda: {sources: [...], flags: [...]}` of a kernel in
.kernalin.yml, or `verify --cuda-source FILE --cuda-flag FLAG`."""

from __future__ import annotations

import glob
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from kernalin_ci.errors import UsageError

SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".inl")
KEYS = ("sources", "flags")


@dataclass(frozen=True)
class CudaSpec:
    """SOURCES: the .cu files the entry builds (repository-relative paths or globs); FLAGS: the compiler
    flags it builds them with (an `-I DIR` is also where the diff looks for the headers they include)."""

    sources: tuple[str, ...]
    flags: tuple[str, ...] = ()

    def include_dirs(self) -> list[str]:
        """The folders of the flags' -I options, as written (relative ones are the repository root's)."""
        out, flags = [], list(self.flags)
        for i, f in enumerate(flags):
            if f == "-I" and i + 1 < len(flags):
                out.append(flags[i + 1])
            elif f.startswith("-I") and len(f) > 2:
                out.append(f[2:])
            elif f.startswith("--include-path="):
                out.append(f.split("=", 1)[1])
        return out

    def files(self, root: Path) -> list[Path]:
        """The source files at ROOT (globs expanded, sorted; only files inside ROOT)."""
        out: set[Path] = set()
        base = root.resolve()
        for pattern in self.sources:
            for name in glob.glob(str(base / pattern), recursive=True):
                p = Path(name).resolve()
                if p.is_file() and (p == base or base in p.parents):
                    out.add(p)
        return sorted(out)

    def to_json(self) -> dict:
        return {"sources": list(self.sources), "flags": list(self.flags)}

    @classmethod
    def from_json(cls, d: dict | None) -> CudaSpec | None:
        return cls(tuple(d.get("sources") or ()), tuple(d.get("flags") or ())) if d else None


def parse(value, setting: str = "cuda") -> CudaSpec:
    """`cuda:` as written in a configuration: {sources: [FILE|GLOB, ...], flags: [FLAG, ...] | "FLAGS"}."""
    if not isinstance(value, dict):
        raise UsageError(f"{setting}: expected a mapping with sources and flags", setting=setting)
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise UsageError(f"{setting}.{unknown[0]}: unknown key (allowed: {', '.join(KEYS)})", setting=setting)
    sources = value.get("sources")
    sources = [sources] if isinstance(sources, str) else sources
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) and s for s in sources):
        raise UsageError(f"{setting}.sources: expected a non-empty list of .cu files or globs", setting=setting)
    for s in sources:
        if os.path.isabs(s) or ".." in Path(s).parts:
            raise UsageError(f"{setting}.sources: {s!r} is not a path inside the repository", setting=setting)
    flags = value.get("flags", [])
    if isinstance(flags, str):
        flags = shlex.split(flags)
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise UsageError(f"{setting}.flags: expected a list of compiler flags", setting=setting)
    return CudaSpec(tuple(sources), tuple(flags))
