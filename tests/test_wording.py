"""Each thing is worded once (kernalin_ci/report/text.py): the terminal, report.md, JUnit and the PR
comment say a benchmark verdict, a finding, a shape not checked and a notice in the same words."""

from __future__ import annotations

import io

import pytest

from kernalin_ci.bench.stats import Verdict
from kernalin_ci.commands.verify import print_result
from kernalin_ci.findings import Finding, Location, NotChecked, Notice, VerifyResult
from kernalin_ci.report.junit import render_junit
from kernalin_ci.report.model import KernelReport, Report
from kernalin_ci.report.text import (
    finding_line,
    finding_text,
    not_checked_text,
    notice_text,
    verdict_line,
    verdict_phrase,
    verdict_words,
)

RATIOS = {"faster": 0.969, "slower": 1.021, "equivalent": 0.999, "inconclusive": 1.004}


@pytest.mark.parametrize("name", sorted(RATIOS))
def test_the_bench_line_and_the_report_word_a_verdict_alike(name):
    r = RATIOS[name]
    v = Verdict(name, r, (r - 0.004, r + 0.004), 0.3, 0.2, 0.5, (0.995, 1.005), 24, "minimum", floor=0.0005)
    assert verdict_phrase(v) == f"{name}: {verdict_words(v)}"
    line = verdict_line(v, "attn")
    assert line.startswith(f"attn  {name.upper()}") and f": {verdict_words(v)} (minimum, A/A floor 0.05%)" in line


def _result() -> VerifyResult:
    return VerifyResult(
        "attention.decode",
        "k.py:attn",
        cases_run=3,
        findings=[Finding("reference", "kv-mask", "out: 2 of 8 rows off", Location("k.py", 57), reproduce="x")],
        notices=[Notice("structural:interpret", "could not verify _k", Location("k.py", 12))],
        not_checked=[NotChecked("D=80 float32", "unsupported", "power of two", ["a", "b"])],
    )


def test_the_terminal_and_junit_word_findings_notices_and_shapes_not_checked_alike():
    res = _result()
    out = io.StringIO()
    print_result(res, out)
    term = out.getvalue()
    kr = KernelReport("attn", "attention.decode", "k.py:attn", "changed", verification=res)
    kr.failed_by = ["finding"]
    junit = render_junit(Report("failure", "x", {}, {}, "cpu", {}, kernels=[kr]))
    f, n, nc = res.findings[0], res.notices[0], res.not_checked[0]
    for text in (finding_text(f), notice_text(n), not_checked_text(nc)):
        first = text.splitlines()[0]
        assert first in term and first.replace(">", "&gt;") in junit
    assert "not checked: D=80 float32: unsupported, not checked: power of two (cases: a, b)" in term
    assert "note: structural:interpret at k.py:12: could not verify _k" in term
    assert finding_line(f) == "kv-mask at k.py:57 (reference): out: 2 of 8 rows off"
