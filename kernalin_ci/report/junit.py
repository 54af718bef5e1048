"""JUnit XML for CI systems other than GitHub (GitLab, Jenkins, Buildkite read it).

One <testsuite name="kernalin-ci"> for the gate, inside <testsuites>. A <testcase> per kernel
(classname = the op, name = the kernel name): a checked kernel that failed the gate carries one
<failure> (findings, a slower or inconclusive benchmark) or one <error> (an infrastructure failure);
an unchanged or removed kernel is <skipped>. A testcase per decode pipeline (classname "pipeline").
Every checked testcase has a <system-out> with the verification summary and the benchmark verdict
in words; the suite's <properties> hold the conclusion, refs, device and policy.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from kernalin_ci.report.markdown import checked_kernels, headline
from kernalin_ci.report.model import KernelReport, PipelineReport, Report
from kernalin_ci.report.text import (
    benchmark_ok,
    bug_classes,
    coverage_text,
    finding_text,
    mass_sentence,
    measurement_note,
    not_checked_texts,
    notice_text,
    plural,
    structural_text,
    verdict_exact,
    verdict_phrase,
    xml_text,
)

SUITE = "kernalin-ci"


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrs) -> ET.Element:
    e = ET.SubElement(parent, tag, {k: xml_text(v) for k, v in attrs.items() if v is not None})
    if text is not None:
        e.text = xml_text(text)
    return e


def _findings(item) -> list:
    return list(item.verification.findings) if item.verification is not None else []


def _benchmark_text(k: KernelReport) -> str | None:
    b = k.benchmark
    parts = []
    if benchmark_ok(b):
        m, v = measurement_note(b), b.verdict
        parts.append(f"benchmark: {verdict_phrase(v)}. {mass_sentence(v)}" + (f" ({m})" if m else ""))
        parts.append(verdict_exact(v))
    elif b is not None and b.error:
        parts.append(f"benchmark failed, no verdict: {b.error}")
    if k.benchmark_note:
        parts.append(f"benchmark note: {k.benchmark_note}")
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.explain.render import explain_lines

    parts += [f"why: {line}" for line in explain_lines(k.explain)]
    return "\n".join(parts) or None


def _verification_text(item) -> str:
    v = item.verification
    if v is None:
        return "verification: none"
    fs = _findings(item)
    ctx = "" if v.error else ", ".join(x for x in (plural(v.cases_run, "case"), f"{v.seconds:.1f} s", v.device) if x)
    line = f"verification: {v.verdict}" + (f" ({ctx})" if ctx else "")
    if fs:
        line += "; " + ", ".join(f"{c} x{n}" for c, n in bug_classes(fs))
    for label, text in (("structural", structural_text(v)), ("coverage", coverage_text(v))):
        if text:
            line += f"\n{label}: {text}"
    for text in not_checked_texts(v):
        line += f"\nnot checked: {text}"
    for n in v.notices:
        line += f"\nnotice: {notice_text(n)}"
    return line


def _failure_body(item) -> tuple[str, str]:
    """(message, text) of the <failure> or <error> element."""
    parts, msgs = [], []
    err = item.error if isinstance(item, KernelReport) else item.verification.error if item.verification else None
    if err:
        msgs.append(f"error: {err.splitlines()[0] if err.strip() else err}")
        parts.append(f"error: {err}")
    fs = _findings(item)
    if fs:
        msgs.append(f"{plural(len(fs), 'finding')}: " + ", ".join(c for c, _ in bug_classes(fs)))
        parts += [finding_text(f) for f in fs]
    if (
        isinstance(item, KernelReport)
        and benchmark_ok(item.benchmark)
        and ({"slower", "inconclusive"} & set(item.failed_by))
    ):
        msgs.append(f"benchmark {verdict_phrase(item.benchmark.verdict)}")
        parts.append(_benchmark_text(item) or "")
    if not msgs:
        msgs.append("failed: " + ", ".join(item.failed_by))
    return "; ".join(msgs), "\n\n".join(parts)


def _testcase(suite: ET.Element, classname: str, name: str, seconds: float) -> ET.Element:
    return _el(suite, "testcase", classname=classname, name=name, time=f"{max(seconds or 0.0, 0.0):.3f}")


def render_junit(report: Report) -> str:
    """The gate as JUnit XML (a UTF-8 string with its XML declaration)."""
    root = ET.Element("testsuites", {"name": SUITE})
    suite = _el(root, "testsuite", name=SUITE)
    props = _el(suite, "properties")
    policy = report.policy or {}
    for name, value in (
        ("conclusion", report.conclusion),
        ("headline", headline(report)),
        ("reason", report.reason),
        ("base", (report.base or {}).get("ref")),
        ("base.sha", (report.base or {}).get("sha")),
        ("head", (report.head or {}).get("ref")),
        ("head.sha", (report.head or {}).get("sha")),
        ("device", report.device),
        ("repo", report.repo),
        ("pr", report.pr),
        ("fail_on", ",".join(policy.get("fail_on") or [])),
        ("rope", policy.get("rope")),
        ("reproduce", report.reproduce),
        ("schema", report.schema),
    ):
        if value not in (None, ""):
            _el(props, "property", name=name, value=str(value))

    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    checked = {id(k) for k in checked_kernels(report)}

    def outcome(tc: ET.Element, item: KernelReport | PipelineReport) -> None:
        if item.failed_by:
            message, text = _failure_body(item)
            tag = "error" if "error" in item.failed_by else "failure"
            counts["errors" if tag == "error" else "failures"] += 1
            _el(tc, tag, text, message=message, type=",".join(item.failed_by))
        out = [_verification_text(item)]
        if isinstance(item, KernelReport):
            out.append(_benchmark_text(item) or "benchmark: none")
            if item.reasons:
                out.append("changed: " + "; ".join(item.reasons))
        else:
            out.append("members: " + ", ".join(f"{r}={n}" for r, n in (item.members or {}).items()))
        _el(tc, "system-out", "\n".join(out))

    for k in report.kernels:
        counts["tests"] += 1
        tc = _testcase(suite, k.op, k.name, k.seconds)
        if id(k) in checked:
            outcome(tc, k)
        else:
            counts["skipped"] += 1
            _el(
                tc,
                "skipped",
                message=f"{k.status}: not checked (no source of this kernel changed)"
                if k.status == "unchanged"
                else f"{k.status}: not checked",
            )
    for name in report.removed:
        counts["tests"] += 1
        counts["skipped"] += 1
        tc = _testcase(suite, "removed", name, 0.0)
        _el(tc, "skipped", message="removed by this pull request")
    for p in report.pipelines:
        counts["tests"] += 1
        outcome(_testcase(suite, "pipeline", p.name, p.seconds), p)

    total = f"{max(report.seconds or 0.0, 0.0):.3f}"
    for e in (root, suite):
        e.set("tests", str(counts["tests"]))
        e.set("failures", str(counts["failures"]))
        e.set("errors", str(counts["errors"]))
        e.set("time", total)
    suite.set("skipped", str(counts["skipped"]))
    ET.indent(root, "  ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
