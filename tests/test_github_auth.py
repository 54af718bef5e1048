"""Credentials: GitHub App (JWT -> installation token), GITHUB_TOKEN, the environment, redaction."""

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kernalin_ci.errors import UsageError
from kernalin_ci.github import GitHubAuthError, GitHubPermissionError, Publication, RetryPolicy, publish
from kernalin_ci.github.auth import app_client, client_from_env, read_private_key
from kernalin_ci.github.errors import redact
from kernalin_ci.testing.pytest_fixtures import github_standin, make_github_standin  # noqa: F401

REPO = "acme/kernels"
HEAD = "8d3f0c1e2b4a5968778695a4b3c2d1e0f9a8b7c6"
BASE = "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"
APP_ID = 318_422
INSTALLATION = 55_501
FAST = dict(
    retry=RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.02, budget_s=5),
    min_write_interval_s=0,
    min_request_interval_s=0,
)
TOKENS = "/app/installations/{installation_id}/access_tokens"


def keypair():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@pytest.fixture(scope="module")
def keys():
    return keypair()


def world(gh, public, installed=(REPO,)):
    gh.add_repo(REPO)
    gh.add_pull_request(REPO, 3, head_sha=HEAD, base_sha=BASE)
    gh.add_app(APP_ID, public, slug="kernalin-ci")
    gh.add_installation(INSTALLATION, APP_ID, list(installed))
    return gh


def pub():
    return Publication(
        repo=REPO,
        head_sha=HEAD,
        pr_number=3,
        conclusion="success",
        title="ok",
        summary="all good",
        comment_markdown="all good",
    )


def test_app_exchanges_a_signed_jwt_for_an_installation_token(github_standin, keys):
    private, public = keys
    gh = world(github_standin, public)
    client = app_client(REPO, app_id=APP_ID, private_key=private, base_url=gh.base_url, **FAST)
    result = publish(client, pub())

    (lookup,) = gh.requests_to("GET", "/repos/{owner}/{repo}/installation")
    (exchange,) = gh.requests_to("POST", TOKENS)
    assert exchange.path == f"/app/installations/{INSTALLATION}/access_tokens"
    for r in (lookup, exchange):
        scheme, token = r.headers["authorization"].split(" ", 1)
        claims = jwt.decode(token, public, algorithms=["RS256"])  # signed with the App's key
        assert scheme == "Bearer" and claims["iss"] == str(APP_ID) and claims["exp"] - claims["iat"] <= 600
    (issued,) = gh.tokens_issued()
    writes = [r for r in gh.requests if r.method in ("POST", "PATCH") and r.path.startswith("/repos/")]
    assert writes and all(r.headers["authorization"] == f"token {issued.token}" for r in writes)
    (run,) = gh.check_runs(REPO)
    assert run["app_id"] == APP_ID and run["conclusion"] == "success"
    assert gh.comments(REPO, 3)[0]["login"] == "kernalin-ci[bot]" and result.comment is not None


def test_known_installation_id_skips_the_lookup(github_standin, keys):
    private, public = keys
    gh = world(github_standin, public)
    publish(
        app_client(
            REPO, app_id=str(APP_ID), private_key=private, installation_id=INSTALLATION, base_url=gh.base_url, **FAST
        ),
        pub(),
    )
    assert gh.requests_to("GET", "/repos/{owner}/{repo}/installation") == []
    assert len(gh.requests_to("POST", TOKENS)) == 1 and len(gh.check_runs(REPO)) == 1


def test_a_key_that_is_not_the_apps_is_refused(github_standin, keys):
    _, public = keys
    wrong, _ = keypair()
    gh = world(github_standin, public)
    with pytest.raises(GitHubAuthError) as info:
        app_client(REPO, app_id=APP_ID, private_key=wrong, base_url=gh.base_url, **FAST)
    assert info.value.status == 401 and "PRIVATE KEY" not in str(info.value)
    with pytest.raises(GitHubAuthError):  # with a known installation, at the token exchange
        publish(
            app_client(
                REPO, app_id=APP_ID, private_key=wrong, installation_id=INSTALLATION, base_url=gh.base_url, **FAST
            ),
            pub(),
        )
    assert gh.tokens_issued() == [] and gh.check_runs(REPO) == []


def test_app_not_installed_on_the_repository(github_standin, keys):
    private, public = keys
    gh = world(github_standin, public, installed=("acme/elsewhere",))
    with pytest.raises(GitHubPermissionError, match="not installed on acme/kernels"):
        app_client(REPO, app_id=APP_ID, private_key=private, base_url=gh.base_url, **FAST)


def test_environment_prefers_a_configured_app_over_github_token(github_standin, keys, tmp_path):
    private, public = keys
    gh = world(github_standin, public)
    gh.add_token("ghs_workflowToken000000000000000000000")
    key_file = tmp_path / "app.pem"
    key_file.write_text(private)
    env = {
        "GITHUB_API_URL": gh.base_url,
        "GITHUB_TOKEN": "ghs_workflowToken000000000000000000000",
        "KERNALIN_GITHUB_APP_ID": str(APP_ID),
        "KERNALIN_GITHUB_APP_PRIVATE_KEY_PATH": str(key_file),
    }
    c = client_from_env(REPO, env=env, **FAST)
    c.set_commit_status(REPO, HEAD, "success", "via the app")
    assert gh.statuses(REPO)[-1]["login"] == "kernalin-ci[bot]"
    # the key may come inline, with its newlines escaped as a secret store often keeps them
    inline = {
        **env,
        "KERNALIN_GITHUB_APP_PRIVATE_KEY": private.replace("\n", "\\n"),
        "KERNALIN_GITHUB_APP_PRIVATE_KEY_PATH": "",
    }
    client_from_env(REPO, env=inline, **FAST).set_commit_status(REPO, HEAD, "success", "inline key")
    # without the App, GITHUB_TOKEN
    plain = {"GITHUB_API_URL": gh.base_url, "GITHUB_TOKEN": "ghs_workflowToken000000000000000000000"}
    client_from_env(REPO, env=plain, **FAST).set_commit_status(REPO, HEAD, "success", "via GITHUB_TOKEN")
    assert [s["login"] for s in gh.statuses(REPO)] == ["kernalin-ci[bot]", "kernalin-ci[bot]", "github-actions[bot]"]


def test_credential_errors_are_usage_errors_that_never_show_the_key(tmp_path):
    with pytest.raises(UsageError, match="no GitHub credentials"):
        client_from_env(REPO, env={})
    with pytest.raises(UsageError, match="neither"):
        client_from_env(REPO, env={"KERNALIN_GITHUB_APP_ID": "1"})
    secretish = "-----BEGIN RSA PRIVATE KEY-----\nMIIEsecretbutbroken\n-----END RSA PRIVATE KEY-----"
    with pytest.raises(UsageError) as info:
        client_from_env(REPO, env={"KERNALIN_GITHUB_APP_ID": "1", "KERNALIN_GITHUB_APP_PRIVATE_KEY": secretish})
    assert "MIIEsecret" not in str(info.value) and "not an unencrypted PEM private key" in str(info.value)
    with pytest.raises(UsageError, match="cannot read"):
        read_private_key(path=tmp_path / "missing.pem")
    with pytest.raises(UsageError, match="must be a number"):
        app_client(REPO, app_id="abc", private_key=keypair()[0])


def test_redact_hides_tokens_jwts_and_keys():
    private, _ = keypair()
    text = (
        f"token ghs_abcdefghijklmnopqrstuvwxyz0123 and github_pat_11ABCDEFG0123456789_abcdefghijkl "
        f"jwt eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxIn0.c2lnbmF0dXJl key {private} custom s3cr3t-value"
    )
    out = redact(text, ["s3cr3t-value"])
    for secret in ("ghs_abc", "github_pat_", "eyJhbGci", "PRIVATE KEY", "s3cr3t"):
        assert secret not in out
    assert out.count("***") == 5
