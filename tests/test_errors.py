"""Errors and exit codes through the real CLI (docs/cli.md): a usage or configuration error is one
line and exit 2, naming the flag only when the user passed one; an internal error (a bug of ours,
here provoked by an entry that breaks the worker it runs in) is exit 3 with its traceback in a log."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import cli

from kernalin_ci.errors import UsageError

BREAKS_THE_WORKER = '''"""A RoPE entry that breaks the checker it runs in: the worker's next case raises TypeError."""
import kernalin_ci.verify.support as _support

_support.Support.run = None


def entry(q, k, positions):
    pass
'''


def broken_entry(tmp_path) -> str:
    p = tmp_path / "breaks.py"
    p.write_text(BREAKS_THE_WORKER)
    return f"{p}:entry"


def test_an_internal_error_exits_3_with_a_pointer_to_its_log(tmp_path):
    r = cli(
        "verify",
        "--op",
        "rope",
        "--entry",
        broken_entry(tmp_path),
        "--device",
        "cpu",
        "--only",
        "dynamic",
        "--probe",
        "pos0",
        "--quiet",
    )
    assert r.returncode == 3, r.stderr
    line = r.stderr.strip()
    assert line.count("\n") == 0, line  # one line
    m = re.fullmatch(
        r"kernalin-ci verify: internal error: the verify-dynamic worker failed: TypeError: .* "
        r"\(traceback in (\S+\.log); --debug prints it\)",
        line,
    )
    assert m, line
    log = Path(m.group(1)).read_text()
    Path(m.group(1)).unlink()
    assert "command: kernalin-ci verify --op rope" in log
    assert "InternalError" in log  # the parent's traceback
    assert "in the worker child:" in log and "support.run(" in log  # the child's, down to the failing call


def test_debug_prints_the_internal_error_traceback_and_still_exits_3(tmp_path):
    r = cli(
        "verify",
        "--op",
        "rope",
        "--entry",
        broken_entry(tmp_path),
        "--device",
        "cpu",
        "--only",
        "dynamic",
        "--probe",
        "pos0",
        "--quiet",
        "--debug",
    )
    assert r.returncode == 3, r.stderr
    assert "Traceback (most recent call last)" in r.stderr and "in the worker child:" in r.stderr
    assert r.stderr.rstrip().endswith("(traceback above)")


def test_a_configuration_error_exits_2_on_one_line(tmp_path):
    (tmp_path / ".kernalin.yml").write_text(
        "version: 1\nkernels:\n  - name: x\n    op: no.such.op\n    entry: k.py:f\n"
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=tmp_path, check=True)
    r = cli("run", "--config", str(tmp_path / ".kernalin.yml"), "--base", "main", "--device", "cpu", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "unknown op 'no.such.op'" in r.stderr


def test_a_bad_entry_exits_2_on_one_line(tmp_path):
    r = cli("verify", "--op", "rope", "--entry", str(tmp_path / "missing.py") + ":entry", "--device", "cpu")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "file not found" in r.stderr


def test_the_flag_is_named_only_when_the_user_passed_it(tmp_path):
    """Library code names the setting (`dtype`); the CLI writes the flag the user typed (`--dtype`)."""
    r = cli(
        "verify",
        "--op",
        "rope",
        "--entry",
        broken_entry(tmp_path),
        "--device",
        "cpu",
        "--dtype",
        "float16",
        "--domain",
        "dtype=float32",
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "kernalin-ci verify: error: --dtype float16: outside the declared domain (dtype float32)"
    )
    e = UsageError("dtype float16: outside the declared domain (dtype float32)", setting="dtype")
    assert str(e).startswith("dtype float16")  # as a gate or daemon reports it: no flag was given there


def _mistakes(tmp_path):
    """User mistakes found by trying each command with bad paths and values: each was an internal error
    (exit 3) once. (command line, the start of the one line it must print)"""
    (tmp_path / "notes.txt").write_text("not a database\n")
    (tmp_path / "a-file").write_text("x\n")
    (tmp_path / "a-folder").mkdir()
    entry = "checks/rope/correct_neox.py:entry"
    return [
        (["history", "--store", str(tmp_path / "notes.txt")], "history "),
        (["history", "--store", str(tmp_path / "a-folder")], "history "),
        (["history", "--store", str(tmp_path / "a-file" / "h.db")], "history "),
        (["dashboard", "--store", str(tmp_path / "notes.txt"), "--out", str(tmp_path / "site")], "history "),
        (["dashboard", "--store", str(tmp_path / "h.db"), "--out", str(tmp_path / "a-file")], "--out "),
        (["run", "--out", str(tmp_path / "a-file")], "--out "),
        (["verify", "--op", "rope", "--entry", entry, "--timeout", "-1"], "argument --timeout: must be a positive"),
        (["pipeline", "--kv-append", entry, "--attention", entry, "--timeout", "0"], "argument --timeout"),
        (["bench", "--op", "rope", "--base", entry, "--head", entry, "--timeout", "-1"], "argument --timeout"),
        (["bench", "--op", "rope", "--base", entry, "--head", entry, "--reps", "0"], "argument --reps"),
        (["catalogue", "--op", "rope", "--markdown", str(tmp_path / "a-folder")], "--markdown "),
        (["tune", "--op", "rope", "--entry", entry, "--out", str(tmp_path / "a-file")], "--out "),
    ]


def test_user_mistakes_are_one_line_and_exit_2_never_3(tmp_path):
    for args, start in _mistakes(tmp_path):
        r = cli(*args)
        line = r.stderr.strip()
        assert r.returncode == 2 and line.count("\n") == 0, (args, r.returncode, r.stderr)
        assert line.startswith(f"kernalin-ci {args[0]}: error: {start}".rstrip()), (args, line)


def test_an_entry_with_the_wrong_keyword_names_is_one_line_before_any_case(tmp_path):
    (tmp_path / "rope.py").write_text("def rope(query, key, positions):\n    return query, key\n")
    r = cli("verify", "--op", "rope", "--entry", f"{tmp_path}/rope.py:rope", "--device", "cpu", "--only", "dynamic")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (
        f"kernalin-ci verify: error: entry {tmp_path}/rope.py:rope: does not take the inputs of op rope "
        "(q, k, positions): missing q, k (the entry has no parameter of that name); unexpected query, key "
        "(required by the entry, but no input of that name)"
    ), r.stderr
    assert r.stdout == ""  # no case ran, no "unsupported, not checked" lines
