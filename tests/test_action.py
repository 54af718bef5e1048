"""The GitHub Action (action.yml), run the way the runner runs a composite action.

The runner is played by `run_action` below: it parses action.yml with PyYAML, fills the inputs
from their defaults and the `with:` values, evaluates the `${{ ... }}` expressions, runs every
`run:` script with `bash --noprofile --norc -eo pipefail` in the workspace, gives each step its
own GITHUB_OUTPUT and GITHUB_STEP_SUMMARY files, reads the outputs back the way the runner
does (`name=value` and `name<<DELIMITER` blocks) and evaluates the action's `outputs:`. The
workspace is a real git repository checked out at a real merge commit, as actions/checkout
leaves it for a pull_request event; the event payload is real-shaped; GITHUB_API_URL points at
the GitHub stand-in (a real HTTP server that validates every request against GitHub's
OpenAPI description).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from kernalin_ci.testing.payloads import pull_request_event
from kernalin_ci.testing.standin_state import READ_ONLY_PERMISSIONS, WRITE_PERMISSIONS

REPO = Path(__file__).resolve().parent.parent
ACTION = REPO / "action.yml"
EXAMPLE_KERNELS = REPO / "examples" / "decode-kernels" / "kernels"
GH_REPO = "acme/kernels"
PR_NUMBER = 42
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
PATH_EXPR = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*")
CONTEXTS = ("inputs", "github", "runner", "steps", "env")


# ---------------------------------------------------------------- the runner, played by the test


@dataclass
class StepRun:
    id: str
    returncode: int
    stdout: str
    stderr: str
    outputs: dict[str, str]
    summary: str
    seconds: float


@dataclass
class ActionRun:
    steps: list[StepRun] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)

    @property
    def returncode(self) -> int:
        return next((s.returncode for s in self.steps if s.returncode), 0)

    @property
    def summary(self) -> str:
        return "".join(s.summary for s in self.steps)

    @property
    def log(self) -> str:
        return "\n".join(
            f"--- step {s.id} (exit {s.returncode}, {s.seconds:.1f} s)\n{s.stdout}\n{s.stderr}" for s in self.steps
        )


def load_action() -> dict:
    return yaml.safe_load(ACTION.read_text())


def evaluate(text: str, ctx: dict) -> str:
    """Substitute `${{ context.path }}` expressions; a missing property is '' (as on GitHub). Anything
    but a plain property path fails the test: the action must stay within what is evaluated here."""

    def one(m: re.Match) -> str:
        expr = m.group(1)
        assert PATH_EXPR.fullmatch(expr), f"expression not evaluated by this test: {expr!r}"
        parts = expr.split(".")
        assert parts[0] in CONTEXTS, f"unknown context in {expr!r}"
        node = ctx
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                return ""
            node = node[part]
        return str(node)

    return EXPR.sub(one, text)


def parse_output_file(path: Path) -> dict[str, str]:
    """GITHUB_OUTPUT: `name=value` lines and `name<<DELIMITER` ... `DELIMITER` blocks."""
    out: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            end = lines.index(delim, i + 1)
            out[name] = "\n".join(lines[i + 1 : end])
            i = end + 1
        elif line:
            name, value = line.split("=", 1)
            out[name] = value
            i += 1
        else:
            i += 1
    return out


def run_action(
    action_path: Path,
    workspace: Path,
    with_: dict,
    env: dict,
    *,
    given: dict[str, dict] | None = None,
    timeout: float = 900,
) -> ActionRun:
    """Run action.yml's steps like the runner. `given`: steps not run, with the outputs they would have
    set (to test one step on its own)."""
    action = load_action()
    assert action["runs"]["using"] == "composite"
    inputs = {}
    for name, spec in action["inputs"].items():
        value = with_.get(name, spec.get("default", ""))
        inputs[name] = evaluate(str(value), {"github": env["_github"]})
    unknown = set(with_) - set(inputs)
    assert not unknown, f"inputs the action does not declare: {unknown}"
    ctx = {"inputs": inputs, "github": env["_github"], "runner": {"temp": env["RUNNER_TEMP"]}, "steps": {}, "env": {}}
    base_env = {k: v for k, v in env.items() if not k.startswith("_")}
    run = ActionRun()
    files = Path(env["RUNNER_TEMP"]) / "_runner_file_commands"
    files.mkdir(parents=True, exist_ok=True)
    for n, step in enumerate(action["runs"]["steps"]):
        sid = step.get("id", f"__step{n}")
        if given and sid in given:
            ctx["steps"][sid] = {"outputs": dict(given[sid]), "outcome": "success"}
            continue
        assert step.get("shell") == "bash", f"step {sid}: composite run steps need shell: bash"
        assert "uses" not in step, "the test runner plays run: steps only"
        out_file, summary_file = files / f"set_output_{n}", files / f"step_summary_{n}"
        step_env = {
            **base_env,
            **{k: evaluate(str(v), ctx) for k, v in (step.get("env") or {}).items()},
            "GITHUB_OUTPUT": str(out_file),
            "GITHUB_STEP_SUMMARY": str(summary_file),
            "GITHUB_ACTION_PATH": str(action_path),
        }
        script = files / f"step_{n}.sh"
        script.write_text(evaluate(step["run"], ctx))
        t0 = time.perf_counter()
        r = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=workspace,
            env=step_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        seconds = time.perf_counter() - t0
        outputs = parse_output_file(out_file)
        summary = summary_file.read_text() if summary_file.exists() else ""
        run.steps.append(StepRun(sid, r.returncode, r.stdout, r.stderr, outputs, summary, seconds))
        ctx["steps"][sid] = {"outputs": outputs, "outcome": "success" if r.returncode == 0 else "failure"}
        if r.returncode != 0:
            break  # later steps have the default `if: success()`
    run.outputs = {name: evaluate(str(spec["value"]), ctx) for name, spec in action["outputs"].items()}
    return run


# ---------------------------------------------------------------- a kernel repository and a pull request

CONFIG = """\
version: 1
kernels:
  - name: rope
    op: rope
    entry: kernels/rope.py:rope
    params: {style: neox}
    dtype: float32
gate:
  fail_on: [finding, slower]
  budget_s: 30
  bench: false
"""

# A correct rewrite: exp(-x * ln(base)) as exp2(-x * log2(base)).
CORRECT_CHANGE = (
    "inv_freq = tl.exp(-(2.0 * i.to(tl.float32) / (2 * HALF)) * log_base)",
    "inv_freq = tl.exp2(-(2.0 * i.to(tl.float32) / (2 * HALF)) * (log_base * 1.4426950408889634))",
)
# The inverse rotation on the first half: invisible at position 0 (sin = 0), a rope-sign finding elsewhere.
BUG_CHANGE = ("(x1 * cos - x2 * sin).to(", "(x1 * cos + x2 * sin).to(")


def git(cwd: Path, *args: str) -> str:
    r = subprocess.run(
        ["git", "-c", "user.name=dev", "-c", "user.email=dev@example.invalid", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout.strip()


@dataclass
class PullRequest:
    workspace: Path
    base: str
    head: str
    merge: str


def make_pull_request(root: Path, change: tuple[str, str]) -> PullRequest:
    """main with the example kernels, a branch that changes kernels/rope.py, and the merge commit that
    actions/checkout checks out (detached) for a pull_request event."""
    ws = root / "workspace"
    shutil.copytree(EXAMPLE_KERNELS, ws / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    (ws / ".kernalin.yml").write_text(CONFIG)
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "base: example kernels")
    base = git(ws, "rev-parse", "HEAD")
    git(ws, "checkout", "-qb", "feature")
    rope = ws / "kernels" / "rope.py"
    old, new = change
    text = rope.read_text()
    assert old in text
    rope.write_text(text.replace(old, new))
    git(ws, "commit", "-qam", "rope: change")
    head = git(ws, "rev-parse", "HEAD")
    git(ws, "checkout", "-q", "--detach", base)
    git(ws, "merge", "-q", "--no-ff", "-m", f"Merge {head} into {base}", head)
    return PullRequest(ws, base, head, git(ws, "rev-parse", "HEAD"))


def action_checkout(root: Path) -> Path:
    """What the runner downloads for `uses: owner/kernalin-ci@ref`: the action's repository."""
    dest = root / "_actions" / "kernalin-ci"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("action.yml", "pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).exists():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "kernalin_ci", dest / "kernalin_ci", ignore=skip)
    return dest


def runner_env(
    root: Path, pr: PullRequest, api_url: str, *, token: str, action_path: Path, fork: str | None = None
) -> dict:
    """The environment the runner gives every step of a pull_request job."""
    event = root / "event.json"
    event.write_text(
        json.dumps(
            pull_request_event(repo=GH_REPO, number=PR_NUMBER, head_sha=pr.head, base_sha=pr.base, head_repo=fork)
        )
    )
    temp = root / "runner-temp"
    temp.mkdir(exist_ok=True)
    venv_bin = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "INPUT_", "KERNALIN_GITHUB_", "RUNNER_")) and k != "VIRTUAL_ENV"
    }
    env.update(
        {
            "PATH": path,
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_EVENT_NAME": "pull_request",
            "GITHUB_EVENT_PATH": str(event),
            "GITHUB_REPOSITORY": GH_REPO,
            "GITHUB_SHA": pr.merge,
            "GITHUB_REF": f"refs/pull/{PR_NUMBER}/merge",
            "GITHUB_RUN_ID": "9001",
            "GITHUB_WORKSPACE": str(pr.workspace),
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_API_URL": api_url,
            "RUNNER_TEMP": str(temp),
            "_github": {
                "token": token,
                "action_path": str(action_path),
                "workspace": str(pr.workspace),
                "event_name": "pull_request",
                "repository": GH_REPO,
                "sha": pr.merge,
            },
        }
    )
    return env


def with_inputs(**kw) -> dict:
    """`with:` values; the interpreter is the one running the tests (it has torch and triton)."""
    return {"python": sys.executable, "device": "cpu", **{k.replace("_", "-"): v for k, v in kw.items()}}


# ---------------------------------------------------------------- tests


def test_action_metadata_declares_the_contract():
    action = load_action()
    assert {"config", "base", "head", "token", "fail-on", "budget", "device"} <= set(action["inputs"])
    assert set(action["outputs"]) == {"conclusion", "verdict", "report"}
    assert action["inputs"]["token"]["default"] == "${{ github.token }}"
    assert action["runs"]["using"] == "composite"
    for step in action["runs"]["steps"]:
        assert step["shell"] == "bash"
        # inputs reach scripts only through env: a value spliced into the script text could inject shell code
        assert not EXPR.search(step["run"]), f"step {step['id']}: expression inside run:"
        assert "set -x" not in step["run"]  # would print the token


@pytest.fixture
def gate_only(tmp_path, github_standin):
    """The gate step on its own, with the install step's output pointing at this interpreter's
    kernalin-ci (installed editable in the test environment)."""
    pr = make_pull_request(tmp_path, CORRECT_CHANGE)
    env = runner_env(tmp_path, pr, github_standin.base_url, token="", action_path=REPO)
    given = {"install": {"bin": str(Path(sys.executable).parent)}}

    def run(**kw):
        return run_action(REPO, pr.workspace, with_inputs(token="", **kw), env, given=given, timeout=120)

    return run


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"fail_on": "finding,faster"}, "--fail-on 'finding,faster': expected a comma-separated list"),
        ({"budget": "0"}, "--budget-s 0: must be positive"),
        ({"budget": "soon"}, "argument --budget-s: invalid float value: 'soon'"),
        ({"config": "missing.yml"}, "missing.yml: no configuration at base"),
    ],
)
def test_bad_inputs_fail_the_step_with_one_line(gate_only, inputs, message):
    run = gate_only(**inputs)
    step = next(s for s in run.steps if s.id == "gate")
    assert step.returncode == 2, run.log
    assert message in step.stderr and "Traceback" not in step.stderr
    assert len(step.stderr.strip().splitlines()) == 1, step.stderr


def test_action_gates_a_pull_request(tmp_path, github_standin):
    """Install from the action's checkout, gate a correct change, post the check run and the comment."""
    gh = github_standin
    pr = make_pull_request(tmp_path, CORRECT_CHANGE)
    token = "ghs_" + secrets.token_hex(18)
    gh.add_repo(GH_REPO)
    gh.add_pull_request(GH_REPO, PR_NUMBER, head_sha=pr.head, base_sha=pr.base, head_ref="feature")
    gh.add_commit(GH_REPO, pr.merge)
    gh.add_token(token, permissions=WRITE_PERMISSIONS)
    action_path = action_checkout(tmp_path)
    env = runner_env(tmp_path, pr, gh.base_url, token=token, action_path=action_path)

    run = run_action(
        action_path, pr.workspace, with_inputs(fail_on="finding,inconclusive", budget="7", dashboard="site"), env
    )

    # history: only a push to the default branch records anything (docs/history.md); a PR passes through
    assert [s.id for s in run.steps] == ["install", "gate", "history"] and run.returncode == 0, run.log
    print("step seconds:", {s.id: round(s.seconds, 1) for s in run.steps})
    assert run.steps[0].outputs["bin"].startswith(env["RUNNER_TEMP"])  # installed into the runner's temp venv
    # the dashboard input: Chart.js fetched and checked at install time, into the venv (docs/history.md)
    from kernalin_ci.dashboard.assets import CHARTJS_FILE, CHARTJS_SHA256

    (chartjs,) = Path(run.steps[0].outputs["bin"]).parent.glob(
        f"lib/*/site-packages/kernalin_ci/dashboard/vendor/{CHARTJS_FILE}"
    )
    assert hashlib.sha256(chartjs.read_bytes()).hexdigest() == CHARTJS_SHA256
    # the Action's outputs, mapped from the gate step's GITHUB_OUTPUT
    assert run.outputs["conclusion"] == "success"
    assert run.outputs["verdict"] == "none"  # gate.bench: false
    report_path = Path(run.outputs["report"])
    assert report_path.is_absolute() and report_path == pr.workspace / "kernalin-out" / "report.json"
    report = json.loads(report_path.read_text())
    assert report["conclusion"] == "success"
    assert report["head"]["sha"] == pr.head and report["base"]["sha"] == pr.base  # from the event, not the merge
    [kernel] = report["kernels"]
    assert (kernel["name"], kernel["status"], kernel["verification"]["verdict"]) == ("rope", "changed", "pass")
    # fail-on and budget override the configuration's gate policy
    assert report["policy"]["fail_on"] == ["finding", "inconclusive"] and report["policy"]["budget_s"] == 7.0
    # the step summary holds the report
    assert "rope" in run.summary and "kernalin-ci" in run.summary.lower()
    # the stand-in got the check run on the PR head (not the merge commit) and the sticky comment
    [check] = gh.check_runs(GH_REPO)
    assert check["head_sha"] == pr.head and check["status"] == "completed" and check["conclusion"] == "success"
    [comment] = gh.comments(GH_REPO, PR_NUMBER)
    assert comment["body"].startswith("<!-- kernalin-ci sticky comment") and "rope" in comment["body"]
    # the token is never printed
    for s in run.steps:
        assert token not in s.stdout + s.stderr + s.summary + json.dumps(s.outputs)
    assert token not in report_path.read_text()


def test_action_fails_on_a_finding(tmp_path, github_standin):
    """A rope-sign bug: the step exits 1, the outputs still come back, the check run fails with an
    annotation on the changed line."""
    gh = github_standin
    pr = make_pull_request(tmp_path, BUG_CHANGE)
    token = "ghs_" + secrets.token_hex(18)
    gh.add_repo(GH_REPO)
    gh.add_pull_request(GH_REPO, PR_NUMBER, head_sha=pr.head, base_sha=pr.base, head_ref="feature")
    gh.add_token(token, permissions=WRITE_PERMISSIONS)
    env = runner_env(tmp_path, pr, gh.base_url, token=token, action_path=REPO)
    given = {"install": {"bin": str(Path(sys.executable).parent)}}

    run = run_action(REPO, pr.workspace, with_inputs(), env, given=given)

    assert run.returncode == 1, run.log
    assert run.outputs["conclusion"] == "failure" and run.outputs["verdict"] == "none"
    report = json.loads(Path(run.outputs["report"]).read_text())
    findings = report["kernels"][0]["verification"]["findings"]
    assert "rope-sign" in {f["bug_class"] for f in findings}
    assert "rope-sign" in run.summary
    [check] = gh.check_runs(GH_REPO)
    assert check["conclusion"] == "failure" and check["head_sha"] == pr.head
    assert any(a["path"] == "kernels/rope.py" for a in check["annotations"])
    assert token not in run.log


def test_fork_pull_request_gets_the_report_without_posting(tmp_path, github_standin):
    """A PR from a fork: GitHub's read-only token. Every write is refused; the gate still runs, warns,
    passes, and the report is in the step summary and the outputs."""
    gh = github_standin
    pr = make_pull_request(tmp_path, CORRECT_CHANGE)
    token = "ghs_" + secrets.token_hex(18)
    gh.add_repo(GH_REPO)
    gh.add_pull_request(GH_REPO, PR_NUMBER, head_sha=pr.head, base_sha=pr.base, head_repo="octo-dev/kernels")
    gh.add_token(token, permissions=READ_ONLY_PERMISSIONS)
    env = runner_env(tmp_path, pr, gh.base_url, token=token, action_path=REPO, fork="octo-dev/kernels")
    given = {"install": {"bin": str(Path(sys.executable).parent)}}

    run = run_action(REPO, pr.workspace, with_inputs(), env, given=given)

    assert run.returncode == 0 and run.outputs["conclusion"] == "success", run.log
    assert gh.check_runs(GH_REPO) == [] and gh.comments(GH_REPO, PR_NUMBER) == []
    assert gh.statuses(GH_REPO) == []
    gate = next(s for s in run.steps if s.id == "gate")
    assert "warning" in gate.stderr and "Traceback" not in gate.stderr
    assert "rope" in run.summary
    assert token not in run.log
