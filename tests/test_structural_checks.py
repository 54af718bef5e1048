"""The structural analyses, end to end in this process (capture, sm_90 TTIR, interpretation, checks).

Every bug fixture under tests/structural_fixtures/ is a one- or two-line change of a correct fixture there
(its docstring names the parent); the structural checks alone must name its class, on the changed line (or on
the documented site below), and must find nothing on any correct fixture. The same holds for the catalogue
under checks/ (its expected classes come from each module's CATALOGUE).
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "structural_fixtures"

# Findings whose line is not the changed line, and why.
SITE = {
    "attn_bug_exp2_unfolded.py": ({33}, "the change is in the launcher; the kernel line that applies the scale"),
    "attn_bug_guarded_combine_no_rescale.py": ({71}, "the removed rescale has no line; the accumulation it misses"),
    "kv_bug_gather_slots_not_kept.py": ({24, 25}, "the change is in the entry (host code has no IR); the stores"),
    "kv_bug_gather_value_from_key.py": ({25}, "the change is in the entry (host code has no IR); the V store"),
    "attn_bug_paged_wrap_mask_if.py": ({40}, "the wrong `if` guards the mask; the exp of the unmasked scores"),
    "attn_bug_no_normalize.py": ({38}, "`out = acc` is an alias (no op); the store of the unnormalised value"),
    "attn_bug_scores_unmasked.py": ({31}, "the removed `where` has no line; the exp of the unmasked scores"),
    "kv_bug_slot_split.py": ({24, 25}, "the offset is computed inside the store's address expression"),
    "rope_bug_gptj_as_neox.py": ({26}, "reshape/permute/split move lanes only; the load the partner comes from"),
    "rope_bug_passthrough.py": ({15}, "the missing store has no line; the kernel's def line"),
}


def catalogue(path: Path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CATALOGUE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path}: no CATALOGUE")


@pytest.fixture
def analyze(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")

    def run(path: Path) -> tuple[dict, dict]:
        from kernalin_ci.entry import load_entry
        from kernalin_ci.ops import get_op
        from kernalin_ci.ops.base import resolve_params
        from kernalin_ci.verify.structural.in_process import analyze_entry

        cat = catalogue(path)
        params = resolve_params(cat["op"], get_op(cat["op"]).params, cat.get("params") or {})
        monkeypatch.setenv("KERNALIN_PARAMS", json.dumps(params))
        return cat, analyze_entry(cat["op"], load_entry(f"{path}:entry", str(ROOT)), params, str(ROOT))

    return run


def changed_lines(path: Path) -> set:
    doc = path.read_text().split('"""')[1]
    base = FIX / re.search(r"from (\w+\.py)", doc).group(1)
    old, new = base.read_text().splitlines(), path.read_text().splitlines()
    out = set()
    for tag, _i1, _i2, j1, j2 in difflib.SequenceMatcher(None, old, new).get_opcodes():
        if tag != "equal" and j1 > 3:  # past the docstring
            out |= set(range(j1 + 1, max(j2, j1 + 1) + 1))
    return out


FIXTURES = sorted(p for p in FIX.glob("*.py") if not p.name.startswith("unsupported"))
STRUCTURAL_SOURCE = "".join(p.read_text() for p in (ROOT / "kernalin_ci" / "verify" / "structural").glob("*.py"))


def written_where_produced(found: list) -> list:
    """The check ids a report shows that do not appear, quoted, in kernalin_ci/verify/structural/."""
    return sorted({f["check"] for f in found if f'"{f["check"]}"' not in STRUCTURAL_SOURCE})


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture(analyze, path):
    cat, res = analyze(path)
    classes = [f["bug_class"] for f in res["findings"]]
    assert all(f["kind"] == "structural" for f in res["findings"])
    assert written_where_produced(res["findings"] + res["notices"]) == []  # grep the id, find the code
    if cat["bug_class"] is None:
        assert classes == [], res["findings"]
        assert res["notices"] == [], res["notices"]
        return
    hits = [f for f in res["findings"] if f["bug_class"] == cat["bug_class"]]
    assert hits, f"expected {cat['bug_class']}, found {classes}"
    want = SITE[path.name][0] if path.name in SITE else changed_lines(path)
    rel = str(path.relative_to(ROOT))
    assert any(f["location"] == {"path": rel, "line": ln} for f in hits for ln in want), (
        f"expected a {cat['bug_class']} finding at {rel}:{sorted(want)}, got {[f['location'] for f in hits]}"
    )


def test_unfollowed_kernel_gets_a_notice_and_is_not_analysed(analyze):
    cat, res = analyze(FIX / "unsupported_gather.py")
    assert res["findings"] == []
    assert len(res["notices"]) == 1
    n = res["notices"][0]
    assert n["message"].startswith("could not verify kernel _append_gather: unsupported operation tt.gather")
    assert n["location"]["path"] == "tests/structural_fixtures/unsupported_gather.py"
    assert res["status"]["status"] == "not-analysed"
    assert res["status"]["cause"].startswith("kernel _append_gather could not be followed: unsupported operation")


def test_entry_that_raises_is_not_analysed(analyze, tmp_path, monkeypatch):
    src = tmp_path / "raises.py"
    src.write_text(
        'CATALOGUE = {"op": "rope", "bug_class": None, "params": {}}\n\n'
        'def entry(q, k, positions):\n    raise ValueError("unsupported head dim")\n'
    )
    cat, res = analyze(src)
    assert res["findings"] == [] and res["notices"] == []
    assert res["status"]["status"] == "not-analysed"
    cause = res["status"]["cause"]
    assert cause.startswith(
        "at D=48 float32 Hq=6 Hkv=2: the entry raised ValueError during the capture call: unsupported head dim"
    ), cause
    assert cause.endswith("(10 shapes tried)")  # every candidate shape was tried before giving up


def test_entry_without_kernels_is_not_analysed(analyze, tmp_path):
    src = tmp_path / "torch_only.py"
    src.write_text(
        'CATALOGUE = {"op": "rope", "bug_class": None, "params": {}}\n\n'
        "def entry(q, k, positions):\n    return q.clone(), k.clone()\n"
    )
    cat, res = analyze(src)
    assert res["findings"] == [] and res["notices"] == []
    assert res["status"]["status"] == "not-analysed"
    assert "the entry launched no Triton kernel" in res["status"]["cause"]


def test_a_scaled_angle_that_is_minus_the_plain_one_is_no_sign_flip(analyze):
    """Llama-3.1's table computed in the kernel: at the capture's position 24593 one scaled angle is minus the
    plain table's; the signs are judged against the scaled angle (no finding), the angles said not analysed."""
    cat, res = analyze(ROOT / "tests" / "kernels" / "rope_llama3_bands.py")
    assert res["findings"] == [], res["findings"]
    st = res["status"]
    assert st["status"] == "analysed" and "rotation values of q" in st["proved"], st
    assert st["gaps"] == [
        "angles (positions, frequencies): not analysed for scaled frequency tables (scaling=llama3): the angles "
        "are not compared with the definition (the pairing, signs, pass-through and addressing are)"
    ], st


def test_a_correct_kernel_is_analysed_at_the_first_shape(analyze):
    cat, res = analyze(FIX / "rope_correct_neox.py")
    st = res["status"]
    assert (st["status"], st["cause"], st["shape"]) == ("analysed", None, "D=48 float32 Hq=6 Hkv=2"), st
    assert st["gaps"] == [] and "rotation values of q" in st["proved"], st
