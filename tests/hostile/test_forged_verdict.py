"""Attack 3 of issue 13: kernel code under test forges the verdict from inside the dynamic worker.

Every entry here is wrong (the GQA head mapping) and, on its first call, writes forged events and result
files for every case and exits. The parent decides the verdict from the tensors it compares, so each run
must FAIL: the forged 'no findings' events are not findings the parent reads."""
import json
from pathlib import Path

import pytest

from conftest import cli

FORGE = str(Path(__file__).with_name("forge_kernels.py"))


def verify(fn):
    r = cli("verify", "--op", "attention.decode", "--entry", f"{FORGE}:{fn}", "--device", "cpu", "--dtype",
            "float32", "--only", "dynamic", "--quiet", "--json", "-", timeout=600)
    assert r.returncode == 1, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    res = json.loads(r.stdout)
    assert res["verdict"] == "fail"
    return res


def classes(res):
    return {f["bug_class"] for f in res["findings"]}


def messages(res):
    return " ".join(f["message"] for f in res["findings"])


def test_forged_pass_events_without_results_fail():
    res = verify("forge_pass_events")
    assert classes(res) == {"bad-result"}
    assert "no readable result file" in messages(res)


def test_wellformed_forged_results_are_compared_by_the_parent():
    """Files in exactly the format the parent reads, events that say 'no findings': the parent builds the
    inputs again, compares the handed-back output with its own float64 reference, and finds the bug."""
    res = verify("forge_wellformed_results")
    assert "gqa-mapping" in classes(res), res["findings"]


def test_junk_symlinked_and_extra_result_files_are_bad_results():
    res = verify("forge_odd_files")
    text = messages(res)
    assert classes(res) == {"bad-result"}
    assert "inputs handed back" in text  # an output alone: no inputs, no guards
    assert "no readable result file" in text  # the symlink is not followed
    assert "a case not asked for" in text
    assert "files no result named" in text  # the extra files


@pytest.mark.parametrize("fn, says", [
    ("forge_early_done", "handed back no result"),
    ("forge_malformed", "malformed event"),
])
def test_early_done_and_malformed_events_fail(fn, says):
    res = verify(fn)
    assert classes(res) == {"bad-result"} and says in messages(res), res["findings"]


def test_a_forged_end_of_the_decode_pipeline_fails():
    r = cli("pipeline", "--kv-append", f"{FORGE}:forge_pipeline_steps", "--attention", f"{FORGE}:forge_pipeline_steps",
            "--device", "cpu", "--steps", "4", "--quiet", "--json", "-", timeout=600)
    assert r.returncode == 1, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    res = json.loads(r.stdout)
    assert classes(res) == {"bad-result"} and "after 0 of 4 steps" in messages(res), res["findings"]
