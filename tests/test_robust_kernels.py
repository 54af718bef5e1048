"""Kernels launched the way production stacks launch them (issue 30, item 2): each verifies through the
CLI and passes, or says exactly what could not be analysed or checked. Never an internal error (exit 3),
never a false finding. The kernels: tests/kernels/robust_launch.py (kv_append) and robust_rope.py.

Each verify runs in float32 only (`--dtype float32`: the launch paths do not depend on the dtype), two at
a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = "tests/kernels/robust_launch.py"

# entry -> what must be said: None (analysed, every case checked), or the words of the structural cause
# and of the cases not checked
CASES = {
    f"{LAUNCH}:enum_constexpr": None,
    f"{LAUNCH}:str_none_constexpr": None,
    f"{LAUNCH}:tuple_constexpr": None,
    f"{LAUNCH}:dataclass_constexpr": None,
    f"{LAUNCH}:heuristics": None,
    f"{LAUNCH}:autotune_pruned": None,
    f"{LAUNCH}:do_not_specialize": None,
    f"{LAUNCH}:ranges": None,
    f"{LAUNCH}:launch_metadata": None,
    f"{LAUNCH}:class_method": None,
    f"{LAUNCH}:through_partial": None,
    "tests/kernels/robust_rope.py:entry": None,
    f"{LAUNCH}:inline_asm": {
        "structural": "unsupported operation tt.elementwise_inline_asm",
        "not_checked": "cannot run inline PTX",
    },
    f"{LAUNCH}:tensor_descriptor": {"structural": "argument k_desc is a tensor descriptor (TMA)"},
    f"{LAUNCH}:fp8_bytes": {"structural": "reads key (float16) through argument key as float8_e4m3fn"},
}


def _verify(entry: str) -> tuple[int, dict | None, str]:
    op = "rope" if "rope" in entry else "kv_append"
    cmd = [sys.executable, "-m", "kernalin_ci", "verify", "--op", op, "--entry", entry, "--dtype", "float32"]
    r = subprocess.run([*cmd, "--json", "-", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    try:
        return r.returncode, json.loads(r.stdout), r.stderr
    except json.JSONDecodeError:
        return r.returncode, None, r.stderr


@pytest.fixture(scope="module")
def outcomes():
    with ThreadPoolExecutor(2) as pool:
        futures = {e: pool.submit(_verify, e) for e in CASES}
        yield {e: f.result() for e, f in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("entry", list(CASES), ids=[e.split(":")[1] for e in CASES])
def test_launch_style_verifies(entry, outcomes):
    rc, res, err = outcomes[entry]
    assert res is not None and rc == 0, f"exit {rc}: {err.strip()[-600:]}\n{res and res.get('findings')}"
    expect = CASES[entry]
    structural = res["structural"]
    if expect is None:
        assert structural["status"] == "analysed", structural
        assert not res["not_checked"], res["not_checked"]
        assert res["cases_run"] > 0
        return
    assert structural["status"] == "not-analysed" and expect["structural"] in structural["cause"], structural
    if "not_checked" in expect:
        assert res["not_checked"] and all(
            n["reason"] == "interpreter" and expect["not_checked"] in n["error"] for n in res["not_checked"]
        ), res["not_checked"]
    else:
        assert not res["not_checked"], res["not_checked"]
