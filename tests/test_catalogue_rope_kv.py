"""The RoPE and KV-append catalogue (checks/rope, checks/kv_append): format, minimal diffs, pos-0 labels.

The whole matrix (every file through the full dynamic verification) is the
catalogue command's test; this file checks what each entry claims about itself:
- the header and the CATALOGUE literal follow checks/ format (classes from the
  fixed vocabulary, params the op accepts, a modelled_on URL for every bug);
- each bug file is a small diff from one correct file of the same directory;
- the `pos0` label is the truth: the pos-0 probe, run for real under the Triton
  interpreter, finds a bug exactly in the files labelled "caught", and passes
  every correct kernel.
"""

import ast
import difflib
import re

import pytest
from catalogue_probe import probe_classes
from conftest import CHECKS, REPO, cli

from kernalin_ci.findings import BUG_CLASSES
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params

DIRS = {"rope": "rope", "kv_append": "kv_append"}
SIGNATURES = {"rope": ["q", "k", "positions"], "kv_append": ["key", "value", "k_cache", "v_cache", "slot_mapping"]}
MAX_DIFF_LINES = 10  # removed + added code lines (outside header and CATALOGUE) between a bug and its parent


def catalogue_files():
    return [(op, p) for op, d in DIRS.items() for p in sorted((CHECKS / d).glob("*.py"))]


def read_catalogue(path):
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    cat = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "CATALOGUE" for t in n.targets)
    )
    entry = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "entry")
    return doc, cat, entry


def code_lines(path):
    """The file without its docstring and CATALOGUE literal: the kernel and entry code."""
    src = path.read_text()
    tree = ast.parse(src)
    lines = src.splitlines()
    drop = set(range(tree.body[0].lineno - 1, tree.body[0].end_lineno))
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "CATALOGUE" for t in n.targets):
            drop |= set(range(n.lineno - 1, n.end_lineno))
    return [line for i, line in enumerate(lines) if i not in drop]


def changed_lines(a, b):
    return sum(1 for d in difflib.ndiff(a, b) if d[:1] in "+-")


@pytest.mark.parametrize("op,path", catalogue_files(), ids=lambda x: getattr(x, "name", x))
def test_header_and_catalogue(op, path):
    doc, cat, entry = read_catalogue(path)
    assert doc and doc.splitlines()[0].strip(), "the header needs a title line"
    assert cat["op"] == op
    resolve_params(op, get_op(op).params, cat["params"])  # raises UsageError for a param the op lacks
    fp8 = ["k_scale", "v_scale"] if cat["params"].get("kv_dtype") else []  # an FP8 cache's scales (docs/ops.md)
    assert [a.arg for a in entry.args.kwonlyargs + entry.args.args] == SIGNATURES[op] + fp8
    if path.name.startswith("correct_"):
        assert cat["bug_class"] is None and cat["pos0"] is None and cat["modelled_on"] is None
    else:
        assert path.name.startswith("bug_")
        assert cat["bug_class"] in BUG_CLASSES
        assert cat["pos0"] in ("caught", "missed")
        assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+", cat["modelled_on"])
        for needle in ("Injected bug", "Bug class: " + cat["bug_class"], "pos-0 probe: " + cat["pos0"]):
            assert needle in doc, f"header lacks {needle!r}"
        assert cat["modelled_on"].split("github.com/")[1].split("/")[0] in doc, "header must name the issue"


@pytest.mark.parametrize(
    "op,path", [(o, p) for o, p in catalogue_files() if p.name.startswith("bug_")], ids=lambda x: getattr(x, "name", x)
)
def test_bug_is_a_small_diff_from_a_correct_kernel(op, path):
    doc, _, _ = read_catalogue(path)
    parent = re.search(r"Parent: (correct_\w+\.py)", doc)
    assert parent, "the header names its parent correct kernel"
    base = path.parent / parent.group(1)
    n = changed_lines(code_lines(base), code_lines(path))
    assert 0 < n <= MAX_DIFF_LINES, f"{path.name} differs from {base.name} in {n} code lines"


def test_pos0_labels_are_what_the_probe_finds():
    files = catalogue_files()
    found = probe_classes([(op, p, read_catalogue(p)[1]["params"]) for op, p in files])
    wrong = []
    for _op, p in files:
        label = read_catalogue(p)[1]["pos0"]
        classes = found[p]
        if bool(classes) != (label == "caught"):
            wrong.append(f"{p.name}: labelled {label}, probe found {classes or 'nothing'}")
    assert not wrong, "\n".join(wrong)


def _verify(op, path, params, device, *extra):
    args = [
        "verify",
        "--op",
        op,
        "--entry",
        f"{path.relative_to(REPO)}:entry",
        "--device",
        device,
        "--only",
        "dynamic",
        "--json",
        "-",
        "--quiet",
        *extra,
    ]
    for k, v in params.items():
        args += ["--param", f"{k}={v}"]
    return cli(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("op,path", catalogue_files(), ids=lambda x: getattr(x, "name", x))
def test_catalogue_on_the_gpu(op, path):
    """On a GPU: every correct kernel passes, every bug is found, the pos-0 labels hold."""
    _, cat, _ = read_catalogue(path)
    full = _verify(op, path, cat["params"], "cuda")
    assert full.returncode == (0 if cat["bug_class"] is None else 1), full.stdout[-3000:] + full.stderr[-2000:]
    probe = _verify(op, path, cat["params"], "cuda", "--probe", "pos0")
    assert probe.returncode == (1 if cat["pos0"] == "caught" else 0), probe.stdout[-3000:] + probe.stderr[-2000:]
