"""CUDA C++ kernels on a GPU (docs/cuda.md), marked `gpu` (skipped without one; run by benchmarks/cuda_gpu.py):
each way an entry builds and launches CUDA code verifies a correct kv_append kernel with no finding; the CUDA
catalogue's rows match their labels (pos-0 probe, dynamic checks, Compute Sanitizer); in an example repository,
a PR that drops a barrier between tiles is gated end to end and fails on Compute Sanitizer's race report, and a
correct PR to the same kernel is verified, sanitized, benchmarked and commented on (tests/test_cuda.py: the same
PR on the CPU). Every command's exit code and last output go to tests.json, so a failure says why."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHECKS, REPO, cli
from test_cuda import BARRIER, UNROLLED, VALUES_LOOP, cuda_repo, pr_to_cuda_repo  # noqa: F401  (the fixture)

from kernalin_ci import catalogue as cat
from kernalin_ci.cuda import toolchain

pytestmark = pytest.mark.gpu
ENTRIES = REPO / "tests" / "cuda_entries"
CUDA_KERNELS = [k for k in cat.discover(CHECKS) if k.cuda]
OUT = Path(os.environ.get("KERNALIN_CUDA_OUT") or REPO / ".cache" / "cuda-gpu")


def record(key: str, value) -> None:
    """Keep a result in OUT/tests.json (benchmarks/cuda_gpu.py brings it back)."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "tests.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1))


def _verify(entry: str, *extra: str, cwd=REPO, name: str = "") -> dict:
    r = cli(
        "verify", "--op", "kv_append", "--entry", entry, "--device", "cuda", "--quiet", "--json", "-", *extra, cwd=cwd
    )
    if r.returncode not in (0, 1):
        record(f"{name}: failed", {"exit": r.returncode, "stderr": r.stderr[-4000:]})
    assert r.returncode in (0, 1), r.stderr[-4000:]
    return json.loads(r.stdout)


def _gate(repo: Path, name: str, *extra: str) -> tuple[int, dict]:
    """`kernalin-ci run --device cuda` on REPO's branch pr against main: (exit code, report.json); its exit code and
    the end of its output are recorded whatever happens (a run that writes no report must say why)."""
    out = repo / "out"
    r = cli("run", "--device", "cuda", "--quiet", "--base", "main", "--out", str(out), *extra, cwd=repo)
    path = out / "report.json"
    report = json.loads(path.read_text()) if path.is_file() else None
    md = (out / "report.md").read_text() if (out / "report.md").is_file() else None
    record(name, {"exit": r.returncode, "stderr": r.stderr[-4000:], "report": report, "report.md": md})
    assert report is not None, f"no report (exit {r.returncode}): {r.stderr[-3000:]}"
    return r.returncode, report


WAYS = {
    "nvrtc-helper": ("checks/cuda/kv_append/correct_per_token.py:entry", "kernalin_ci.cuda.nvrtc"),
    "cuda-python": ("tests/cuda_entries/kv_append_cuda_python.py:entry", "cuda.bindings"),
    "cupy": ("tests/cuda_entries/kv_append_cupy.py:entry", "cupy"),
    "load_inline": ("tests/cuda_entries/kv_append_load_inline.py:entry", "torch.utils.cpp_extension"),
    "torch-op": ("tests/cuda_entries/kv_append_torch_op.py:entry", "torch.utils.cpp_extension"),
}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_each_way_of_launching_cuda_code_verifies(way):
    entry, module = WAYS[way]
    pytest.importorskip(module)
    res = _verify(
        entry, "--cuda-source", "checks/cuda/kv_append/kv_append.cu", "--cuda-flag=-Ichecks/cuda/common", name=way
    )
    record(f"way {way}", res)
    assert res["findings"] == [], res["findings"]
    assert res["verdict"] == "pass" and res["cases_run"] >= 10, (res["not_checked"], res["notices"])
    assert res["build"]["status"] in ("built", "cached")
    assert res["sanitizer"]["status"] in ("checked", "not-checked")


@pytest.fixture(scope="module")
def matrix():
    kinds = ("probe", "dynamic", "sanitizer")
    rows = cat.matrix(CUDA_KERNELS, kinds, "cuda", jobs=4)
    record("cuda catalogue", [cat.row_json(r) for r in rows])
    return {r.kernel.name: r for r in rows}


@pytest.mark.parametrize("name", [k.name for k in CUDA_KERNELS])
def test_cuda_catalogue_row_matches_its_label(matrix, name):
    row = matrix[name]
    assert not row.mismatches(), row.mismatches()


@pytest.mark.skipif(toolchain.compute_sanitizer() is None, reason="no compute-sanitizer")
def test_a_dropped_barrier_is_caught_end_to_end(cuda_repo):  # noqa: F811
    pr_to_cuda_repo(cuda_repo, BARRIER, "", "drop a barrier")
    code, report = _gate(cuda_repo, "gate: a dropped barrier")
    [k] = report["kernels"]
    assert code == 1 and report["conclusion"] == "failure", report["reason"]
    assert k["status"] == "changed" and k["reasons"] == ["common/decode_attention.cuh changed"]
    v = k["verification"]
    classes = {f["bug_class"] for f in v["findings"] if f["kind"] == "sanitizer"}
    assert "shared-race" in classes, v["findings"]
    assert v["sanitizer"]["status"] == "checked" and k["benchmark_note"] == "not benchmarked: verification failed"
    assert "racecheck" in (cuda_repo / "out" / "report.md").read_text()


@pytest.mark.skipif(toolchain.compute_sanitizer() is None, reason="no compute-sanitizer")
def test_a_correct_change_is_verified_sanitized_and_benchmarked_end_to_end(cuda_repo):  # noqa: F811
    pr_to_cuda_repo(cuda_repo, VALUES_LOOP, UNROLLED, "unroll the values' loop")
    code, report = _gate(cuda_repo, "gate: a correct change", "--fail-on", "finding")
    [k] = report["kernels"]
    v = k["verification"]
    assert v["findings"] == [] and v["verdict"] == "pass" and v["cases_run"] >= 10, v["findings"]
    assert v["build"]["status"] in ("built", "cached") and v["sanitizer"]["status"] == "checked", v["sanitizer"]
    assert k["benchmark"] and k["benchmark"]["verdict"], (k["benchmark"], k["benchmark_note"], k.get("error"))
    assert code == 0 and report["conclusion"] == "success", report["reason"]
    md = (cuda_repo / "out" / "report.md").read_text()
    assert "- **Compute Sanitizer:** checked" in md and "- **Benchmark:**" in md


def test_the_sanitizer_runs_on_a_triton_kernel_without_false_findings():
    if toolchain.compute_sanitizer() is None:
        pytest.skip("no compute-sanitizer")
    r = cli("verify", "--op", "kv_append", "--entry", "checks/kv_append/correct_per_token.py:entry", "--device",
            "cuda", "--only", "sanitizer", "--quiet", "--json", "-")  # fmt: skip
    assert r.returncode in (0, 1), r.stderr[-3000:]
    res = json.loads(r.stdout)
    record("sanitizer on a Triton kernel", res)
    assert res["sanitizer"]["status"] == "checked", res["sanitizer"]
    assert res["findings"] == [], res["findings"]
    assert set(res["sanitizer"]["tools"]) == {"memcheck", "racecheck", "initcheck", "synccheck"}


if __name__ == "__main__":
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", __file__]))
