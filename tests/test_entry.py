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
