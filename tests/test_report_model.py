"""The one report model: typed results (VerifyResult, BenchResult and its ShapeResults) stay on the Report until the
writer serialises them, and Report.from_json is the one way back from report.json (the daemon, history)."""

from __future__ import annotations

import json

import jsonschema
from test_report import gate_report

from kernalin_ci.bench.result import BenchResult, ShapeResult
from kernalin_ci.bench.stats import Verdict
from kernalin_ci.findings import VerifyResult
from kernalin_ci.history.model import run_from_report
from kernalin_ci.report.markdown import render_markdown
from kernalin_ci.report.model import PipelineReport, Report
from kernalin_ci.report.schema import REPORT_SCHEMA
from kernalin_ci.report.writer import report_json


def test_report_json_round_trips_through_the_typed_model():
    r = gate_report()
    text = report_json(r)
    back = Report.from_json(json.loads(text))
    assert isinstance(back.kernels[0].verification, VerifyResult)
    assert back.kernels[0].verification.findings[0].location.path == "kernels/attn.py"
    assert isinstance(back.kernels[1].benchmark, BenchResult) and back.kernels[1].bench_verdict == "faster"
    assert report_json(back) == text and render_markdown(back) == render_markdown(r)


def test_fields_a_newer_version_wrote_are_left_out():
    doc = json.loads(report_json(gate_report()))
    doc["future"] = 1
    doc["kernels"][0]["future"] = {"x": 1}
    doc["kernels"][0]["verification"]["future"] = []
    doc["kernels"][0]["verification"]["findings"][0]["future"] = "?"
    doc["kernels"][0]["verification"]["findings"][0]["location"]["column"] = 3
    back = Report.from_json(doc)
    assert back.kernels[0].verification.findings[0].location.line == 57
    assert report_json(back) == report_json(gate_report())


def test_a_verdict_turned_inconclusive_keeps_the_one_measured():
    """kernalin_ci.explain turns a verdict inconclusive when the environment changed while timing."""
    r = gate_report()
    b = r.kernels[1].benchmark
    b.verdict_measured, b.verdict.verdict = b.verdict.verdict, "inconclusive"
    doc = json.loads(report_json(r))
    assert list(doc["kernels"][1]["benchmark"])[-1] == "verdict_measured"
    assert doc["kernels"][1]["benchmark"]["verdict"] == "inconclusive"
    back = Report.from_json(doc)
    assert back.kernels[1].benchmark.verdict_measured == "faster" and back.kernels[1].bench_verdict == "inconclusive"
    assert report_json(back) == report_json(r)


def test_a_verification_that_could_not_run_keeps_its_three_fields():
    r = gate_report()
    r.pipelines.append(PipelineReport("broken", {"rope": "r"}, VerifyResult("decode-pipeline", "", error="no entry")))
    doc = json.loads(report_json(r))
    assert doc["pipelines"][1]["verification"] == {"verdict": "fail", "findings": [], "error": "no entry"}
    jsonschema.validate(doc, REPORT_SCHEMA)
    back = Report.from_json(doc)
    assert back.pipelines[1].verification.error == "no entry" and back.pipelines[1].verification.verdict == "fail"
    assert "no entry" in render_markdown(back)


def test_history_reads_the_typed_report_and_its_json_alike():
    r = gate_report()
    typed = run_from_report(r, repo="acme/k", commit="c" * 40, branch="main", recorded_at=1.0)
    loaded = run_from_report(json.loads(report_json(r)), repo="acme/k", commit="c" * 40, branch="main", recorded_at=1.0)
    assert typed == loaded
    p = next(p for p in typed.points if p.kernel == "decode_attention")
    assert p.verification == "fail"
    assert [f["bug_class"] for f in p.findings] == ["softmax-no-max", "kv-mask", "non-finite"]


# report.json's per-shape object, in the order it has always had: the case, then the shape's own verdict
SHAPE_KEYS = ["shape", "dims", "dtype", "inner", "timing", "copies"]
SHAPE_VERDICT_KEYS = [*SHAPE_KEYS, *Verdict.__dataclass_fields__, "base_ms", "head_ms"]


def test_benchmark_shapes_are_typed_until_the_writer():
    r = gate_report()
    text = report_json(r)
    doc = json.loads(text)
    assert list(doc["kernels"][1]["benchmark"]["shapes"][0]) == SHAPE_VERDICT_KEYS
    assert doc["kernels"][1]["benchmark"]["shapes"][0]["verdict"] == "faster"
    back = Report.from_json(doc)
    (s,) = back.kernels[1].benchmark.shapes
    assert isinstance(s, ShapeResult) and isinstance(s.verdict, Verdict) and s.verdict.verdict == "faster"
    assert (s.shape, s.dtype, s.inner, s.timing, s.copies) == ("B32 kv4096", "float16", 1, "cuda-graph", 4)
    assert s.dims["kv_len"] == 4096 and s.base_ms > s.head_ms
    assert report_json(back) == text


def test_a_shape_without_a_verdict_keeps_only_its_case():
    """A benchmark that stopped before a verdict still lists its shapes, without per-shape figures."""
    r = gate_report()
    b = r.kernels[1].benchmark
    b.verdict, b.error, b.error_kind = None, "head: the process died during round 3", "crashed"
    b.shapes = [ShapeResult("T=4", {"tokens": 4}, "float32", 1, "wall-clock", 1)]
    doc = json.loads(report_json(r))
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert doc["kernels"][1]["benchmark"]["shapes"] == [
        {"shape": "T=4", "dims": {"tokens": 4}, "dtype": "float32", "inner": 1, "timing": "wall-clock", "copies": 1}
    ]
    back = Report.from_json(doc)
    assert back.kernels[1].benchmark.shapes == b.shapes and report_json(back) == report_json(r)
