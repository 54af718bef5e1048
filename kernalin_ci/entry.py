"""Load an entry (`path/to/file.py:function` or `package.module:function`).

Every entry is loaded *isolated*: the modules it imports from its own tree are
taken out of `sys.modules` again once it is loaded, so the same file (and its
sibling modules) from two checkouts, base and head, can be loaded side by side
in one process without one shadowing the other.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernalin_ci.errors import UsageError


@dataclass(frozen=True)
class EntrySpec:
    """A parsed entry: either a file path or a dotted module, and a function name."""

    raw: str
    target: str  # file path (as written) or dotted module name
    function: str
    is_file: bool

    def file_path(self, root: Path | None = None) -> Path | None:
        """The entry file, resolved against `root` (default: the current directory)."""
        if not self.is_file:
            return None
        p = Path(self.target)
        return p if p.is_absolute() else (root or Path.cwd()) / p


def parse_entry(spec: str) -> EntrySpec:
    if not isinstance(spec, str) or ":" not in spec:
        raise UsageError(f"entry {spec!r}: expected 'path/to/file.py:function' or 'package.module:function'")
    target, _, function = spec.rpartition(":")
    if not target or not function.isidentifier():
        raise UsageError(f"entry {spec!r}: expected 'path/to/file.py:function' or 'package.module:function'")
    is_file = target.endswith(".py") or "/" in target or os.sep in target
    if not is_file and not all(part.isidentifier() for part in target.split(".")):
        raise UsageError(f"entry {spec!r}: {target!r} is neither a .py file nor a dotted module name")
    return EntrySpec(spec, target, function, is_file)


def _gist(message: str) -> str:
    """A multi-line error in one line: its first line, and the first later line that names an error (an
    extension build's message is the compiler's command first, its diagnostic further down)."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    detail = next((ln for ln in lines[1:] if re.search(r"\berror\b", ln, re.IGNORECASE)), None)
    return f"{lines[0][:400]} ... {detail[:400]}" if detail else lines[0]


def load_entry(spec: str | EntrySpec, root: str | Path | None = None) -> Callable:
    """Import the entry and return its function.

    `root` is the directory that relative file paths and the entry's own imports
    resolve against (a repository root or a worktree); default: the current
    directory. Raises UsageError with one line for every way this can fail.
    """
    es = parse_entry(spec) if isinstance(spec, str) else spec
    root = Path(root).resolve() if root is not None else Path.cwd().resolve()
    if es.is_file:
        path = es.file_path(root).resolve()
        if not path.is_file():
            raise UsageError(f"entry {es.raw!r}: file not found: {path}")
        module = _import_isolated(es, root, path)
    else:
        module = _import_isolated(es, root, None)
    fn = getattr(module, es.function, None)
    if fn is None:
        where = path if es.is_file else es.target
        raise UsageError(f"entry {es.raw!r}: no function {es.function!r} in {where}")
    if not callable(fn):
        raise UsageError(f"entry {es.raw!r}: {es.function!r} is not callable")
    return fn


def _import_isolated(es: EntrySpec, root: Path, path: Path | None):
    search = [str(root)]
    if path is not None and str(path.parent) != str(root):
        search.insert(0, str(path.parent))
    before = set(sys.modules)
    old_path = list(sys.path)
    sys.path[:0] = search
    try:
        if path is not None:
            digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
            name = f"_kernalin_entry_{path.stem}_{digest}"
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses and pickling look the module up by name
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            module = importlib.import_module(es.target)
    except UsageError:
        raise
    except ModuleNotFoundError as e:
        if path is None and e.name and es.target.startswith(e.name):
            raise UsageError(f"entry {es.raw!r}: module {es.target!r} not found (searched {root})") from None
        raise UsageError(f"entry {es.raw!r}: importing it raised ModuleNotFoundError: {e}") from None
    except SystemExit as e:
        raise UsageError(f"entry {es.raw!r}: importing it called exit({e.code})") from None
    except BaseException as e:  # the user's code: any error is a load error
        raise UsageError(f"entry {es.raw!r}: importing it raised {type(e).__name__}: {_gist(str(e))}") from None
    finally:
        sys.path[:] = old_path
        _forget_tree_modules(before, [root] + ([path.parent] if path is not None else []), keep=path is not None)
    return module


def _forget_tree_modules(before: set[str], dirs: list[Path], keep: bool) -> None:
    """Drop modules newly imported from the entry's tree so another tree can import its own copies.

    Installed packages (anything under the interpreter's prefixes or a site-packages
    folder) are never dropped, even when a virtual environment lives inside the tree.
    """
    roots = tuple(str(d) + os.sep for d in dirs)
    installed = tuple(str(Path(p).resolve()) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    for name in set(sys.modules) - before:
        if name.startswith("_kernalin_entry_") and keep:
            continue  # the entry module itself stays registered (its name is unique per path)
        f = getattr(sys.modules.get(name), "__file__", None) or ""
        if not f:
            continue
        f = os.path.realpath(f)
        if "site-packages" in f or "dist-packages" in f or f.startswith(installed):
            continue
        if f.startswith(roots):
            del sys.modules[name]


def signature_mismatch(fn: Callable, names: list[str]) -> str | None:
    """Whether FN can be called with the keyword arguments NAMES (an op's inputs, in the op's order): None
    when it can (or when its signature cannot be read: a builtin, an odd callable), else what is wrong,
    e.g. "missing q, k (the entry has no parameter of that name); unexpected query, key (the op passes no
    argument of that name)". Defaults and **kwargs are honoured: an entry may take more than the op passes
    when those have defaults, and anything at all with **kwargs."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    accepted = {p.name for p in params if p.kind in named}
    required = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and (p.kind in named or p.kind is inspect.Parameter.POSITIONAL_ONLY)
        and not (p.kind in named and p.name in names)
    ]
    missing = [] if takes_any else [n for n in names if n not in accepted]
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing)} (the entry has no parameter of that name)")
    if required:
        parts.append(f"unexpected {', '.join(required)} (required by the entry, but no input of that name)")
    return "; ".join(parts) or None
