"""kernalin_ci.github publishing, through PyGithub, against the local GitHub stand-in.

Every request is validated by the stand-in against GitHub's OpenAPI description; the
fixture fails a test at teardown if one was not valid.
"""

import logging

import pytest

from kernalin_ci.github import (
    Annotation,
    GitHubAuthError,
    GitHubError,
    GitHubUnavailable,
    Publication,
    RetryPolicy,
    begin,
    publish,
    sticky_marker,
)
from kernalin_ci.github.auth import enterprise_api_url, token_client
from kernalin_ci.testing.pytest_fixtures import github_standin, make_github_standin  # noqa: F401
from kernalin_ci.testing.standin_state import NOT_ACCESSIBLE, READ_ONLY_PERMISSIONS, WRITE_PERMISSIONS

REPO = "acme/kernels"
PR = 7
BASE = "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"
HEAD = "8d3f0c1e2b4a5968778695a4b3c2d1e0f9a8b7c6"
HEAD2 = "9e4a1d2f3c5b6a7988796a5b4c3d2e1f0a9b8c7d"
TOKEN = "ghs_actionsTokenForTests0123456789abcdef"
FAST = RetryPolicy(attempts=4, base_delay_s=0.01, max_delay_s=0.05, budget_s=10)
CREATE = "/repos/{owner}/{repo}/check-runs"
UPDATE = "/repos/{owner}/{repo}/check-runs/{check_run_id}"
COMMENTS = "/repos/{owner}/{repo}/issues/{issue_number}/comments"
STATUSES = "/repos/{owner}/{repo}/statuses/{sha}"


def world(gh, token=TOKEN, permissions=None):
    gh.add_repo(REPO)
    gh.add_pull_request(REPO, PR, head_sha=HEAD, base_sha=BASE)
    gh.add_commit(REPO, HEAD2)
    gh.add_token(token, permissions=permissions)
    return gh


def client(gh, token=TOKEN, retry=FAST):
    return token_client(token, base_url=gh.base_url, retry=retry, min_write_interval_s=0, min_request_interval_s=0)


def pub(**kw):
    d = dict(
        repo=REPO,
        head_sha=HEAD,
        pr_number=PR,
        conclusion="failure",
        title="2 kernels checked, 1 failed",
        summary="### decode_attention: **fail**\n\n| check | result |\n|---|---|\n| kv-mask | fail |",
        text="details",
        comment_markdown="## kernalin-ci\n\ndecode_attention failed: kv-mask",
        details_url="https://ci.example/runs/5",
    )
    d.update(kw)
    return Publication(**d)


def annotations(n):
    return [
        Annotation(
            path=f"kernels/attn_{i % 3}.py",
            start_line=10 + i,
            end_line=10 + i,
            message=f"finding {i}: positions >= kv_len take part in the softmax",
            title=f"kv-mask #{i}",
        )
        for i in range(n)
    ]


def test_check_run_lifecycle_in_progress_then_completed(github_standin):
    gh = world(github_standin)
    c = client(gh)
    started = begin(c, REPO, HEAD, details_url="https://ci.example/runs/5")
    assert started.warnings == [] and started.check_run_id is not None
    (run,) = gh.check_runs(REPO)
    assert (run["id"], run["status"], run["head_sha"], run["name"]) == (
        started.check_run_id,
        "in_progress",
        HEAD,
        "kernalin-ci",
    )
    assert run["conclusion"] is None and run["started_at"] and run["output"]["title"]

    result = publish(c, pub(), check_run_id=started.check_run_id)
    (run,) = gh.check_runs(REPO)
    assert run["status"] == "completed" and run["conclusion"] == "failure" and run["completed_at"]
    assert run["output"] == {"title": "2 kernels checked, 1 failed", "summary": pub().summary, "text": "details"}
    assert result.check_run.id == run["id"] and result.check_run.html_url.endswith(f"/runs/{run['id']}")
    assert result.commit_status is None and result.on_pull_request and result.warnings == []
    (create,) = gh.requests_to("POST", CREATE)
    assert create.body["status"] == "in_progress" and create.body["head_sha"] == HEAD
    final = gh.requests_to("PATCH", UPDATE)[-1]
    assert final.body["conclusion"] == "failure" and final.body["status"] == "completed"
    assert gh.statuses(REPO) == []  # no fallback needed


def test_publish_without_begin_creates_and_completes_one_run(github_standin):
    gh = world(github_standin)
    publish(client(gh), pub(conclusion="success", annotations=[]))
    (run,) = gh.check_runs(REPO)
    assert run["conclusion"] == "success" and run["annotations"] == []


def test_120_annotations_go_in_three_requests_of_at_most_50(github_standin):
    gh = world(github_standin)
    c = client(gh)
    started = begin(c, REPO, HEAD)
    findings = annotations(120)
    result = publish(c, pub(annotations=findings), check_run_id=started.check_run_id)
    patches = gh.requests_to("PATCH", UPDATE)
    assert [len(r.body["output"].get("annotations", [])) for r in patches] == [50, 50, 20]
    assert ["conclusion" in r.body for r in patches] == [False, False, True]  # completed with the last batch
    (run,) = gh.check_runs(REPO)
    assert run["annotations"] == [a.to_api() for a in findings]
    assert run["annotations"][0] == {
        "path": "kernels/attn_0.py",
        "start_line": 10,
        "end_line": 10,
        "annotation_level": "failure",
        "title": "kv-mask #0",
        "message": "finding 0: positions >= kv_len take part in the softmax",
    }
    assert result.annotations_posted == 120 and result.annotations_omitted == 0
    # GitHub's own view of them, read back through PyGithub (paginated)
    listed = list(c.gh.get_repo(REPO).get_check_run(run["id"]).get_annotations())
    assert len(listed) == 120 and listed[119].start_line == 129


def test_sticky_comment_is_edited_in_place_on_the_next_push(github_standin):
    gh = world(github_standin)
    for i in range(130):  # a busy conversation: the sticky comment ends up on the second page
        gh.add_comment(REPO, PR, f"comment {i} by a reviewer")
    c = client(gh)
    first = publish(c, pub(comment_markdown="first push: 1 failure"))
    for i in range(5):
        gh.add_comment(REPO, PR, f"later comment {i}")
    second = publish(c, pub(head_sha=HEAD2, comment_markdown="second push: all pass", conclusion="success"))

    marker = sticky_marker("kernalin-ci")
    mine = [x for x in gh.comments(REPO, PR) if marker in x["body"]]
    assert len(mine) == 1
    assert mine[0]["body"] == f"{marker}\nsecond push: all pass" and mine[0]["edits"] == 1
    assert first.comment.id == second.comment.id == mine[0]["id"]
    assert len(gh.requests_to("POST", COMMENTS)) == 1  # created once, edited once
    assert len(gh.comments(REPO, PR)) == 136
    # the list was read across pages, following Link headers
    assert any(r.query.get("page") == ["2"] for r in gh.requests_to("GET", COMMENTS))


def test_unchanged_comment_is_not_rewritten(github_standin):
    gh = world(github_standin)
    c = client(gh)
    publish(c, pub())
    publish(c, pub())
    (mine,) = gh.comments(REPO, PR)
    assert mine["edits"] == 0 and gh.requests_to("PATCH", "/repos/{owner}/{repo}/issues/comments/{comment_id}") == []


def test_duplicate_sticky_comments_from_an_old_race_converge_to_one(github_standin):
    gh = world(github_standin)
    marker = sticky_marker("kernalin-ci")
    first = gh.add_comment(REPO, PR, f"{marker}\nold", login="github-actions[bot]")
    gh.add_comment(REPO, PR, "a human")
    gh.add_comment(REPO, PR, f"{marker}\nold too", login="github-actions[bot]")
    publish(client(gh), pub(comment_markdown="new"))
    bodies = [x["body"] for x in gh.comments(REPO, PR)]
    assert bodies == [f"{marker}\nnew", "a human"]
    assert gh.comments(REPO, PR)[0]["id"] == first


def test_comment_marker_is_per_check_name(github_standin):
    gh = world(github_standin)
    c = client(gh)
    publish(c, pub(name="kernalin-ci / attention", comment_markdown="A"))
    publish(c, pub(name="kernalin-ci / rope", comment_markdown="B"))
    assert sorted(x["body"].split("\n", 1)[1] for x in gh.comments(REPO, PR)) == ["A", "B"]


@pytest.mark.parametrize("conclusion,state", [("failure", "failure"), ("success", "success"), ("neutral", "success")])
def test_checks_forbidden_falls_back_to_a_commit_status(github_standin, conclusion, state):
    # a token that may write statuses and comments but not check runs
    gh = world(github_standin, permissions={**WRITE_PERMISSIONS, "checks": "read"})
    result = publish(client(gh), pub(conclusion=conclusion, title="x" * 200))
    assert gh.check_runs(REPO) == []
    (st,) = gh.statuses(REPO, HEAD)
    assert (st["state"], st["context"], st["target_url"]) == (state, "kernalin-ci", "https://ci.example/runs/5")
    assert len(st["description"]) <= 140 and st["description"].startswith("xxx")
    assert result.commit_status == state and result.check_run is None and result.on_pull_request
    assert any(NOT_ACCESSIBLE in w for w in result.warnings)
    assert result.comment is not None  # the comment is still posted


def test_injected_403_and_404_on_check_run_creation_fall_back(github_standin):
    gh = world(github_standin)
    gh.inject("POST", CREATE, 403, message=NOT_ACCESSIBLE, times=1)
    gh.inject("POST", CREATE, 404, message="Not Found", times=1)
    c = client(gh)
    for head in (HEAD, HEAD2):
        assert publish(c, pub(head_sha=head)).commit_status == "failure"
    assert [s["sha"] for s in gh.statuses(REPO)] == [HEAD, HEAD2]
    assert len(gh.requests_to("POST", CREATE)) == 2  # 403/404 are not retried


def test_begin_falls_back_to_a_pending_status(github_standin):
    gh = world(github_standin, permissions={**WRITE_PERMISSIONS, "checks": "read"})
    started = begin(client(gh), REPO, HEAD)
    assert started.check_run_id is None and started.commit_status == "pending"
    assert [s["state"] for s in gh.statuses(REPO, HEAD)] == ["pending"]


def test_fork_pull_request_token_posts_nothing_and_warns(github_standin, caplog):
    gh = world(github_standin, permissions=READ_ONLY_PERMISSIONS)
    caplog.set_level(logging.WARNING, "kernalin_ci.github")
    result = publish(client(gh), pub())
    assert gh.check_runs(REPO) == [] and gh.statuses(REPO) == [] and gh.comments(REPO, PR) == []
    assert not result.on_pull_request and result.comment is None
    assert len(result.warnings) == 3 and "job log" in result.warnings[2]
    assert len(caplog.records) == 3


def test_502s_are_retried_and_succeed(github_standin):
    gh = world(github_standin)
    fault = gh.inject("POST", CREATE, 502, times=2)
    gh.inject("GET", COMMENTS, 503, times=1)
    result = publish(client(gh), pub())
    assert fault.hits == 2 and len(gh.requests_to("POST", CREATE)) == 3
    assert len(gh.check_runs(REPO)) == 1 and result.check_run is not None and result.comment is not None


def test_dropped_connections_are_retried(github_standin):
    gh = world(github_standin)
    gh.inject("PATCH", UPDATE, drop=True, times=1)
    result = publish(client(gh), pub(annotations=annotations(3)))
    (run,) = gh.check_runs(REPO)
    assert run["conclusion"] == "failure" and result.check_run is not None


def test_a_lost_answer_is_never_a_second_check_run_or_comment(github_standin):
    gh = world(github_standin)
    gh.inject("POST", CREATE, 502, after=True)  # GitHub creates the run, the answer is lost
    gh.inject("POST", COMMENTS, 504, after=True)
    publish(client(gh), pub())
    assert len(gh.check_runs(REPO)) == 1 and gh.check_runs(REPO)[0]["status"] == "completed"
    assert len(gh.comments(REPO, PR)) == 1


def test_persistent_500_raises_after_bounded_retries_and_does_the_rest(github_standin):
    gh = world(github_standin)
    gh.inject("PATCH", UPDATE, 500, times=None)
    with pytest.raises(GitHubUnavailable) as info:
        publish(client(gh), pub())
    assert len(gh.requests_to("PATCH", UPDATE)) == FAST.attempts
    assert info.value.attempts == FAST.attempts and "500" in str(info.value)
    result = info.value.result
    assert result.commit_status == "failure" and result.comment is not None  # the other steps still ran
    assert [s["state"] for s in gh.statuses(REPO, HEAD)] == ["failure"]


def test_retry_budget_bounds_total_time(github_standin):
    gh = world(github_standin)
    gh.inject("POST", STATUSES, 502, times=None)
    slow = RetryPolicy(attempts=50, base_delay_s=0.05, max_delay_s=0.1, budget_s=0.3)
    with pytest.raises(GitHubUnavailable, match="gave up after"):
        client(gh, retry=slow).set_commit_status(REPO, HEAD, "success", "ok")
    assert 2 <= len(gh.requests_to("POST", STATUSES)) < 50


def test_secondary_rate_limit_waits_as_asked(github_standin, caplog):
    gh = world(github_standin)
    gh.inject(
        "POST",
        CREATE,
        403,
        message="You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
        headers={"Retry-After": "1"},
    )
    caplog.set_level(logging.WARNING, "kernalin_ci.github")
    publish(client(gh), pub())
    assert len(gh.check_runs(REPO)) == 1 and gh.statuses(REPO) == []  # retried, not a permission fallback
    assert any("in 1.00s (as the server asked)" in r.getMessage() for r in caplog.records)


def test_primary_rate_limit_past_the_budget_gives_up_at_once(github_standin):
    gh = world(github_standin)
    import time

    gh.inject(
        "POST",
        STATUSES,
        403,
        message="API rate limit exceeded for installation ID 1.",
        times=None,
        headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(time.time()) + 3600)},
    )
    with pytest.raises(GitHubUnavailable, match="gave up after 1 tries"):
        client(gh).set_commit_status(REPO, HEAD, "success", "ok")


def test_other_4xx_are_not_retried(github_standin):
    gh = world(github_standin)
    with pytest.raises(GitHubError) as info:  # a sha GitHub does not know: 422
        client(gh).set_commit_status(REPO, "f" * 40, "success", "ok")
    assert info.value.status == 422 and not isinstance(info.value, GitHubUnavailable)
    assert len(gh.requests_to("POST", STATUSES)) == 1


def test_bad_credentials_raise_auth_error_without_the_token(github_standin):
    gh = world(github_standin)
    bad = "ghs_revokedTokenValue0123456789ABCDEFGH"
    with pytest.raises(GitHubAuthError) as info:
        publish(client(gh, token=bad), pub())
    assert info.value.status == 401 and bad not in str(info.value)


def test_secrets_echoed_by_the_server_are_redacted(github_standin):
    gh = world(github_standin)
    gh.inject("POST", STATUSES, 500, message=f"upstream said: token {TOKEN} is odd", times=None)
    with pytest.raises(GitHubUnavailable) as info:
        client(gh).set_commit_status(REPO, HEAD, "success", "ok")
    assert TOKEN not in str(info.value) and "***" in str(info.value)


def test_daemon_reuses_its_check_run_by_external_id(github_standin):
    gh = world(github_standin)
    c = client(gh)
    a = begin(c, REPO, HEAD, external_id="job-17")
    b = begin(c, REPO, HEAD, external_id="job-17")  # the job restarted
    assert a.check_run_id == b.check_run_id
    publish(c, pub(external_id="job-17"))  # no id passed: found by external id
    other = begin(c, REPO, HEAD, external_id="job-18")
    runs = gh.check_runs(REPO)
    assert [(r["external_id"], r["status"]) for r in runs] == [("job-17", "completed"), ("job-18", "in_progress")]
    assert other.check_run_id == runs[1]["id"]
    assert c.find_check_run(REPO, HEAD, external_id="job-17") == a.check_run_id
    assert c.find_check_run(REPO, HEAD, external_id="job-99") is None
    publish(c, pub(external_id="job-17", conclusion="success"))  # a redelivery updates the completed run
    assert len(gh.check_runs(REPO)) == 2 and gh.check_runs(REPO)[0]["conclusion"] == "success"


def test_long_summary_and_comment_are_cut_to_githubs_limits(github_standin):
    gh = world(github_standin)
    summary = "intro\n```\n" + "\n".join(f"line {i} " + "x" * 60 for i in range(1200))  # an open code block
    publish(client(gh), pub(summary=summary, text=summary, comment_markdown=summary))
    (run,) = gh.check_runs(REPO)
    for value in (run["output"]["summary"], run["output"]["text"]):
        assert len(value) <= 65535 and "characters omitted" in value
        assert value.count("```") % 2 == 0
    (comment,) = gh.comments(REPO, PR)
    assert len(comment["body"]) <= 65536 and comment["body"].startswith(sticky_marker())


def test_more_than_1000_annotations_are_capped_and_counted(github_standin):
    gh = world(github_standin)
    result = publish(client(gh), pub(annotations=annotations(1003)))
    (run,) = gh.check_runs(REPO)
    assert len(run["annotations"]) == 1000 and result.annotations_omitted == 3
    assert "3 more findings" in run["output"]["summary"]
    assert max(len(r.body["output"].get("annotations", [])) for r in gh.requests_to("PATCH", UPDATE)) == 50


def test_enterprise_base_url(make_github_standin):
    gh = world(make_github_standin(prefix="/api/v3"))
    assert gh.base_url.endswith("/api/v3")
    c = client(gh)
    started = begin(c, REPO, HEAD)
    result = publish(c, pub(annotations=annotations(60)), check_run_id=started.check_run_id)
    (run,) = gh.check_runs(REPO)
    assert run["conclusion"] == "failure" and len(run["annotations"]) == 60 and result.comment is not None
    assert all(r.template for r in gh.requests)  # every request was under /api/v3 and matched the API
    assert enterprise_api_url("ghe.example.com") == "https://ghe.example.com/api/v3"
