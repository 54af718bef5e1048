"""The places a decode step has for the gated kernels, defined once (docs/tokens.md, docs/ops.md "Decode
pipeline").

Each op names the place it fills (`Op.decode_role`). A step has three separate places, or one fused place
(a `decode_step` entry does the three at once). A place is filled by the ops that name it, a paged cache
first (what a serving engine keeps). The decode pipeline check runs the separate places as one loop over
one paged cache: kv_append and attention required, rope optional; its members are named by their op.
"""

from __future__ import annotations

import functools

from kernalin_ci.ops import NAMES, get_op

SEPARATE = ("attention", "rope", "kv_append")
FUSED = "decode_step"
ROLES = (*SEPARATE, FUSED)
PIPELINE = ("kv_append", "attention", "rope")  # the pipeline's members, in the order a step calls them
PIPELINE_REQUIRED = ("kv_append", "attention")


@functools.cache
def role_ops(role: str) -> tuple[str, ...]:
    """The ops that fill place `role`, a paged cache first."""

    ops = [op for op in (get_op(name) for name in NAMES) if op.decode_role == role]
    return tuple(op.name for op in sorted(ops, key=lambda op: not op.paged_cache))


def pipeline_op(role: str) -> str:
    """The op of a pipeline member: its place's op over a paged cache."""
    return role_ops(role)[0]
