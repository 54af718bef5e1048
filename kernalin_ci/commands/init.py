"""kernalin-ci init: write a commented starter .kernalin.yml."""

from __future__ import annotations

from pathlib import Path

from kernalin_ci.config import DEFAULT_FILE, STARTER
from kernalin_ci.errors import UsageError

NAME = "init"
HELP = "write a commented starter .kernalin.yml"
ORDER = 40


def add_arguments(p):
    p.add_argument("--path", default=DEFAULT_FILE, help=f"where to write it (default {DEFAULT_FILE})")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")


def run(args) -> int:
    path = Path(args.path)
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists (use --force to overwrite)")
    path.write_text(STARTER)
    print(f"wrote {path}: list your kernels under 'kernels', then run `kernalin-ci run`")
    return 0
