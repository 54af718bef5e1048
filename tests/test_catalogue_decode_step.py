"""The decode_step catalogue (checks/decode_step): fused decode-step kernels, correct and with step-level bugs.

What each file claims about itself, checked here:
- the header and the CATALOGUE literal follow checks/ format (a class from the fixed vocabulary, params the
  op accepts, the entry's keyword arguments, a modelled_on URL for every bug, named in the header);
- each bug file is a small diff from the correct file it names as its parent;
- the `pos0` label is the truth: the pos-0 probe (one step, one sequence, position 0), run for real under
  the Triton interpreter, finds a bug exactly in the files labelled "caught", with the file's class.

The dynamic (64-step decode loop) and structural cells of these files run with the whole catch matrix
(tests/test_catalogue_matrix.py, which also asserts each decode_step bug's class in both cells); on a GPU,
`pytest -m gpu tests/test_catalogue_decode_step.py` judges every file on cuda.
"""

import json

import pytest
from catalogue_probe import probe_classes
from conftest import CHECKS, REPO, cli
from test_catalogue_rope_kv import changed_lines, code_lines, read_catalogue

from kernalin_ci.findings import BUG_CLASSES
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params

OP = "decode_step"
SIGNATURE = ["q", "k", "v", "positions", "k_cache", "v_cache", "slot_mapping", "block_tables", "kv_lens", "scale"]
FEATURE_INPUTS = ["alibi_slopes", "sinks"]  # the attention features' inputs (docs/ops.md), after the contract's
FILES = sorted((CHECKS / "decode_step").glob("*.py"))
MAX_DIFF_LINES = 10


def test_the_catalogue_has_both_fused_shapes_and_every_step_level_bug():
    names = {p.stem for p in FILES}
    assert {"correct_fused", "correct_two_launches"} <= names
    classes = {read_catalogue(p)[1]["bug_class"] for p in FILES}
    assert {"step-order", "kv-unrotated", "stray-write", "new-token-twice", "rope-value"} <= classes
    assert {"window-mask", "soft-cap", "alibi", "attention-sink"} <= classes  # one per attention feature


def test_the_feature_kernels_say_the_structural_analysis_does_not_model_them():
    """Every file that switches an attention feature on says the structural analysis does not model it
    (the catch matrix then asks its dynamic catch only), and every feature bug is one the pos-0 probe misses."""
    for p in FILES:
        cat = read_catalogue(p)[1]
        if any(cat["params"].get(k) for k in ("window", "logit_cap", "alibi", "sinks")):
            assert cat.get("structural") == "not-analysed", p.name
            assert cat["pos0"] in (None, "missed"), p.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_header_and_catalogue(path):
    import re

    doc, cat, entry = read_catalogue(path)
    assert doc and doc.splitlines()[0].strip()
    assert cat["op"] == OP
    resolve_params(OP, get_op(OP).params, cat["params"])
    args = [a.arg for a in entry.args.kwonlyargs + entry.args.args]
    assert args[: len(SIGNATURE)] == SIGNATURE and args[len(SIGNATURE) :] in ([], FEATURE_INPUTS), args
    if path.name.startswith("correct_"):
        assert cat["bug_class"] is None and cat["pos0"] is None and cat["modelled_on"] is None
        return
    assert cat["bug_class"] in BUG_CLASSES and cat["pos0"] in ("caught", "missed")
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+", cat["modelled_on"])
    for needle in ("Injected bug", "Bug class: " + cat["bug_class"], "pos-0 probe: " + cat["pos0"]):
        assert needle in doc, f"header lacks {needle!r}"
    owner_repo = "/".join(cat["modelled_on"].split("github.com/")[1].split("/")[:2])
    assert owner_repo in doc, "the header names the issue's repository"
    parent = re.search(r"Parent: (correct_\w+\.py)", doc)
    assert parent, "the header names its parent correct kernel"
    n = changed_lines(code_lines(path.parent / parent.group(1)), code_lines(path))
    assert 0 < n <= MAX_DIFF_LINES, f"{path.name} differs from its parent in {n} code lines"


def test_pos0_labels_are_what_the_probe_finds():
    found = probe_classes([(OP, p, read_catalogue(p)[1]["params"]) for p in FILES], timeout=600)
    wrong = []
    for p in FILES:
        cat = read_catalogue(p)[1]
        classes = found[p]
        want = [cat["bug_class"]] if cat["pos0"] == "caught" else []
        if classes != want:
            wrong.append(f"{p.name}: labelled {cat['pos0']} ({cat['bug_class']}), probe found {classes or 'nothing'}")
    assert not wrong, "\n".join(wrong)


def _verify(path, params, device, *extra):
    args = [
        "verify",
        "--op",
        OP,
        "--entry",
        f"{path.relative_to(REPO)}:entry",
        "--device",
        device,
        "--json",
        "-",
        "--quiet",
        *extra,
    ]
    for k, v in params.items():
        args += ["--param", f"{k}={v}"]
    return cli(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_catalogue_on_the_gpu(path):
    """On a GPU: every correct kernel passes (dynamic loops and structural), every step-level bug is found by
    both with its class, a feature bug by the loops (the structural analysis says it does not model the
    feature), the pos-0 label holds."""
    _, cat, _ = read_catalogue(path)
    full = _verify(path, cat["params"], "cuda")
    res = json.loads(full.stdout)
    assert full.returncode == (0 if cat["bug_class"] is None else 1), full.stdout[-3000:] + full.stderr[-2000:]
    if cat.get("structural") == "not-analysed":
        assert res["structural"]["status"] == "not-analysed", res["structural"]
        assert not cat["bug_class"] or any(f["kind"] == "dynamic" for f in res["findings"]), res["findings"]
    else:
        assert res["structural"]["status"] == "analysed", res["structural"]
    if cat["bug_class"] and cat.get("structural") != "not-analysed":
        for kind in ("dynamic", "structural"):
            got = {f["bug_class"] for f in res["findings"] if f["kind"] == kind}
            assert cat["bug_class"] in got, (kind, got)
    probe = _verify(path, cat["params"], "cuda", "--probe", "pos0")
    assert probe.returncode == (1 if cat["pos0"] == "caught" else 0), probe.stdout[-3000:] + probe.stderr[-2000:]


def test_power_of_two_kernel_passes_by_default():
    """A correct fused step that takes only power-of-two head dims passes the default verify on the CPU
    (whose loop is at D 40): the loop runs at the nearest head dim it takes, and the head dims it refuses
    are reported as unsupported, not checked (issue 30, item 1)."""
    r = cli("verify", "--op", OP, "--entry", "tests/kernels/decode_step_pow2.py:entry", "--json", "-", "--quiet")
    res = json.loads(r.stdout)
    assert r.returncode == 0, res["findings"]
    refused = {n["shape"].split()[0]: n for n in res["not_checked"]}
    assert set(refused) == {"D=40", "D=80", "D=96"}, refused
    assert refused["D=40"]["reason"] == "unsupported" and refused["D=40"]["instead"].startswith("D=64")
    assert "power of two" in refused["D=40"]["error"]
    assert res["coverage"]["head_dims"] == [64, 128, 256]
    assert res["structural"]["status"] == "analysed"
