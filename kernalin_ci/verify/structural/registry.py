"""Which structural analysis an op names (`Op.structural`: a module of this package defining `ANALYSIS`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kernalin_ci.ops.base import Op, Params

if TYPE_CHECKING:
    from kernalin_ci.verify.structural.common import Analysis


def analysis_of(op: Op) -> Analysis | None:
    """The structural analysis the op names (`Op.structural`), or None when it has none."""
    if op.structural is None:
        return None
    analysis: Analysis = importlib.import_module(f"kernalin_ci.verify.structural.{op.structural}").ANALYSIS
    return analysis


def not_modelled(op: Op, params: Params) -> str | None:
    """The structural status's cause when PARAMS switch on what the op's analysis does not model
    (`Op.unanalysed`: its checks would judge the kernel by a definition without these features); None when
    they switch on nothing of the kind. One rule for `verify` and the in-process analysis alike."""
    features = op.unanalysed(params)
    if not features:
        return None
    them = "them" if len(features) > 1 else "it"
    return f"not analysed for {', '.join(features)}: the structural analysis does not model {them}"
