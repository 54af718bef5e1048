"""The explanation is typed until the writer (kernalin_ci.explain.model.Explanation): each of the four
shapes report.json has always held (the error alone, identity and error, skipped, full) is read back by
Report.from_json and written again byte for byte, key order included; the gate's builders still make them."""

from __future__ import annotations

import json

import jsonschema
import pytest
from test_report import gate_report

from kernalin_ci.config import Kernel
from kernalin_ci.explain.gate import ExplainPlan, finish_kernel, plan_kernel, skipped
from kernalin_ci.explain.identity import EQUIVALENT, Identity, ShapeIdentity, SideCompile
from kernalin_ci.explain.model import Explanation
from kernalin_ci.report.markdown import render_markdown
from kernalin_ci.report.model import KernelReport, Report
from kernalin_ci.report.schema import REPORT_SCHEMA
from kernalin_ci.report.writer import report_json

TOOLCHAIN = {"base": {"triton": "3.6.0", "torch": "2.11.0"}, "head": {"triton": "3.6.0", "torch": "2.11.0"}}
START = {"gpu_name": "NVIDIA H200", "gpu_uuid": "GPU-1", "driver": "580.1", "torch": "2.11.0", "copy_gbs": 3900.0}


def identity(identical: bool) -> dict:
    """Identity.to_json as the gate writes it (field order, then the derived verdict)."""
    return {
        "status": "compared",
        "cause": None,
        "toolchain_changed": [],
        "shapes": [
            {"shape": "B=1", "identical": True, "differences": []},
            {
                "shape": "B=8",
                "identical": identical,
                "differences": [] if identical else ["launch 1 (_decode_kernel): num_warps 4 -> 8"],
            },
        ],
        "toolchain": TOOLCHAIN,
        "seconds": 12.25,
        "verdict": EQUIVALENT if identical else None,
    }


SIDE = {
    "bytes": 1 << 20,
    "flops": 1 << 18,
    "ms": 0.0001,
    "achieved_gbs": 10485.76,
    "achieved_tflops": 2.62,
    "peak_gbs": 4800.0,
    "peak_tflops": 989.0,
    "peak_flops_kind": "bf16 dense",
    "pct_peak_bw": 2.18,
    "pct_peak_flops": 0.0026,
    "pct_copy_bw": 2.69,
    "bound": "memory-bound",
    "above_peak": True,
    "problem": "above peak: a measurement problem",
}
WHY = {
    "kernel": "_decode_kernel",
    "shape": "B=8",
    "launch": 1,
    "base": {"num_warps": 4, "registers": 96},
    "head": {"num_warps": 8, "registers": 64},
    "changed": ["num_warps", "registers"],
}
REGIME = {"clock": "cuda-events", "l2_flush": True, "reps": 30, "timing": ["cuda-graph"], "regime": "cold"}

# report.json's `explain` in the four shapes, with the keys in the order the gate has always written them
SHAPES = {
    "error": {"error": "UsageError: unknown op 'nope' (ops: ...)"},
    "identity-and-error": {"identity": identity(False), "error": "KeyError: 'launches'"},
    "skipped": {
        "identity": identity(True),
        "verdict": EQUIVALENT,
        "peak": [],
        "why": [],
        "provenance": {"start": START, "end": None, "changed": []},
        "recheck": None,
        "profile": None,
    },
    "full": {
        "identity": identity(False),
        "verdict": "inconclusive: environment changed (sm_clock_mhz 1980 -> 1500)",
        "peak": [{"shape": "B=8", "model": None, "base": SIDE, "head": SIDE}],
        "why": [WHY],
        "provenance": {
            "start": START,
            "end": dict(START, sm_clock_mhz=1500),
            "changed": ["sm_clock_mhz 1980 -> 1500"],
            "regime": REGIME,
        },
        "recheck": {"case": "B=8", "verdict": "pass", "findings": [], "error": None},
        "profile": {"status": "not profiled", "cause": "ncu (Nsight Compute) is not on PATH"},
        "peak_note": "GPU 'NVIDIA X' is not in the peak table: shares of peak not available",
        "above_peak": True,
    },
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_shape_round_trips_byte_for_byte(shape):
    d = SHAPES[shape]
    ex = Explanation.from_json(d)
    assert json.dumps(ex.to_json()) == json.dumps(d)
    r = gate_report()
    r.kernels[0].explain = ex
    text = report_json(r)
    doc = json.loads(text)
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert json.dumps(doc["kernels"][0]["explain"]) == json.dumps(d)
    back = Report.from_json(doc)
    assert isinstance(back.kernels[0].explain, Explanation) and back.kernels[0].explain == ex
    assert report_json(back) == text and render_markdown(back) == render_markdown(r)


def test_the_typed_explanation_reads_as_its_json_did():
    full = Explanation.from_json(SHAPES["full"])
    assert full.made and full.above_peak and full.provenance.regime == REGIME
    assert isinstance(full.identity, Identity) and full.identity.shapes[1].differences
    assert full.identity.verdict is None and Explanation.from_json(SHAPES["skipped"]).identity.verdict == EQUIVALENT
    partial = Explanation.from_json(SHAPES["identity-and-error"])
    assert not partial.made and partial.error == "KeyError: 'launches'" and partial.identity is not None


def test_the_gate_builds_the_shapes_it_always_wrote(tmp_path):
    """skipped(), and the gate's two calls failing (an op it cannot resolve), write the shapes above."""
    ident = Identity(
        "compared",
        shapes=[ShapeIdentity("B=1", True, []), ShapeIdentity("B=8", True, [])],
        toolchain=TOOLCHAIN,
        seconds=12.25,
    )
    plan = ExplainPlan([], ident, SideCompile(), SideCompile(), START)
    assert json.dumps(skipped(plan).to_json()) == json.dumps(SHAPES["skipped"])

    k = Kernel(name="k", op="nope", entry="k.py:f")
    kr = KernelReport(k.name, k.op, k.entry, "changed")
    assert plan_kernel(kr, k, "nope", {}, "cpu", tmp_path, tmp_path) is None
    assert list(kr.explain.to_json()) == ["error"] and kr.explain.error.startswith("UsageError: unknown op 'nope'")
    finish_kernel(kr, plan, k, "nope", {}, "cpu", tmp_path)
    assert list(kr.explain.to_json()) == ["identity", "error"]
    assert kr.explain.to_json()["identity"] == SHAPES["skipped"]["identity"]
