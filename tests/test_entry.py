"""Entry loading: file and module entries, clear load errors, base and head side by side."""

import textwrap

import pytest

from kernalin_ci.entry import load_entry, parse_entry
from kernalin_ci.errors import UsageError


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_file_entry_resolves_against_root_not_cwd(tmp_path, monkeypatch):
    write(tmp_path / "repo/kernels/attn.py", "def entry(x):\n    return x + 1\n")
    monkeypatch.chdir(tmp_path)  # cwd is not the root
    fn = load_entry("kernels/attn.py:entry", root=tmp_path / "repo")
    assert fn(1) == 2


def test_absolute_file_entry_works_from_any_cwd(tmp_path, monkeypatch):
    write(tmp_path / "k.py", "def entry():\n    return 'k'\n")
    monkeypatch.chdir("/")
    assert load_entry(f"{tmp_path}/k.py:entry")() == "k"


def test_module_entry(tmp_path):
    write(tmp_path / "pkg/__init__.py", "")
    write(tmp_path / "pkg/mod.py", "def run():\n    return 'mod'\n")
    assert load_entry("pkg.mod:run", root=tmp_path)() == "mod"


def test_base_and_head_copies_load_side_by_side(tmp_path):
    """Same file names, same sibling module name, different code: both stay themselves."""
    for tree, value in (("base", 1), ("head", 2)):
        write(tmp_path / tree / "kernels/common.py", f"VALUE = {value}\n")
        write(tmp_path / tree / "kernels/attn.py", "from common import VALUE\n\ndef entry():\n    return VALUE\n")
        write(tmp_path / tree / "pkg/__init__.py", "")
        write(tmp_path / tree / "pkg/k.py", f"def entry():\n    return {value * 10}\n")
    base = load_entry("kernels/attn.py:entry", root=tmp_path / "base")
    head = load_entry("kernels/attn.py:entry", root=tmp_path / "head")
    assert (base(), head()) == (1, 2)
    base_m = load_entry("pkg.k:entry", root=tmp_path / "base")
    head_m = load_entry("pkg.k:entry", root=tmp_path / "head")
    assert (base_m(), head_m()) == (10, 20)


@pytest.mark.parametrize(
    "spec, text, needle",
    [
        ("missing.py:entry", None, "file not found"),
        ("k.py:nope", "def entry():\n    pass\n", "no function 'nope'"),
        ("k.py:entry", "import not_a_module_anywhere\n", "ModuleNotFoundError"),
        ("k.py:entry", "raise RuntimeError('boom\\nsecond line')\n", "RuntimeError: boom"),
        # an extension that does not build (torch.utils.cpp_extension): the compiler's diagnostic, not only its command
        (
            "k.py:entry",
            "raise RuntimeError('Error building extension: [1/3] nvcc -c k.cu\\nk.cu(3): error: "
            'identifier "x" is undefined\\nninja: build stopped\')\n',
            'k.cu(3): error: identifier "x" is undefined',
        ),
        ("k.py:entry", "def entry(:\n", "SyntaxError"),
        ("k.py:entry", "entry = 3\n", "not callable"),
        ("nosuch.module:fn", None, "not found"),
        ("no-colon", None, "expected"),
    ],
)
def test_load_errors_are_one_line(tmp_path, spec, text, needle):
    if text is not None:
        write(tmp_path / "k.py", text)
    with pytest.raises(UsageError) as e:
        load_entry(spec, root=tmp_path)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_parse_entry():
    assert parse_entry("a/b.py:f").is_file
    assert not parse_entry("a.b:f").is_file
    with pytest.raises(UsageError):
        parse_entry("a.py:")


def _stub(path, function):
    """A function with the signature of FUNCTION in PATH, read with ast (defaults as None), or None when the
    file does not define it with a plain `def` (then the worker's own check reads the real one)."""
    import ast

    tree = ast.parse(path.read_text())
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function), None)
    if node is None:
        return None
    args = node.args
    args.defaults = [ast.Constant(None) for _ in args.defaults]
    args.kw_defaults = [None if d is None else ast.Constant(None) for d in args.kw_defaults]
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None
    scope: dict = {}
    module = ast.fix_missing_locations(ast.Module([ast.FunctionDef("f", args, [ast.Pass()], [], None)], []))
    exec(compile(module, "stub", "exec"), scope)
    return scope["f"]


def _known_entries():
    """(label, op, file, function, params) of every entry the project ships or tests against: the catalogue,
    the example repository, the real-world corpus's adapters."""
    import ast
    import json

    import yaml
    from conftest import CHECKS, REPO

    for path in sorted(CHECKS.glob("*/*.py")):
        tree = ast.parse(path.read_text())
        cat = next(
            (
                n.value
                for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "CATALOGUE"
            ),
            None,
        )
        if cat is not None:
            meta = ast.literal_eval(cat)
            yield str(path.relative_to(REPO)), meta["op"], path, "entry", meta.get("params") or {}
    example = REPO / "examples" / "decode-kernels"
    for k in yaml.safe_load((example / ".kernalin.yml").read_text())["kernels"]:
        file, _, fn = k["entry"].rpartition(":")
        yield k["name"], k["op"], example / file, fn, k.get("params") or {}
    manifest = json.loads((REPO / "tests" / "realworld" / "manifest.json").read_text())
    for name, k in manifest["kernels"].items():
        file, _, fn = k["adapter"].rpartition(":")
        yield name, k["op"], REPO / file, fn, k.get("params") or {}


def test_no_known_entry_is_refused_by_the_signature_check():
    from kernalin_ci.entry import signature_mismatch
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params

    checked = 0
    for label, op_name, path, function, params in _known_entries():
        op = get_op(op_name)
        resolved = resolve_params(op_name, op.params, params)
        names = list(op.inputs(op.probe(resolved, None), resolved, "cpu", poison=False))
        stub = _stub(path, function)
        if stub is not None:
            assert signature_mismatch(stub, names) is None, (label, names)
            checked += 1
    assert checked > 50


def test_a_wrong_signature_says_what_is_missing_and_unexpected():
    from kernalin_ci.entry import signature_mismatch

    def rope(query, key, positions):
        pass

    assert signature_mismatch(rope, ["q", "k", "positions"]) == (
        "missing q, k (the entry has no parameter of that name); "
        "unexpected query, key (required by the entry, but no input of that name)"
    )

    def fine(q, k, positions, block=16, *, scale=None): ...
    def anything(q, **kw): ...
    def positional(q, /, k, positions): ...

    assert signature_mismatch(fine, ["q", "k", "positions"]) is None
    assert signature_mismatch(anything, ["q", "k", "positions"]) is None
    assert signature_mismatch(positional, ["q", "k", "positions"]).startswith("missing q")
    assert signature_mismatch(len, ["obj"]).startswith("missing obj")  # len(obj, /) takes no keyword
