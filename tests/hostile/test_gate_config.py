"""Issue 29, attack 1: a pull request lowers its own gate. It breaks the RoPE kernel and, in its own
.kernalin.yml, sets `gate: {fail_on: [inconclusive]}` (and drops the kernel it broke from the list). Before the
fix `kernalin-ci run` (and the Action, which runs it) read the configuration from the working tree, the PR's:
exit 0 and a success, with the kernel's verdict `fail` inside the report. Now the base revision's
configuration decides, the report says so, and the comment lists what the PR changes, loudest where it
loosens the gate."""

import json
import shutil
import subprocess

import pytest
from conftest import REPO, cli

from kernalin_ci.gate.config_source import gate_config
from kernalin_ci.gate.diff import event_refs, resolve_refs

EXAMPLE = REPO / "examples" / "decode-kernels"
# the position read as the token's index: right at position t = index, wrong elsewhere
BUGGY_ROPE = ("    pos = tl.load(pos_ptr + t).to(tl.float32)", "    pos = t.to(tl.float32)")


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


ONLY_ROPE = """\
version: 1
kernels:
  - name: rope
    op: rope
    entry: kernels/rope.py:rope
    params: {style: neox}
    domain: {head_dim: 64, num_q_heads: 4, num_kv_heads: 2, dtype: float32}
  - name: kv_append
    op: kv_append
    entry: kernels/kv_cache.py:append
    params: {block_size: 16}
gate:
  fail_on: [finding, slower]
  bench: false
"""


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    shutil.copytree(EXAMPLE, r, ignore=shutil.ignore_patterns("prs"))
    (r / ".kernalin.yml").write_text(ONLY_ROPE)
    git(r, "init", "-q", "-b", "main")
    commit_all(r, "base")
    return r


def test_a_pull_request_cannot_lower_its_own_gate(repo):
    rope = (repo / "kernels/rope.py").read_text()
    assert BUGGY_ROPE[0] in rope
    git(repo, "checkout", "-qb", "pr")
    (repo / "kernels/rope.py").write_text(rope.replace(*BUGGY_ROPE))
    lowered = ONLY_ROPE.replace("  fail_on: [finding, slower]\n", "  fail_on: [inconclusive]\n")
    (repo / ".kernalin.yml").write_text(lowered)
    commit_all(repo, "rope: faster; and a quieter gate")
    r = cli("run", "--device", "cpu", "--quiet", "--base", "main", "--out", str(repo / "out"), cwd=repo)
    report = json.loads((repo / "out/report.json").read_text())
    assert r.returncode == 1, r.stderr[-3000:]
    assert report["conclusion"] == "failure" and report["policy"]["fail_on"] == ["finding", "slower"]
    (rope_k,) = [k for k in report["kernels"] if k["name"] == "rope"]
    assert rope_k["verification"]["verdict"] == "fail" and rope_k["failed_by"] == ["finding"]
    conf = report["configuration"]
    assert conf["source"] == "base" and conf["revision"] == git(repo, "rev-parse", "main")
    (change,) = conf["changes"]
    assert change == {"what": "gate.fail_on: drops finding, slower; adds inconclusive", "loosens": True, "by": "head"}
    md = (repo / "out/report.md").read_text()
    assert "> [!WARNING]" in md and "takes effect after merge" in md and "LOOSENS the gate" in md
    assert "configuration: .kernalin.yml at base" in r.stderr  # the gate's own line says which one decided


def test_the_workflows_overrides_are_reported_and_a_dropped_kernel_is_still_gated(repo):
    git(repo, "checkout", "-qb", "pr")
    rope = (repo / "kernels/rope.py").read_text()
    (repo / "kernels/rope.py").write_text(rope.replace(*BUGGY_ROPE))
    cfg = ONLY_ROPE.replace(
        "  - name: rope\n    op: rope\n    entry: kernels/rope.py:rope\n    params: {style: neox}\n"
        "    domain: {head_dim: 64, num_q_heads: 4, num_kv_heads: 2, dtype: float32}\n",
        "",
    )
    assert "name: rope" not in cfg
    (repo / ".kernalin.yml").write_text(cfg)
    commit_all(repo, "rope is no kernel of ours any more")
    r = cli(
        "run", "--device", "cpu", "--quiet", "--base", "main", "--fail-on", "none", "--out", str(repo / "out"), cwd=repo
    )
    report = json.loads((repo / "out/report.json").read_text())
    assert r.returncode == 0  # the workflow (the operator) may switch failing off; the report says it did
    (rope_k,) = [k for k in report["kernels"] if k["name"] == "rope"]
    assert rope_k["status"] == "changed" and rope_k["verification"]["verdict"] == "fail"
    changes = {(c["what"], c["loosens"], c["by"]) for c in report["configuration"]["changes"]}
    assert ("kernel rope removed from the configuration", True, "head") in changes
    assert ("gate.fail_on: drops finding, slower", True, "command line") in changes


def test_trusted_head_branches_only_from_the_base_and_never_from_a_fork(repo, tmp_path):
    trusting = ONLY_ROPE.replace("  bench: false\n", "  bench: false\n  trust_head_config: ['release/*']\n")
    (repo / ".kernalin.yml").write_text(trusting)
    base = commit_all(repo, "trust release branches")
    for branch in ("release/1.2", "feature"):
        git(repo, "checkout", "-qb", branch, "main")
        (repo / ".kernalin.yml").write_text(
            trusting.replace("  fail_on: [finding, slower]\n", "  fail_on: [finding]\n")
        )
        head = commit_all(repo, "no more slower")
        refs = resolve_refs(repo, base, "HEAD")
        assert refs.head_branch == branch
        cfg, origin, _ = gate_config(repo, None, refs.base, refs.head, head_branch=refs.head_branch, fork=refs.fork)
        assert cfg.gate.fail_on == (("finding",) if branch == "release/1.2" else ("finding", "slower"))
        assert origin.source == ("head" if branch == "release/1.2" else "base")
    # a fork's branch is never trusted, whatever its name; nor a PR branch that adds itself to the list
    event = tmp_path / "event.json"
    pr = {"number": 7, "base": {"sha": base, "repo": {"full_name": "acme/k"}}}
    pr["head"] = {"sha": head, "ref": "release/1.2", "repo": {"full_name": "mallory/k"}}
    event.write_text(json.dumps({"pull_request": pr}))
    ev = event_refs(str(event))
    assert ev["fork"] and ev["head_branch"] == "release/1.2"
    cfg, origin, _ = gate_config(repo, None, base, head, head_branch=ev["head_branch"], fork=ev["fork"])
    assert origin.source == "base" and cfg.gate.fail_on == ("finding", "slower")
    git(repo, "checkout", "-q", "main")
    (repo / ".kernalin.yml").write_text(ONLY_ROPE)
    plain = commit_all(repo, "no trusted branches")
    git(repo, "checkout", "-qb", "self-trust", plain)
    (repo / ".kernalin.yml").write_text(trusting.replace("['release/*']", "['*']").replace("slower]", "]"))
    mine = commit_all(repo, "trust me")
    cfg, origin, _ = gate_config(repo, None, plain, mine, head_branch="self-trust")
    assert origin.source == "base" and any(c.loosens and "trust_head_config" in c.what for c in origin.changes)


def test_the_pull_request_that_introduces_the_configuration_is_gated_by_it(repo):
    git(repo, "rm", "-q", ".kernalin.yml")
    base = commit_all(repo, "no configuration yet")
    git(repo, "checkout", "-qb", "adopt")
    (repo / ".kernalin.yml").write_text(ONLY_ROPE)
    head = commit_all(repo, "adopt kernalin-ci")
    cfg, origin, _ = gate_config(repo, None, base, head)
    assert (
        origin.source == "head"
        and "introduces" in origin.why
        and [k.name for k in cfg.kernels] == ["rope", "kv_append"]
    )
