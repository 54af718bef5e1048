"""tune's outputs: the terminal table, tune.json and tune.md (plain text from a TuneResult)."""

from __future__ import annotations

from kernalin_ci.report.text import verdict_interval


def _verdict_cell(j, name: str) -> str:
    v = j.vs_reference.get(name)
    if v is None:
        return "reference"
    return f"{v.verdict} {verdict_interval(v, 3)}"


def rows(result) -> list[list[str]]:
    """Per shape: shape, best config, best ms, reference ms, posterior of best vs reference, equivalents."""
    out = []
    for j in result.judgements:
        shape = result.shapes[j.shape]["shape"] if j.shape < len(result.shapes) else str(j.shape)
        eq = ", ".join(result.label(n) for n in j.equivalent) or "-"
        out.append(
            [
                shape,
                result.label(j.best),
                f"{j.ms[j.best]:.4g}",
                f"{j.ms[result.reference]:.4g}",
                _verdict_cell(j, j.best),
                f"+-{100 * j.rope:.2f}%",
                eq,
            ]
        )
    return out


HEADER = [
    "shape",
    "best verified config",
    "ms",
    "reference ms",
    "best vs reference (ratio, 95% HDI)",
    "equivalence margin",
    "equivalent within the margin",
]


def table(result) -> str:
    lines = []
    t = result.target
    ref = result.label(result.reference) if result.reference else "-"
    lines.append(
        f"TUNE {t.name or t.entry} ({t.op}) on {result.device}: {len(result.space.candidates)} candidates, "
        f"{len(result.dropped)} failed verification, reference: {ref}"
    )
    for c in result.dropped:
        first = c.finding_lines()[0] if c.findings else c.note
        lines.append(f"  dropped  {c.candidate.label}: {first}")
    for c in result.checked:
        if c.passed is None:
            lines.append(f"  not checked  {result.label(c.candidate.name)}: {c.note}")
    rs = rows(result)
    if rs:
        widths = [max(len(h), *(len(r[i]) for r in rs)) for i, h in enumerate(HEADER)]
        lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(HEADER, widths)))
        for r in rs:
            lines.append("  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)))
    lines.append(f"  chosen for every shape: {result.label(result.chosen)}")
    clock = "GPU" if result.clock == "cuda-events" else "CPU wall-clock"
    rs_ = result.race_setup
    split = f"setup {rs_['seconds']:.1f} s + {rs_.get('rounds', 0)} rounds, " if "seconds" in rs_ else ""
    lines.append(
        f"  verification {result.verify_seconds:.1f} s; race {result.race_seconds:.1f} s ({split}{clock}, budget "
        f"{result.budget_s:g} s, {len(result.rungs)} screening rungs, {result.final_rounds} final rounds, "
        f"stopped: {result.stopped}); {result.seconds:.1f} s in all"
    )
    for n in result.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines)


def to_json(result, patch=None, why: str = "") -> dict:
    labels = {c.name: c.label for c in result.space.candidates} | {"current": result.label("current")}
    t = result.target
    return {
        "kernel": t.name or None,
        "op": t.op,
        "entry": t.entry,
        "device": result.device,
        "clock": result.clock,
        "space": {
            "params": {
                k: sorted({c.params[k] for c in result.space.candidates}, key=str) for k in result.space.current.params
            },
            "autotune": result.space.autotuned,
            "current": result.space.current.to_json(),
            "candidates": len(result.space.candidates),
        },
        "verification": [c.to_json() for c in result.checked],
        "dropped": [
            {"name": c.candidate.name, "label": c.candidate.label, "findings": c.finding_lines(), "note": c.note}
            for c in result.dropped
        ],
        "reference": result.reference,
        "shapes": result.shapes,
        "per_shape": [j.to_json(labels) for j in result.judgements],
        "chosen": result.chosen,
        "chosen_label": result.label(result.chosen),
        "rungs": result.rungs,
        "final_rounds": result.final_rounds,
        "stopped": result.stopped,
        "verify_seconds": result.verify_seconds,
        "race_seconds": result.race_seconds,
        "race_setup": result.race_setup,
        "seconds": result.seconds,
        "budget_s": result.budget_s,
        "notes": result.notes,
        "timed": result.timed,
        "patch": {"path": patch.path, "diff": patch.diff} if patch else None,
        "patch_note": why or None,
    }


def markdown(result, patch=None, why: str = "") -> str:
    t = result.target
    out = [
        f"## kernalin-ci tune: {t.name or t.entry}",
        "",
        f"`{t.op}` `{t.entry}` on {result.device}: {len(result.space.candidates)} candidates, "
        f"{len(result.dropped)} failed verification and were never timed.",
        "",
    ]
    if result.dropped:
        out += ["| dropped config | finding |", "|---|---|"]
        for c in result.dropped:
            text = "<br>".join(c.finding_lines()) if c.findings else c.note
            out.append(f"| `{c.candidate.label}` | {text.replace('|', '/')} |")
        out.append("")
    rs = rows(result)
    if rs:
        out += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        out += ["| " + " | ".join(x.replace("|", "/") for x in r) + " |" for r in rs]
        out.append("")
    out.append(
        f"Chosen for every shape: `{result.label(result.chosen)}`. Reference: `{result.label(result.reference)}`."
    )
    out.append("")
    out.append(
        f"Verification {result.verify_seconds:.1f} s, race {result.race_seconds:.1f} s "
        f"({result.clock or 'no timing'}), stopped: {result.stopped}."
    )
    for n in result.notes:
        out.append(f"- {n}")
    if patch:
        out += ["", "```diff", patch.diff.rstrip("\n"), "```"]
    elif why:
        out += ["", f"No patch: {why}."]
    return "\n".join(out) + "\n"


__all__ = ["table", "to_json", "markdown"]
