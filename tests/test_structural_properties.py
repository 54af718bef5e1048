"""'Analysed' means analysed (issue 30, item 4): the structural status lists the properties proved of the
kernels and, as gaps, those the analysis could not verify, with why; report.json, the CLI and the PR
comment carry both, and a report without them still loads."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from kernalin_ci.findings import StructuralStatus, VerifyResult
from kernalin_ci.report.schema import REPORT_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
ROPE_PARAMS = {"style": "neox", "base": 10000.0, "rotary_dim": None, "max_position": 65536}


def _analyse(monkeypatch, entry: str, op: str, params: dict) -> dict:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("KERNALIN_PARAMS", json.dumps(params))
    from kernalin_ci.entry import load_entry
    from kernalin_ci.verify.structural.in_process import analyze_entry

    return analyze_entry(op, load_entry(entry, str(ROOT)), params, str(ROOT))


def test_a_value_the_analysis_cannot_follow_is_a_gap_not_a_pass(monkeypatch):
    """q's rotation is followed and proved; k's goes through a data-dependent guard: 'rotation values of
    k' is a gap with its cause, never among the proved properties."""
    st = _analyse(monkeypatch, "tests/kernels/rope_guarded_k.py:entry", "rope", ROPE_PARAMS)["status"]
    assert st["status"] == "analysed"
    assert "rotation values of q" in st["proved"] and "memory bounds" in st["proved"]
    assert "rotation values of k" not in st["proved"]
    assert [g.split(":")[0] for g in st["gaps"]] == ["rotation values of k"]
    assert "not a linear form" in st["gaps"][0]


def test_a_kernel_followed_whole_proves_every_property(monkeypatch):
    st = _analyse(monkeypatch, "tests/kernels/robust_rope.py:entry", "rope", ROPE_PARAMS)["status"]
    assert st["gaps"] == [] and "rotation values of k" in st["proved"] and "passthrough" in st["proved"]


def test_proved_and_gaps_in_the_outputs_and_old_reports_still_load():
    from test_report import gate_report

    from kernalin_ci.report.markdown import render_markdown
    from kernalin_ci.report.writer import report_json

    st = StructuralStatus("analysed", shape="D=48 float32", proved=["memory bounds"], gaps=["rotation values of k: x"])
    assert "proved: memory bounds" in st.summary() and "not verified: rotation values of k: x" in st.summary()
    v = VerifyResult(op="rope", entry="k.py:entry", structural=st)
    assert VerifyResult.from_json(v.to_json()).structural == st
    old = v.to_json()
    old["structural"] = {"status": "analysed", "cause": None, "shape": "D=48 float32"}  # before issue 30
    assert VerifyResult.from_json(old).structural.gaps == []
    report = gate_report()
    report.kernels[0].verification.structural = st
    doc = json.loads(report_json(report))
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert doc["kernels"][0]["verification"]["structural"]["gaps"] == ["rotation values of k: x"]
    text = render_markdown(report)
    assert "proved: memory bounds" in text and "**not verified:** rotation values of k: x" in text
