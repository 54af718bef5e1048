"""The contract lives in the repository: docs/ops.md and docs/cli.md stay in step with the code, and
no shipped file sends a reader to a specification outside the repository.

Shipped means every file of the repository (tracked, or untracked and not ignored) except `tests/` and
`.ci/`: those two run only in this project's CI, which may read data kept beside the checkout; what a
user installs, reads or copies (the package, docs, README, checks/, examples/, benchmarks/, action.yml,
Dockerfile, runners/) may not.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernalin_ci import config
from kernalin_ci.cli import build_parser
from kernalin_ci.daemon.workspace import REPO_KEYS
from kernalin_ci.errors import UsageError
from kernalin_ci.findings import Finding, Location, Notice, VerifyResult
from kernalin_ci.ops import NAMES, get_op
from kernalin_ci.ops.base import DTYPES, TOLERANCE, Case, resolve_params
from kernalin_ci.report.schema import KERNEL, PIPELINE, REPORT_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
NOT_SHIPPED = ("tests/", ".ci/")

# ../shared (as a path, or spelled out as os.path.join(..., "..", "shared")) and the SPEC-*.md files
OUTSIDE_SPEC = re.compile(r"\.\.[/\\]shared\b|[\"']\.\.[\"']\s*,\s*[\"']shared[\"']|\bSPEC-\w+")


# --- no shipped file refers to ../shared or the SPEC files -------------------------------------------


def shipped_files() -> list[str]:
    """Repository-relative paths of the shipped files (see the module docstring)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        paths = [p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked sdist)
        paths = []
        for d, dirs, files in os.walk(ROOT):
            dirs[:] = [x for x in dirs if not x.startswith(".") and x != "__pycache__" and not x.endswith(".egg-info")]
            paths += [os.path.relpath(os.path.join(d, f), ROOT) for f in files]
    return sorted(p for p in paths if not p.startswith(NOT_SHIPPED) and (ROOT / p).is_file())


def outside_references(text: str) -> list[str]:
    return [m.group(0) for m in OUTSIDE_SPEC.finditer(text)]


def test_the_detector_sees_every_spelling_and_nothing_else():
    assert outside_references("see ../shared/SPEC-ops.md") == ["../shared", "SPEC-ops"]
    assert outside_references('SHARED = os.path.join(ROOT, "..", "shared", "gpu-traces")') != []
    assert outside_references("the verdict object of SPEC-cli.md") == ["SPEC-cli"]
    assert outside_references(r"..\shared\gpu-traces") != []
    # the project's own docs, and the OpenAPI description looked up in shared/ inside the checkout
    assert outside_references("docs/ops.md, docs/cli.md, shared/github-openapi/api.github.com.json.gz") == []


def test_shipped_means_everything_but_the_tests_and_the_ci_script():
    files = shipped_files()
    for must in (
        "README.md",
        "CONTRIBUTING.md",
        "docs/ops.md",
        "docs/cli.md",
        "kernalin_ci/cli.py",
        "action.yml",
        "Dockerfile",
    ):
        assert must in files
    assert not [p for p in files if p.startswith(NOT_SHIPPED)]


def test_no_shipped_file_refers_to_a_specification_outside_the_repository():
    offenders = []
    for rel in shipped_files():
        try:
            text = (ROOT / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary
        for n, line in enumerate(text.splitlines(), 1):
            if outside_references(line):
                offenders.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not offenders, "refer to docs/ops.md / docs/cli.md instead:\n" + "\n".join(offenders)


# --- markdown helpers -----------------------------------------------------------------------------------


def sections(path: str) -> dict[str, str]:
    """'## heading' -> the text up to the next '## ' heading."""
    out: dict[str, str] = {}
    head = None
    for line in (ROOT / path).read_text().splitlines():
        if line.startswith("## "):
            head = line[3:].strip()
            out[head] = ""
        elif head is not None:
            out[head] += line + "\n"
    return out


def section_for(path: str, code: str) -> str:
    """The section whose heading starts with the code span `code`."""
    found = [body for head, body in sections(path).items() if head.startswith(f"`{code}`")]
    assert len(found) == 1, f"{path}: expected one '## `{code}` ...' section, found {len(found)}"
    return found[0]


def table(body: str, first_header: str) -> dict[str, list[str]]:
    """The markdown table whose header starts with `first_header`: first cell (code span removed) -> cells."""
    lines = body.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} |")), None)
    assert start is not None, f"no table with header '{first_header}'"
    rows = {}
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]]
        for key in re.findall(r"`([^`]+)`", cells[0]) or [cells[0]]:
            rows[key] = cells[1:]
    return rows


# --- docs/ops.md ----------------------------------------------------------------------------------------


def render_default(v) -> str:
    if v is None:
        return "unset"
    if isinstance(v, (list, dict)):
        return f"`{json.dumps(v)}`"
    return f"`{v}`"


@pytest.mark.parametrize("name", NAMES)
def test_every_op_param_is_documented_with_its_default(name):
    op = get_op(name)
    rows = table(section_for("docs/ops.md", name), "param")
    code = {p.name: render_default(p.default) for p in op.params}
    documented = {k: cells[0] for k, cells in rows.items()}
    assert documented == code, f"docs/ops.md, {name}: params table {documented} vs the code's {code}"


@pytest.mark.parametrize("name", [n for n in NAMES if n != "custom"])
def test_every_op_argument_is_documented(name):
    """The keyword arguments an entry receives (built by the op itself) are the args table's rows."""
    op = get_op(name)
    params = resolve_params(name, op.params, {})
    kwargs = op.inputs(op.probe(params, "float32"), params, "cpu", poison=False)
    documented = set(table(section_for("docs/ops.md", name), "arg"))
    assert documented == set(kwargs), f"docs/ops.md, {name}: args {sorted(documented)} vs {sorted(kwargs)}"


def test_tolerances_are_the_codes():
    rows = table(sections("docs/ops.md")["Tolerances"], "dtype")
    assert set(rows) == set(DTYPES)
    for dt, cells in rows.items():
        assert float(cells[0].strip("`")) == TOLERANCE[dt], f"docs/ops.md: tolerance of {dt}"


# --- docs/cli.md ----------------------------------------------------------------------------------------


def subcommands() -> dict:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return dict(sub.choices)


def _documented_options(body: str) -> set[str]:
    return set(re.findall(r"`(--[a-z0-9-]+)", body))


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_command_and_option_is_documented(command):
    body = section_for("docs/cli.md", f"kernalin-ci {command}")
    options, positionals = set(), []
    for action in subcommands()[command]._actions:
        if action.option_strings:
            options |= {s for s in action.option_strings if s.startswith("--") and s not in ("--help", "--debug")}
            for choice in action.choices or ():
                assert re.search(rf"\b{re.escape(str(choice))}\b", body), (
                    f"docs/cli.md, {command}: choice {choice!r} of {action.option_strings[-1]} missing"
                )
        else:
            positionals.append(action.metavar or action.dest)
    assert _documented_options(body) == options, f"docs/cli.md, {command}: options differ from the parser's"
    for name in positionals:
        assert f"`{name}" in body, f"docs/cli.md, {command}: positional {name} missing"


def test_global_options_are_documented():
    text = (ROOT / "docs/cli.md").read_text()
    for opt in ("--debug", "--version"):
        assert f"`{opt}`" in text


def _json_keys(body: str) -> set[str]:
    return set(re.findall(r'"([a-z_0-9]+)"', body))


def test_verify_json_fields_are_documented():
    case = Case("c", {"D": 64})
    result = VerifyResult(
        "rope",
        "k.py:f",
        findings=[Finding("check", "wrong-output", "m", Location("k.py", 1), case.to_json(), "kernalin-ci verify ...")],
        notices=[Notice("check", "m")],
    ).to_json()
    keys = set(result) | set(result["findings"][0]) | set(result["notices"][0]) | set(case.to_json())
    keys |= set(result["findings"][0]["location"])
    missing = keys - _json_keys(section_for("docs/cli.md", "kernalin-ci verify"))
    assert not missing, f"docs/cli.md, verify JSON: {sorted(missing)} missing"


def test_compare_and_bench_json_fields_are_documented():
    from kernalin_ci.bench.result import BenchResult
    from kernalin_ci.bench.stats import Verdict

    v = Verdict("faster", 0.97, (0.96, 0.98), 0.99, 0.0, 0.01, (0.995, 1.005), 20, "minimum")
    missing = set(v.to_json()) - _json_keys(section_for("docs/cli.md", "kernalin-ci compare"))
    assert not missing, f"docs/cli.md, compare JSON: {sorted(missing)} missing"
    bench = BenchResult("rope", "a.py:f", "b.py:f", "cpu", verdict=v).to_json()
    body = section_for("docs/cli.md", "kernalin-ci bench")
    missing = set(bench) - set(v.to_json()) - set(re.findall(r"`([a-z_0-9]+)`", body))
    assert not missing, f"docs/cli.md, bench JSON: {sorted(missing)} missing"


def test_report_json_fields_are_documented():
    keys = set(REPORT_SCHEMA["properties"]) | set(KERNEL["properties"]) | set(PIPELINE["properties"])
    missing = keys - _json_keys(section_for("docs/cli.md", "kernalin-ci run"))
    assert not missing, f"docs/cli.md, report.json: {sorted(missing)} missing"


def _allowed_keys(text: str) -> list[str]:
    """The keys config.parse accepts at one level, from its own 'unknown key' error."""
    with pytest.raises(UsageError, match="unknown key") as e:
        config.parse(text)
    return re.search(r"allowed: ([^)]*)", str(e.value)).group(1).split(", ")


def test_every_configuration_key_is_documented():
    kernel = "kernels:\n  - {name: a, op: rope, entry: k.py:f}\n"
    levels = {
        "top level": _allowed_keys("bogus: 1\n"),
        "kernels[]": _allowed_keys("kernels:\n  - {name: a, bogus: 1}\n"),
        "gate": _allowed_keys(kernel + "gate: {bogus: 1}\n"),
        "pipelines[]": _allowed_keys(kernel + "pipelines:\n  - {bogus: 1}\n"),
        "model": _allowed_keys(kernel + "model: {bogus: 1}\n"),
        "daemon": list(REPO_KEYS),
    }
    body = sections("docs/cli.md")["`.kernalin.yml`"]
    documented = set(re.findall(r"^\s*-?\s*([a-z_]+):", body, re.M))
    for level, keys in levels.items():
        missing = set(keys) - documented
        assert not missing, f"docs/cli.md, .kernalin.yml {level}: {sorted(missing)} missing"
    for item in config.FAIL_ON:
        assert item in body


# --- docs/adapters.md: the worked examples run -----------------------------------------------------------

KERNELS = ROOT / "tests" / "adapter_kernels"  # test kernels shaped like the production kernels the examples name
# one small case per op (the full case set is the catalogue's business; this checks the adapter)
EXAMPLE_CASES = {
    "attention.decode_paged": {
        "name": "adapter",
        "dims": {"Hq": 4, "Hkv": 2, "D": 64, "kv_lens": [1, 17, 40], "scale": 0.125},
    },
    "rope": {"name": "adapter", "dims": {"T": 5, "Hq": 2, "Hkv": 1, "D": 128, "positions": [0, 1, 7, 100, 8191]}},
}


def adapter_examples() -> list[tuple[str, str]]:
    """(yaml, python) code-block pairs of the worked examples, in order."""
    body = sections("docs/adapters.md")["Worked examples"]
    blocks = re.findall(r"```(yaml|python)\n(.*?)```", body, re.S)
    yamls = [text for lang, text in blocks if lang == "yaml"]
    pythons = [text for lang, text in blocks if lang == "python"]
    assert len(yamls) == len(pythons) >= 3
    return list(zip(yamls, pythons))


@pytest.mark.parametrize("index", range(3))
def test_worked_adapter_example_verifies_on_a_real_kernel(index, tmp_path):
    yaml_text, code = adapter_examples()[index]
    kernel = config.parse("kernels:\n" + yaml_text).kernels[0]  # the example's configuration is valid
    entry_file, _, function = kernel.entry.partition(":")
    assert code.startswith(f"# {entry_file}\n"), "the code block starts with its file name"
    (tmp_path / entry_file).parent.mkdir(parents=True)
    (tmp_path / entry_file).write_text(code)
    for module in re.findall(r"^from (\w+) import", code, re.M):
        if (KERNELS / f"{module}.py").is_file():
            (tmp_path / entry_file).with_name(f"{module}.py").write_text((KERNELS / f"{module}.py").read_text())
    cmd = [
        sys.executable,
        "-m",
        "kernalin_ci",
        "verify",
        "--op",
        kernel.op,
        "--entry",
        kernel.entry,
        "--device",
        "cpu",
        "--quiet",
        "--json",
        "-",
        "--case",
        json.dumps(EXAMPLE_CASES[kernel.op]),
    ]
    for k, v in kernel.params.items():
        cmd += ["--param", f"{k}={v}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    result = json.loads(proc.stdout)
    assert result["cases_run"] == 1
    assert result["findings"] == [], json.dumps(result["findings"], indent=1)
    assert proc.returncode == 0
