"""The ops of docs/ops.md, one module each (a subclass of `base.Op` named by its `OP_CLASS`);
`get_op(name)` is the registry."""

from __future__ import annotations

import importlib

from kernalin_ci.errors import UsageError
from kernalin_ci.ops.base import Op
from kernalin_ci.ops.names import MODULES, NAMES

__all__ = ["MODULES", "NAMES", "get_op"]


def get_op(name: str, root: str | None = None) -> Op:
    """A new instance of op `name`. `root`: the directory user callables named in its params resolve
    against (the custom op's reference and inputs; None: the current directory)."""
    if name not in MODULES:
        raise UsageError(f"unknown op {name!r} (ops: {', '.join(NAMES)})")
    op: Op = importlib.import_module(f"kernalin_ci.ops.{MODULES[name]}").OP_CLASS(root)
    return op
