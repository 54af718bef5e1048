"""The report renderers: report.json, the PR comment (rendered with GitHub's own cmark-gfm), JUnit XML,
the badges and write_all, on realistic Reports.

The benchmark verdict in these reports is real: `compare_trace` on an H200 timing trace
(tests/data/gpu-traces, from ../shared/gpu-traces) wrapped in the BenchResult JSON the gate stores,
its posterior_hist included.
"""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from functools import lru_cache
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import cmarkgfm
import jsonschema
import numpy as np
import pytest
from cmarkgfm.cmark import Options

from kernalin_ci.bench.result import BenchResult, ShapeResult
from kernalin_ci.bench.stats import Verdict, compare_trace
from kernalin_ci.findings import Finding, Location, Notice, VerifyResult
from kernalin_ci.gate.run import conclude
from kernalin_ci.github.client import COMMENT_MAX_CHARS, sticky_marker, truncate_markdown
from kernalin_ci.ops.base import Case
from kernalin_ci.report.badge import COLORS, badge_endpoint, badge_svg
from kernalin_ci.report.chart import posterior_chart
from kernalin_ci.report.junit import render_junit
from kernalin_ci.report.markdown import COMMENT_LIMIT, STEP_SUMMARY_LIMIT, headline, render_markdown
from kernalin_ci.report.model import KernelReport, PipelineReport, Report
from kernalin_ci.report.schema import REPORT_SCHEMA
from kernalin_ci.report.text import mass_sentence, verdict_phrase
from kernalin_ci.report.writer import FILES, report_json, step_summary, write_all
from kernalin_ci.verify import reproduce_command

TRACE = Path(__file__).resolve().parent / "data" / "gpu-traces" / "timings_attn.npz"
ATTN = "kernels/attn.py:entry"
HOSTILE = "evil|<script>alert(1)</script>`x`"


# ---------------------------------------------------------------------------------------- reports


@lru_cache(maxsize=1)
def _faster() -> BenchResult:
    """A real verdict, posterior_hist included: base = the kv_len 4177 attention variant, head = the
    kv_len 4096 one (~2.6% less work), 200 interleaved H200 rounds."""
    t = np.load(TRACE)["t"]
    v = compare_trace(t[:, 4], t[:, 0])
    dims = {"B": 32, "Hq": 32, "Hkv": 8, "D": 128, "kv_len": 4096}
    res = BenchResult(
        "rope",
        "kernels/rope.py:entry",
        "kernels/rope.py:entry",
        "cuda",
        verdict=v,
        rounds=v.rounds,
        seconds=18.2,
        clock="cuda-events",
        shapes=[
            ShapeResult(
                "B32 kv4096",
                dims,
                "float16",
                inner=1,
                timing="cuda-graph",
                copies=4,
                verdict=v,
                base_ms=float(np.median(t[:, 4])),
                head_ms=float(np.median(t[:, 0])),
            )
        ],
    )
    assert res.verdict.posterior_hist["edges"] and res.verdict.verdict == "faster"
    return res  # what the gate stores as KernelReport.benchmark


def faster_benchmark() -> BenchResult:
    return copy.deepcopy(_faster())


def case_gqa() -> Case:
    return Case("gqa-8", {"Hq": 16, "Hkv": 2, "D": 64, "kv_lens": [5, 17, 129, 300], "scale": 0.125}, "float16", 3)


def failing_verification(name_in_message: str = "out") -> VerifyResult:
    gqa = case_gqa()
    big = Case(
        "large-scores",
        {"Hq": 8, "Hkv": 2, "D": 64, "kv_lens": [2, 16, 100, 257], "scale": 0.125, "qk_std": 6.5},
        "float32",
        5,
        ("large-scores",),
    )
    return VerifyResult(
        "attention.decode",
        ATTN,
        cases_run=48,
        seconds=12.3,
        device="cuda",
        findings=[
            Finding(
                "exp-max",
                "softmax-no-max",
                "tl.exp of the scores without subtracting their running maximum",
                Location("kernels/attn.py", 57),
                kind="structural",
            ),
            Finding(
                "reference",
                "kv-mask",
                f"{name_in_message}: 12 of 64 rows off the float64 reference (worst relative "
                "error 0.41 at b=1 h=3 (kv_len=17); tolerance 0.006); it matches what a kv-mask bug produces",
                Location("kernels/attn.py", 88),
                case=gqa.to_json(),
                reproduce=reproduce_command("attention.decode", ATTN, {}, "cuda", gqa),
            ),
            Finding(
                "finite",
                "non-finite",
                f"{name_in_message}: NaN/Inf in 8 of 32 rows where the reference is finite",
                case=big.to_json(),
                reproduce=reproduce_command("attention.decode", ATTN, {}, "cuda", big),
            ),
        ],
    )


def gate_report() -> Report:
    """A failing kernel (structural + dynamic findings), a faster kernel, a new kernel, an unchanged one,
    a passing pipeline and a removed kernel; conclusion and reason from the gate's own conclude()."""
    r = Report(
        conclusion="",
        reason="",
        base={"ref": "main", "sha": "a" * 40},
        head={"ref": "feature/fast-attn", "sha": "b" * 40},
        device="cuda",
        policy={"fail_on": ["finding", "slower"], "rope": 0.005, "budget_s": 30.0, "bench": True},
        repo="acme/llm-kernels",
        pr=42,
        reproduce=f"kernalin-ci run --base {'a' * 40} --head {'b' * 40} --device cuda",
    )
    r.kernels.append(
        KernelReport(
            "decode_attention",
            "attention.decode",
            ATTN,
            "changed",
            ["kernels/attn.py changed"],
            failing_verification(),
            None,
            "not benchmarked: verification failed",
            failed_by=["finding"],
            seconds=14.0,
        )
    )
    r.kernels.append(
        KernelReport(
            "rope_neox",
            "rope",
            "kernels/rope.py:entry",
            "changed",
            ["kernels/rope.py changed"],
            VerifyResult("rope", "kernels/rope.py:entry", 40, 3.2, device="cuda"),
            faster_benchmark(),
            seconds=25.0,
        )
    )
    kv = VerifyResult(
        "kv_append",
        "kernels/kv.py:entry",
        30,
        2.0,
        device="cuda",
        notices=[
            Notice("offset-width", "could not decide whether the slot offset is 64-bit", Location("kernels/kv.py", 12))
        ],
    )
    r.kernels.append(
        KernelReport(
            "kv_append_v2",
            "kv_append",
            "kernels/kv.py:entry",
            "new",
            ["new kernel"],
            kv,
            None,
            "new kernel: nothing to compare against",
            seconds=3.0,
        )
    )
    r.kernels.append(KernelReport("rope_gptj", "rope", "kernels/rope_gptj.py:entry", "unchanged"))
    pv = VerifyResult("decode-pipeline", "kv_append+attention.decode_paged", 1, 9.0, device="cuda")
    r.pipelines.append(
        PipelineReport(
            "decode_loop",
            {"kv_append": "kv_append_v2", "attention.decode_paged": "paged_attention"},
            pv,
            seconds=9.0,
        )
    )
    r.removed = ["old_attention"]
    r.conclusion, r.reason = conclude(r)
    r.seconds = 61.0
    return r


def passing_report() -> Report:
    r = gate_report()
    r.kernels = [k for k in r.kernels if not k.failed_by]
    r.conclusion, r.reason = conclude(r)
    return r


# ---------------------------------------------------------------------------------------- GitHub's renderer


def gfm(markdown: str) -> str:
    """HTML as GitHub's cmark-gfm renders it, raw HTML allowed and *without* the tag filter, so a raw
    tag that escaped our escaping would show up as a tag."""
    return cmarkgfm.markdown_to_html_with_extensions(
        markdown, options=Options.CMARK_OPT_UNSAFE, extensions=["table", "autolink", "strikethrough"]
    )


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables, self.cell, self.tags = [], None, []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def parse_html(html: str) -> _Tables:
    p = _Tables()
    p.feed(html)
    return p


def table_rows(markdown: str) -> list[list[str]]:
    tables = parse_html(gfm(markdown)).tables
    assert len(tables) == 1
    return tables[0]


def row_of(rows: list[list[str]], name: str) -> list[str]:
    return next(r for r in rows if r[1] == name)


# ---------------------------------------------------------------------------------------- headline, table


def test_headline_failure_names_kernel_and_bug_classes():
    r = gate_report()
    assert headline(r) == (
        "❌ kernalin-ci: failed — decode_attention: 3 findings (softmax-no-max, kv-mask, non-finite)"
    )
    md = render_markdown(r)
    assert md.splitlines()[0] == (
        "### ❌ kernalin-ci: failed — `decode_attention`: 3 findings (`softmax-no-max`, `kv-mask`, `non-finite`)"
    )


def test_headline_success_names_faster_kernel_and_never_cpu_timings():
    r = passing_report()
    assert r.conclusion == "success"
    assert headline(r) == "✅ kernalin-ci: passed — 2 kernels verified; rope_neox 2.6% faster; 1 pipeline checked"
    r.kernels[0].benchmark_note = "CPU interpreter wall-clock timings: reported, never gating"
    assert headline(r) == "✅ kernalin-ci: passed — 2 kernels verified; 1 pipeline checked"
    r.kernels, r.pipelines = [], []
    r.conclusion, r.reason = conclude(r)
    assert headline(r) == "✅ kernalin-ci: passed — no kernel changed"


def test_table_shows_verification_and_benchmark_per_kernel():
    r = gate_report()
    b = r.kernels[1].benchmark
    rows = table_rows(render_markdown(r))
    assert rows[0] == [
        "",
        "kernel",
        "op",
        "change",
        "verification",
        "benchmark",
        "head/base",
        "95% HDI",
        "P(faster)",
        "margin",
    ]
    assert [row[1] for row in rows[1:]] == ["decode_attention", "rope_neox", "kv_append_v2", "decode_loop"]
    assert row_of(rows, "decode_attention")[4] == "3 findings: softmax-no-max, kv-mask, non-finite"
    assert row_of(rows, "decode_attention")[5] == "not benchmarked: verification failed"
    assert row_of(rows, "rope_neox") == [
        "✅",
        "rope_neox",
        "rope",
        "changed",
        "pass · 40 cases",
        "2.6% faster",
        f"{b.verdict.ratio:.4f}",
        f"{b.verdict.hdi[0]:.4f}–{b.verdict.hdi[1]:.4f}",
        ">99.9%",
        "±0.5%",
    ]
    assert row_of(rows, "kv_append_v2")[4:6] == ["pass · 30 cases · 1 notice", "new kernel: nothing to compare against"]
    assert row_of(rows, "decode_loop")[2:5] == ["pipeline", "kv_append_v2 → paged_attention", "pass · 1 case"]
    md = render_markdown(r)
    assert "1 unchanged kernel (not checked)" in md and "`rope_gptj`" in md  # not a table row
    assert "Removed by this pull request (no longer checked): `old_attention`" in md
    assert md.rstrip().endswith(f"```sh\n{r.reproduce}\n```")


def _verdict(**kw) -> Verdict:
    return Verdict(**({"rounds": 24, "rope_source": "minimum"} | kw))


def test_verdict_phrases_for_humans():
    b = _verdict(
        verdict="faster",
        ratio=0.969,
        hdi=(0.965, 0.973),
        p_faster=0.994,
        p_slower=0.0,
        p_equivalent=0.006,
        rope=(0.995, 1.005),
    )
    assert verdict_phrase(b) == "faster: 3.1% (95% HDI 2.7%..3.5%), P(faster) 99.4%, margin ±0.5%"
    assert mass_sentence(b) == "99.4% of the posterior mass sits below the equivalence margin (head faster)."
    slow = replace(
        b,
        verdict="slower",
        ratio=1.0042,
        hdi=(1.0031, 1.0055),
        p_faster=0.0,
        p_slower=0.97,
        p_equivalent=0.03,
        rope=(0.9975, 1.0025),
    )
    assert verdict_phrase(slow) == "slower: 0.42% (95% HDI 0.31%..0.55%), P(slower) 97.0%, margin ±0.25%"
    eq = replace(
        b, verdict="equivalent", ratio=0.9998, hdi=(0.9991, 1.0004), p_faster=0.0, p_slower=0.0, p_equivalent=1.0
    )
    assert verdict_phrase(eq) == "equivalent: -0.02% (95% HDI -0.09%..+0.04%), P(equivalent) >99.9%, margin ±0.5%"
    assert mass_sentence(eq) == ">99.9% of the posterior mass sits inside the equivalence margin."
    inc = replace(
        b, verdict="inconclusive", ratio=0.996, hdi=(0.990, 1.002), p_faster=0.4, p_slower=0.0, p_equivalent=0.6
    )
    assert verdict_phrase(inc) == (
        "inconclusive: -0.4% (95% HDI -1.0%..+0.2%), P(faster) 40.0%, P(equivalent) 60.0%, P(slower) <0.1%, "
        "margin ±0.5%"
    )
    # the comment phrases the real verdict the same way, next to its chart
    r = gate_report()
    real = r.kernels[1].benchmark.verdict
    md = render_markdown(r)
    assert f"**Benchmark:** {verdict_phrase(real)}. {mass_sentence(real)}" in md
    assert verdict_phrase(real).startswith("faster: 2.61% (95% HDI 2.58%..2.63%), P(faster) >99.9%")
    # the margin column is spelled out under the table, and nothing a person reads says ROPE
    assert "<sub>margin: the equivalence margin, a change of head/base within ±margin counts as equivalent" in md
    assert "ROPE" not in md.replace("(the region of practical equivalence", "")


# ---------------------------------------------------------------------------------------- chart


def _chart_series(chart: str) -> tuple[list[str], list[float], list[float]]:
    labels = json.loads(re.search(r'x-axis "[^"]*" (\[.*\])', chart).group(1))
    bars = json.loads(re.search(r"^    bar (\[.*\])$", chart, re.M).group(1))
    line = json.loads(re.search(r"^    line (\[.*\])$", chart, re.M).group(1))
    return labels, bars, line


def test_chart_present_only_with_posterior_hist():
    r = gate_report()
    md = render_markdown(r)
    assert md.count("```mermaid") == 1
    section = md[md.index("#### ✅ `rope_neox`") : md.index("#### ✅ `kv_append_v2`")]
    assert "```mermaid\n" in section and "xychart-beta" in section
    r.kernels[1].benchmark.verdict.posterior_hist = None
    md = render_markdown(r)
    assert "mermaid" not in md and "xychart" not in md
    assert verdict_phrase(r.kernels[1].benchmark.verdict) in md  # the verdict stays, only the chart goes
    assert posterior_chart(None) is None
    bad = {"edges": [1.0], "density": [1.0]}
    assert posterior_chart(replace(r.kernels[1].benchmark.verdict, posterior_hist=bad)) is None


def test_chart_marks_rope_and_one_and_keeps_the_mass():
    b = faster_benchmark().verdict
    labels, bars, line = _chart_series(posterior_chart(b))
    assert len(labels) == len(bars) == len(line) <= 30
    assert abs(sum(bars) - 100) < 0.05
    centres = [float(x) for x in labels]
    assert 1.0 in centres  # a bar centred on 1.0
    step = centres[1] - centres[0]
    # the ROPE plateau covers exactly the bars whose centre lies in [0.995, 1.005]
    inside = [0.995 - 1e-9 <= c <= 1.005 + 1e-9 for c in centres]
    assert [v > 0 for v in line] == inside and any(inside)
    # the mass sits where the verdict says: the tallest bar is within a bar of the posterior median
    assert abs(centres[bars.index(max(bars))] - b.ratio) <= step
    # near the ROPE (a small effect) the grid is fine and the posterior spreads over several bars
    near = copy.deepcopy(b)
    shift = 1.001 / b.ratio
    near.posterior_hist["edges"] = [e * shift for e in b.posterior_hist["edges"]]
    labels, bars, _ = _chart_series(posterior_chart(near))
    assert sum(1 for v in bars if v > 1) >= 3 and abs(sum(bars) - 100) < 0.05


# ---------------------------------------------------------------------------------------- details


def test_details_hold_each_finding_with_case_location_and_reproduce():
    r = gate_report()
    findings = r.kernels[0].verification.findings
    md = render_markdown(r)
    html = gfm(md)
    assert "<summary>3 findings: softmax-no-max, kv-mask, non-finite</summary>" in html
    blocks = re.findall(r'<pre><code class="language-sh">(.*?)</code></pre>', html, re.S)
    unescaped = [unescape(b).strip() for b in blocks]
    for f in findings[1:]:
        assert f.reproduce in unescaped
    assert r.reproduce in unescaped
    assert "`kernels/attn.py:57`" in md and "`kernels/attn.py:88`" in md
    assert "Case: `gqa-8 [float16, seed 3] Hq=16 Hkv=2 D=64 kv_lens=[5,17,129,300] scale=0.125`" in md
    assert "**1. `softmax-no-max`** · structural check `exp-max`" in md
    assert md.count("<details>") == md.count("</details>")


def test_hostile_names_and_messages_are_escaped():
    r = gate_report()
    k = r.kernels[0]
    k.name, k.op = HOSTILE, "attention|decode"
    k.verification = failing_verification(name_in_message="a|b </details><script>x()</script> *bold* `tick`")
    k.reasons = ["kernels/<b>attn</b>.py changed"]
    r.conclusion, r.reason = conclude(r)
    md = render_markdown(r)
    html = gfm(md)
    assert "<script" not in html and "<b>" not in html
    assert html.count("<details>") == html.count("</details>")
    rows = table_rows(md)
    assert all(len(row) == 10 for row in rows)  # no pipe broke a row
    assert row_of(rows, HOSTILE)[2] == "attention|decode"
    # the name renders literally in the headline too
    first = gfm(md.splitlines()[0])
    assert "evil|&lt;script&gt;alert(1)&lt;/script&gt;`x`" in first
    assert "a|b &lt;/details&gt;&lt;script&gt;x()&lt;/script&gt; *bold* `tick`" in html
    suite = ET.fromstring(render_junit(r)).find("testsuite")
    assert suite.find("testcase[@classname='attention|decode']").get("name") == HOSTILE


# ---------------------------------------------------------------------------------------- size limit


def _huge_report(n: int = 3000) -> Report:
    r = gate_report()
    gqa = case_gqa()
    many = []
    for i in range(n):
        c = Case(f"sweep-{i}", {**gqa.dims, "kv_lens": [i + 1, 2 * i + 3]}, "float16", i)
        many.append(
            Finding(
                "reference",
                "kv-mask",
                f"out: row {i} off the float64 reference " + "x" * 80,
                Location("kernels/attn.py", 88),
                case=c.to_json(),
                reproduce=reproduce_command("attention.decode", ATTN, {}, "cuda", c),
            )
        )
    r.kernels[0].verification.findings = many
    return r


def test_comment_stays_under_githubs_limit_with_headline_and_table_intact():
    r = _huge_report()
    md = render_markdown(r)
    assert len(md) <= COMMENT_LIMIT < COMMENT_MAX_CHARS
    # the publisher prepends its marker; the comment still needs no cut there
    body = f"{sticky_marker()}\n{md}"
    assert len(body) <= COMMENT_MAX_CHARS and truncate_markdown(body, COMMENT_MAX_CHARS) == body
    assert md.splitlines()[0] == "### ❌ kernalin-ci: failed — `decode_attention`: 3000 findings (`kv-mask`)"
    rows = table_rows(md)
    assert [row[1] for row in rows[1:]] == ["decode_attention", "rope_neox", "kv_append_v2", "decode_loop"]
    assert row_of(rows, "decode_attention")[4] == "3000 findings: kv-mask ×3000"
    shown = len(re.findall(r"^\*\*\d+\. `kv-mask`\*\*", md, re.M))
    assert 10 < shown < 3000
    note = re.search(r"shortened to stay under \d+ characters .*?: ([\d]+) findings", md)
    assert note and int(note.group(1)) == 3000 - shown
    assert f"*… {3000 - shown} more findings not shown here: see report.json.*" in md
    assert md.count("<details>") == md.count("</details>")
    assert sum(1 for line in md.splitlines() if line.startswith("```")) % 2 == 0
    assert md.rstrip().endswith(f"```sh\n{r.reproduce}\n```")  # the whole-gate command survives
    # the step summary has far more room (GitHub takes 1 MiB there), and is cut the same way beyond it
    summary = step_summary(r)
    assert len(summary) <= STEP_SUMMARY_LIMIT and len(summary.encode()) < 1 << 20
    assert shown < len(re.findall(r"^\*\*\d+\. `kv-mask`\*\*", summary, re.M)) < 3000
    assert summary.count("<details>") == summary.count("</details>")


def test_step_summary_shows_every_finding_the_comment_had_to_leave_out():
    r = _huge_report(300)
    md, summary = render_markdown(r), step_summary(r)
    assert len(re.findall(r"^\*\*\d+\. `kv-mask`\*\*", md, re.M)) < 300 and "shortened" in md
    assert len(re.findall(r"^\*\*\d+\. `kv-mask`\*\*", summary, re.M)) == 300 and "shortened" not in summary
    assert summary.splitlines()[0] == md.splitlines()[0]


# ---------------------------------------------------------------------------------------- JUnit


def test_junit_has_a_testcase_per_kernel_and_pipeline():
    r = gate_report()
    root = ET.fromstring(render_junit(r))
    suite = root.find("testsuite")
    counts = (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped"))
    assert counts == ("6", "1", "0", "2")
    cases = {(tc.get("classname"), tc.get("name")): tc for tc in suite.findall("testcase")}
    assert set(cases) == {
        ("attention.decode", "decode_attention"),
        ("rope", "rope_neox"),
        ("kv_append", "kv_append_v2"),
        ("rope", "rope_gptj"),
        ("removed", "old_attention"),
        ("pipeline", "decode_loop"),
    }
    failure = cases["attention.decode", "decode_attention"].find("failure")
    assert failure.get("type") == "finding"
    assert failure.get("message") == "3 findings: softmax-no-max, kv-mask, non-finite"
    for f in r.kernels[0].verification.findings[1:]:
        assert f"reproduce: {f.reproduce}" in failure.text
    assert "[softmax-no-max] structural check exp-max at kernels/attn.py:57" in failure.text
    out = cases["rope", "rope_neox"].find("system-out").text
    assert f"benchmark: {verdict_phrase(r.kernels[1].benchmark.verdict)}" in out
    assert cases["rope", "rope_gptj"].find("skipped") is not None
    assert cases["pipeline", "decode_loop"].find("failure") is None
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["conclusion"] == "failure" and props["reproduce"] == r.reproduce


def test_junit_errors_slower_kernels_failing_pipelines_and_control_characters():
    r = passing_report()
    slow = r.kernels[0]
    slow.benchmark.verdict = replace(
        slow.benchmark.verdict,
        verdict="slower",
        ratio=1.021,
        hdi=(1.018, 1.024),
        p_faster=0.0,
        p_slower=0.999,
        p_equivalent=0.001,
    )
    slow.failed_by = ["slower"]
    r.kernels.append(
        KernelReport(
            "broken",
            "rope",
            "kernels/broken.py:nope",
            "changed",
            ["kernels/broken.py changed"],
            None,
            error="cannot load kernels/broken.py:nope: \x1b[31mno function\x1b[0m \x00",
            failed_by=["error"],
        )
    )
    pipe = r.pipelines[0]
    pipe.verification = VerifyResult(
        "decode-pipeline",
        "kv_append+attention.decode_paged",
        1,
        9.0,
        findings=[Finding("pipeline-cache", "kv-slot", "step 17: k_cache slot 33 does not hold the token")],
    )
    pipe.failed_by = ["finding"]
    r.conclusion, r.reason = conclude(r)
    assert headline(r) == (
        "❌ kernalin-ci: failed — rope_neox: 2.1% slower; broken: error; decode_loop: 1 finding (kv-slot)"
    )
    suite = ET.fromstring(render_junit(r)).find("testsuite")
    assert (suite.get("failures"), suite.get("errors")) == ("2", "1")
    tcs = {tc.get("name"): tc for tc in suite.findall("testcase")}
    assert tcs["rope_neox"].find("failure").get("type") == "slower"
    assert "slower: 2.1% (95% HDI 1.8%..2.4%)" in tcs["rope_neox"].find("failure").get("message")
    err = tcs["broken"].find("error")
    assert "\\x1b[31mno function\\x1b[0m \\x00" in err.text
    assert tcs["decode_loop"].find("failure").get("message") == "1 finding: kv-slot"
    md = render_markdown(r)
    assert "#### ❌ pipeline `decode_loop`" in md and "step 17: k\\_cache slot 33" in md
    assert "**2.1% slower**" in md  # the gating verdict stands out in the table


def test_a_benchmark_without_verdict_shows_its_error():
    r = passing_report()
    k = r.kernels[0]
    k.benchmark = BenchResult(
        "rope", k.entry, k.entry, "cuda", error="head: the process died during round 3", error_kind="crashed"
    )
    jsonschema.validate(json.loads(report_json(r)), REPORT_SCHEMA)
    md = render_markdown(r)
    assert row_of(table_rows(md), "rope_neox")[5:] == ["benchmark failed (below)", "—", "—", "—", "—"]
    assert "- **Benchmark:** failed, no verdict: head: the process died during round 3" in md
    assert "mermaid" not in md
    out = ET.fromstring(render_junit(r)).find("testsuite/testcase[@name='rope_neox']/system-out").text
    assert "benchmark failed, no verdict: head: the process died during round 3" in out


# ---------------------------------------------------------------------------------------- badges


def _svg(r: Report) -> ET.Element:
    return ET.fromstring(badge_svg(r))


def test_badge_svg_is_a_self_contained_flat_badge():
    r = gate_report()
    svg = _svg(r)
    ns = "{http://www.w3.org/2000/svg}"
    assert svg.find(f"{ns}title").text == "kernalin-ci: failed (1 of 3 kernels)"
    texts = [t.text for t in svg.iter(f"{ns}text")]
    assert "failed (1 of 3 kernels)" in texts and "kernalin-ci" in texts
    rects = svg.find(f"{ns}g").findall(f"{ns}rect")
    assert int(svg.get("width")) == int(rects[0].get("width")) + int(rects[1].get("width"))
    assert rects[1].get("fill") == COLORS["red"]
    raw = badge_svg(r)
    assert "href" not in raw and "@import" not in raw and "<image" not in raw
    assert re.findall(r"https?://[^\"]+", raw) == ["http://www.w3.org/2000/svg"]
    # the width follows the text
    passing = passing_report()
    assert _svg(passing).find(f"{ns}title").text == "kernalin-ci: passed (2 kernels)"
    assert int(_svg(passing).get("width")) < int(svg.get("width"))


def test_badge_endpoint_json_for_each_conclusion():
    assert badge_endpoint(gate_report()) == {
        "schemaVersion": 1,
        "label": "kernalin-ci",
        "message": "failed (1 of 3 kernels)",
        "color": "red",
    }
    r = passing_report()
    assert badge_endpoint(r)["message"] == "passed (2 kernels)" and badge_endpoint(r)["color"] == "brightgreen"
    r.kernels, r.pipelines = [], []
    r.conclusion, r.reason = conclude(r)
    assert badge_endpoint(r) | {} == {
        "schemaVersion": 1,
        "label": "kernalin-ci",
        "message": "no kernels changed",
        "color": "blue",
    }
    r.conclusion = "neutral"
    assert badge_endpoint(r)["color"] == "lightgrey" and badge_endpoint(r)["message"] == "neutral"


# ---------------------------------------------------------------------------------------- report.json, write_all


def _strict_json(text: str):
    def no_constant(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=no_constant)


def test_write_all_writes_every_file(tmp_path):
    r = gate_report()
    r.kernels[1].benchmark.verdict.floor = float("nan")  # NaN is not JSON: written as null
    paths = write_all(r, tmp_path / "out")
    assert sorted(paths) == sorted(FILES) and all(p.parent == tmp_path / "out" for p in paths.values())
    assert all(p.is_file() for p in paths.values())
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == sorted(FILES)  # no temporary files left
    doc = _strict_json(paths["report.json"].read_text())
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert doc["kernels"][1]["benchmark"]["floor"] is None
    # SPEC-cli's shape of report.json
    assert doc["conclusion"] == "failure"
    assert [k["name"] for k in doc["kernels"]] == ["decode_attention", "rope_neox", "kv_append_v2", "rope_gptj"]
    assert doc["kernels"][0]["verification"]["verdict"] == "fail"
    assert len(doc["kernels"][0]["verification"]["findings"]) == 3
    assert doc["kernels"][1]["benchmark"]["verdict"] == "faster" and doc["kernels"][0]["benchmark"] is None
    back = Report.from_json(doc)
    assert render_markdown(back) == paths["report.md"].read_text() == render_markdown(r)
    assert ET.parse(paths["junit.xml"]).getroot().find("testsuite").get("tests") == "6"
    assert ET.parse(paths["badge.svg"]).getroot().get("height") == "20"
    assert _strict_json(paths["badge.json"].read_text()) == badge_endpoint(r)
    assert report_json(r) == paths["report.json"].read_text()


def test_schema_rejects_what_the_docs_forbid():
    doc = json.loads(report_json(gate_report()))
    jsonschema.validate(doc, REPORT_SCHEMA)
    for bad in (
        {**doc, "conclusion": "maybe"},
        {**doc, "kernels": [{**doc["kernels"][0], "status": "edited"}]},
        {**doc, "kernels": [{**doc["kernels"][1], "benchmark": {**doc["kernels"][1]["benchmark"], "hdi": [0.9]}}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, REPORT_SCHEMA)
    f = doc["kernels"][0]["verification"]["findings"][0]
    f["bug_class"] = "typo-class"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, REPORT_SCHEMA)


def test_coverage_not_checked_and_structural_status_in_every_output():
    """The shape domain's facts (docs/verification.md) in the comment, the step summary, JUnit and report.json."""
    from kernalin_ci.findings import Coverage, NotChecked, StructuralStatus

    r = passing_report()
    kv = next(k for k in r.kernels if k.name == "kv_append_v2")
    kv.verification = VerifyResult(
        "kv_append",
        "kernels/kv.py:entry",
        31,
        2.0,
        device="cuda",
        coverage=Coverage([64, 128], ["2", "8"], ["float32", "float16"], [16], [], []),
        not_checked=[
            NotChecked(
                "D=80 Hkv=6 float32 block_size=16",
                "unsupported",
                "CompilationError: arange's range must be a power of 2 <script>",
                ["odd-heads"],
                "D=64 Hkv=6 float32 block_size=16",
            )
        ],
        structural=StructuralStatus("not-analysed", "kernel _append_gather could not be followed: tt.gather"),
    )
    for text in (render_markdown(r), step_summary(r)):
        assert (
            "- **Structural:** **not analysed (kernel \\_append\\_gather could not be followed: tt.gather)**." in text
        )
        assert "- **Coverage:** D 64, 128 · float32, float16 · heads 2, 8 · block size 16." in text
        assert (
            "D=80 Hkv=6 float32 block\\_size=16: unsupported, checked at D=64 Hkv=6 float32 "
            "block\\_size=16 instead: CompilationError: arange's range must be a power of 2 &lt;script&gt; "
            "(cases: odd-heads)"
        ) in text
    row = row_of(table_rows(render_markdown(r)), "kv_append_v2")[4]
    assert row == "pass · 31 cases · 1 shape not checked · structure not analysed"
    tc = [t for t in ET.fromstring(render_junit(r)).iter("testcase") if t.get("name") == "kv_append_v2"][0]
    out = tc.find("system-out").text
    assert "structural: not analysed (kernel _append_gather" in out and "coverage: D 64, 128" in out
    assert "not checked: D=80 Hkv=6 float32 block_size=16: unsupported" in out
    jsonschema.validate(json.loads(report_json(r)), REPORT_SCHEMA)
    bad = json.loads(report_json(r))
    next(k for k in bad["kernels"] if k["name"] == "kv_append_v2")["verification"]["structural"]["status"] = "skipped"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, REPORT_SCHEMA)
