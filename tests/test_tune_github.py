"""`kernalin-ci tune --github` against the GitHub stand-in (every request checked against GitHub's OpenAPI
description) and real git repositories: a bare `origin` the stand-in reads branches and diffs from, and a
clone the tune ran in. The full CLI run that opens a pull request is in test_tune.py (it shares the tune
run of the autotuned kernel); here: the review with suggestions, its idempotence, and the checks made
before any tuning."""

import json
import subprocess

import pytest
from conftest import REPO, cli

from kernalin_ci.errors import UsageError
from kernalin_ci.github.errors import GitHubError
from kernalin_ci.testing.payloads import pull_request_event
from kernalin_ci.testing.pytest_fixtures import github_standin  # noqa: F401
from kernalin_ci.tune import patch as patch_mod
from kernalin_ci.tune import post

FIXTURE = REPO / "tests" / "tune_kernels" / "paged_tiles.py"
NAME = "acme/kernels"
TOKEN = "ghs_tuneTokenForTests0123456789abcdef0000"
KERNEL = "kernels/paged_tiles.py"
CONFIG = """\
version: 1
kernels:
  - name: paged
    op: attention.decode_paged
    entry: kernels/paged_tiles.py:entry
    params: {block_size: 16}
    tune: {params: {BLOCK_N: [8, 16]}}
"""


def git(cwd, *args) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def git_world(tmp_path, pr_change: bool = True):
    """origin (bare) with main; a clone `work` on branch `feature` whose commit adds a comment above the
    entry's def (so the def line is in the pull request's diff); -> (work, origin, base sha, head sha)."""
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    work = tmp_path / "work"
    git(tmp_path, "init", "-q", "-b", "main", str(work))
    for k, v in (("user.name", "dev"), ("user.email", "dev@example.invalid")):
        git(work, "config", k, v)
    (work / "kernels").mkdir()
    (work / KERNEL).write_text(FIXTURE.read_text())
    (work / ".kernalin.yml").write_text(CONFIG)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "kernels")
    git(work, "remote", "add", "origin", str(origin))
    git(work, "push", "-q", "origin", "main")
    base = git(work, "rev-parse", "HEAD").strip()
    git(work, "checkout", "-q", "-b", "feature")
    if pr_change:
        text = (work / KERNEL).read_text()
        (work / KERNEL).write_text(text.replace("def entry(", "# the entry point\ndef entry(", 1))
        git(work, "commit", "-q", "-am", "a comment")
    git(work, "push", "-q", "origin", "feature")
    return work, origin, base, git(work, "rev-parse", "HEAD").strip()


def env_for(gh, **extra):
    return {"GITHUB_API_URL": gh.base_url, "GITHUB_TOKEN": TOKEN, "GITHUB_REPOSITORY": NAME, **extra}


def test_changes_anchor_every_range_on_old_lines():
    old = "a\nb\nc\n"
    assert post.changes(old, "a\nB\nc\n") == [post.LineChange(2, 2, "B\n")]
    assert post.changes(old, "a\nb\nx\ny\nc\n") == [post.LineChange(2, 2, "b\nx\ny\n")]  # an insertion keeps its line
    assert post.changes(old, "x\na\nb\nc\n") == [post.LineChange(1, 1, "x\na\n")]
    assert post.changes(old, "a\nc\n") == [post.LineChange(2, 2, "")]
    assert post.hunk_ranges("@@ -1,3 +1,4 @@\n a\n+b\n c\n d\n@@ -20 +21 @@\n-x\n+y") == [(1, 4), (21, 21)]
    assert post.blob_sha("hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"  # git hash-object
    assert post.repo_from_url("git@github.example:acme/kernels.git") == NAME
    assert post.repo_from_url("https://x.example/acme/kernels") == NAME


def test_a_review_suggests_the_lines_in_the_diff_and_is_posted_once(github_standin, tmp_path):
    work, origin, base, head = git_world(tmp_path)
    gh = github_standin
    gh.add_repo(NAME, git_dir=str(origin))
    gh.add_pull_request(NAME, 7, head_sha=head, base_sha=base, head_ref="feature")
    gh.add_token(TOKEN)
    old = (work / KERNEL).read_text()
    new = patch_mod.write_params(old, "entry", {"BLOCK_N": 8})
    far = new.replace("import torch\n", "import torch  # tuned\n", 1)  # a line far from the PR's diff
    assert far != new
    p = patch_mod.Patch(KERNEL, old, far)

    dest = post.resolve(str(work), pr=7, env=env_for(gh))
    assert (dest.repo, dest.pr, dest.head_sha) == (NAME, 7, None)
    done = post.post(dest, p, str(work), kernel="paged", label="BLOCK_N=8 num_warps=4", markdown="## tune\n")
    assert done.kind == "review" and done.new and (done.suggestions, done.changes) == (1, 2)
    (review,) = gh.pulls(NAME)[0]["reviews"]
    assert review["state"] == "COMMENTED" and review["commit_id"] == head
    assert (
        review["body"].startswith("<!-- kernalin-ci tune: ")
        and "1 of 2 changed line ranges lie outside" in review["body"]
    )
    (c,) = review["comments"]
    lines = old.splitlines(True)
    # GitHub applies a suggestion by replacing lines start_line..line with its block: do the same
    block = c["body"].split("```suggestion\n", 1)[1].rsplit("```", 1)[0]
    applied = "".join(lines[: c["start_line"] - 1]) + block + "".join(lines[c["line"] :])
    assert applied == new and c["side"] == "RIGHT" and c["path"] == KERNEL

    again = post.post(dest, p, str(work), kernel="paged", label="BLOCK_N=8 num_warps=4", markdown="## tune\n")
    assert not again.new and again.url == done.url and len(gh.pulls(NAME)[0]["reviews"]) == 1
    assert "already suggested" in again.line()
    # what the review left out, GitHub refuses: a line comment outside the pull request's diff
    outside = {"path": KERNEL, "line": 1, "side": "RIGHT", "body": "x"}
    with pytest.raises(GitHubError, match="must be part of the diff"):
        dest.client.post_review(NAME, 7, commit_id=head, body="b", comments=[outside], marker="<!-- other -->")


def test_in_a_pull_request_run_the_event_names_the_pr_and_a_file_outside_its_diff_is_not_suggested(
    github_standin, tmp_path
):
    work, origin, base, head = git_world(tmp_path, pr_change=False)
    (work / "README.md").write_text("docs\n")  # the pull request changes another file only
    git(work, "add", "README.md")
    git(work, "commit", "-q", "-m", "docs")
    git(work, "push", "-q", "origin", "feature")
    head = git(work, "rev-parse", "HEAD").strip()
    gh = github_standin
    gh.add_repo(NAME, git_dir=str(origin))
    gh.add_pull_request(NAME, 42, head_sha=head, base_sha=base, head_ref="feature")
    gh.add_token(TOKEN)
    event = tmp_path / "event.json"
    event.write_text(json.dumps(pull_request_event(repo=NAME, number=42, head_sha=head, base_sha=base)))
    env = env_for(gh, GITHUB_ACTIONS="true", GITHUB_EVENT_NAME="pull_request", GITHUB_SHA=head)
    env["GITHUB_EVENT_PATH"] = str(event)
    dest = post.resolve(str(work), env=env)
    assert (dest.pr, dest.head_sha) == (42, head)
    with pytest.raises(UsageError, match="--base"):
        post.resolve(str(work), base="main", env=env)
    old = (work / KERNEL).read_text()
    p = patch_mod.Patch(KERNEL, old, patch_mod.write_params(old, "entry", {"BLOCK_N": 8}))
    done = post.post(dest, p, str(work), kernel="paged", label="BLOCK_N=8", markdown="## tune\n")
    assert (done.suggestions, done.changes) == (0, 1)
    (review,) = gh.pulls(NAME)[0]["reviews"]
    assert review["comments"] == [] and "is not changed by this pull request" in review["body"]
    assert not gh.requests_to("GET", "/repos/{owner}/{repo}/pulls/{pull_number}")  # the head came from the event


def test_github_problems_are_one_line_and_exit_2_before_any_tuning(tmp_path):
    work, *_ = git_world(tmp_path)
    no_creds = {"GITHUB_TOKEN": "", "KERNALIN_GITHUB_APP_ID": "", "GITHUB_ACTIONS": "", "GITHUB_REPOSITORY": NAME}
    cases = [
        (["--github"], no_creds, "no GitHub credentials"),
        (["--pr", "3"], {}, "--pr and --base go with --github"),
        (["--github", "--pr", "3", "--base", "main"], {**no_creds, "GITHUB_TOKEN": TOKEN}, "--base names"),
    ]
    for args, env, text in cases:
        r = cli("tune", "paged", "--device", "cpu", *args, cwd=work, env=env)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert text in r.stderr and TOKEN not in r.stderr + r.stdout, (args, r.stderr)
        assert not (work / "tune.json").exists()  # nothing was tuned
    (work / KERNEL).write_text((work / KERNEL).read_text() + "# local edit\n")
    r = cli("tune", "paged", "--device", "cpu", "--github", cwd=work, env={**no_creds, "GITHUB_TOKEN": TOKEN})
    assert r.returncode == 2 and "uncommitted changes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
