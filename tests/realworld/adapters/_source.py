"""Load one production module from the fetched corpus (`tests/realworld/fetch.py`).

The tree is the `src/` folder beside this file's folder when there is one (a mutant's tree:
`.cache/realworld/mutants/<kernel>/` holds `src/` with the mutated files and `adapters/`, a copy of
these adapters), else the extracted originals in `.cache/realworld/src/`. `stubs` stands in for the few
package utilities a module imports (our own few lines, e.g. `is_hip`), so no serving stack has to be
installed; they are removed from `sys.modules` again once the module is loaded. `package` names the
package a module's relative imports resolve against (`from .utils import ...`: stub `package.utils`).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


def source_root() -> Path:
    beside = HERE.parent / "src"
    return beside if beside.is_dir() else originals_root()


def originals_root() -> Path:
    """The extracted originals (`.cache/realworld/src/`), from an adapter in the repository or in a mutant's tree
    (`.cache/realworld/mutants/<kernel>/adapters/`): what no mutant changes (vendored headers) is read there."""
    if (HERE.parent / "src").is_dir():
        return HERE.parents[2] / "src"
    return HERE.parents[2] / ".cache" / "realworld" / "src"


def load(dist: str, member: str, stubs: dict[str, dict] | None = None, package: str = "") -> types.ModuleType:
    path = source_root() / dist / member
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `python tests/realworld/fetch.py` first")
    added = []
    for modname, attrs in (stubs or {}).items():
        parts = modname.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                sys.modules[name] = types.ModuleType(name)
                added.append(name)
        for a, value in attrs.items():
            setattr(sys.modules[modname], a, value)
    name = "_realworld_" + member.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if package:
        module.__package__ = package
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        for n in added:
            sys.modules.pop(n, None)
    return module
