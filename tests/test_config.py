""".kernalin.yml parsing: the starter parses; every error names file, line and key (exit 2)."""

import json
import subprocess

import pytest
from conftest import cli

from kernalin_ci.config import STARTER, load, parse
from kernalin_ci.errors import UsageError

GOOD = """\
kernels:
  - name: attn
    op: attention.decode_paged
    entry: kernels/attn.py:entry
    params: {block_size: 32}
    sources: ["kernels/common/*.py"]
  - name: kv
    op: kv_append
    entry: kernels/kv.py:entry
    params: {block_size: 32}
gate:
  fail_on: [finding, slower, inconclusive]
  margin: 0.01
  budget_s: 12
pipelines:
  - name: loop
    kv_append: kv
    attention: attn
    steps: 16
"""


def test_starter_parses():
    cfg = parse(STARTER, "starter.yml")
    assert cfg.kernels[0].op == "attention.decode" and cfg.gate.fail_on == ("finding", "slower")


def test_full_config():
    cfg = parse(GOOD, "k.yml")
    assert [k.name for k in cfg.kernels] == ["attn", "kv"]
    assert cfg.kernels[0].params == {"block_size": 32} and cfg.kernels[0].sources == ["kernels/common/*.py"]
    assert cfg.kernels[0].entry_file == "kernels/attn.py"
    assert cfg.gate.fail_on == ("finding", "slower", "inconclusive") and cfg.gate.rope == 0.01
    assert cfg.gate.budget_s == 12.0
    assert cfg.pipelines[0].kv_append == "kv" and cfg.pipelines[0].steps == 16


@pytest.mark.parametrize(
    "text, where",
    [
        ("kernels: [\n  {name: a, op: attention.decode, entry: a.py:entry\n", "k.yml:3: not valid YAML"),
        (
            "kernels:\n  - name: a\n    op: attention.decoder\n    entry: a.py:entry\n",
            "k.yml:3: kernels[0].op: unknown op",
        ),
        ("kernels:\n  - name: a\n    op: rope\n    entry: a.py\n", "k.yml:4: kernels[0].entry"),
        (
            "kernels:\n  - name: a\n    op: rope\n    entry: a.py:f\n    params: {style: llama}\n",
            "k.yml:5: kernels[0].params: op rope: param style='llama' must be one of neox, gptj",
        ),
        (
            "kernels:\n  - name: a\n    op: rope\n    entry: a.py:f\n    colour: red\n",
            "k.yml:5: kernels[0].colour: unknown key",
        ),
        (
            "kernels:\n  - name: a\n    op: rope\n    entry: a.py:f\n  - name: a\n    op: rope\n    entry: b.py:f\n",
            "k.yml:5: kernels[1].name: duplicate kernel name",
        ),
        (
            "kernels:\n  - name: a\n    op: rope\n    entry: a.py:f\ngate:\n  fail_on: [faster]\n",
            "k.yml:6: gate.fail_on",
        ),
        ("kernels:\n  - name: a\n    op: rope\n    entry: a.py:f\ngate:\n  margin: 2\n", "k.yml:6: gate.margin"),
        (
            "kernels:\n  - name: a\n    op: rope\n    entry: a.py:f\npipelines:\n  - name: p\n    kv_append: a\n"
            "    attention: a\n",
            "k.yml:7: pipelines[0].kv_append: kernel 'a' is rope, expected kv_append",
        ),
        ("kernels: []\n", "k.yml:1: kernels: expected a non-empty list"),
        ("", "k.yml:1: empty configuration"),
    ],
)
def test_errors_name_file_line_and_key(text, where):
    with pytest.raises(UsageError) as e:
        parse(text, "k.yml")
    assert str(e.value).startswith(where), str(e.value)


def test_daemon_section_is_left_to_the_daemon():
    cfg = parse("kernels:\n  - name: a\n    op: rope\n    entry: a.py:f\ndaemon:\n  fork_label: ok-to-test\n", "k.yml")
    assert [k.name for k in cfg.kernels] == ["a"]


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load(tmp_path / "nope.yml")


def test_run_with_bad_config_exits_2_with_one_line(tmp_path):
    (tmp_path / "bad.yml").write_text("kernels:\n  - name: a\n    op: nope\n    entry: a.py:f\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=tmp_path, check=True)
    r = cli("run", "--config", str(tmp_path / "bad.yml"), "--base", "HEAD", "--device", "cpu", cwd=tmp_path)
    assert r.returncode == 2
    # the configuration as committed at base, named as git names it: REV:PATH:LINE
    assert r.stderr.strip().count("\n") == 0 and ":bad.yml:3: kernels[0].op" in r.stderr


def test_init_writes_a_starter_that_parses(tmp_path):
    r = cli("init", cwd=tmp_path)
    assert r.returncode == 0
    assert load(tmp_path / ".kernalin.yml").kernels[0].name == "decode_attention"
    r = cli("init", cwd=tmp_path)
    assert r.returncode == 2 and "exists" in r.stderr


def test_the_starter_lists_every_op():
    from kernalin_ci.ops import NAMES

    start = STARTER.index("    op: ")
    listed = STARTER[start : STARTER.index("entry:", start)].replace("#", " ").replace("|", " ").split()
    assert [op for op in NAMES if op not in listed] == []


def test_the_untouched_starter_fails_with_a_line_that_says_what_to_edit(tmp_path):
    def git(*args):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )

    git("init", "-q", "-b", "main")
    assert cli("init", cwd=tmp_path).returncode == 0
    git("add", "-A")
    git("commit", "-qm", "kernalin-ci init")
    r = cli("run", "--base", "HEAD", "--device", "cpu", "--quiet", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    error = report["kernels"][0]["error"]
    line = next(i for i, text in enumerate(STARTER.splitlines(), 1) if text.strip().startswith("entry:"))
    start = "entry kernels/attention.py:entry: kernels/attention.py does not exist at head; edit kernels[0].entry ("
    assert error.startswith(start) and f".kernalin.yml:{line})" in error, error  # the configuration that decided
    assert "kernalin-gate-" not in error and "kernalin-gate-" not in r.stderr + r.stdout  # no temporary checkout
    assert f"ERROR decode_attention: {error}" in r.stdout.splitlines()


def test_gate_rope_is_the_old_name_of_gate_margin(capsys):
    text = "kernels:\n  - name: a\n    op: rope\n    entry: a.py:f\ngate:\n  rope: 0.02\n"
    assert parse(text, "k.yml").gate.rope == 0.02  # still works
    assert capsys.readouterr().err == (
        "kernalin-ci: warning: k.yml:6: gate.rope: deprecated: rename it gate.margin (the equivalence margin)\n"
    )
    with pytest.raises(UsageError, match="k.yml:6: gate.rope: the old name of gate.margin"):
        parse(text + "  margin: 0.01\n", "k.yml")


def test_the_first_error_in_the_file_is_reported_and_keys_are_plain_strings():
    text = "kernels:\n  - name: a\n    op: rope\n    entry: a.py\n    timeout: 0\n  - name: b\n    colour: red\n"
    with pytest.raises(UsageError) as e:
        parse(text, "k.yml")
    assert str(e.value) == "k.yml:4: kernels[0].entry: expected 'path/to/file.py:function' or 'module:function'"
    with pytest.raises(UsageError, match=r"^k.yml:5: kernels\[0\].op: duplicate key$"):
        parse("kernels:\n  - name: a\n    op: rope\n    entry: a.py:f\n    op: rope\n", "k.yml")
    with pytest.raises(UsageError, match=r"^k.yml:1: kernels: expected a non-empty list$"):
        parse("kernels: {a: 1}\n", "k.yml")
