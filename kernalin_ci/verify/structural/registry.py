"""Which structural analysis an op names (`Op.structural`: a module of this package defining `ANALYSIS`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kernalin_ci.ops.base import Op

if TYPE_CHECKING:
    from kernalin_ci.verify.structural.common import Analysis


def analysis_of(op: Op) -> Analysis | None:
    """The structural analysis the op names (`Op.structural`), or None when it has none."""
    if op.structural is None:
        return None
    analysis: Analysis = importlib.import_module(f"kernalin_ci.verify.structural.{op.structural}").ANALYSIS
    return analysis
