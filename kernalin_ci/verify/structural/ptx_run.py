"""The PTX engine in the structural pipeline (parent side): material in, findings, notices and status out.

The worker hands back each launch's PTX and a twin call (material.py, task.py: engine "ptx");
ptx_facts.py turns them into launch facts; kernalin_ci.ptx proves the properties. A violated property is
a finding whose message carries the counterexample (block, lane, shape symbols, index values); a property
the engine cannot decide, or a kernel it cannot follow, is a notice and makes the status "not analysed"
for that kernel, never a pass. The proved properties, with their domain, are listed in the result.
"""

from __future__ import annotations

import re
import time

from kernalin_ci import ptx as engine
from kernalin_ci.ops import get_op
from kernalin_ci.ptx import solver
from kernalin_ci.ptx.syntax import PtxSyntaxError, parse
from kernalin_ci.verify.structural import ptx_facts
from kernalin_ci.verify.structural.capture import capture_cases
from kernalin_ci.verify.structural.common import StructuralFindings
from kernalin_ci.verify.structural.ptx_facts import FactsError
from kernalin_ci.verify.structural.result import structural_result


def analyse_ptx(
    op_name: str, mat, params: dict, root: str | None = None, seconds: dict | None = None, domain=None
) -> dict:

    rep = StructuralFindings()
    times = {"capture": 0.0, "compile": 0.0, **(seconds or {}), "prove": 0.0}

    op = get_op(op_name)
    if op.structural is None:  # an op with no structural analysis has no PTX properties either
        return structural_result(rep, [], times, root, not_analysed=f"no PTX properties for op {op_name}")
    if not solver.available():
        return structural_result(rep, [], times, root, not_analysed="no solver (the PTX engine needs z3-solver)")
    cap = mat.capture
    if cap is None:
        return structural_result(
            rep, [], times, root, not_analysed=mat.refused[0] if mat.refused else "no capture call"
        )
    kernels, unfollowed, proved = [], [], []
    host_filled = ptx_facts.host_filled(cap)
    max_position = getattr(domain, "max_position", None)
    for la, text in zip(cap.launches, mat.ptx or [""] * len(cap.launches)):
        where = (la.path, la.line)
        if not text:
            unfollowed.append(f"kernel {la.kernel}: no PTX")
            continue
        t0 = time.perf_counter()
        try:
            n_params = len(parse(text).params)
            facts, contract = ptx_facts.build(op, params, cap, la, mat.twin, n_params, max_position)
        except (FactsError, PtxSyntaxError) as e:
            rep.notice("structural:ptx-facts", f"PTX engine: kernel {la.kernel} not analysed: {e}", where=where)
            unfollowed.append(f"kernel {la.kernel}: {e}")
            continue
        out = engine.analyse(text, facts, contract)
        times["prove"] += time.perf_counter() - t0
        kernels.append({"kernel": la.kernel, "seconds": {k: round(v, 4) for k, v in out.seconds.items()}})
        if out.not_analysed:
            rep.notice(
                "structural:ptx-engine", f"PTX engine: kernel {la.kernel} not analysed: {out.not_analysed}", where=where
            )
            unfollowed.append(f"kernel {la.kernel}: {out.not_analysed}")
            continue
        for r in out.results:
            at = (r.where.file, r.where.line) if r.where is not None and r.where.file else where
            if r.status == "proved":
                proved.append(f"{la.kernel}: {r.name}")
            elif r.status == "violated" and (through := _through_host_data(r, host_filled)):
                cause = (
                    f"its counterexample goes through {through}, a tensor the entry filled on the host (a copy or "
                    "gather of its inputs): the PTX engine does not relate its size or elements to the op's inputs"
                )
                rep.notice("structural:ptx-proof", f"PTX engine: not proved: {r.name} ({cause})", where=at)
            elif r.status == "violated":
                n = len(rep.findings)
                rep.finding(_check(r), r.bug_class or "stray-write", _message(r), where=at)
                if len(rep.findings) > n:
                    case = replay_case(op, params, mat, r.counterexample, domain)
                    if case is not None:
                        rep.findings[-1].case = case.to_json()
                    else:  # too large to run, or values the op's cases cannot say (verify replays the others)
                        rep.findings[-1].message += "; not replayed (no case of the op at these values)"
            else:
                rep.notice("structural:ptx-proof", f"PTX engine: not proved: {r.name} ({r.cause})", where=at)
    shape = f"{mat.label}; PTX: {len(proved)} properties proved" if proved else mat.label
    res = structural_result(
        rep, kernels, times, root, not_analysed="; ".join(unfollowed) or None, shape=shape, proved=proved
    )
    res["proved"] = proved  # also beside the status: tests and benchmarks/ptx_bench.py read it there
    return res


def replay_case(op, params: dict, mat, counterexample: dict, domain=None):
    """The op case that replays a counterexample (Op.counterexample_case): the capture case with the
    counterexample's shape symbols and index values; None when the op's cases cannot say it."""
    if mat.shape is None:
        return None
    cases = capture_cases(op, params, domain)
    if mat.shape >= len(cases):
        return None
    shape: dict[str, int] = {}
    index: dict[str, dict[tuple[int, ...], int]] = {}
    for k, v in counterexample.items():
        m = re.fullmatch(r"(\w+)\[([\d, ]+)\]", k)
        if m:
            index.setdefault(m.group(1), {})[tuple(int(x) for x in m.group(2).split(","))] = int(v)
        elif not k.startswith(("ctaid.", "__")) and not re.fullmatch(r"k\d+", k):
            shape[k] = int(v)
    return op.counterexample_case(cases[mat.shape], params, shape, index)


def _through_host_data(r, host_filled: set[str]) -> str | None:
    """The host-filled scratch tensor a violated property's counterexample assigns (its size or an element) or
    its cause names (a cache store of its elements), if any: a counterexample over values the entry derived
    from its inputs on the host (`key[slot_mapping >= 0]`) that the facts leave free is no counterexample."""
    for name in sorted(host_filled):
        word = re.compile(rf"\b{re.escape(name)}\b")
        if any(word.match(k) for k in r.counterexample) or word.search(r.cause or ""):
            return name
    return None


def _check(r) -> str:
    """The check id of a violated property (written whole: grep finds it here)."""
    if r.name.endswith("in bounds"):
        return "structural:ptx-bounds"
    if r.bug_class in ("softmax-no-max", "scale", "online-rescale", "softmax-no-normalize", "split-combine"):
        return "structural:ptx-softmax"
    if r.bug_class in ("rope-pairing", "rope-passthrough", "rope-sign", "rope-position", "rope-frequency", "precision"):
        return "structural:ptx-rope"
    if r.bug_class in ("stride", "gqa-mapping", "paged-index", "kv-mask", "unmasked-load"):
        return "structural:ptx-kv-reads"
    if r.bug_class == "shared-race":
        return "structural:ptx-races"
    if r.bug_class in ("step-order", "new-token-twice"):
        return "structural:ptx-step-order"
    return "structural:ptx-cache-store"


def _message(r) -> str:
    cx = ", ".join(f"{k}={v}" for k, v in r.counterexample.items() if not re.fullmatch(r"k\d+", k))  # not loop k
    lane = f", thread {r.lane}" if r.lane is not None else ""
    more = f": {r.cause}" if r.cause else ""
    return f"PTX engine: violated: {r.name}{more} (counterexample{lane}: {cx or 'any'}; domain {r.domain})"
