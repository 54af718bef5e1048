"""The PR comment (report.md), the Actions step summary and the one-line headline.

Layout (docs/report.md): the headline; one line of context (refs, device, counts); one table with a
row per checked kernel and per pipeline (failing rows first); then a section per checked kernel and
pipeline (verification, benchmark verdict in words, the posterior chart, the findings in a
collapsible block with each case and its reproduce command); the unchanged and removed kernels; and
the command that re-runs the whole gate.

GitHub refuses a comment over 65536 characters. The headline, context line, table and reproduce
command always stay; the sections below the table are filled in order while they fit, then cut at a
finding boundary (a collapsible block is always closed) with a note saying how much was left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernalin_ci.findings import BUG_CLASSES, Finding, Notice
from kernalin_ci.report.chart import posterior_chart
from kernalin_ci.report.model import KernelReport, PipelineReport, Report
from kernalin_ci.report.text import (
    MARGIN_LEGEND,
    SPEED_TRUST,
    benchmark_ok,
    bug_classes,
    case_summary,
    clip,
    code,
    code_block,
    config_change_text,
    config_origin_text,
    coverage_text,
    effect,
    hdi_text,
    html_text,
    isolation_text,
    location_text,
    mass_sentence,
    md,
    measurement_note,
    not_checked_texts,
    plural,
    prob,
    ratio_text,
    rope_text,
    structural_text,
    verdict_phrase,
)
from kernalin_ci.report.tokens import markdown_section

COMMENT_MAX_CHARS = 65536  # GitHub's limit for an issue or pull-request comment body
# The publisher prepends the sticky-comment marker (one HTML comment line); leave it room.
COMMENT_LIMIT = COMMENT_MAX_CHARS - 536
STEP_SUMMARY_LIMIT = 500_000  # characters; GitHub's step summary limit is 1 MiB of UTF-8
NOTE_RESERVE = 400  # room kept for the truncation note
MESSAGE_MAX = 2000  # one finding's message in the comment (report.json has it whole)
REPRODUCE_MAX = 4000  # a longer command is referred to report.json rather than cut (a cut command is wrong)
MAX_HEADLINE_ITEMS = 3
MAX_CLASSES = 6
NAME_MAX = 200  # a kernel, op or pipeline name as shown (report.json has it whole)

ICON = {"success": "✅", "failure": "❌", "neutral": "➖"}
WORD = {"success": "passed", "failure": "failed", "neutral": "neutral"}


# ---------------------------------------------------------------------------------------- helpers


def checked_kernels(report: Report) -> list[KernelReport]:
    """The kernels the gate checked (changed or new), in report order."""
    return [k for k in report.kernels if k.status not in ("unchanged", "removed")]


def _findings(item: KernelReport | PipelineReport) -> list[Finding]:
    return list(item.verification.findings) if item.verification is not None else []


def _notices(item: KernelReport | PipelineReport) -> list[Notice]:
    return list(item.verification.notices) if item.verification is not None else []


def _error(item: KernelReport | PipelineReport) -> str | None:
    if isinstance(item, KernelReport) and item.error:
        return item.error
    v = item.verification
    return v.error if v is not None and v.error else None


def _name(s: object, *, table: bool = False) -> str:
    return code(clip(str(s), NAME_MAX), table=table)


def _classes(findings: list[Finding], markdown: bool, table: bool = False, counts: bool = False) -> str:
    cls = bug_classes(findings)
    shown = []
    for c, n in cls[:MAX_CLASSES]:
        s = code(c, table=table) if markdown else c
        shown.append(s + (f" ×{n}" if counts and n > 1 else ""))
    if len(cls) > MAX_CLASSES:
        shown.append(f"{len(cls) - MAX_CLASSES} more")
    return ", ".join(shown)


def _failure_phrase(item: KernelReport | PipelineReport, markdown: bool) -> str:
    """What one failing kernel or pipeline failed by, e.g. '2 findings (softmax-no-max, kv-mask)'."""
    parts = []
    b = getattr(item, "benchmark", None)
    for why in item.failed_by:
        if why == "finding":
            fs = _findings(item)
            parts.append(f"{plural(len(fs), 'finding')} ({_classes(fs, markdown)})")
        elif why == "slower":
            parts.append(effect(b.verdict) if benchmark_ok(b) else "slower")
        elif why == "inconclusive":
            parts.append("benchmark inconclusive")
        elif why == "error":
            parts.append("error")
        else:
            parts.append(md(why) if markdown else why)
    return ", ".join(parts)


def _failing(report: Report) -> list[KernelReport | PipelineReport]:
    return [k for k in report.kernels if k.failed_by] + [p for p in report.pipelines if p.failed_by]


def headline(report: Report, *, markdown: bool = False) -> str:
    """The gate result in one line, e.g. '❌ kernalin-ci: failed — decode_attention: 2 findings
    (softmax-no-max, kv-mask)'. Plain text by default (a check run title); MARKDOWN puts names in
    code spans."""
    c = report.conclusion
    icon, word = ICON.get(c, "❔"), WORD.get(c, c)

    def name(x) -> str:
        return _name(x.name) if markdown else clip(x.name, NAME_MAX)

    if c == "failure":
        bad = _failing(report)
        parts = [f"{name(x)}: {_failure_phrase(x, markdown)}" for x in bad[:MAX_HEADLINE_ITEMS]]
        if len(bad) > MAX_HEADLINE_ITEMS:
            parts.append(f"and {len(bad) - MAX_HEADLINE_ITEMS} more")
        rest = "; ".join(parts) or (md(report.reason) if markdown else report.reason)
    elif c == "success":
        checked = checked_kernels(report)
        if not checked:
            rest = "no kernel changed"
        else:
            rest = f"{plural(len(checked), 'kernel')} verified"
            notable = [
                f"{name(k)} {effect(k.benchmark.verdict)}"
                for k in checked
                if benchmark_ok(k.benchmark)
                and k.benchmark_note is None
                and k.benchmark.verdict.verdict in ("faster", "slower")
            ]
            if notable:
                rest += "; " + ", ".join(notable[:MAX_HEADLINE_ITEMS])
                if len(notable) > MAX_HEADLINE_ITEMS:
                    rest += f" and {len(notable) - MAX_HEADLINE_ITEMS} more"
        if report.pipelines:
            rest += f"; {plural(len(report.pipelines), 'pipeline')} checked"
    else:
        rest = md(report.reason) if markdown else report.reason
    line = f"{icon} kernalin-ci: {word} — {rest}" if rest else f"{icon} kernalin-ci: {word}"
    return line.replace("\n", " ")


# ---------------------------------------------------------------------------------------- head


def _ref(side: dict | None) -> str:
    side = side or {}
    ref, sha = side.get("ref"), side.get("sha")
    if ref and sha and not str(sha).startswith(str(ref)):
        return f"{code(ref)} ({code(str(sha)[:12])})"
    return code(str(sha or ref or "?")[:40])


def _context(report: Report) -> str:
    checked = checked_kernels(report)
    parts = [
        f"base {_ref(report.base)} → head {_ref(report.head)}",
        f"device {code(report.device)}",
        f"{len(checked)} of {plural(len(report.kernels), 'kernel')} checked",
    ]
    if report.pipelines:
        parts.append(plural(len(report.pipelines), "pipeline"))
    if report.removed:
        parts.append(f"{len(report.removed)} removed")
    fail_on = (report.policy or {}).get("fail_on")
    if fail_on:
        parts.append("fails on: " + ", ".join(md(x) for x in fail_on))
    if report.seconds:
        parts.append(f"{report.seconds:.0f} s")
    return "<sub>" + " · ".join(parts) + "</sub>"


def _trust(report: Report) -> str:
    """Where the gate's configuration came from, what this pull request changes in it (a notice, louder where
    a change loosens the gate), the isolation its kernel code ran under, and which verdicts it can sway."""
    out = []
    origin = report.configuration
    if origin is not None and origin.changes:
        lines = [f"> - {md(config_change_text(c))}" for c in origin.changes]
        head = [c for c in origin.changes if c.by == "head"]
        if head and origin.source == "base":
            lines.insert(0, "> This pull request changes the gate's configuration; it takes effect after merge.")
        kind = "WARNING" if origin.loosened else "NOTE"
        out.append(f"> [!{kind}]\n" + "\n".join(lines) + "\n")
    parts = []
    if origin is not None:
        parts.append(f"configuration: {md(config_origin_text(origin))}")
    if report.isolation is not None:
        parts.append(f"kernel code ran {md(isolation_text(report.isolation))}")
    if checked_kernels(report) and any(k.benchmark is not None for k in report.kernels):
        parts.append(md(SPEED_TRUST))
    if parts:
        out.append("<sub>" + " · ".join(parts) + "</sub>\n")
    return "\n".join(out) + ("\n" if out else "")


TABLE_HEADER = (
    "| | kernel | op | change | verification | benchmark | head/base | 95% HDI | P(faster) | margin |\n"
    "|:-:|---|---|---|---|---|--:|--:|--:|--:|"
)


def _verification_cell(item) -> str:
    v = item.verification
    fs = _findings(item)
    if fs:
        return f"{plural(len(fs), 'finding')}: {_classes(fs, True, table=True, counts=True)}"
    if _error(item):
        return "error (below)"
    if v is None:
        return "—"
    word = "**not checked** (needs a GPU)" if v.verdict == "not-checked" else "pass"  # never a pass: docs/cuda.md
    cell = f"{word} · {plural(v.cases_run, 'case')}"
    if _notices(item):
        cell += f" · {plural(len(_notices(item)), 'notice')}"
    if v.not_checked:
        cell += f" · {plural(len(v.not_checked), 'shape')} not checked"
    if v.structural.status == "not-analysed":
        cell += " · **structure not analysed**"
    elif v.structural.gaps:
        cell += f" · **{plural(len(v.structural.gaps), 'structural gap')}**"
    return cell


def _benchmark_cells(k: KernelReport) -> list[str]:
    b = k.benchmark
    note = f"<br><sub>{md(clip(k.benchmark_note, 200))}</sub>" if k.benchmark_note else ""
    if b is not None and not benchmark_ok(b):
        what = "benchmark failed" if b.error else "incomplete verdict"
        return [f"**{what}** (below)" + note, "—", "—", "—", "—"]
    if b is None:
        return [md(clip(k.benchmark_note, 200)) if k.benchmark_note else "—", "—", "—", "—", "—"]
    v = b.verdict
    word = effect(v)
    if "slower" in k.failed_by or "inconclusive" in k.failed_by:
        word = f"**{word}**"
    return [word + note, ratio_text(v.ratio), hdi_text(v.hdi), prob(v.p_faster), rope_text(v.rope)]


def _row(item) -> str:
    icon = "❌" if item.failed_by else "✅"
    if isinstance(item, KernelReport):
        cells = [
            icon,
            _name(item.name, table=True),
            _name(item.op, table=True),
            md(item.status),
            _verification_cell(item),
            *_benchmark_cells(item),
        ]
    else:
        members = " → ".join(_name(n, table=True) for n in (item.members or {}).values())
        cells = [
            icon,
            _name(item.name, table=True),
            "pipeline",
            members,
            _verification_cell(item),
            "—",
            "—",
            "—",
            "—",
            "—",
        ]
    return "| " + " | ".join(cells) + " |"


def _table(rows: list[str], room: int) -> str:
    """The table, all rows when they fit ROOM (always, in practice); else as many as fit and a count."""
    out, used = [TABLE_HEADER], len(TABLE_HEADER) + 1
    for i, r in enumerate(rows):
        if used + len(r) + 1 > room - 120:
            rest = len(rows) - i
            out.append(f"| | … | {plural(rest, 'more row')}: see report.json | | | | | | | |")
            break
        out.append(r)
        used += len(r) + 1
    return "\n".join(out)


def _footer(report: Report) -> str:
    if not report.reproduce:
        return ""
    if len(report.reproduce) > REPRODUCE_MAX:  # never print a cut command: it would run something else
        return (
            f"Reproduce the whole gate locally: the command ({len(report.reproduce)} characters) is in report.json.\n"
        )
    return "**Reproduce the whole gate locally:**\n\n" + code_block(report.reproduce, "sh") + "\n"


# ---------------------------------------------------------------------------------------- sections


@dataclass
class _Section:
    """One kernel's or pipeline's block: an intro, optional extras (chart, notices), findings to collapse."""

    intro: str
    extras: list[str]
    findings: list[str]  # one markdown item per finding
    summary: str  # the collapsed findings' <summary> line (plain text)


def _verification_line(item) -> str | None:
    v = item.verification
    fs = _findings(item)
    if v is None or (not fs and v.error):
        return None
    where = (
        [] if v.error else [plural(v.cases_run, "case"), f"{v.seconds:.1f} s"] + ([md(v.device)] if v.device else [])
    )
    ctx = f" ({', '.join(w for w in where if w)})" if where else ""
    if not fs and v.verdict == "not-checked":
        return f"- **Verification:** **not checked** (needs a GPU: no case ran, never a pass){ctx}."
    if not fs:
        return f"- **Verification:** passed{ctx}."
    meaning = "; ".join(
        f"{code(c)}{f' ×{n}' if n > 1 else ''}: {md(BUG_CLASSES.get(c, 'unknown class'))}"
        for c, n in bug_classes(fs)[:MAX_CLASSES]
    )
    more = f"; and {len(bug_classes(fs)) - MAX_CLASSES} more classes" if len(bug_classes(fs)) > MAX_CLASSES else ""
    return f"- **Verification:** failed, {plural(len(fs), 'finding')}{ctx}. {meaning}{more}."


def _benchmark_line(k: KernelReport) -> str | None:
    b = k.benchmark
    note = f" *{md(clip(k.benchmark_note, 500))}*" if k.benchmark_note else ""
    if benchmark_ok(b):
        m = measurement_note(b)
        phrase = f"{verdict_phrase(b.verdict)}. {mass_sentence(b.verdict)}"
        return f"- **Benchmark:** {phrase}" + (f" <sub>{m}</sub>" if m else "") + note
    if b is not None and b.error:
        return f"- **Benchmark:** failed, no verdict: {md(clip(str(b.error), MESSAGE_MAX))}" + note
    if b is not None:
        return "- **Benchmark:** the verdict in report.json is incomplete." + note
    return f"- **Benchmark:**{note}" if note else None


def _finding_item(i: int, f: Finding) -> str:
    """A Finding as a markdown item: finding_text's parts (report/text.py), in markdown."""
    head = f"**{i}. {code(f.bug_class)}** · {md(f.kind)} check {code(f.check)}"
    loc = location_text(f.location)
    if loc:
        head += f" · {code(loc)}"
    lines = [head, "", md(clip(str(f.message), MESSAGE_MAX))]
    case = case_summary(f.case)
    if case:
        lines += ["", f"Case: {code(clip(case, 1000))}"]
    rep = f.reproduce
    if rep and len(rep) <= REPRODUCE_MAX:
        lines += ["", "Reproduce:", "", code_block(rep, "sh")]
    elif rep:
        lines += ["", f"Reproduce: the command is {len(rep)} characters long; it is in report.json."]
    return "\n".join(lines) + "\n\n"


def _domain_lines(item) -> list[str]:
    """The structural status, the coverage and what was not checked, as list items."""
    v = item.verification
    if v is None:
        return []
    lines = []
    st = structural_text(v)
    if st and v.structural.status == "analysed":
        shape = f" at {v.structural.shape}" if v.structural.shape else ""
        lines.append(f"- **Structural:** analysed{md(shape)}.")
        if v.structural.proved:
            lines.append(f"  - proved: {md(clip(', '.join(v.structural.proved), 500))}")
        lines += [f"  - **not verified:** {md(clip(g, 300))}" for g in v.structural.gaps[:10]]
    elif st:
        lines.append(f"- **Structural:** **{md(clip(st, 600))}**.")
    lines += _cuda_lines(v)
    cov = coverage_text(v)
    if cov:
        lines.append(f"- **Coverage:** {md(cov)}.")
    nc = not_checked_texts(v)
    if nc:
        lines.append(
            f"- **Not checked:** {plural(len(nc), 'shape')} outside the kernel's domain or the "
            f"interpreter's reach (never a finding):"
        )
        lines += [f"  - {md(clip(t, 500))}" for t in nc[:10]]
        if len(nc) > 10:
            lines.append(f"  - … {len(nc) - 10} more in report.json")
    return lines


def _cuda_lines(v) -> list[str]:
    """A CUDA C++ kernel's build and Compute Sanitizer's run (docs/cuda.md), where the result has them."""
    lines = []
    if v.build:
        b = v.build
        sources = ", ".join(b.get("sources") or []) or "no source"
        lines.append(
            f"- **CUDA build:** {md(b.get('status', '?'))} ({md(clip(sources, 300))}, {md(b.get('arch', '?'))})."
        )
    san = v.sanitizer
    if san.status == "checked":
        lines.append(f"- **Compute Sanitizer:** {md(san.summary())}.")
    elif san.status == "not-checked":
        lines.append(f"- **Compute Sanitizer:** **{md(san.summary())}**.")
    return lines


def _notices_block(item) -> str | None:
    ns = _notices(item)
    if not ns:
        return None
    items = []
    for n in ns[:20]:
        loc = location_text(n.location)
        items.append(f"- {code(n.check)}{' at ' + code(loc) if loc else ''}: {md(clip(str(n.message), 500))}")
    if len(ns) > 20:
        items.append(f"- … {len(ns) - 20} more in report.json")
    return (
        f"<details><summary>{plural(len(ns), 'notice')}: checks that could not decide "
        f"(they never fail the gate)</summary>\n\n" + "\n".join(items) + "\n\n</details>\n\n"
    )


def _kernel_section(k: KernelReport) -> _Section:
    icon = "❌" if k.failed_by else "✅"
    lines = [f"#### {icon} {_name(k.name)} · {_name(k.op)} · {md(k.status)}", ""]
    if k.reasons:
        lines += [f"<sub>{md(clip('; '.join(k.reasons), 500))}</sub>", ""]
    if k.failed_by:
        lines.append(f"- **Fails the gate on:** {', '.join(md(x) for x in k.failed_by)}.")
    vl = _verification_line(k)
    if vl:
        lines.append(vl)
    lines += _domain_lines(k)
    bl = _benchmark_line(k)
    if bl:
        lines.append(bl)
    err = _error(k)
    if err:
        lines.append(f"- **Error:** {md(clip(err, MESSAGE_MAX))}")
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.explain.render import explain_block

    extras = [
        x
        for x in (
            posterior_chart(k.benchmark.verdict) if benchmark_ok(k.benchmark) else None,
            explain_block(k.explain),
            _notices_block(k),
        )
        if x
    ]
    extras = [x if x.endswith("\n\n") else x + "\n\n" for x in extras]
    fs = _findings(k)
    return _Section(
        "\n".join(lines) + "\n\n",
        extras,
        [_finding_item(i + 1, f) for i, f in enumerate(fs)],
        f"{plural(len(fs), 'finding')}: {_classes(fs, False)}",
    )


def _pipeline_section(p: PipelineReport) -> _Section:
    icon = "❌" if p.failed_by else "✅"
    members = " → ".join(f"{md(role)} {_name(n)}" for role, n in (p.members or {}).items())
    lines = [f"#### {icon} pipeline {_name(p.name)}", "", f"<sub>{members}</sub>", ""]
    vl = _verification_line(p)
    if vl:
        lines.append(vl)
    err = _error(p)
    if err:
        lines.append(f"- **Error:** {md(clip(err, MESSAGE_MAX))}")
    fs = _findings(p)
    extras = [x for x in (_notices_block(p),) if x]
    return _Section(
        "\n".join(lines) + "\n\n",
        extras,
        [_finding_item(i + 1, f) for i, f in enumerate(fs)],
        f"{plural(len(fs), 'finding')}: {_classes(fs, False)}",
    )


def _others(report: Report) -> list[str]:
    out = []
    unchanged = [k for k in report.kernels if k.status == "unchanged"]
    if unchanged:
        names = ", ".join(
            f"{_name(k.name)} ({_name(k.op)}{': ' + md(clip('; '.join(k.reasons), 500)) if k.reasons else ''})"
            for k in unchanged
        )
        out.append(
            f"<details><summary>{plural(len(unchanged), 'unchanged kernel')} (not checked)</summary>"
            f"\n\n{names}\n\n</details>\n\n"
        )
    if report.removed:
        out.append(
            "Removed by this pull request (no longer checked): " + ", ".join(_name(n) for n in report.removed) + "\n\n"
        )
    return out


# ---------------------------------------------------------------------------------------- assembly


class _Budget:
    def __init__(self, room: int):
        self.room, self.parts = room, []
        self.cut_findings = self.cut_blocks = 0

    def take(self, s: str) -> bool:
        if len(s) > self.room:
            return False
        self.parts.append(s)
        self.room -= len(s)
        return True


def _fill(budget: _Budget, sections: list[_Section], others: list[str]) -> None:
    for sec in sections:
        if not budget.take(sec.intro):
            budget.cut_blocks += 1 + len(sec.extras)
            budget.cut_findings += len(sec.findings)
            continue
        for x in sec.extras:
            if not budget.take(x):
                budget.cut_blocks += 1
        if not sec.findings:
            continue
        opener = f"<details><summary>{html_text(sec.summary)}</summary>\n\n"
        closer = "</details>\n\n"
        note_room = 120
        if budget.room < len(opener) + len(closer) + note_room + 200:
            budget.cut_findings += len(sec.findings)
            continue
        budget.take(opener)
        budget.room -= len(closer) + note_room
        shown = 0
        for item in sec.findings:
            if not budget.take(item):
                break
            shown += 1
        budget.room += len(closer) + note_room
        if shown < len(sec.findings):
            rest = len(sec.findings) - shown
            budget.cut_findings += rest
            budget.take(f"*… {plural(rest, 'more finding')} not shown here: see report.json.*\n\n")
        budget.take(closer)
    for x in others:
        if not budget.take(x):
            budget.cut_blocks += 1


def render_markdown(report: Report, *, limit: int = COMMENT_LIMIT) -> str:
    """The PR comment for REPORT, at most LIMIT characters (the default leaves room under GitHub's
    65536 for the sticky-comment marker)."""
    top = f"### {headline(report, markdown=True)}\n\n{_context(report)}\n\n{_trust(report)}"
    footer = _footer(report)
    items = (
        _failing(report)
        + [k for k in checked_kernels(report) if not k.failed_by]
        + [p for p in report.pipelines if not p.failed_by]
    )
    rows = [_row(x) for x in items]
    fixed = len(top) + len(footer) + NOTE_RESERVE + 4
    table = _table(rows, limit - fixed) + "\n\n" if rows else ""
    if any(isinstance(x, KernelReport) and benchmark_ok(x.benchmark) for x in items):
        table += f"<sub>{MARGIN_LEGEND}</sub>\n\n"
    budget = _Budget(limit - fixed - len(table))
    sections = [_kernel_section(x) if isinstance(x, KernelReport) else _pipeline_section(x) for x in items]
    throughput = markdown_section(report.model)  # decode tokens/s and $/Mtok (report/tokens.py)
    if throughput and not budget.take(throughput):
        budget.cut_blocks += 1
    _fill(budget, sections, _others(report))
    note = ""
    if budget.cut_findings or budget.cut_blocks:
        what = []
        if budget.cut_findings:
            what.append(plural(budget.cut_findings, "finding"))
        if budget.cut_blocks:
            what.append(plural(budget.cut_blocks, "other block"))
        note = (
            f"> [!NOTE]\n> This report was shortened to stay under {limit} characters (GitHub takes at most "
            f"{COMMENT_MAX_CHARS} in a comment): {' and '.join(what)} not shown. The full report is in the "
            f"job's output (report.json).\n\n"
        )
    out = top + table + "".join(budget.parts) + note + footer
    return out[:limit] if len(out) > limit else out  # a guard only: the budget keeps it under


def render_step_summary(report: Report) -> str:
    """Markdown for $GITHUB_STEP_SUMMARY: the comment's layout with room for every finding."""
    return render_markdown(report, limit=STEP_SUMMARY_LIMIT)
