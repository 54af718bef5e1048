"""The explanation as text (the gate's log, JUnit) and as a collapsed block of the PR comment."""

from __future__ import annotations

from kernalin_ci.explain.code import mix_text
from kernalin_ci.explain.model import Explanation
from kernalin_ci.explain.peak import peak_text
from kernalin_ci.explain.profile import profile_lines
from kernalin_ci.explain.provenance import provenance_text


def _na(x, unit: str = "") -> str:
    return "n/a" if x is None else f"{x}{unit}"


def _occ(f: dict) -> str:
    if f.get("occupancy") is None:
        return "n/a"
    return f"{f['occupancy']:.0%} ({f.get('occupancy_limited_by')})"


def why_lines(row: dict) -> list[str]:
    """One changed kernel, base -> head, as short lines."""
    b, h = row.get("base") or {}, row.get("head") or {}
    out = [
        f"{row['kernel']} (launch {row['launch']}, {row['shape']}): changed {', '.join(row['changed']) or 'code only'}"
    ]
    for label, key, fmt in (
        ("num_warps", "num_warps", _na),
        ("num_stages", "num_stages", _na),
        ("registers/thread", "registers", _na),
        ("spills (bytes)", "spill_bytes", _na),
        ("shared memory (bytes)", "shared_bytes", _na),
    ):
        out.append(f"  {label}: {fmt(b.get(key))} -> {fmt(h.get(key))}")
    out.append(f"  theoretical occupancy (sm_90): {_occ(b)} -> {_occ(h)}")
    bc, hc = b.get("constexprs") or {}, h.get("constexprs") or {}
    moved = {k: (bc.get(k), hc.get(k)) for k in set(bc) | set(hc) if bc.get(k) != hc.get(k)}
    if moved:
        out.append("  constexprs: " + ", ".join(f"{k} {x} -> {y}" for k, (x, y) in sorted(moved.items())))
    if b.get("autotuned") or h.get("autotuned"):
        out.append("  autotuned: every config compiled and compared (the one picked at run time is not known here)")
    out.append(f"  base: {mix_text(b.get('mix'))}")
    out.append(f"  head: {mix_text(h.get('mix'))}")
    return out


def explain_lines(ex: Explanation | None) -> list[str]:
    """The whole explanation of one kernel as plain lines."""
    if ex is None:
        return []
    if ex.error and not ex.made:
        return [f"explanation not available: {ex.error}"]
    out = []
    ident = ex.identity
    if ident is not None and ident.status == "not-compared":
        out.append(f"compiled code: not compared ({ident.cause})")
    elif ident is not None:
        same = [s.shape for s in ident.shapes if s.identical]
        n = len(ident.shapes)
        if ident.verdict:
            out.append(f"compiled code: {ident.verdict} at all {n} benchmark shapes; timing skipped")
        else:
            out.append(f"compiled code: identical at {len(same)} of {n} benchmark shapes")
            for s in ident.shapes:
                if not s.identical:
                    out.append(f"  {s.shape}: " + ("; ".join(s.differences or []) or "not compared"))
        if ident.toolchain_changed:
            out.append(f"toolchain changed (every shape timed): {'; '.join(ident.toolchain_changed)}")
    if ex.verdict and not (ident is not None and ident.verdict):
        out.append(str(ex.verdict))
    for row in ex.peak or []:
        if row.get("model"):
            out.append(f"% of peak, {row['shape']}: {row['model']}")
            continue
        for side in ("base", "head"):
            if row.get(side):
                out.append(f"{side} {row['shape']}: {peak_text(row[side])}")
    if ex.peak_note:
        out.append(ex.peak_note)
    for row in ex.why:
        out += why_lines(row)
    prov = ex.provenance
    if prov.start:
        out.append(f"ran on: {provenance_text(prov.start)}")
    if prov.end and prov.end.get("sm_clock_mhz") is not None:
        out.append(f"at the end: {provenance_text(prov.end)}")
    if prov.regime:
        r = prov.regime
        regime = f"{r['regime']}, " if r.get("regime") else ""
        flush = {True: "on", False: "off"}.get(r.get("l2_flush"), "n/a")
        out.append(
            f"timing regime: {regime}clock {r.get('clock')}, L2 flush {flush}, "
            f"{', '.join(r.get('timing') or []) or 'n/a'}, {r.get('reps')} reps"
        )
    if prov.changed:
        out.append(f"environment changed: {'; '.join(prov.changed)}")
    rc = ex.recheck
    if rc:
        if rc.get("findings"):
            out.append(f"correctness after timing: FAILED on {rc['case']} ({len(rc['findings'])} findings)")
        elif rc.get("error"):
            out.append(f"correctness after timing: {rc['error']}")
        else:
            out.append(f"correctness after timing: {rc.get('verdict')} on {rc['case']}")
    out += profile_lines(ex.profile)
    if ex.error:
        out.append(f"explanation incomplete: {ex.error}")
    return out


def explain_summary(ex: Explanation | None) -> str | None:
    """A few words for the gate's one-line summary."""
    if ex is None:
        return None
    ident = ex.identity
    if ident is not None and ident.verdict:
        return ident.verdict
    parts = []
    if ident is not None and ident.shapes:
        same = sum(1 for s in ident.shapes if s.identical)
        parts.append(f"{same}/{len(ident.shapes)} shapes identical code")
    if ex.above_peak:
        parts.append("above peak: measurement problem")
    rc = ex.recheck or {}
    if rc.get("findings"):
        parts.append("re-check after timing FAILED")
    return ", ".join(parts) or None


def explain_block(ex: Explanation | None) -> str | None:
    """A collapsed <details> block for the PR comment (markdown), or None."""
    lines = explain_lines(ex)
    if not lines:
        return None
    import html

    title = explain_summary(ex) or "details"
    body = "\n".join(lines)
    return (
        f"<details><summary>Why: {html.escape(title)}</summary>\n\n```text\n{body.replace('```', 'ʼʼʼ')}\n```"
        f"\n\n</details>\n\n"
    )
