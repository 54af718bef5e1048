"""A case that loses the CUDA context (an illegal memory access) is that case's `cuda-error`; the cases
after it run in a fresh worker and keep their own results (never `bad-result: no result`)."""

import json

import pytest
from conftest import REPO, cli

pytestmark = pytest.mark.gpu


def test_cases_after_a_lost_cuda_context_run_in_a_fresh_worker(tmp_path):
    out = tmp_path / "r.json"
    r = cli(
        "verify", "--op", "kv_append", "--entry", f"{REPO}/tests/kernels/kv_append_wild_store.py:entry",
        "--param", "block_size=16", "--device", "cuda", "--only", "dynamic", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    res = json.loads(out.read_text())
    classes = [f["bug_class"] for f in res["findings"]]
    assert "cuda-error" in classes, classes
    assert "bad-result" not in classes, res["findings"]
    # only the two-kv-head cases lose the context: the others ran, in fresh workers, and passed. Compute
    # Sanitizer runs a few cases in one process: its findings name those cases in their message, not one case
    # (on an H100, sessions 9 and 11: a memcheck `stray-write` of the wild store, "(cases: slots, heads)")
    dynamic = [f for f in res["findings"] if not f["check"].startswith("sanitizer:")]
    lost = {(f.get("case") or {}).get("name") for f in dynamic}
    caseless = [(f["check"], f["bug_class"], f["message"][:300]) for f in dynamic if not f.get("case")]
    assert lost <= {"slots", "fresh-inputs", "free-low-slots"}, (lost, caseless)
    assert all("(cases: " in f["message"] for f in res["findings"] if f["check"].startswith("sanitizer:"))
