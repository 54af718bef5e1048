"""The attention part of the bug catalogue (checks/attention_decode*/): format, coverage, minimal diffs,
and the truth of every `pos0` label (the single probe is run for real under the Triton interpreter).

The whole-matrix run (every file through the full case set) lives in the catalogue test; this file
checks what is specific to the attention entries."""

import ast
import difflib
import re

import pytest
from catalogue_probe import probe_classes
from conftest import CHECKS

from kernalin_ci.findings import BUG_CLASSES

DIRS = {
    "attention_decode": "attention.decode",
    "attention_decode_paged": "attention.decode_paged",
    "attention_decode_multi": "attention.decode_multi",
    "attention_decode_mla": "attention.decode_mla",
}
SIGNATURE = {
    "attention.decode": ["q", "k_cache", "v_cache", "kv_lens", "scale"],
    "attention.decode_paged": ["q", "k_cache", "v_cache", "block_tables", "kv_lens", "scale"],
    "attention.decode_multi": ["q", "k_cache", "v_cache", "block_tables", "query_start_loc", "kv_lens", "scale"],
    "attention.decode_mla": ["q_nope", "q_pe", "kv_cache", "block_tables", "kv_lens", "scale"],
}
FULL = ("attention_decode", "attention_decode_paged")  # the plain ops: 8 bugs each; the newer ops have fewer
ALLOWED_IMPORTS = {"torch", "triton", "triton.language", "math", "kernalin_ci"}
# every class the attention catalogue must show at least once, across both ops
REQUIRED = {
    "softmax-no-max",
    "softmax-no-normalize",
    "online-rescale",
    "split-combine",
    "kv-mask",
    "unmasked-load",
    "gqa-mapping",
    "stride",
    "scale",
    "paged-index",
}
FILES = sorted(p for d in DIRS for p in (CHECKS / d).glob("*.py"))


def parse(path):
    src = path.read_text()
    tree = ast.parse(src)
    doc = ast.get_docstring(tree)
    return src, tree, doc, ast.literal_eval(catalogue_node(tree).value)


def catalogue_node(tree):
    return next(
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CATALOGUE" for t in n.targets)
    )


def code_body(src):
    """The kernel and entry: everything after the header and the CATALOGUE dict."""
    return src.splitlines()[catalogue_node(ast.parse(src)).end_lineno :]


def label(path):
    return f"{path.parent.name}/{path.name}"


def test_both_directories_are_populated():
    for d in DIRS:
        names = [p.name for p in (CHECKS / d).glob("*.py")]
        enough = 8 if d in FULL else 2
        assert any(n.startswith("correct_") for n in names) and sum(n.startswith("bug_") for n in names) >= enough, d


@pytest.mark.parametrize("path", FILES, ids=label)
def test_header_catalogue_and_entry(path):
    src, tree, doc, cat = parse(path)
    op = DIRS[path.parent.name]
    assert doc and doc.splitlines()[0].strip(), "module docstring with a title line"
    assert set(cat) >= {"op", "bug_class", "pos0", "params", "modelled_on", "style"}
    assert cat["op"] == op
    assert isinstance(cat["params"], dict) and cat["style"]
    if path.name.startswith("correct_"):
        assert cat["bug_class"] is None and cat["pos0"] is None and cat["modelled_on"] is None
    else:
        assert path.name.startswith("bug_")
        assert cat["bug_class"] in BUG_CLASSES
        assert cat["pos0"] in ("caught", "missed")
        assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+", cat["modelled_on"])
        assert cat["modelled_on"] in doc, "the header cites the issue it is modelled on"
        assert f"pos0 probe: {cat['pos0']}" in doc, "the header states and explains the pos0 result"
        assert "should be" in doc, "the header shows the injected line and what it should be"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert all(a.name in ALLOWED_IMPORTS for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.module in ALLOWED_IMPORTS, node.module
    entry = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "entry")
    args = [a.arg for a in entry.args.args]
    assert args[: len(SIGNATURE[op])] == SIGNATURE[op]
    fp8 = ["k_scale", "v_scale"] if cat["params"].get("kv_dtype") else []  # FP8 caches: their scales
    assert args[len(SIGNATURE[op]) :] in (fp8, ["alibi_slopes", "sinks", *fp8]), "the feature inputs, optional, last"
    if args != SIGNATURE[op]:  # a feature kernel's structural cell says what it does not analyse
        assert cat.get("structural") == "not-analysed"


def test_bug_classes_cover_the_attention_vocabulary():
    classes = {op: set() for op in DIRS.values()}
    for path in FILES:
        cat = parse(path)[3]
        if cat["bug_class"]:
            classes[cat["op"]].add(cat["bug_class"])
    assert REQUIRED <= classes["attention.decode"] | classes["attention.decode_paged"]
    assert "paged-index" in classes["attention.decode_paged"]


@pytest.mark.parametrize("path", [p for p in FILES if p.name.startswith("bug_")], ids=label)
def test_each_bug_is_a_small_diff_from_a_correct_kernel(path):
    """The bug is a change of one to four lines of a correct kernel in the same directory."""
    body = code_body(path.read_text())
    best = None
    for ref in path.parent.glob("correct_*.py"):
        diff = [
            ln
            for ln in difflib.unified_diff(code_body(ref.read_text()), body, lineterm="", n=0)
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
        ]
        changed = max(sum(ln.startswith("-") for ln in diff), sum(ln.startswith("+") for ln in diff))
        best = changed if best is None else min(best, changed)
    assert best is not None and 1 <= best <= 4, f"{best} changed lines from the nearest correct kernel"


@pytest.mark.slow
def test_pos0_labels_are_the_truth():
    """The pos-0 probe (what `verify --probe pos0` runs) finds a bug exactly in the files labelled caught, and
    never in a correct one; every file in one child process (tests/catalogue_probe.py)."""
    cats = {p: parse(p)[3] for p in FILES}
    found = probe_classes([(cat["op"], p, cat["params"]) for p, cat in cats.items()])
    wrong = [
        f"{label(p)}: labelled {cat['pos0']}, probe found {found[p] or 'nothing'}"
        for p, cat in cats.items()
        if bool(found[p]) != (cat["pos0"] == "caught")
    ]
    assert not wrong, "\n".join(wrong)
