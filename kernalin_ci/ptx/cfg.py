"""The control-flow graph of a kernel: where lanes split by a branch meet again."""

from __future__ import annotations

from kernalin_ci.ptx.syntax import PtxKernel


def post_dominators(k: PtxKernel) -> dict[int, int]:
    """For each conditional forward branch, the index of its immediate post-dominator: the first
    instruction every path from the branch reaches (where split lanes meet again); none when a path
    returns first."""
    instrs = k.instrs
    n = len(instrs)
    leaders = {0} | set(k.labels.values()) | {i + 1 for i, x in enumerate(instrs) if x.opcode in ("bra", "ret", "exit")}
    starts = sorted(x for x in leaders if x < n)
    block_of = {}
    for bi, st in enumerate(starts):
        end = starts[bi + 1] if bi + 1 < len(starts) else n
        for i in range(st, end):
            block_of[i] = bi
    succ: list[list[int]] = []
    for bi in range(len(starts)):
        last = (starts[bi + 1] if bi + 1 < len(starts) else n) - 1
        x = instrs[last]
        out = []
        if x.opcode == "bra":
            out.append(block_of[k.labels[x.operands[0]]])
            if x.guard is not None and last + 1 < n:
                out.append(block_of[last + 1])
        elif x.opcode in ("ret", "exit") and x.guard is None:
            pass
        elif last + 1 < n:
            out.append(block_of[last + 1])
        succ.append(out)
    nb = len(starts)
    every = (1 << nb) - 1
    pdom = [every] * nb
    changed = True
    while changed:
        changed = False
        for b in reversed(range(nb)):
            new = every
            for c in succ[b]:
                new &= pdom[c]
            new = (new if succ[b] else 0) | (1 << b)
            if new != pdom[b]:
                pdom[b], changed = new, True
    out = {}
    for bi in range(len(starts)):
        last = (starts[bi + 1] if bi + 1 < len(starts) else n) - 1
        x = instrs[last]
        if x.opcode != "bra" or x.guard is None or k.labels[x.operands[0]] <= last:
            continue
        later = pdom[bi] & ~(1 << bi)
        cands = [c for c in range(bi + 1, nb) if later >> c & 1]
        if cands:
            out[last] = starts[min(cands)]  # the nearest: forward code, so the lowest block
    return out
