"""The Action's history step (action.yml, step `history`), played by tests/test_action.py's runner on a
real git repository: a push to the default branch appends its run to the data branch on the remote and
builds the dashboard; a pull request records nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

from history_support import bench, kernel, report
from test_action import REPO, run_action, with_inputs

SITE = "kernalin-site"


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def checkout(tmp_path: Path) -> tuple[Path, Path, str]:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    ws = tmp_path / "workspace"
    subprocess.run(["git", "clone", "-q", str(remote), str(ws)], check=True, capture_output=True)
    (ws / "README").write_text("kernels\n")
    git(ws, "add", "README")
    git(ws, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a commit on main")
    git(ws, "push", "-q", "origin", "main")
    return remote, ws, git(ws, "rev-parse", "HEAD")


def run_history_step(tmp_path, ws, sha, event_name: str, ref: str):
    rep = tmp_path / "report.json"
    rep.write_text(json.dumps(report([kernel("rope", bench(1.01, 0.5))])))
    temp = tmp_path / "runner-temp"
    temp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "INPUT_", "RUNNER_", "KERNALIN_"))}
    env.update(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_REPOSITORY": "acme/kernels",
            "GITHUB_SHA": sha,
            "GITHUB_REF_NAME": ref.rpartition("/")[2],
            "RUNNER_TEMP": str(temp),
            "_github": {
                "event_name": event_name,
                "ref": ref,
                "repository": "acme/kernels",
                "sha": sha,
                "server_url": "https://github.com",
                "run_id": "77",
                "workspace": str(ws),
                "event": {"repository": {"default_branch": "main"}},
            },
        }
    )
    given = {"install": {"bin": str(Path(sys.executable).parent)}, "gate": {"report": str(rep)}}
    run = run_action(
        REPO, ws, with_inputs(history_branch="kernalin-history", dashboard=SITE), env, given=given, timeout=300
    )
    assert [s.id for s in run.steps] == ["history"] and run.returncode == 0, run.log
    return run


def test_a_push_to_the_default_branch_is_recorded_on_the_data_branch_with_a_dashboard(tmp_path):
    remote, ws, sha = checkout(tmp_path)
    run_history_step(tmp_path, ws, sha, "push", "refs/heads/main")
    data = json.loads(git(remote, "show", "kernalin-history:history.json"))
    (r,) = data["runs"]
    assert (r["repo"], r["commit"], r["branch"]) == ("acme/kernels", sha, "main")
    assert r["report_url"] == "https://github.com/acme/kernels/actions/runs/77"
    assert r["points"][0]["head_ms"] == 0.5 and r["environment"]["gpu"] == "NVIDIA H200"
    page = (ws / SITE / "index.html").read_text()
    assert sha in page and (ws / SITE / "assets" / "chart.umd.min.js").is_file()
    assert '"order":{"by":"git","ref":"refs/remotes/origin/main","head":"' + sha in page  # the checkout's graph
    assert git(ws, "rev-parse", "--abbrev-ref", "HEAD") == "main"  # the checkout is as it was


def test_a_pull_request_records_nothing(tmp_path):
    remote, ws, sha = checkout(tmp_path)
    run_history_step(tmp_path, ws, sha, "pull_request", "refs/pull/3/merge")
    assert (
        subprocess.run(
            ["git", "-C", str(remote), "rev-parse", "--verify", "-q", "kernalin-history"], capture_output=True
        ).returncode
        != 0
    )
    assert not (ws / SITE).exists()


def test_a_push_to_the_default_branch_gates_the_pushed_range(tmp_path):
    from kernalin_ci.gate.diff import event_refs

    def refs(**ev):
        path = tmp_path / "event.json"
        path.write_text(json.dumps({"repository": {"full_name": "acme/k", "default_branch": "main"}, **ev}))
        return event_refs(str(path))

    assert refs(ref="refs/heads/main", before="a" * 40, after="b" * 40) == {
        "base": "a" * 40,
        "head": "b" * 40,
        "repo": "acme/k",
    }
    assert refs(ref="refs/heads/feature", before="a" * 40, after="b" * 40) == {}  # merge base, as before
    assert refs(ref="refs/heads/main", before="0" * 40, after="b" * 40) == {}  # a new branch: no range
