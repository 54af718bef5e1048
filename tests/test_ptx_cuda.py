"""The PTX engine on CUDA C++ kernels, no GPU: the structural capture records a launch through
kernalin_ci.cuda.nvrtc (PTX compiled by NVRTC on the CPU, grid, block, typed arguments), the launch facts come
from it like a Triton kernel's, and the catalogue's CUDA kv_append is proved correct or caught."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("z3")
pytest.importorskip("cuda.bindings")

ROOT = Path(__file__).resolve().parents[1]
CUDA = ROOT / "checks" / "cuda"


def _nvrtc_or_skip():
    from kernalin_ci.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except Exception as e:  # no NVRTC library here
        pytest.skip(f"no NVRTC ({e})")


def test_a_cuda_kernel_is_captured_and_proved_for_every_shape_of_the_domain():
    _nvrtc_or_skip()
    os.environ["TRITON_INTERPRET"] = "0"
    from kernalin_ci.catalogue import read_meta
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.verify.structural.capture import capture_at, capture_cases
    from kernalin_ci.verify.structural.in_process import analyze_entry

    path = CUDA / "kv_append" / "correct_per_token.py"
    meta = read_meta(path)
    params = resolve_params(meta.op, get_op(meta.op).params, meta.params)
    fn = load_entry(f"{path}:entry", None)
    cap = capture_at(get_op(meta.op), fn, params, capture_cases(get_op(meta.op), params)[0])
    (la,) = cap.launches
    assert la.kernel == "kv_append16" and la.block == (128, 1, 1) and la.grid[0] == 5  # T = 5 tokens
    assert ".entry kv_append16" in la.ptx and ".entry kv_append32" not in la.ptx  # the launched kernel only
    assert la.path.endswith("kv_append.cu") and la.line > 0
    assert [a.tensor for a in la.args[:5]] == ["key", "value", "k_cache", "v_cache", "slot_mapping"]

    out = analyze_entry(meta.op, fn, params, str(ROOT), engine="ptx")
    assert out["status"]["status"] == "analysed" and not out["findings"], out
    assert "kv_append16: store to k_cache writes key of the token owning the slot" in out["proved"]
    assert len(out["proved"]) == 7  # slot, key, value loads; both stores in bounds; both caches' contract


def test_verify_engine_ptx_catches_a_cuda_bug_on_the_cpu_with_a_counterexample():
    _nvrtc_or_skip()
    from kernalin_ci.cuda.sources import CudaSpec
    from kernalin_ci.verify import verify

    path = CUDA / "kv_append" / "bug_padding_not_skipped.py"
    spec = CudaSpec.from_json({"sources": ["kv_append/kv_append.cu"], "flags": ["-Icommon"]})
    r = verify(
        "kv_append",
        f"{path}:entry",
        {},
        "cpu",
        only="structural",
        engine="ptx",
        progress=False,
        cuda=spec,
        root=str(CUDA),
    )
    assert r.structural.status == "analysed"
    padding = [f for f in r.findings if f.bug_class == "kv-padding"]
    assert padding and all(f.check.startswith("structural:ptx-") for f in padding)
    f = padding[0]
    assert re.search(r"slot_mapping\[\d+\]=-1", f.message)  # the counterexample: a padding token
    assert f.location.path.endswith("kv_append.cu")  # the CUDA source line, from the PTX's line info
    assert "not replayed (a CUDA C++ kernel runs only on a GPU)" in f.message
