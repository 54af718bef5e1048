"""The plain-data result of a structural analysis, shared by both engines (analyse.py, ptx_run.py)."""

from __future__ import annotations

import os
import traceback


def structural_result(
    rep,
    kernels,
    times,
    root,
    not_analysed: str | None = None,
    shape: str | None = None,
    proved: list[str] | None = None,
) -> dict:
    """The plain-data result of one entry's analysis (either engine): its findings, notices, kernels, seconds
    and status; source paths under `root` (default: the current directory) made relative to it."""
    base = os.path.realpath(root or os.getcwd()) + os.sep
    for item in rep.findings + rep.notices:
        if item.location is not None:
            p = os.path.realpath(item.location.path)
            if p.startswith(base):
                item.location.path = p[len(base) :]
    status = (
        {"status": "not-analysed", "cause": not_analysed, "shape": None}
        if not_analysed
        else {
            "status": "analysed",
            "cause": None,
            "shape": shape,
            "proved": list(proved or []),
            "gaps": [f"{prop}: {why}" for prop, why in rep.gaps.items()],
        }
    )
    return {
        "findings": [f.to_json() for f in rep.findings],
        "notices": [n.to_json() for n in rep.notices],
        "kernels": kernels,
        "seconds": {k: round(v, 4) for k, v in times.items()},
        "status": status,
    }


def analysis_failure(e: BaseException) -> str:
    """One line for an unexpected exception of the analysis: its type, message and where in kernalin-ci
    it was raised (for a bug report)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "kernalin_ci" in f.filename]
    where = f" at {ours[-1].filename.rsplit('kernalin_ci', 1)[-1].lstrip('/')}:{ours[-1].lineno}" if ours else ""
    msg = " ".join(str(e).split())[:200]
    return f"{type(e).__name__}: {msg}{where} (a kernalin-ci limitation: please report it)"
