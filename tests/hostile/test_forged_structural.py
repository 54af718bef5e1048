"""Attack 3 of issue 13 against the structural analysis: kernel code under test forges the structural
worker's result. The worker hands back only raw material (the captured launches, tensors and TTIR), and
the parent analyses it; a forged 'analysed, no findings' event, or material the parent cannot accept,
is a `bad-result` finding and the status "not analysed (bad result: ...)", never a pass."""

import json
from pathlib import Path

import pytest
from conftest import cli

FORGE = str(Path(__file__).with_name("forge_structural.py"))


def verify(fn):
    r = cli(
        "verify",
        "--op",
        "attention.decode",
        "--entry",
        f"{FORGE}:{fn}",
        "--device",
        "cpu",
        "--only",
        "structural",
        "--quiet",
        "--json",
        "-",
        timeout=300,
    )
    assert r.returncode == 1, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    res = json.loads(r.stdout)
    assert res["verdict"] == "fail"
    assert {f["bug_class"] for f in res["findings"]} == {"bad-result"}, res["findings"]
    assert res["structural"]["status"] == "not-analysed"
    assert res["structural"]["cause"].startswith("bad result: ")
    return res["structural"]["cause"]


def test_a_forged_structural_done_event_is_not_a_pass():
    """Before the parent analysed the material itself, this event alone made `verify` print PASS."""
    assert "names another result file" in verify("forge_structural_done")


@pytest.mark.parametrize(
    "fn, says",
    [
        ("forge_oversized_material", "not a regular file of at most"),
        ("forge_malformed_material", "structural material: tensors"),
    ],
)
def test_material_the_parent_cannot_accept_is_a_bad_result(fn, says):
    assert says in verify(fn)
