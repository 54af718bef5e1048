"""The ops of docs/ops.md, one module each; `get_op(name)` is the registry."""
from __future__ import annotations

import importlib

from kernalin_ci.errors import UsageError

MODULES = {
    "attention.decode": "attention_decode",
    "attention.decode_paged": "attention_decode_paged",
    "rope": "rope",
    "kv_append": "kv_append",
    "custom": "custom",
}
NAMES = tuple(MODULES)


def get_op(name: str):
    if name not in MODULES:
        raise UsageError(f"unknown op {name!r} (ops: {', '.join(NAMES)})")
    return importlib.import_module(f"kernalin_ci.ops.{MODULES[name]}").OP


def written(op, params: dict) -> tuple[str, ...]:
    """The inputs an entry of this op may write."""
    fn = getattr(op, "written_names", None)
    return tuple(fn(params)) if fn else tuple(op.written)
