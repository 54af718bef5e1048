"""Every verdict explained (kernalin_ci.explain): compiled-code identity on the CPU (real Triton
compiles for sm_90 in worker children), the bytes/FLOPs models, % of peak and its >100% flag,
provenance on the CPU, and the report rendering."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

from kernalin_ci.bench.shapes import bench_cases
from kernalin_ci.explain import code, peak, provenance
from kernalin_ci.explain.identity import EQUIVALENT, SideCompile, compare, compile_side, why_changed
from kernalin_ci.explain.model import Explanation
from kernalin_ci.explain.render import explain_block, explain_lines
from kernalin_ci.findings import VerifyResult
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Case, resolve_params
from kernalin_ci.report.model import KernelReport, Report
from kernalin_ci.report.schema import REPORT_SCHEMA

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "decode-kernels"
OP = "attention.decode"


def _tree(tmp: Path, name: str, patch: str | None) -> str:
    d = tmp / name
    shutil.copytree(EXAMPLE / "kernels", d / "kernels")
    if patch:
        subprocess.run(["git", "apply", str(EXAMPLE / "prs" / patch)], cwd=d, check=True)
    return str(d)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Base, a comment-only PR and a num_warps PR of the example's decode attention, compiled at the
    CPU benchmark shapes: the comment PR through the gate's own call (`plan_kernel`, as kernalin_ci.gate.run
    makes it), the num_warps PR alongside."""
    from concurrent.futures import ThreadPoolExecutor

    from kernalin_ci.config import Kernel
    from kernalin_ci.explain import plan_kernel

    tmp = tmp_path_factory.mktemp("explain")
    params = resolve_params(OP, get_op(OP).params, {})
    cases = bench_cases(OP, params, "cpu", {})
    trees = {
        name: _tree(tmp, name, patch)
        for name, patch in (("base", None), ("comment", "comment-only.patch"), ("warps", "more-warps.patch"))
    }
    k = Kernel(name="decode_attention", op=OP, entry="kernels/attention.py:decode")
    kr = KernelReport(k.name, OP, k.entry, "changed")
    with ThreadPoolExecutor(2) as pool:
        warps = pool.submit(compile_side, OP, k.entry, trees["warps"], params, cases)
        plan = plan_kernel(kr, k, OP, {}, "cpu", trees["base"], trees["comment"])
        sides = {"base": plan.base, "comment": plan.head, "warps": warps.result()}
    return cases, sides, kr, trees


def test_comment_only_change_is_identical_compiled_code(compiled):
    cases, s, kr, _ = compiled
    assert s["base"].error is None, s["base"].error
    la = s["base"].shapes[0]["launches"][0]
    assert la["kernel"] == "_decode_kernel" and la["compiled"]["sass"] and la["compiled"]["ptx"]
    ident = compare(s["base"], s["comment"], cases)
    assert ident.status == "compared" and ident.all_identical, ident.to_json()
    assert ident.verdict == EQUIVALENT and ident.to_time([c.name for c in cases]) == []
    # the gate's call: no timing, the verdict in the note and in report.json
    assert kr.benchmark is None and kr.benchmark_note.startswith(EQUIVALENT)
    assert kr.explain.identity.verdict == EQUIVALENT and kr.explain.provenance.start["torch"]


def test_num_warps_change_differs_and_says_why(compiled):
    cases, s, _, _ = compiled
    ident = compare(s["base"], s["warps"], cases)
    assert not ident.all_identical and ident.verdict is None
    assert ident.to_time([c.name for c in cases]) == [cases[0].name]
    assert any("num_warps 4 -> 8" in d for d in ident.shapes[0].differences)
    rows = why_changed(s["base"], s["warps"], cases, ident)
    assert rows and "num_warps" in rows[0]["changed"]
    b, h = rows[0]["base"], rows[0]["head"]
    assert (b["num_warps"], h["num_warps"]) == (4, 8)
    assert isinstance(b["registers"], int) and b["registers"] > 0 and b["spill_bytes"] == 0
    assert 0 < b["occupancy"] <= 1 and b["mix"]["classes"]["global-load"] > 0
    text = "\n".join(explain_lines(Explanation(ident, why=rows)))
    assert "num_warps: 4 -> 8" in text and "registers/thread:" in text and "theoretical occupancy" in text


def test_only_the_shapes_that_differ_are_timed(compiled):
    cases, s, _, _ = compiled
    two = [cases[0], Case("second", cases[0].dims, cases[0].dtype)]
    base = SideCompile(s["base"].toolchain, [s["base"].shapes[0]] * 2)
    head = SideCompile(s["comment"].toolchain, [s["comment"].shapes[0], s["warps"].shapes[0]])
    ident = compare(base, head, two)
    assert [x.identical for x in ident.shapes] == [True, False] and not ident.all_identical
    assert ident.to_time([c.name for c in two]) == ["second"]


def test_toolchain_change_times_everything(compiled):
    cases, s, _, _ = compiled
    other = SideCompile(dict(s["comment"].toolchain, triton="0.0-other"), s["comment"].shapes)
    ident = compare(s["base"], other, cases)
    assert ident.toolchain_changed and not ident.all_identical
    assert ident.to_time([c.name for c in cases]) == [c.name for c in cases]


def test_the_cpu_path_reports_what_it_can_and_says_what_it_cannot(compiled):
    """The gate's after-benchmark step on the CPU with --profile, for the num_warps PR (real compiled sides,
    nothing timed here): static figures from the compiled code, the re-check against the reference, and a
    stated reason for everything a GPU would add (% of peak, NVML, Nsight Compute)."""
    from kernalin_ci.config import Kernel
    from kernalin_ci.explain.gate import ExplainPlan, after_bench

    cases, s, _, trees = compiled
    ident = compare(s["base"], s["warps"], cases)
    plan = ExplainPlan(
        cases, ident, s["base"], s["warps"], provenance.environment("cpu"), ident.to_time([c.name for c in cases])
    )
    plan.base_root = trees["base"]
    k = Kernel(name="decode_attention", op=OP, entry="kernels/attention.py:decode")
    kr = KernelReport(k.name, OP, k.entry, "changed")
    ex = after_bench(plan, kr, k, OP, {}, "cpu", trees["warps"], profile=True)
    assert ex.profile == {"status": "not profiled", "cause": "Nsight Compute needs a GPU (device cpu)"}
    assert ex.peak_note.startswith("CPU interpreter wall-clock times: % of a GPU's peak is not available")
    assert ex.why and ex.why[0]["base"]["registers"] and ex.why[0]["head"]["num_warps"] == 8
    assert ex.recheck["verdict"] == "pass" and ex.recheck["case"] == cases[0].name
    lines = explain_lines(ex)
    assert "Nsight Compute: not profiled (Nsight Compute needs a GPU (device cpu))" in lines
    assert any(ln.startswith("ran on: ") and "not available" in ln for ln in lines)
    # report.json's full explanation, in its key order, and back through from_json byte for byte
    j = ex.to_json()
    assert list(j) == ["identity", "verdict", "peak", "why", "provenance", "recheck", "profile", "peak_note"]
    assert list(j["provenance"]) == ["start", "end", "changed", "regime"]
    text = json.dumps(j, indent=2)
    assert json.dumps(Explanation.from_json(json.loads(text)).to_json(), indent=2) == text
    assert explain_lines(Explanation.from_json(json.loads(text))) == lines


def test_code_normalisation_and_occupancy():
    ptx = (
        '.version 8.0\n.file 1 "a.py"\n.loc 1 10 3\n$L__tmp1:\nld.global.f32 %f1, [%rd1];\n'
        ".section .debug_info\n{\n.b8 1\n}\n"
    )
    assert code.normalize_ptx(ptx) == ".version 8.0\nld.global.f32 %f1, [%rd1];"
    ttgir = '#loc = loc("a.py":1:0)\n%0 = tt.load %arg0 : !tt.ptr<f32> loc(#loc3)\n'
    assert code.normalize_ttgir(ttgir) == "%0 = tt.load %arg0 : !tt.ptr<f32>"
    # 128 registers x 4 warps: 16 warps fit in the register file -> 4 blocks -> 25%
    occ = code.occupancy(90, 4, 128, 0)
    assert occ == {"blocks_per_sm": 4, "warps_per_sm": 16, "fraction": 0.25, "limited_by": "registers"}
    assert code.occupancy(90, 4, 32, 0)["fraction"] == 1.0
    mix = code.instruction_mix(
        ["@P0 LDG.E.128 R4, desc[UR4][R2.64]", "HGMMA.64x64x16.F32 R0, gdesc[UR4]", "FFMA R1, R2, R3, R4", "EXIT"]
    )
    assert mix["classes"] == {"global-load": 1, "tensor-core": 1, "fp32": 1, "branch": 1}
    assert mix["widest_global_bits"] == 128


def _case(op: str, dims: dict, dtype: str = "bfloat16") -> Case:
    return Case("c", dims, dtype)


def test_bytes_and_flops_models():
    att = get_op("attention.decode").traffic(
        _case("attention.decode", {"Hq": 32, "Hkv": 8, "D": 128, "kv_lens": [1000, 3000], "scale": 1.0}), {}
    )
    # q + K and V once per KV head + lens; out; 4·Hq·D per key
    assert att.bytes_read == 2 * 32 * 128 * 2 + 2 * 4000 * 8 * 128 * 2 + 8
    assert att.bytes_written == 2 * 32 * 128 * 2 and att.flops == 4 * 32 * 128 * 4000
    paged = get_op("attention.decode_paged").traffic(
        _case("", {"Hq": 32, "Hkv": 8, "D": 128, "kv_lens": [1000, 3000], "scale": 1.0}), {"block_size": 16}
    )
    assert paged.bytes_read == att.bytes_read + 4 * (63 + 188)
    rope = get_op("rope").traffic(_case("", {"T": 64, "Hq": 32, "Hkv": 8, "D": 128}), {"rotary_dim": 64})
    assert (rope.bytes_read, rope.bytes_written, rope.flops) == (
        64 * 40 * 128 * 2 + 64 * 8,
        64 * 40 * 128 * 2,
        3 * 64 * 40 * 64,
    )
    kv = get_op("kv_append").traffic(_case("", {"T": 10, "Hkv": 8, "D": 128, "num_blocks": 4, "padding": 2}), {})
    assert (kv.bytes_read, kv.bytes_written, kv.flops) == (2 * 10 * 2048 + 80, 2 * 8 * 2048, 0)
    assert get_op("custom").traffic(_case("", {}), {}) is None


def test_percent_of_peak_and_above_peak_is_a_measurement_problem():
    h200 = peak.gpu_peaks("NVIDIA H200")
    assert h200["model"] == "H200 SXM" and h200["hbm_gbs"] == 4800
    assert peak.gpu_peaks("NVIDIA H100 80GB HBM3")["model"] == "H100 SXM"
    assert peak.gpu_peaks("NVIDIA A100-SXM4-40GB")["hbm_gbs"] == 1555
    assert peak.gpu_peaks("Some Future GPU") is None
    t = get_op("attention.decode").traffic(
        _case("", {"Hq": 32, "Hkv": 8, "D": 128, "kv_lens": [32768], "scale": 1.0}), {}
    )
    ms = t.bytes / 4000e9 * 1e3  # 4 TB/s
    p = peak.shape_peak(t, ms, "bfloat16", h200, 4200.0, tensor=False)
    assert p["bound"] == "memory-bound" and abs(p["pct_peak_bw"] - 4000 / 4800) < 1e-9
    assert not p["above_peak"] and "83% of HBM peak" in peak.peak_text(p)
    small = get_op("attention.decode").traffic(
        _case("", {"Hq": 32, "Hkv": 8, "D": 128, "kv_lens": [256], "scale": 1.0}), {}
    )
    fast = peak.shape_peak(small, small.bytes / 9000e9 * 1e3, "bfloat16", h200, 4200.0, tensor=False)
    assert fast["above_peak"] and "measurement problem" in fast["problem"] and "L2" in fast["problem"]
    assert "⚠" in peak.peak_text(fast)
    # the machine's measured copy bandwidth is a peak too: 4.6 TB/s is 96% of the datasheet but 112% of a
    # measured 4.1 TB/s copy, which no DRAM read reaches; 4.4 TB/s (107%) is a kernel that only reads
    at = {gbs: peak.shape_peak(t, t.bytes / (gbs * 1e9) * 1e3, "bfloat16", h200, 4100.0, False) for gbs in (4400, 4600)}
    assert not at[4400]["above_peak"] and at[4600]["above_peak"]
    assert at[4600]["problem"].startswith("112% of the measured copy bandwidth 4100 GB/s: a measurement problem")
    unknown = peak.shape_peak(t, t.bytes / 5000e9 * 1e3, "bfloat16", None, 4100.0, False)
    assert unknown["above_peak"] and unknown["pct_peak_bw"] is None  # no table row: the copy still counts


def test_provenance_on_the_cpu_says_what_is_unavailable():
    env = provenance.environment("cpu")
    assert env.get("gpu_name") is None and "not available" in env["unavailable"]
    assert env["torch"] and env["triton"]
    assert "not available" in provenance.provenance_text(env)
    other = dict(env, gpu_uuid="GPU-other")
    assert provenance.changed(env, other) == ["gpu_uuid None -> GPU-other"]


def test_report_renders_and_validates():
    from kernalin_ci.report.junit import render_junit
    from kernalin_ci.report.markdown import render_markdown
    from kernalin_ci.report.writer import report_json

    t = get_op("attention.decode").traffic(
        _case("", {"Hq": 32, "Hkv": 8, "D": 128, "kv_lens": [256], "scale": 1.0}), {}
    )
    h200 = peak.gpu_peaks("NVIDIA H200")
    ex = {
        "identity": {
            "status": "compared",
            "cause": None,
            "toolchain_changed": [],
            "toolchain": {},
            "seconds": 1.0,
            "shapes": [{"shape": "B=1", "identical": False, "differences": ["launch 1 (k): num_warps 4 -> 8"]}],
            "verdict": None,
        },
        "verdict": None,
        "why": [],
        "above_peak": True,
        "peak": [
            {
                "shape": "B=1",
                "model": None,
                "base": peak.shape_peak(t, t.bytes / 9000e9 * 1e3, "bfloat16", h200, None, False),
                "head": peak.shape_peak(t, t.bytes / 9000e9 * 1e3, "bfloat16", h200, None, False),
            }
        ],
        "provenance": {
            "start": {"gpu_name": "NVIDIA H200", "gpu_uuid": "GPU-1", "torch": "2", "triton": "3"},
            "end": None,
            "changed": [],
            "regime": {"clock": "cuda-events"},
        },
        "recheck": {"case": "B=1", "verdict": "pass", "findings": [], "error": None},
        "profile": None,
    }
    v = VerifyResult("attention.decode", "a.py:f")
    kr = KernelReport("k", "attention.decode", "a.py:f", "changed", explain=Explanation.from_json(ex), verification=v)
    r = Report("success", "ok", {"ref": "a", "sha": "1"}, {"ref": "b", "sha": "2"}, "cuda", {}, kernels=[kr])
    jsonschema.validate(json.loads(report_json(r)), REPORT_SCHEMA)
    md = render_markdown(r)
    assert "<details><summary>Why: 0/1 shapes identical code, above peak: measurement problem</summary>" in md
    assert "measurement problem" in md and "correctness after timing: pass" in md
    assert "why: compiled code: identical at 0 of 1" in render_junit(r)
    assert explain_block(None) is None
    same = {
        "identity": {
            "status": "compared",
            "shapes": [{"shape": "B=1", "identical": True, "differences": []}],
            "verdict": EQUIVALENT,
        }
    }
    assert "timing skipped" in explain_block(Explanation.from_json(same))


def test_profile_says_when_nsight_is_missing_and_parses_ncu_csv(monkeypatch, tmp_path):
    from kernalin_ci.explain.profile import (
        counters_admin_only,
        install_dirs,
        nsight,
        parse,
        profile_lines,
        side_by_side,
    )

    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu here
    assert nsight(True) == {"status": "not profiled", "cause": "ncu (Nsight Compute) is not on PATH"}
    assert nsight(False) is None
    header = '"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'
    text = (
        "==PROF== Connected\n"
        + header
        + "\n"
        + '"0","1","_decode_kernel","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","81.52"\n'
        + '"0","1","_decode_kernel","sm__warps_active.avg.pct_of_peak_sustained_active","%","45.0"\n'
    )
    rows = parse(text)
    assert rows == [{"kernel": "_decode_kernel", "dram_throughput_pct": 81.52, "achieved_occupancy_pct": 45.0}]
    head = [{"kernel": "_decode_kernel", "dram_throughput_pct": 70.0, "l2_hit_rate_pct": 12.5}]
    p = {
        "status": "profiled",
        "cause": "shape s",
        "sandboxed": True,
        "base": {"kernels": rows},
        "head": {"kernels": head},
    }
    assert side_by_side(p) == [
        {
            "kernel": "_decode_kernel",
            "dram_throughput_pct": [81.52, 70.0],
            "achieved_occupancy_pct": [45.0, None],
            "l2_hit_rate_pct": [None, 12.5],
        }
    ]
    lines = profile_lines(p)
    assert lines[0] == "Nsight Compute, base -> head (shape s, in the worker sandbox):"
    assert lines[1] == (
        "  _decode_kernel: DRAM throughput 81.5% -> 70.0%, achieved occupancy 45.0% -> n/a, L2 hit rate n/a -> 12.5%"
    )
    failed = profile_lines({"status": "profiled", "cause": "s", "base": {"kernels": rows}, "head": {"error": "ncu: x"}})
    assert "  head: ncu: x" in failed
    # the driver's counter restriction, read from its parameter file
    params = tmp_path / "params"
    params.write_text("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\n")
    assert counters_admin_only(str(params)) is True
    params.write_text("RmProfilingAdminOnly: 0\n")
    assert counters_admin_only(str(params)) is False
    assert counters_admin_only(str(tmp_path / "absent")) is None
    assert install_dirs("/usr/local/cuda-13.0/bin/ncu") == ["/usr/local/cuda-13.0"]
    assert install_dirs("/opt/nvidia/nsight-compute/2025.3.1/ncu") == ["/opt/nvidia/nsight-compute/2025.3.1"]


def test_a_profiler_wraps_the_worker_inside_the_worker_sandbox(tmp_path, monkeypatch, request):
    """How --profile starts ncu: as `wrap`, the command that starts the worker inside the sandbox. A real
    wrapper (sh) records who and where it ran, then starts the worker, whose events still arrive."""
    from kernalin_ci import sandbox
    from kernalin_ci.isolate import run_task
    from kernalin_ci.jobs import EnvJob

    monkeypatch.setenv(sandbox.ENV_WORKER_SANDBOX, "auto")
    if not sandbox.workers_sandboxed():
        pytest.skip(f"no worker sandbox here: {sandbox.bwrap_works(sandbox.SandboxSettings())}")
    monkeypatch.setenv(sandbox.ENV_WORKER_SANDBOX, "on")
    folder = sandbox.CappedFolder("kernalin-test-out-")  # the wrapper writes folder.path, we read folder.view
    request.addfinalizer(folder.close)
    secret = tmp_path / "secret"
    secret.write_text("outside")
    script = (
        'id -u > "$0/uid"; cat "$1" > "$0/secret" 2>/dev/null; echo $$ > "$0/pid"; '
        'touch /dev/shm/k && echo yes > "$0/shm"; shift; exec "$@"'
    )
    o = run_task(
        EnvJob(),
        "cpu",
        120,
        writable=(folder,),
        wrap=("/bin/sh", "-c", script, folder.path, str(secret)),
    )
    out = Path(folder.view)
    assert o.status == "ok" and any(e.get("event") == "explain-env" for e in o.events)
    assert int((out / "pid").read_text()) < 10  # its own PID namespace
    assert (out / "secret").read_text() == ""  # the rest of the file system does not exist inside
    assert (out / "shm").read_text() == "yes\n"  # POSIX shared memory, the sandbox's own
    if os.geteuid() == 0:
        assert (out / "uid").read_text().strip() == "65534"


def test_the_gate_on_the_cpu_times_nothing_and_says_so_once(compiled):
    """On the CPU the gate compares the compiled code and stops there: no interpreter timing (it never
    gates), no verdict, one note; none of a GPU's figures (occupancy, % of peak) in the explanation."""
    from kernalin_ci.explain import untimed_on_cpu
    from kernalin_ci.explain.gate import CPU_NOT_TIMED, ExplainPlan

    cases, s, _, _ = compiled
    ident = compare(s["base"], s["warps"], cases)
    plan = ExplainPlan(cases, ident, s["base"], s["warps"], provenance.environment("cpu"), [c.name for c in cases])
    kr = KernelReport("decode_attention", OP, "kernels/attention.py:decode", "changed")
    untimed_on_cpu(kr, plan)
    assert kr.benchmark is None and kr.bench_verdict is None and kr.benchmark_note == CPU_NOT_TIMED
    lines = explain_lines(kr.explain)
    assert lines[0] == f"compiled code: identical at 0 of {len(cases)} benchmark shapes"
    assert not any("occupancy" in ln or "peak" in ln or "inconclusive" in ln for ln in lines), lines
