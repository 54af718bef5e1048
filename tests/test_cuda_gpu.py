"""CUDA C++ kernels on a GPU (docs/cuda.md), marked `gpu` (skipped without one; run by benchmarks/cuda_gpu.sh):
each way an entry builds and launches CUDA code verifies a correct kv_append kernel with no finding; the CUDA
catalogue's rows match their labels (pos-0 probe, dynamic checks, Compute Sanitizer); a PR that drops a barrier
between tiles in an example repository is gated end to end and fails on Compute Sanitizer's race report."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHECKS, REPO, cli
from test_cuda import BARRIER, cuda_repo, git  # noqa: F401  (the example repository fixture)

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


def _verify(entry: str, *extra: str, cwd=REPO) -> dict:
    r = cli(
        "verify", "--op", "kv_append", "--entry", entry, "--device", "cuda", "--quiet", "--json", "-", *extra, cwd=cwd
    )
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


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
    res = _verify(entry, "--cuda-source", "checks/cuda/kv_append/kv_append.cu", "--cuda-flag=-Ichecks/cuda/common")
    record(f"way {way}", res)
    assert res["findings"] == [], res["findings"]
    assert res["verdict"] == "pass" and res["cases_run"] >= 10
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
    header = cuda_repo / "common" / "decode_attention.cuh"
    text = header.read_text()
    git(cuda_repo, "checkout", "-qb", "pr")
    header.write_text(text.replace(BARRIER, ""))
    git(cuda_repo, "commit", "-qam", "drop a barrier")
    out = cuda_repo / "out"
    r = cli("run", "--device", "cuda", "--quiet", "--base", "main", "--out", str(out), cwd=cuda_repo)
    report = json.loads((out / "report.json").read_text())
    record("gate: a dropped barrier", report)
    assert r.returncode == 1, r.stderr
    [k] = report["kernels"]
    classes = {f["bug_class"] for f in k["verification"]["findings"] if f["kind"] == "sanitizer"}
    assert "shared-race" in classes, k["verification"]["findings"]


def test_the_sanitizer_runs_on_a_triton_kernel_without_false_findings():
    if toolchain.compute_sanitizer() is None:
        pytest.skip("no compute-sanitizer")
    r = cli("verify", "--op", "kv_append", "--entry", "checks/kv_append/correct_per_token.py:entry", "--device",
            "cuda", "--only", "sanitizer", "--quiet", "--json", "-")  # fmt: skip
    res = json.loads(r.stdout)
    record("sanitizer on a Triton kernel", res)
    assert res["sanitizer"]["status"] == "checked", res["sanitizer"]
    assert res["findings"] == [], res["findings"]
    assert set(res["sanitizer"]["tools"]) == {"memcheck", "racecheck", "initcheck", "synccheck"}


if __name__ == "__main__":
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", __file__]))
