"""The repository headers a CUDA source includes: `#include "..."` lines, followed transitively, resolved as
the compiler does for the quoted form (the including file's folder first, then each -I folder), and kept only
inside the repository. `#include <...>` names the system's and the toolkit's headers: not followed."""

from __future__ import annotations

import re
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def included_files(root: Path, source: Path, include_dirs: list[str] = ()) -> set[Path]:
    """Every repository file SOURCE includes, directly or through another header (SOURCE itself not counted)."""
    base = root.resolve()
    dirs = [(base / d).resolve() for d in include_dirs]
    found: set[Path] = set()
    todo = [source.resolve()]
    while todo:
        path = todo.pop()
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for name in INCLUDE.findall(_without_comments(text)):
            for folder in [path.parent, *dirs]:
                cand = (folder / name).resolve()
                if cand.is_file() and (base == cand or base in cand.parents):
                    if cand not in found and cand != source.resolve():
                        found.add(cand)
                        todo.append(cand)
                    break
    return found


def _without_comments(text: str) -> str:
    """The text with /* */ and // comments blanked (an include in a comment is not one)."""
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def kernel_files(root: Path, spec) -> set[str]:
    """Repository-relative paths of the spec's sources and every header they include, at ROOT."""
    base = root.resolve()
    out: set[str] = set()
    for src in spec.files(base):
        out.add(str(src.relative_to(base)))
        out |= {str(p.relative_to(base)) for p in included_files(base, src, spec.include_dirs())}
    return out
