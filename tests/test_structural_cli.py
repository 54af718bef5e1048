"""`kernalin-ci verify --only structural` and the default verify (both kinds), as real subprocesses."""

from __future__ import annotations

import json

import pytest
from conftest import cli

FIX = "tests/structural_fixtures"


def verify(*args):
    r = cli("verify", *args, "--device", "cpu", "--quiet", "--json", "-")
    return r, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else None)


def test_only_structural_finds_the_bug_and_its_line():
    r, out = verify("--op", "kv_append", "--entry", f"{FIX}/kv_bug_padding.py:entry", "--only", "structural")
    assert r.returncode == 1, r.stderr
    assert out["verdict"] == "fail" and out["cases_run"] == 0
    assert {f["kind"] for f in out["findings"]} == {"structural"}
    hit = [f for f in out["findings"] if f["bug_class"] == "kv-padding"]
    assert hit and hit[0]["location"] == {"path": f"{FIX}/kv_bug_padding.py", "line": 16}
    assert hit[0]["check"] == "structural:kv-padding" and "slot -1" in hit[0]["message"]
    assert f"{FIX}/kv_bug_padding.py:16" in r.stderr  # the human summary names file:line


def test_only_structural_passes_a_correct_kernel():
    r, out = verify(
        "--op", "rope", "--entry", f"{FIX}/rope_correct_neox.py:entry", "--only", "structural", "--param", "style=neox"
    )
    assert r.returncode == 0, r.stderr
    assert out["verdict"] == "pass" and out["findings"] == [] and out["notices"] == []


def test_a_kernel_it_cannot_follow_is_a_notice_not_a_pass_or_a_failure():
    r, out = verify("--op", "kv_append", "--entry", f"{FIX}/unsupported_gather.py:entry", "--only", "structural")
    assert r.returncode == 0, r.stderr
    assert out["findings"] == []
    assert [n["message"].split(":")[0] for n in out["notices"]] == ["could not verify kernel _append_gather"]
    assert "note: structural:interpret" in r.stderr
    assert out["structural"]["status"] == "not-analysed"
    assert "structural: not analysed (kernel _append_gather could not be followed" in r.stderr


def test_an_entry_that_crashes_during_capture_is_not_analysed(tmp_path):
    (tmp_path / "crash.py").write_text(
        "import os, signal\n\n\ndef entry(q, k, positions):\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    r, out = verify("--op", "rope", "--entry", str(tmp_path / "crash.py") + ":entry", "--only", "structural")
    assert r.returncode == 0, r.stderr
    assert out["findings"] == [] and out["notices"] == []
    assert out["structural"]["status"] == "not-analysed"
    assert out["structural"]["cause"].startswith("the structural worker crashed: killed by SIGSEGV")


def test_bad_entry_is_a_usage_error():
    r = cli("verify", "--op", "rope", "--entry", "no/such/file.py:entry", "--only", "structural", "--device", "cpu")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "file not found" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_default_verify_runs_both_kinds_and_merges():
    r, out = verify("--op", "kv_append", "--entry", f"{FIX}/kv_bug_source.py:entry")
    assert r.returncode == 1, r.stderr
    kinds = {(f["kind"], f["bug_class"]) for f in out["findings"]}
    assert ("dynamic", "kv-source") in kinds and ("structural", "kv-source") in kinds
    assert out["cases_run"] > 0
