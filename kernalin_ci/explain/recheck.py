"""Correctness after timing: one timed shape of the head, checked again against the float64 reference
through the verify worker (a fresh child, the reference from the op's definition). A finding fails the
gate like any verification finding."""

from __future__ import annotations

import json

from kernalin_ci.errors import UsageError
from kernalin_ci.verify import verify


def smallest(op, params: dict, cases: list):
    """The timed case with the least traffic (the cheapest reference), or the first."""

    def size(c):
        t = op.traffic(c, params)
        return t.bytes if t is not None else 0

    return min(cases, key=size) if cases else None


def recheck(k, op_name: str, case, device: str, head_root: str) -> dict:
    """Run `case` through the verify worker at head -> {"case", "verdict", "findings", "error"}."""

    out = {"case": case.name, "verdict": None, "findings": [], "error": None}
    try:
        vr = verify(
            op_name,
            k.entry,
            k.params,
            device,
            root=head_root,
            case_json=json.dumps(case.to_json()),
            timeout_s=k.timeout,
            progress=False,
            raw_domain=k.domain,
        )
    except UsageError as e:
        out["error"] = str(e)
        return out
    j = vr.to_json()
    out["verdict"] = j.get("verdict")
    out["findings"] = j.get("findings", [])
    if j.get("not_checked"):
        out["error"] = "not checked: " + "; ".join(n.get("error", "") for n in j["not_checked"])[:300]
    return out
