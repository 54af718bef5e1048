"""The Actions environment: a real-shaped pull_request event, INPUT_*, GITHUB_OUTPUT, GITHUB_STEP_SUMMARY."""

import json

import pytest

from kernalin_ci.errors import UsageError
from kernalin_ci.github import actions
from kernalin_ci.testing.openapi import OpenAPI
from kernalin_ci.testing.payloads import pull_request_event

MERGE_SHA = "5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d"


def schema_errors(payload, action):
    return OpenAPI.load().validate_component(f"webhook-pull-request-{action}", payload)


@pytest.mark.parametrize("action", ["opened", "synchronize", "reopened"])
@pytest.mark.parametrize("fork", [None, "octo-dev/kernels"])
def test_payload_fixture_matches_githubs_webhook_schema(action, fork):
    assert schema_errors(pull_request_event(action=action, head_repo=fork), action) == []


def test_schema_check_is_not_vacuous():
    ev = pull_request_event()
    del ev["pull_request"]["head"]["sha"]
    ev["pull_request"]["base"]["repo"]["fork"] = "no"
    errors = schema_errors(ev, "synchronize")
    assert any("'sha' is a required property" in e for e in errors)
    assert any("'no' is not of type 'boolean'" in e for e in errors)


def actions_env(tmp_path, payload, event_name="pull_request"):
    path = tmp_path / "event.json"
    path.write_text(json.dumps(payload))
    return {
        "GITHUB_ACTIONS": "true",
        "GITHUB_EVENT_NAME": event_name,
        "GITHUB_EVENT_PATH": str(path),
        "GITHUB_REPOSITORY": "acme/kernels",
        "GITHUB_SHA": MERGE_SHA,
        "GITHUB_RUN_ID": "9001",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_API_URL": "https://api.github.com",
        "GITHUB_OUTPUT": str(tmp_path / "output"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    }


def test_pull_request_from_a_branch(tmp_path):
    ev = pull_request_event(
        number=42,
        head_sha="8d3f0c1e2b4a5968778695a4b3c2d1e0f9a8b7c6",
        base_sha="1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d",
    )
    ctx = actions.context(actions_env(tmp_path, ev))
    pr = ctx.pull_request
    assert (pr.repo, pr.number, pr.action) == ("acme/kernels", 42, "synchronize")
    assert (pr.base_sha, pr.base_ref) == ("1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d", "main")
    assert (pr.head_sha, pr.head_ref) == ("8d3f0c1e2b4a5968778695a4b3c2d1e0f9a8b7c6", "faster-decode-attention")
    assert pr.head_repo == "acme/kernels" and pr.is_fork is False
    assert ctx.sha == MERGE_SHA and ctx.head_sha == pr.head_sha  # results go on the head, not the merge commit
    assert ctx.run_url == "https://github.com/acme/kernels/actions/runs/9001"
    assert actions.in_actions(actions_env(tmp_path, ev))


def test_pull_request_from_a_fork(tmp_path):
    ctx = actions.context(actions_env(tmp_path, pull_request_event(head_repo="octo-dev/kernels")))
    assert ctx.pull_request.is_fork and ctx.pull_request.head_repo == "octo-dev/kernels"
    assert ctx.pull_request.repo == "acme/kernels"
    ev = pull_request_event(head_repo="octo-dev/kernels")
    ev["pull_request"]["head"]["repo"] = None  # the fork was deleted
    pr = actions.context(actions_env(tmp_path, ev, "pull_request_target")).pull_request
    assert pr.is_fork and pr.head_repo is None


def test_non_pull_request_events_and_bad_payloads(tmp_path):
    push = {"ref": "refs/heads/main", "before": "0" * 40, "after": MERGE_SHA, "repository": {"full_name": "a/b"}}
    ctx = actions.context(actions_env(tmp_path, push, "push"))
    assert ctx.pull_request is None and ctx.head_sha == MERGE_SHA
    env = actions_env(tmp_path, {"pull_request": {"number": 1}})
    with pytest.raises(UsageError, match="pull_request lacks"):
        actions.context(env)
    (tmp_path / "event.json").write_text("{not json")
    with pytest.raises(UsageError, match="not JSON"):
        actions.context(env)
    with pytest.raises(UsageError, match="cannot read"):
        actions.context({**env, "GITHUB_EVENT_PATH": str(tmp_path / "absent.json")})
    with pytest.raises(UsageError, match="GITHUB_SHA"):
        actions.context({"GITHUB_EVENT_NAME": "push", "GITHUB_REPOSITORY": "a/b"})


def test_inputs():
    env = {
        "INPUT_GITHUB-TOKEN": "  ghs_x  ",
        "INPUT_BASE_REF": "main",
        "INPUT_POST-COMMENT": "false",
        "INPUT_STRICT": "TRUE",
        "INPUT_EMPTY": "   ",
        "INPUT_BAD": "yes",
    }
    assert actions.input_variable("github-token") == "INPUT_GITHUB-TOKEN"
    assert actions.get_input("github-token", env=env) == "ghs_x"
    assert actions.get_input("base ref", env=env) == "main"  # spaces become underscores
    assert actions.get_input("empty", env=env, default="d") == "d"
    with pytest.raises(UsageError, match="input required and not supplied: config"):
        actions.get_input("config", env=env, required=True)
    assert actions.get_bool_input("post-comment", env=env) is False
    assert actions.get_bool_input("strict", env=env) is True
    assert actions.get_bool_input("missing", env=env, default=True) is True
    with pytest.raises(UsageError, match="must be true or false"):
        actions.get_bool_input("bad", env=env)


def parse_output_file(text):
    """Read GITHUB_OUTPUT the way the runner does: NAME=VALUE lines and NAME<<DELIM ... DELIM blocks."""
    out, lines, i = {}, text.split("\n"), 0
    while i < len(lines):
        line = lines[i]
        if not line:
            i += 1
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            j = lines.index(delim, i + 1)
            out[name] = "\n".join(lines[i + 1 : j])
            i = j + 1
        else:
            name, value = line.split("=", 1)
            out[name] = value
            i += 1
    return out


def test_outputs_use_the_multiline_safe_delimiter_form(tmp_path):
    env = actions_env(tmp_path, pull_request_event())
    (tmp_path / "output").write_text("earlier=step\n")  # other steps' outputs stay
    tricky = "line one\nEOF\nname=injected\n<<EOF\n\nlast line"
    assert actions.set_output("conclusion", "failure", env=env)
    assert actions.set_output("report", tricky, env=env)
    assert actions.set_output("counts", {"kernels": 2, "failed": 1}, env=env)
    text = (tmp_path / "output").read_text()
    assert "report<<ghadelimiter_" in text
    assert parse_output_file(text) == {
        "earlier": "step",
        "conclusion": "failure",
        "report": tricky,
        "counts": '{"kernels": 2, "failed": 1}',
    }
    assert actions.set_output("x", "y", env={}) is False
    with pytest.raises(ValueError):
        actions.set_output("bad\nname", "v", env=env)


def test_step_summary_appends_and_stays_under_1_mib(tmp_path):
    env = actions_env(tmp_path, pull_request_event())
    assert actions.append_step_summary("## kernalin-ci\n\n| kernel | verdict |\n|---|---|\n| attn | fail |", env=env)
    assert actions.append_step_summary("second part", env=env)
    summary = tmp_path / "summary.md"
    assert summary.read_text() == "## kernalin-ci\n\n| kernel | verdict |\n|---|---|\n| attn | fail |\nsecond part\n"
    assert actions.append_step_summary("é" * 700_000, env=env)  # 1.4 MB of UTF-8
    data = summary.read_bytes()
    assert len(data) <= actions.STEP_SUMMARY_MAX_BYTES and data.decode("utf-8").endswith("job's output.*\n")
    assert actions.append_step_summary("nothing", env={}) is False


def test_workflow_command_annotations_are_escaped_per_githubs_rules():
    from kernalin_ci.github.client import Annotation
    from kernalin_ci.github.workflow_commands import MAX_PER_STEP, command, commands

    a = Annotation("dir,a/k:1%.py", 7, 7, "50% off\r\nline two\n::error::injected", title="k: a, b")
    line = command(a)
    assert line == (
        "::error file=dir%2Ca/k%3A1%25.py,line=7,title=k%3A a%2C b::50%25 off%0D%0Aline two%0A::error::injected"
    )
    assert "\n" not in line and "\r" not in line  # one line: the message cannot start a command of its own
    many = commands([Annotation("k.py", i + 1, i + 1, "m") for i in range(MAX_PER_STEP + 3)])
    assert len(many) == MAX_PER_STEP + 1 and many[-1].startswith("kernalin-ci: 3 more findings are not annotated")
