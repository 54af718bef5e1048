"""The GitHub stand-in itself: it must refuse what GitHub refuses, and say so.

These tests drive it with plain HTTP (requests) and with PyGithub. Those that send
invalid requests on purpose use a GitHubStandIn of their own (not the fixture, which
fails a test that sent one).
"""

import json

import jwt
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from github import Auth, Github

from kernalin_ci.testing.github_standin import GitHubStandIn
from kernalin_ci.testing.openapi import OpenAPI
from kernalin_ci.testing.pytest_fixtures import github_standin, make_github_standin  # noqa: F401
from kernalin_ci.testing.standin_state import NOT_ACCESSIBLE, READ_ONLY_PERMISSIONS

REPO = "acme/kernels"
HEAD = "8d3f0c1e2b4a5968778695a4b3c2d1e0f9a8b7c6"
BASE = "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"
HDRS = {"Authorization": "token t0ken", "User-Agent": "test", "Accept": "application/vnd.github+json"}


@pytest.fixture
def bare():
    with GitHubStandIn() as gh:
        gh.add_repo(REPO)
        gh.add_pull_request(REPO, 7, head_sha=HEAD, base_sha=BASE)
        gh.add_token("t0ken")
        yield gh


def test_the_description_is_githubs():
    api = OpenAPI.load()
    assert api.spec["openapi"].startswith("3.0") and len(api.spec["paths"]) > 800
    match, _ = api.find("PATCH", "/repos/a/b/check-runs/12")
    assert match.operation.operation_id == "checks/update" and match.path_params == {
        "owner": "a",
        "repo": "b",
        "check_run_id": "12",
    }
    # literal segments win: /issues/comments/{id}, not /issues/{issue_number}/...
    match, _ = api.find("GET", "/repos/a/b/issues/comments/5")
    assert match.operation.template == "/repos/{owner}/{repo}/issues/comments/{comment_id}"


def test_invalid_body_is_answered_422_and_recorded(bare):
    r = requests.post(
        f"{bare.base_url}/repos/{REPO}/check-runs", headers=HDRS, json={"name": "x", "status": "in_progress"}
    )  # head_sha missing
    assert r.status_code == 422 and "head_sha" in r.json()["message"]
    assert len(bare.problems) == 1 and "'head_sha' is a required property" in bare.problems[0]
    assert bare.check_runs(REPO) == []
    with pytest.raises(AssertionError, match="head_sha"):
        bare.assert_no_problems()


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"name": "x", "head_sha": HEAD, "output": {"title": "t"}}, "'summary' is a required property"),
        ({"name": "x", "head_sha": HEAD, "conclusion": "passed"}, "'passed' is not one of"),
        ({"name": "x", "head_sha": HEAD, "started_at": "yesterday"}, "is not a 'date-time'"),
        (
            {
                "name": "x",
                "head_sha": HEAD,
                "output": {
                    "title": "t",
                    "summary": "s",
                    "annotations": [
                        {"path": "a.py", "start_line": 1, "end_line": 1, "annotation_level": "failure", "message": "m"}
                    ]
                    * 51,
                },
            },
            "breaks 'maxItems': 50",
        ),
    ],
)
def test_body_schema_rules_are_enforced(bare, body, needle):
    r = requests.post(f"{bare.base_url}/repos/{REPO}/check-runs", headers=HDRS, json=body)
    assert r.status_code == 422 and any(needle in p for p in bare.problems), bare.problems


def test_unknown_paths_methods_and_query_parameters_are_problems(bare):
    assert requests.get(f"{bare.base_url}/repos/{REPO}/check-runz", headers=HDRS).status_code == 404
    assert requests.put(f"{bare.base_url}/repos/{REPO}/check-runs", headers=HDRS, json={}).status_code == 404
    assert requests.get(f"{bare.base_url}/repos/{REPO}/issues/7/comments?perpage=5", headers=HDRS).status_code == 422
    assert requests.get(f"{bare.base_url}/repos/{REPO}/check-runs/abc", headers=HDRS).status_code == 422
    text = "\n".join(bare.problems)
    assert "no such path" in text and "no such method" in text and "'perpage' is not in the description" in text
    assert "'abc' is not a valid integer" in text


def test_valid_but_unimplemented_endpoint_is_a_problem_until_routed(bare):
    assert requests.get(f"{bare.base_url}/repos/{REPO}/pulls/7/commits", headers=HDRS).status_code == 501
    assert "does not implement" in bare.problems[0]
    bare.problems.clear()
    bare.route("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/commits", lambda ctx: (404, {"message": "Not Found"}))
    assert requests.get(f"{bare.base_url}/repos/{REPO}/pulls/7/commits", headers=HDRS).status_code == 404
    assert bare.problems == []


def test_responses_off_the_description_are_problems(bare):
    bare.route("GET", "/repos/{owner}/{repo}/check-runs/{check_run_id}", lambda ctx: (200, {"id": "seven"}))
    requests.get(f"{bare.base_url}/repos/{REPO}/check-runs/7", headers=HDRS)
    assert any("stand-in answered off the description" in p for p in bare.problems)


def test_enterprise_prefix_is_enforced():
    with GitHubStandIn(prefix="/api/v3") as gh:
        gh.add_repo(REPO)
        gh.add_token("t0ken")
        r = requests.get(f"{gh.web_url}/repos/{REPO}/commits/{HEAD}/check-runs", headers=HDRS)
        assert r.status_code == 404 and "outside the API prefix" in gh.problems[0]


def test_permissions_and_credentials_are_checked(bare):
    bare.add_token("readonly", permissions=READ_ONLY_PERMISSIONS)
    url = f"{bare.base_url}/repos/{REPO}/statuses/{HEAD}"
    r = requests.post(url, headers={**HDRS, "Authorization": "token readonly"}, json={"state": "success"})
    assert r.status_code == 403 and r.json()["message"] == NOT_ACCESSIBLE
    r = requests.post(url, headers={**HDRS, "Authorization": "token nope"}, json={"state": "success"})
    assert r.status_code == 401 and r.json()["message"] == "Bad credentials"
    r = requests.post(f"{bare.base_url}/repos/acme/other/statuses/{HEAD}", headers=HDRS, json={"state": "success"})
    assert r.status_code == 404
    assert bare.statuses(REPO) == [] and bare.problems == []  # refusals are GitHub's answers, not problems


def test_pagination_follows_githubs_link_headers(github_standin):
    gh = github_standin
    gh.add_repo(REPO)
    gh.add_pull_request(REPO, 7, head_sha=HEAD, base_sha=BASE)
    gh.add_token("t0ken")
    for i in range(250):
        gh.add_comment(REPO, 7, f"c{i}")
    r = requests.get(f"{gh.base_url}/repos/{REPO}/issues/7/comments?per_page=100", headers=HDRS)
    assert len(r.json()) == 100 and 'rel="next"' in r.headers["Link"] and "page=3" in r.headers["Link"]
    g = Github(
        auth=Auth.Token("t0ken"),
        base_url=gh.base_url,
        per_page=100,
        retry=None,
        lazy=True,
        seconds_between_requests=None,
        seconds_between_writes=None,
    )
    bodies = [c.body for c in g.get_repo(REPO).get_issue(7).get_comments()]
    assert bodies == [f"c{i}" for i in range(250)]
    assert len(gh.requests_to("GET", "/repos/{owner}/{repo}/issues/{issue_number}/comments")) == 1 + 3


def test_faults_count_down_and_match_templates_or_globs(bare):
    f1 = bare.inject("POST", "/repos/{owner}/{repo}/statuses/{sha}", 502, times=2)
    f2 = bare.inject("*", f"/repos/{REPO}/issues/*", 503, times=1)
    url = f"{bare.base_url}/repos/{REPO}/statuses/{HEAD}"
    codes = [requests.post(url, headers=HDRS, json={"state": "success"}).status_code for _ in range(3)]
    assert codes == [502, 502, 201] and f1.hits == 2
    r = requests.get(f"{bare.base_url}/repos/{REPO}/issues/7/comments", headers=HDRS)
    assert r.status_code == 503 and r.headers["Content-Type"].startswith("text/html") and f2.hits == 1
    assert len(bare.statuses(REPO)) == 1


def test_a_completed_check_run_cannot_be_reopened(bare):
    r = requests.post(
        f"{bare.base_url}/repos/{REPO}/check-runs",
        headers=HDRS,
        json={"name": "x", "head_sha": HEAD, "conclusion": "success"},
    )
    assert r.status_code == 201 and r.json()["status"] == "completed"
    r = requests.patch(r.json()["url"], headers=HDRS, json={"status": "in_progress"})
    assert r.status_code == 422


def _keypair():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


def test_jwts_are_verified_with_the_apps_public_key(bare):
    private, public = _keypair()
    other, _ = _keypair()
    bare.add_app(4242, public)
    bare.add_installation(77, 4242, [REPO])
    url = f"{bare.base_url}/app/installations/77/access_tokens"
    import time

    now = int(time.time())
    good = jwt.encode({"iat": now - 60, "exp": now + 300, "iss": "4242"}, private, algorithm="RS256")
    forged = jwt.encode({"iat": now - 60, "exp": now + 300, "iss": "4242"}, other, algorithm="RS256")
    expired = jwt.encode({"iat": now - 900, "exp": now - 300, "iss": "4242"}, private, algorithm="RS256")
    too_long = jwt.encode({"iat": now, "exp": now + 3600, "iss": "4242"}, private, algorithm="RS256")
    answers = {
        name: requests.post(url, headers={**HDRS, "Authorization": f"Bearer {t}"}, json={})
        for name, t in [("good", good), ("forged", forged), ("expired", expired), ("too_long", too_long)]
    }
    assert answers["good"].status_code == 201 and answers["good"].json()["token"].startswith("ghs_")
    assert [answers[k].status_code for k in ("forged", "expired", "too_long")] == [401, 401, 401]
    # the token it issued works on the repository, within the installation's permissions
    token = answers["good"].json()["token"]
    r = requests.post(
        f"{bare.base_url}/repos/{REPO}/statuses/{HEAD}",
        headers={**HDRS, "Authorization": f"token {token}"},
        json={"state": "pending"},
    )
    assert r.status_code == 201 and r.json()["creator"]["login"] == "kernalin-ci[bot]"
    assert json.loads(json.dumps(bare.tokens_issued()[0].permissions))["checks"] == "write"


def test_the_fixture_fails_a_test_that_sent_an_invalid_request(tmp_path):
    import subprocess
    import sys

    (tmp_path / "test_sends_invalid.py").write_text(
        "import requests\n"
        "from kernalin_ci.testing.pytest_fixtures import github_standin  # noqa: F401\n"
        "def test_it(github_standin):\n"
        "    github_standin.add_repo('a/b')\n"
        "    requests.post(github_standin.base_url + '/repos/a/b/check-runs', json={'name': 1},\n"
        "                  headers={'User-Agent': 't'})\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the GitHub stand-in saw problems" in r.stdout and "1 passed, 1 error" in r.stdout
