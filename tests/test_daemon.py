"""The daemon in this process, on loopback: real signed HTTP deliveries, the real SQLite queue, real git
fetches of real repositories, the local runner, and the GitHub stand-in (every request it gets is
checked against GitHub's OpenAPI description; a bad one fails the test at teardown).

Jobs here run a stand-in gate command (kernalin_ci.testing.daemon_world.FAKE_GATE) that writes a real
report.json; tests/test_daemon_gate.py runs the real gate end to end.
"""

import json
import os
import time
from pathlib import Path

import pytest

from kernalin_ci.daemon import webhook
from kernalin_ci.daemon.app import Daemon, wait_for
from kernalin_ci.daemon.deliver import deliver, get_json
from kernalin_ci.daemon.metrics import rss_bytes
from kernalin_ci.daemon.runners.local import marked_pids
from kernalin_ci.github.client import sticky_marker
from kernalin_ci.report.badge import badge_endpoint, badge_svg
from kernalin_ci.report.markdown import render_markdown
from kernalin_ci.report.model import Report
from kernalin_ci.testing.daemon_world import (
    APP_ID,
    INSTALLATION_ID,
    WEBHOOK_SECRET,
    World,
    fake_gate_command,
    job_started,
    settings_for,
    wait_job,
)
from kernalin_ci.testing.openapi import OpenAPI

REPO = "acme/kernels"
BASE_CONFIG = """\
version: 1
kernels:
  - name: kv_append
    op: kv_append
    entry: kernels/kv_cache.py:append
    params: {block_size: 16}
gate:
  bench: false
"""
BASE_FILES = {".kernalin.yml": BASE_CONFIG, "kernels/kv_cache.py": "# the kernel\n", "verdict.txt": "success\n"}


@pytest.fixture
def world(tmp_path, github_standin):
    w = World(tmp_path / "world", github_standin).start()
    w.add_repo(REPO, BASE_FILES)
    yield w
    w.stop()


@pytest.fixture
def make_daemon(tmp_path, world):
    made = []

    def make(**overrides) -> Daemon:
        sections = {"runner": {"command": fake_gate_command()}}
        sections.update(overrides)
        cfg = world.daemon_config(tmp_path / f"state{len(made)}", **sections)
        d = Daemon(settings_for(world, cfg)).start()
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


def send(d: Daemon, event: str, payload, **kw):
    return deliver(d.url + "/webhook", event, payload, WEBHOOK_SECRET, **kw)


def get(d: Daemon):
    return lambda path: get_json(d.url + path)


def pr_head(
    world, number: int, files: dict, *, fork: str | None = None, label: str | None = None, action: str = "opened"
) -> tuple[str, dict]:
    repo = world.repos[REPO]
    head = repo.commit(files, f"pr {number}", branch=f"pr-{number}")
    return head, world.pull_request(REPO, number, head, repo.main, action=action, fork=fork, label=label)


def job_out(d: Daemon, job_id: str) -> Path:
    return d.settings.jobs_dir / job_id / "out"


def runs_of(world, job_id: str) -> list[dict]:
    return [r for r in world.standin.check_runs(REPO) if r["external_id"] == job_id]


# -- deliveries ------------------------------------------------------------------------------------


def test_signed_delivery_queues_a_job_runs_the_pr_head_and_posts_the_result(world, make_daemon):
    d = make_daemon()
    head, payload = pr_head(world, 7, {"verdict.txt": "failure\n", "kernels/kv_cache.py": "# faster\n"})
    status, answer = send(d, "pull_request", payload)
    assert status == 202 and answer["status"] == "accepted" and len(answer["jobs"]) == 1
    job = wait_job(get(d), answer["jobs"][0])
    assert job["state"] == "done" and job["conclusion"] == "failure" and job["post_state"] == "posted"
    out = job_out(d, job["id"])
    # the command ran in a fresh checkout of the PR head (its verdict.txt), fetched by the daemon
    assert Path((out / "cwd.txt").read_text()).name == "repo"
    assert json.loads((out / "report.json").read_text())["head"]["sha"] == head
    runs = runs_of(world, job["id"])
    assert len(runs) == 1 and runs[0]["status"] == "completed" and runs[0]["conclusion"] == "failure"
    assert runs[0]["head_sha"] == head and runs[0]["name"] == "kernalin-ci"
    assert runs[0]["app_id"] == APP_ID  # posted as the App's installation, through an installation token
    comments = world.standin.comments(REPO, 7)
    report = Report.from_json(json.loads((out / "report.json").read_text()))
    assert [c["body"] for c in comments] == [sticky_marker() + "\n" + render_markdown(report)]
    assert not (d.settings.jobs_dir / job["id"] / "repo").exists()  # the checkout is removed afterwards


def test_bad_and_missing_signatures_are_refused_before_parsing(world, make_daemon):
    d = make_daemon()
    _, payload = pr_head(world, 8, {"verdict.txt": "success\n"})
    body = json.dumps(payload).encode()
    cases = [
        dict(secret=None),  # no header
        dict(secret="not-the-secret"),
        dict(secret=WEBHOOK_SECRET, signature_value="sha1=" + webhook.signature(WEBHOOK_SECRET.encode(), body)[7:]),
        dict(secret=WEBHOOK_SECRET, signature_value=webhook.signature(WEBHOOK_SECRET.encode(), body + b" ")),
        dict(secret=WEBHOOK_SECRET, signature_value="sha256="),
        dict(secret=WEBHOOK_SECRET, signature_value="sha256=\u00e9" * 3),
    ]
    for c in cases:
        status, answer = deliver(
            d.url + "/webhook", "pull_request", body, c["secret"], signature_value=c.get("signature_value")
        )
        assert status == 401, (c, answer)
    # a signed body that is not JSON is refused with 401 too when the signature is wrong: the body is never parsed
    status, _ = deliver(d.url + "/webhook", "pull_request", b"{not json", "wrong-secret")
    assert status == 401
    assert d.store.deliveries() == 0 and d.store.jobs() == []


def test_replayed_delivery_id_is_acknowledged_once(world, make_daemon):
    d = make_daemon()
    _, payload = pr_head(world, 9, {"verdict.txt": "success\n"})
    first = send(d, "pull_request", payload, delivery_id="72d3162e-cc78-11e3-81ab-4c9367dc0958")
    again = send(d, "pull_request", payload, delivery_id="72d3162e-cc78-11e3-81ab-4c9367dc0958")
    assert first[0] == 202 and again == (
        200,
        {"status": "duplicate", "delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"},
    )
    wait_job(get(d), first[1]["jobs"][0])
    assert len(d.store.jobs()) == 1 and len(world.standin.check_runs(REPO)) == 1


def test_malformed_json_and_bodies_of_the_wrong_shape_are_400(world, make_daemon):
    d = make_daemon()
    _, payload = pr_head(world, 10, {"verdict.txt": "success\n"})
    assert send(d, "pull_request", b'{"action": "opened", ')[0] == 400
    assert send(d, "pull_request", b"\xff\xfe not utf-8")[0] == 400
    assert send(d, "pull_request", b"[1, 2, 3]")[0] == 400
    del payload["pull_request"]["head"]["sha"]
    status, answer = send(d, "pull_request", payload)
    assert status == 400 and "head.sha" in answer["error"]
    payload["pull_request"]["head"]["sha"] = "--upload-pack=touch /tmp/x"  # never reaches git
    assert send(d, "pull_request", payload)[0] == 400
    assert send(d, "pull_request", {"action": "opened"}, delivery_id="")[0] == 400  # no delivery id
    assert d.store.jobs() == []


def test_oversized_bodies_are_413_without_a_job(world, make_daemon):
    d = make_daemon(webhook={"max_body_bytes": 50_000})
    _, payload = pr_head(world, 11, {"verdict.txt": "success\n"})
    payload["pull_request"]["body"] = "x" * 60_000
    status, answer = send(d, "pull_request", payload)
    assert status == 413 and "50000" in answer["error"]
    status, _ = deliver(d.url + "/webhook", "pull_request", b"y" * 3_000_000, None)  # unsigned too: 413 first
    assert status == 413
    assert d.store.deliveries() == 0 and d.store.jobs() == []


def test_unknown_events_and_actions_are_acknowledged_and_ignored(world, make_daemon):
    d = make_daemon()
    for event, payload in [
        ("issues", {"action": "opened", "issue": {"number": 1}}),
        ("ping", {"zen": "Keep it logically awesome.", "hook_id": 1}),
        ("push", {"ref": "refs/heads/main"}),
    ]:
        status, answer = send(d, event, payload)
        assert status == 202 and answer["status"] == "ignored", answer
    _, payload = pr_head(world, 12, {"verdict.txt": "success\n"}, action="edited")
    assert send(d, "pull_request", payload)[1]["status"] == "ignored"
    assert d.store.deliveries() == 4 and d.store.jobs() == []


def test_answers_come_before_the_work(world, make_daemon):
    d = make_daemon()
    _, payload = pr_head(world, 13, {"verdict.txt": "success\n", "sleep.txt": "120"})
    status, answer = send(d, "pull_request", payload)
    assert status == 202  # answered while the job has not even started or is still running
    assert d.store.job(answer["jobs"][0]).state in ("queued", "running")
    assert world.standin.check_runs(REPO) == [] or world.standin.check_runs(REPO)[0]["status"] == "in_progress"
    send(d, "pull_request", {**payload, "action": "closed"})
    assert wait_job(get(d), answer["jobs"][0], posted=False)["state"] == "cancelled"


# -- the job's life -------------------------------------------------------------------------------


def test_a_new_push_cancels_the_superseded_job_and_marks_its_check_run(world, make_daemon):
    d = make_daemon()
    repo = world.repos[REPO]
    old_head = repo.commit({"verdict.txt": "success\n", "sleep.txt": "60"}, "slow", branch="pr-14")
    first = send(d, "pull_request", world.pull_request(REPO, 14, old_head, repo.main))[1]["jobs"][0]
    assert wait_for(lambda: job_started(job_out(d, first).parent) and d.store.job(first).began, 30)
    assert marked_pids(first)  # the job's processes, seen from the host (its own PIDs are namespaced)
    new_head = repo.commit({"sleep.txt": "0"}, "fast", branch="pr-14")
    status, answer = send(d, "pull_request", world.pull_request(REPO, 14, new_head, repo.main, action="synchronize"))
    assert status == 202 and answer["cancelled"] == [first]
    old = wait_job(get(d), first)
    assert old["state"] == "cancelled" and "superseded by a newer push" in old["cancel_reason"]
    assert wait_for(lambda: not marked_pids(first), 10)
    new = wait_job(get(d), answer["jobs"][0])
    assert new["state"] == "done" and new["conclusion"] == "success"
    (old_run,) = runs_of(world, first)
    assert old_run["conclusion"] == "cancelled" and old_run["head_sha"] == old_head
    (new_run,) = runs_of(world, new["id"])
    assert new_run["conclusion"] == "success" and new_run["head_sha"] == new_head
    assert len(world.standin.comments(REPO, 14)) == 1  # one sticky comment, from the job that finished


def test_a_queued_job_superseded_before_it_starts_posts_nothing(world, make_daemon):
    d = make_daemon()
    repo = world.repos[REPO]
    busy_head = repo.commit({"sleep.txt": "60"}, "slow", branch="pr-15")
    busy = send(d, "pull_request", world.pull_request(REPO, 15, busy_head, repo.main))[1]["jobs"][0]
    assert wait_for(lambda: job_started(job_out(d, busy).parent), 30)  # the only slot is taken
    h1 = repo.commit({"verdict.txt": "failure\n"}, "a", branch="pr-16")
    j1 = send(d, "pull_request", world.pull_request(REPO, 16, h1, repo.main))[1]["jobs"][0]
    h2 = repo.commit({"verdict.txt": "success\n"}, "b", branch="pr-16")
    j2 = send(d, "pull_request", world.pull_request(REPO, 16, h2, repo.main, action="synchronize"))[1]["jobs"][0]
    assert d.store.job(j1).state == "cancelled"
    send(d, "pull_request", {**world.pull_request(REPO, 15, busy_head, repo.main), "action": "closed"})
    assert wait_job(get(d), busy)["state"] == "cancelled"
    assert wait_job(get(d), j2)["conclusion"] == "success"
    assert runs_of(world, j1) == []  # never started: nothing to mark


def test_job_timeout_kills_the_job_and_is_not_retried(world, make_daemon):
    d = make_daemon(runner={"command": fake_gate_command(), "timeout_s": 1.5})
    _, payload = pr_head(world, 17, {"sleep.txt": "60"})
    job = wait_job(get(d), send(d, "pull_request", payload)[1]["jobs"][0])
    assert job["state"] == "failed" and job["conclusion"] == "timed_out" and job["attempts"] == 0
    assert job_started(job_out(d, job["id"]).parent)
    assert wait_for(lambda: not marked_pids(job["id"]), 5)
    (run,) = runs_of(world, job["id"])
    assert run["conclusion"] == "timed_out" and "Timed out" in run["output"]["title"]


def test_a_gate_that_cannot_run_fails_once_without_retries(world, make_daemon):
    d = make_daemon()
    _, payload = pr_head(world, 18, {"verdict.txt": "error\n"})
    job = wait_job(get(d), send(d, "pull_request", payload)[1]["jobs"][0])
    assert job["state"] == "failed" and job["attempts"] == 0 and "exit code 2" in job["error"]
    (run,) = runs_of(world, job["id"])
    assert run["conclusion"] == "failure" and ".kernalin.yml:3: kernels: required" in run["output"]["summary"]


def test_infrastructure_failures_are_retried_with_backoff_then_reported(world, make_daemon):
    d = make_daemon(
        github={**world.daemon_config(world.root)["github"], "clone_url": f"file://{world.root}/nowhere/{{repo}}.git"}
    )
    _, payload = pr_head(world, 19, {"verdict.txt": "success\n"})
    t0 = time.time()
    job = wait_job(get(d), send(d, "pull_request", payload)[1]["jobs"][0], timeout=60)
    assert job["state"] == "failed" and job["attempts"] == 3 and "git fetch failed" in job["error"]
    assert job["finished_at"] - t0 >= 0.2 * 0.5 + 0.4 * 0.5  # two backoff waits (base 0.2 s, jitter 0.5..1)
    (run,) = runs_of(world, job["id"])
    assert run["conclusion"] == "failure" and "infrastructure error after 3 attempts" in run["output"]["title"]


def test_github_5xx_while_posting_is_retried_and_posted_once(world, make_daemon):
    world.standin.inject("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}", 502, times=6)
    world.standin.inject("POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments", 502, times=1, after=True)
    d = make_daemon()
    _, payload = pr_head(world, 20, {"verdict.txt": "success\n"})
    job = wait_job(get(d), send(d, "pull_request", payload)[1]["jobs"][0], timeout=60)
    assert job["post_state"] == "posted" and d.store.job(job["id"]).post_attempts >= 1
    (run,) = runs_of(world, job["id"])
    assert run["status"] == "completed" and run["conclusion"] == "success"
    assert len(world.standin.comments(REPO, 20)) == 1  # the lost answer did not make a second comment


def check_run_event(world, job_id: str, head: str) -> dict:
    """A check_run.rerequested delivery for the run with external id JOB_ID (GitHub's webhook shape)."""
    pr = world.pull_request(REPO, 21, head, world.repos[REPO].main)
    app = {
        "id": APP_ID,
        "slug": "kernalin-ci",
        "node_id": "MDM6QXBwNDI0MjQy",
        "owner": pr["sender"],
        "name": "kernalin-ci",
        "description": None,
        "external_url": "https://ci.example.invalid",
        "html_url": "https://github.com/apps/kernalin-ci",
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
        "permissions": {"checks": "write"},
        "events": ["pull_request"],
    }
    suite = {
        "id": 5100001,
        "node_id": "CS_kwDO",
        "head_branch": "pr-21",
        "head_sha": head,
        "status": "completed",
        "conclusion": "success",
        "url": f"https://api.github.com/repos/{REPO}/check-suites/5100001",
        "before": None,
        "after": head,
        "pull_requests": [],
        "app": app,
        "created_at": "2026-05-20T08:01:19Z",
        "updated_at": "2026-05-20T08:02:19Z",
    }
    run = {
        "id": 4100001,
        "head_sha": head,
        "node_id": "CR_kwDO",
        "external_id": job_id,
        "url": f"https://api.github.com/repos/{REPO}/check-runs/4100001",
        "html_url": f"https://github.com/{REPO}/runs/4100001",
        "details_url": "https://ci.example.invalid/jobs/x",
        "status": "completed",
        "conclusion": "success",
        "started_at": "2026-05-20T08:01:19Z",
        "completed_at": "2026-05-20T08:02:19Z",
        "output": {
            "title": "t",
            "summary": "s",
            "text": None,
            "annotations_count": 0,
            "annotations_url": f"https://api.github.com/repos/{REPO}/check-runs/4100001/annotations",
        },
        "name": "kernalin-ci",
        "check_suite": suite,
        "app": app,
        "pull_requests": [],
    }
    return {
        "action": "rerequested",
        "check_run": run,
        "repository": pr["repository"],
        "sender": pr["sender"],
        "installation": {"id": INSTALLATION_ID, "node_id": "MDIzOkludGVncmF0aW9uOTA5MA=="},
    }


def installation_event(action: str) -> dict:
    owner = {
        "login": "acme",
        "id": 91000001,
        "node_id": "O_kgDO",
        "avatar_url": "https://avatars.example/u/1",
        "gravatar_id": "",
        "url": "https://api.github.com/users/acme",
        "html_url": "https://github.com/acme",
        "followers_url": "https://api.github.com/users/acme/followers",
        "following_url": "https://api.github.com/users/acme/following{/other_user}",
        "gists_url": "https://api.github.com/users/acme/gists{/gist_id}",
        "starred_url": "https://api.github.com/users/acme/starred{/owner}{/repo}",
        "subscriptions_url": "https://api.github.com/users/acme/subscriptions",
        "organizations_url": "https://api.github.com/users/acme/orgs",
        "repos_url": "https://api.github.com/users/acme/repos",
        "events_url": "https://api.github.com/users/acme/events{/privacy}",
        "received_events_url": "https://api.github.com/users/acme/received_events",
        "type": "Organization",
        "site_admin": False,
    }
    inst = {
        "id": INSTALLATION_ID,
        "account": owner,
        "repository_selection": "selected",
        "access_tokens_url": f"https://api.github.com/app/installations/{INSTALLATION_ID}/access_tokens",
        "repositories_url": "https://api.github.com/installation/repositories",
        "html_url": f"https://github.com/organizations/acme/settings/installations/{INSTALLATION_ID}",
        "app_id": APP_ID,
        "target_id": 91000001,
        "target_type": "Organization",
        "permissions": {"checks": "write", "contents": "read", "pull_requests": "write"},
        "events": ["pull_request", "check_run"],
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
        "single_file_name": None,
        "app_slug": "kernalin-ci",
        "suspended_at": None,
        "suspended_by": None,
    }
    return {
        "action": action,
        "installation": inst,
        "repositories": [
            {"id": 812000001, "node_id": "R_kgDO", "name": "kernels", "full_name": REPO, "private": False}
        ],
        "requester": None,
        "sender": owner,
    }


def test_event_builders_match_githubs_webhook_schemas(world):
    spec = OpenAPI.load()
    head = world.repos[REPO].commit({"verdict.txt": "success\n"}, "x", branch="pr-21")
    assert spec.validate_component("webhook-check-run-rerequested", check_run_event(world, "kci-1", head)) == []
    for action in ("created", "deleted", "suspend"):
        assert spec.validate_component(f"webhook-installation-{action}", installation_event(action)) == []
    fork_labeled = world.pull_request(
        REPO, 22, head, world.repos[REPO].main, action="labeled", fork="octo-dev/kernels", label="safe-to-test"
    )
    assert spec.validate_component("webhook-pull-request-labeled", fork_labeled) == []


def test_check_run_rerequested_runs_the_job_again(world, make_daemon):
    d = make_daemon()
    head, payload = pr_head(world, 21, {"verdict.txt": "success\n"})
    first = wait_job(get(d), send(d, "pull_request", payload)[1]["jobs"][0])
    status, answer = send(d, "check_run", check_run_event(world, first["id"], head))
    assert status == 202 and len(answer["jobs"]) == 1 and answer["jobs"][0] != first["id"]
    again = wait_job(get(d), answer["jobs"][0])
    assert again["state"] == "done" and again["trigger"] == "check_run.rerequested (pull_request.opened)"
    assert [r["external_id"] for r in world.standin.check_runs(REPO)] == [first["id"], again["id"]]
    assert len(world.standin.comments(REPO, 21)) == 1
    status, answer = send(d, "check_run", check_run_event(world, "kci-0123456789abcdef0123", head))
    assert status == 202 and answer["jobs"] == [] and "not one of this daemon's jobs" in answer["note"]


def test_installation_events_are_recorded_and_a_removed_installation_cancels_its_jobs(world, make_daemon):
    d = make_daemon()
    assert send(d, "installation", installation_event("created"))[0] == 202
    _, payload = pr_head(world, 23, {"sleep.txt": "60"})
    job = send(d, "pull_request", payload)[1]["jobs"][0]
    assert wait_for(lambda: job_started(job_out(d, job).parent), 30)
    status, answer = send(d, "installation", installation_event("deleted"))
    assert status == 202 and answer["cancelled"] == [job]
    assert wait_job(get(d), job, posted=False)["state"] == "cancelled"


# -- policy -----------------------------------------------------------------------------------------


def test_a_forks_pull_request_waits_for_the_maintainers_label(world, make_daemon):
    d = make_daemon()
    fork = "octo-dev/kernels"
    head, payload = pr_head(world, 24, {"verdict.txt": "failure\n"}, fork=fork)
    waiting = wait_job(get(d), send(d, "pull_request", payload)[1]["jobs"][0])
    assert waiting["state"] == "done" and waiting["conclusion"] == "neutral" and waiting["outcome"] == "waiting"
    assert not (job_out(d, waiting["id"]) / "started").exists()  # none of the fork's code ran
    (run,) = runs_of(world, waiting["id"])
    assert run["conclusion"] == "neutral" and "safe-to-test" in run["output"]["title"]
    # another label: nothing happens
    other = send(
        d,
        "pull_request",
        world.pull_request(REPO, 24, head, world.repos[REPO].main, action="labeled", fork=fork, label="documentation"),
    )[1]["jobs"][0]
    assert wait_job(get(d), other)["outcome"] == "skipped" and runs_of(world, other) == []
    # the maintainer's label: now it runs
    approved = send(
        d,
        "pull_request",
        world.pull_request(REPO, 24, head, world.repos[REPO].main, action="labeled", fork=fork, label="safe-to-test"),
    )[1]["jobs"][0]
    job = wait_job(get(d), approved)
    assert job["conclusion"] == "failure" and (job_out(d, approved) / "started").exists()
    # a new push from the fork waits again
    head2 = world.repos[REPO].commit({"verdict.txt": "success\n"}, "more", branch="pr-24")
    again = send(
        d, "pull_request", world.pull_request(REPO, 24, head2, world.repos[REPO].main, action="synchronize", fork=fork)
    )[1]["jobs"][0]
    assert wait_job(get(d), again)["conclusion"] == "neutral"


def test_the_configuration_comes_from_the_base_branch(world, make_daemon):
    """The fork label is taken from the base's .kernalin.yml; the PR's own copy changes nothing."""
    d = make_daemon()
    repo = world.repos[REPO]
    repo.commit({".kernalin.yml": BASE_CONFIG + "\ndaemon:\n  fork_label: ok-to-test\n"}, "label on main")
    fork = "octo-dev/kernels"
    head = repo.commit(
        {".kernalin.yml": BASE_CONFIG + "daemon: {fork_label: documentation}\n", "verdict.txt": "success\n"},
        "try to pick my own label",
        branch="pr-25",
    )
    ev = world.pull_request(REPO, 25, head, repo.main, action="labeled", fork=fork, label="documentation")
    assert wait_job(get(d), send(d, "pull_request", ev)[1]["jobs"][0])["outcome"] == "skipped"
    ev = world.pull_request(REPO, 25, head, repo.main, action="labeled", fork=fork, label="ok-to-test")
    job = wait_job(get(d), send(d, "pull_request", ev)[1]["jobs"][0])
    assert job["outcome"] == "report"
    # the job saw the base's configuration with the daemon section blanked, line numbers kept
    seen = (d.settings.jobs_dir / job["id"] / "kernalin.yml").read_text()
    assert seen.splitlines()[: len(BASE_CONFIG.splitlines())] == BASE_CONFIG.splitlines()
    assert "daemon" not in seen and "fork_label" not in seen
    assert len(seen.splitlines()) == len((BASE_CONFIG + "\ndaemon:\n  fork_label: ok-to-test\n").splitlines())


def test_no_configuration_on_the_base_means_nothing_to_do(world, make_daemon):
    d = make_daemon()
    repo = world.repos[REPO]
    repo.commit({".kernalin.yml": None}, "drop the config")
    head = repo.commit({"verdict.txt": "failure\n"}, "x", branch="pr-26")
    job = wait_job(get(d), send(d, "pull_request", world.pull_request(REPO, 26, head, repo.main))[1]["jobs"][0])
    assert job["outcome"] == "skipped" and runs_of(world, job["id"]) == []


def test_jobs_never_see_a_secret(world, make_daemon, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_daemonprocesstoken0000000000")
    d = make_daemon(runner={"command": fake_gate_command(), "env": {"HF_HOME": "/models"}})
    _, payload = pr_head(world, 27, {"verdict.txt": "success\n"})
    job = wait_job(get(d), send(d, "pull_request", payload)[1]["jobs"][0])
    env = json.loads((job_out(d, job["id"]) / "env.json").read_text())
    text = json.dumps(env)
    assert WEBHOOK_SECRET not in text and "PRIVATE KEY" not in text and "ghs_" not in text
    assert not any(k.startswith(("KERNALIN_GITHUB", "KERNALIN_WEBHOOK", "GITHUB_")) for k in env)
    assert env["HF_HOME"] == "/models" and env["CUDA_VISIBLE_DEVICES"] == "" and env["KERNALIN_DAEMON_JOB"] == job["id"]
    assert env["HOME"] == "/job/home" and env["TMPDIR"] == "/job/tmp"  # the sandbox's own capped tmpfs
    git_config = (d.settings.jobs_dir / job["id"]).glob("**/.git/config")
    assert all("extraHeader" not in p.read_text() for p in git_config)
    assert "***" in repr(d.settings.secrets) and world.private_key not in repr(d.settings)


# -- health, metrics, badges ------------------------------------------------------------------------

_SAMPLE = (
    r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*",?)*\})? '
    r"(-?[0-9.]+(e[+-]?[0-9]+)?|\+Inf|-Inf|NaN)"
)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format 0.0.4, strictly: HELP/TYPE lines before a family's samples, every sample valid."""
    import re

    assert text.endswith("\n")
    samples, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped") and name not in typed
            typed.add(name)
        elif line.startswith("# HELP ") or not line:
            continue
        else:
            assert re.fullmatch(_SAMPLE, line), line
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            assert any(name == t or name.startswith(t + "_") for t in typed), f"{name} before its TYPE"
            key, value = line.rsplit(" ", 1)
            if "{" in key:  # labels have no order: sorted, for the lookups below
                labels = re.findall(r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"', key[key.index("{") :])
                key = name + "{" + ",".join(sorted(labels)) + "}"
            samples[key] = float(value)
    return samples


def test_healthz_and_metrics(world, make_daemon):
    d = make_daemon()
    assert get_json(d.url + "/healthz") == (200, {"status": "ok", "queue_depth": 0, "slots": ["cpu0"]})
    _, payload = pr_head(world, 28, {"verdict.txt": "success\n"})
    wait_job(get(d), send(d, "pull_request", payload)[1]["jobs"][0])
    send(d, "pull_request", b"not json")
    status, text = get_json(d.url + "/metrics")
    m = parse_metrics(text)
    assert status == 200
    assert m["kernalin_ci_queue_depth"] == 0 and m['kernalin_ci_jobs{state="done"}'] == 1
    assert m['kernalin_ci_gpu_busy{slot="cpu0"}'] == 0
    assert m['kernalin_ci_job_duration_seconds_count{outcome="report"}'] == 1
    assert m['kernalin_ci_job_duration_seconds_bucket{le="+Inf",outcome="report"}'] == 1
    assert m['kernalin_ci_webhook_deliveries_total{event="pull_request",status="202"}'] == 1
    assert m['kernalin_ci_webhook_deliveries_total{event="pull_request",status="400"}'] == 1
    assert m["kernalin_ci_webhook_ack_seconds_count"] == 2
    assert m['kernalin_ci_posts_total{result="posted"}'] == 1
    assert 0 < m["kernalin_ci_process_resident_memory_bytes"] == pytest.approx(rss_bytes(), rel=0.5)
    assert (
        m["kernalin_ci_process_cpu_seconds_total"] > 0 and m["kernalin_ci_process_open_fds"] > 0
    )  # prometheus_client's


def test_badges_show_the_newest_result_into_the_default_branch(world, make_daemon):
    d = make_daemon()
    assert get_json(d.url + "/badge/acme/kernels.svg")[0] == 404  # no delivery from this repository yet
    _, payload = pr_head(world, 29, {"verdict.txt": "failure\n"})
    wait_job(get(d), send(d, "pull_request", payload)[1]["jobs"][0])
    _, payload = pr_head(world, 30, {"verdict.txt": "success\n"})
    job = wait_job(get(d), send(d, "pull_request", payload)[1]["jobs"][0])
    report = Report.from_json(json.loads((job_out(d, job["id"]) / "report.json").read_text()))
    assert get_json(d.url + "/badge/acme/kernels.svg") == (200, badge_svg(report))
    assert get_json(d.url + "/badge/acme/kernels.json") == (200, badge_endpoint(report))
    assert get_json(d.url + "/badge/acme/kernels.json")[1] == {
        "schemaVersion": 1,
        "label": "kernalin-ci",
        "message": "passed (1 kernel)",
        "color": "brightgreen",
    }
    assert get_json(d.url + "/badge/acme/kernels.json?branch=release")[0] == 404
    assert get_json(d.url + "/badge/acme/other.svg")[0] == 404


def test_private_repositories_have_no_public_badge_or_job_page(world, make_daemon):
    d = make_daemon()
    _, payload = pr_head(world, 31, {"verdict.txt": "success\n"})
    payload["repository"]["private"] = True
    payload["repository"]["visibility"] = "private"
    job_id = send(d, "pull_request", payload)[1]["jobs"][0]
    assert wait_for(lambda: d.store.job(job_id).post_state == "posted", 60)
    assert get_json(d.url + "/badge/acme/kernels.json")[0] == 404
    assert get_json(d.url + f"/jobs/{job_id}")[0] == 404
    # the fetch token: read-only, made for this job (public repositories are fetched without one)
    assert [t.permissions for t in world.standin.tokens_issued()].count({"contents": "read"}) == 1


# -- configuration ----------------------------------------------------------------------------------


def test_configuration_errors_name_the_key_and_exit_2(tmp_path):
    from conftest import cli

    cfg = tmp_path / "daemon.yml"
    for text, expected in [
        ("runner:\n  backend: podman\n", ":2: runner.backend: must be one of local, docker"),  # file:line: key
        ("gpus: many\n", "gpus: expected auto, cpu"),
        ("listen: 8080\n", "listen: expected HOST:PORT"),
        ("runner: {env: {GITHUB_TOKEN: x}}\n", "runner.env.GITHUB_TOKEN: secrets are never"),
        ("queue: {backend: sqlite, extra: 1}\n", "queue.extra: unknown key"),
        ("listen: [\n", "not valid YAML"),
    ]:
        cfg.write_text(text)
        r = cli("serve", "--config", str(cfg), env={"KERNALIN_WEBHOOK_SECRET": "s"})
        assert r.returncode == 2 and expected in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    cfg.write_text("state_dir: /tmp/x\n")
    r = cli("serve", "--config", str(cfg), env={"KERNALIN_WEBHOOK_SECRET": ""})
    assert r.returncode == 2 and "no webhook secret" in r.stderr


def test_secrets_come_from_files_or_the_environment(tmp_path):
    from kernalin_ci.daemon.settings import load

    (tmp_path / "secret").write_text("from-a-file\n")
    (tmp_path / "d.yml").write_text(f"webhook: {{secret_file: {tmp_path / 'secret'}}}\ngithub: {{app_id: 12}}\n")
    s = load(tmp_path / "d.yml", env={})
    assert s.secrets.webhook == b"from-a-file" and s.github.app_id == 12
    s = load(tmp_path / "d.yml", env={"KERNALIN_WEBHOOK_SECRET": "from-env", "KERNALIN_GITHUB_APP_ID": "77"})
    assert s.secrets.webhook == b"from-env" and s.github.app_id == 77
    assert "from-env" not in repr(s) and "from-env" not in repr(s.secrets)


def test_a_second_daemon_on_the_same_state_directory_is_refused(world, make_daemon):
    from kernalin_ci.errors import UsageError

    d = make_daemon()
    with pytest.raises(UsageError, match="another kernalin-ci daemon"):
        Daemon(d.settings)
    assert os.path.exists(d.settings.db_path)


# -- GPU slots --------------------------------------------------------------------------------------


def test_gpu_slots_from_what_nvidia_smi_lists(monkeypatch):
    from kernalin_ci.daemon.gpus import Slot, slots
    from kernalin_ci.errors import UsageError

    found = [(0, "GPU-aaaa"), (1, "GPU-bbbb")]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert slots("auto", found=found) == [Slot("gpu0", "cuda", "GPU-aaaa"), Slot("gpu1", "cuda", "GPU-bbbb")]
    assert slots(1, found=found) == [Slot("gpu0", "cuda", "GPU-aaaa")]
    assert slots(["GPU-bbbb"], found=found) == [Slot("gpu1", "cuda", "GPU-bbbb")]
    assert slots("auto", 3, found=[]) == [Slot(f"cpu{i}", "cpu", "") for i in range(3)]
    with pytest.raises(UsageError, match="3 GPUs asked for, 2 found"):
        slots(3, found=found)
    with pytest.raises(UsageError, match="no GPU 7"):
        slots([7], found=found)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # what this process may use, it keeps to
    assert slots("auto", found=found) == [Slot("gpu1", "cuda", "GPU-bbbb")]


def test_one_job_per_gpu_each_with_its_own_visible_device(world, make_daemon, tmp_path):
    """Two GPU slots (the scheduling is real; the command does not touch a GPU): jobs run two at a time,
    never two on one slot, each seeing only its GPU."""
    from kernalin_ci.daemon.gpus import Slot

    slots = [Slot("gpu0", "cuda", "GPU-aaaa"), Slot("gpu1", "cuda", "GPU-bbbb")]
    cfg = world.daemon_config(tmp_path / "gpu-state", runner={"command": fake_gate_command()})
    d = Daemon(settings_for(world, cfg), slots=slots).start()
    try:
        repo = world.repos[REPO]
        ids = []
        for n in range(40, 46):
            head = repo.commit({"sleep.txt": "1.5"}, f"pr {n}", branch=f"pr-{n}")
            ids.append(send(d, "pull_request", world.pull_request(REPO, n, head, repo.main))[1]["jobs"][0])
        jobs = [wait_job(get(d), i, timeout=120) for i in ids]
        assert {j["slot"] for j in jobs} == {"gpu0", "gpu1"}
        for j in jobs:
            env = json.loads((job_out(d, j["id"]) / "env.json").read_text())
            assert env["CUDA_VISIBLE_DEVICES"] == {"gpu0": "GPU-aaaa", "gpu1": "GPU-bbbb"}[j["slot"]]
            assert json.loads((job_out(d, j["id"]) / "report.json").read_text())["device"] == "cuda"
        for slot in ("gpu0", "gpu1"):
            spans = sorted((j["started_at"], j["finished_at"]) for j in jobs if j["slot"] == slot)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans  # one at a time per GPU
        spans = sorted((j["started_at"], j["finished_at"]) for j in jobs)
        assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # and both GPUs busy at once
    finally:
        d.stop()


def test_deployment_files_agree_with_the_daemon():
    import yaml

    from kernalin_ci.daemon.settings import ENV_APP_KEY_PATH, ENV_WEBHOOK_SECRET_FILE, load

    root = Path(__file__).resolve().parent.parent / "runners"
    for cfg in (root / "daemon.yml", root / "compose" / "daemon.yml"):
        s = load(cfg, env={})
        assert s.github.app_id == 123456 and s.secrets.webhook == b""  # no secret in an example
    full = load(root / "daemon.yml", env={})
    assert full.runner.backend == "docker" and full.queue.backend == "sqlite" and full.fork_label == "safe-to-test"
    compose = yaml.safe_load((root / "compose" / "compose.yaml").read_text())
    env = compose["services"]["daemon"]["environment"]
    assert set(env) == {ENV_WEBHOOK_SECRET_FILE, ENV_APP_KEY_PATH}
    assert compose["services"]["daemon"]["command"][0] == "serve"
    # Compose: jobs in their own containers (the daemon container holds /run/secrets), started through the
    # host's socket; their mounts name host paths, so the state folder has the same path on both sides
    small = load(root / "compose" / "daemon.yml", env={})
    assert small.runner.backend == "docker"
    for name in ("daemon", "worker"):
        volumes = compose["services"][name]["volumes"]
        assert f"{small.state_dir}:{small.state_dir}" in volumes
        assert "/var/run/docker.sock:/var/run/docker.sock" in volumes
    for f in (root / "k8s").glob("*.yaml"):
        assert list(yaml.safe_load_all(f.read_text()))
    values = yaml.safe_load((root / "k8s" / "values-gpu-runners.yaml").read_text())
    (runner,) = values["template"]["spec"]["containers"]
    assert runner["resources"]["limits"]["nvidia.com/gpu"] == 1 and runner["command"] == ["/home/runner/run.sh"]
    unit = (root / "systemd" / "kernalin-ci.service").read_text()
    assert f"Environment={ENV_WEBHOOK_SECRET_FILE}=%d/webhook-secret" in unit
    assert f"Environment={ENV_APP_KEY_PATH}=%d/app-key" in unit and "kernalin-ci serve --config" in unit
