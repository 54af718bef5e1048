"""A local HTTP server that plays GitHub's REST API, for tests.

    with GitHubStandIn() as gh:                      # or GitHubStandIn(prefix="/api/v3") for Enterprise
        gh.add_repo("acme/kernels")
        gh.add_pull_request("acme/kernels", 7, head_sha=HEAD, base_sha=BASE)
        gh.add_token("ghs_actions", permissions=WRITE_PERMISSIONS)
        client = Github(auth=Auth.Token("ghs_actions"), base_url=gh.base_url)
        ...
        gh.check_runs("acme/kernels")                 # state, as plain dicts
        gh.assert_no_problems()

It is a real `ThreadingHTTPServer` on 127.0.0.1 (a free port). Every request is
checked against GitHub's official OpenAPI description (path template, method,
path and query parameters, JSON body schema): an invalid one is answered 422 and
recorded in `problems`, as is a request to a path or method GitHub does not
have, one the stand-in does not implement, and a response of the stand-in's own
that does not match the description. The pytest fixture in
`kernalin_ci.testing.pytest_fixtures` fails the test at teardown when
`problems` is not empty.

State is in memory: repositories with known commits and pull requests, check
runs (with check suites and annotations), issue comments, commit statuses, pull
request reviews, GitHub Apps with installations and installation tokens. A
repository added with `git_dir=` (a real bare repository the test pushes to) has
branches: a pull request opened over the API needs its head and base branches
there, and a pull request's files and diff hunks (where a review comment may go)
are `git diff`'s. Tokens carry GitHub App
permissions (`checks`, `statuses`, `issues`, `pull_requests`, ...): a write without
the permission answers 403 "Resource not accessible by integration", as GitHub
does for the read-only GITHUB_TOKEN of a pull request from a fork. App endpoints
take a JWT, verified (RS256) with the public key given to `add_app`.

Failures are injected with `inject(METHOD, PATH, STATUS, times=N)`: PATH is an
OpenAPI template (`/repos/{owner}/{repo}/check-runs`) or a glob over the request
path; `drop=True` closes the connection without an answer; `after=True` lets the request
take effect and fails only its answer.

Lists are paginated like GitHub's (`per_page` default 30, max 100, `Link` header).
Other endpoints can be added with `route(METHOD, TEMPLATE, handler)`.
"""

from __future__ import annotations

import base64
import copy
import fnmatch
import itertools
import json
import re
import secrets
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt

from kernalin_ci.testing.openapi import INVALID_JSON, OpenAPI

NOT_ACCESSIBLE = "Resource not accessible by integration"
DOCS = "https://docs.github.com/rest"
ACTIONS_APP_ID = 15368  # the "GitHub Actions" app that owns GITHUB_TOKEN's check runs
WRITE_PERMISSIONS = {
    "checks": "write",
    "statuses": "write",
    "issues": "write",
    "pull_requests": "write",
    "contents": "read",
    "metadata": "read",
}
# what the GITHUB_TOKEN of a pull_request event from a fork gets
READ_ONLY_PERMISSIONS = {
    "checks": "read",
    "statuses": "read",
    "issues": "read",
    "pull_requests": "read",
    "contents": "read",
    "metadata": "read",
}
COMMENT_MAX_CHARS = 65536  # GitHub answers 422 for a longer issue comment body (not in the description)
STATUS_DESCRIPTION_MAX_CHARS = 140
_LEVELS = {"read": 1, "write": 2, "admin": 3}


def iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if ts is None else ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_id(kind: str, ident: int) -> str:
    return base64.b64encode(f"0:{kind}{ident}".encode()).decode()


class ApiError(Exception):
    """Raised by a handler to answer an error the way GitHub does."""

    def __init__(self, status: int, message: str, *, headers: dict | None = None, errors: list | None = None):
        super().__init__(message)
        self.status, self.message, self.headers, self.errors = status, message, headers or {}, errors


@dataclass
class Request:
    """One request the stand-in received, and what it answered."""

    method: str
    path: str  # without the base prefix and the query
    query: dict[str, list[str]]
    body: object  # parsed JSON; None when there was none
    headers: dict[str, str]  # lower-case names
    template: str | None = None
    status: int = 0
    fault: bool = False  # answered by an injected fault
    problems: list[str] = field(default_factory=list)


@dataclass
class Fault:
    method: str
    path: str
    status: int
    times: int | None  # None: every matching request
    message: str | None = None
    headers: dict = field(default_factory=dict)
    drop: bool = False
    after: bool = False  # the request takes effect first; only its answer fails (a lost answer)
    hits: int = 0

    def matches(self, method: str, path: str, template: str | None) -> bool:
        if self.method != "*" and self.method != method:
            return False
        if "{" in self.path:
            return self.path == template
        return fnmatch.fnmatchcase(path, self.path)

    @property
    def spent(self) -> bool:
        return self.times is not None and self.hits >= self.times


@dataclass
class Token:
    token: str
    permissions: dict[str, str]
    repos: set[str] | None  # None: every repository
    login: str
    app_id: int | None  # None: a personal access token
    expires_at: float | None = None


@dataclass
class App:
    id: int
    slug: str
    name: str
    public_key: str  # PEM


@dataclass
class Installation:
    id: int
    app_id: int
    account: str
    repos: set[str]
    permissions: dict[str, str]


@dataclass
class Repo:
    id: int
    full_name: str
    commits: set[str] = field(default_factory=set)
    pulls: dict[int, dict] = field(default_factory=dict)
    check_runs: dict[int, dict] = field(default_factory=dict)
    check_suites: dict[tuple, int] = field(default_factory=dict)  # (app_id, head_sha) -> id
    comments: dict[int, dict] = field(default_factory=dict)
    statuses: list[dict] = field(default_factory=list)
    git_dir: str | None = None  # a real (bare) git repository: its branches and commits
    default_branch: str = "main"


@dataclass
class Ctx:
    """What a handler gets: the matched request and helpers to authorise it."""

    standin: GitHubStandIn
    method: str
    template: str
    path_params: dict[str, str]
    query: dict[str, list[str]]
    body: object
    auth: Token | App | None
    response_headers: dict[str, str] = field(default_factory=dict)

    def q(self, name: str, default: str | None = None) -> str | None:
        return self.query.get(name, [default])[0]

    def repo(self, *permission: str, level: str = "read") -> Repo:
        """The repository of the path, once the caller may use it with PERMISSION (any one) at LEVEL."""
        return self.standin._authorise(
            self, f"{self.path_params['owner']}/{self.path_params['repo']}", permission, level
        )

    def app(self) -> App:
        if not isinstance(self.auth, App):
            raise ApiError(401, "A JSON web token could not be decoded")
        return self.auth


Handler = Callable[[Ctx], tuple[int, object]]


class GitHubStandIn:
    def __init__(self, *, prefix: str = "", openapi: OpenAPI | None = None, validate_responses: bool = True):
        self.prefix = prefix.rstrip("/")
        self.openapi = openapi or OpenAPI.load()
        self.validate_responses = validate_responses
        self.requests: list[Request] = []
        self.problems: list[str] = []
        self.faults: list[Fault] = []
        self._repos: dict[str, Repo] = {}
        self._tokens: dict[str, Token] = {}
        self._apps: dict[int, App] = {}
        self._installations: dict[int, Installation] = {}
        self._ids = itertools.count(1001)
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._routes: dict[tuple[str, str], Handler] = {}
        self._add_default_routes()

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> GitHubStandIn:
        standin = self

        class _H(_HandlerBase):
            owner = standin

        self._server = _Server(("127.0.0.1", 0), _H)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="github-standin", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> GitHubStandIn:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return self._server.server_address[1]

    @property
    def web_url(self) -> str:
        """The host's root, where html_url links point."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """What to give PyGithub as base_url: the API root (with the Enterprise prefix, if any)."""
        return f"{self.web_url}{self.prefix}"

    # -- the world --------------------------------------------------------------------------------
    def add_repo(self, full_name: str, *, git_dir: str | None = None, default_branch: str = "main") -> Repo:
        """A repository; with GIT_DIR (a real repository), its branches, commits and diffs are git's."""
        with self._lock:
            repo = Repo(next(self._ids), full_name, git_dir=git_dir, default_branch=default_branch)
            self._repos[full_name] = repo
            return repo

    def add_commit(self, repo: str, sha: str) -> None:
        with self._lock:
            self._repos[repo].commits.add(sha)

    def add_pull_request(
        self,
        repo: str,
        number: int,
        *,
        head_sha: str,
        base_sha: str,
        head_ref: str = "feature",
        base_ref: str = "main",
        head_repo: str | None = None,
        title: str = "A change",
        body: str | None = None,
        login: str = "octocat",
    ) -> dict:
        """A pull request (an issue too) from HEAD_REPO (a fork when it differs from REPO) into REPO."""
        with self._lock:
            r = self._repos[repo]
            r.commits.update({head_sha, base_sha})
            pr = self._new_pull(
                r, number, head_sha, base_sha, head_ref, base_ref, head_repo or repo, title, body, login
            )
            return dict(pr)

    def _new_pull(self, r: Repo, number, head_sha, base_sha, head_ref, base_ref, head_repo, title, body, login) -> dict:
        now = iso()
        pr = {
            "id": next(self._ids),
            "number": number,
            "head_sha": head_sha,
            "base_sha": base_sha,
            "head_ref": head_ref,
            "base_ref": base_ref,
            "head_repo": head_repo,
            "title": title,
            "body": body,
            "state": "open",
            "login": login,
            "created_at": now,
            "updated_at": now,
            "reviews": [],
        }
        r.pulls[number] = pr
        return pr

    def add_token(
        self,
        token: str,
        *,
        permissions: dict[str, str] | None = None,
        repos: list[str] | None = None,
        app_id: int | None = ACTIONS_APP_ID,
        login: str = "github-actions[bot]",
        expires_in_s: float | None = None,
    ) -> None:
        """A token GitHub would accept: by default a GITHUB_TOKEN with write permissions on every repository."""
        with self._lock:
            self._tokens[token] = Token(
                token,
                dict(WRITE_PERMISSIONS if permissions is None else permissions),
                set(repos) if repos is not None else None,
                login,
                app_id,
                time.time() + expires_in_s if expires_in_s is not None else None,
            )

    def add_app(self, app_id: int, public_key_pem: str, *, slug: str = "kernalin-ci", name: str | None = None) -> None:
        with self._lock:
            self._apps[app_id] = App(app_id, slug, name or slug, public_key_pem)

    def add_installation(
        self, installation_id: int, app_id: int, repos: list[str], *, permissions: dict[str, str] | None = None
    ) -> None:
        with self._lock:
            account = repos[0].split("/")[0]
            self._installations[installation_id] = Installation(
                installation_id,
                app_id,
                account,
                set(repos),
                dict(WRITE_PERMISSIONS if permissions is None else permissions),
            )

    def add_comment(self, repo: str, issue_number: int, body: str, *, login: str = "octocat") -> int:
        """A comment someone else wrote (for tests that need a crowded conversation)."""
        with self._lock:
            return self._new_comment(self._repos[repo], issue_number, body, login, None)["id"]

    # -- failures ---------------------------------------------------------------------------------
    def inject(
        self,
        method: str,
        path: str,
        status: int = 502,
        *,
        times: int | None = 1,
        message: str | None = None,
        headers: dict | None = None,
        drop: bool = False,
        after: bool = False,
    ) -> Fault:
        """Answer the next TIMES requests METHOD PATH (template or glob; method '*' for any) with STATUS.

        Without a message, 5xx answers are an HTML page (as GitHub's front end sends), others JSON
        {"message": reason}. drop=True closes the connection without answering. after=True lets the
        request take effect and fails only the answer (GitHub did it, the client never heard).
        """
        fault = Fault(
            method.upper() if method != "*" else "*", path, status, times, message, dict(headers or {}), drop, after
        )
        with self._lock:
            self.faults.append(fault)
        return fault

    def route(self, method: str, template: str, handler: Handler) -> None:
        """Serve METHOD TEMPLATE (an OpenAPI path template) with HANDLER(ctx) -> (status, json)."""
        self._routes[(method.upper(), template)] = handler

    # -- inspection -------------------------------------------------------------------------------
    def requests_to(self, method: str, template: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method.upper() and r.template == template]

    def check_runs(self, repo: str) -> list[dict]:
        """Every check run of REPO, oldest first, with its 'annotations' and its 'updates' (PATCH count)."""
        with self._lock:
            return [copy.deepcopy(r) for r in self._repos[repo].check_runs.values()]

    def comments(self, repo: str, issue_number: int) -> list[dict]:
        with self._lock:
            return [copy.deepcopy(c) for c in self._repos[repo].comments.values() if c["issue_number"] == issue_number]

    def pulls(self, repo: str) -> list[dict]:
        """Every pull request of REPO, oldest first, each with its 'reviews' (and their 'comments')."""
        with self._lock:
            return [copy.deepcopy(pr) for pr in self._repos[repo].pulls.values()]

    def statuses(self, repo: str, sha: str | None = None) -> list[dict]:
        with self._lock:
            return [copy.deepcopy(s) for s in self._repos[repo].statuses if sha is None or s["sha"] == sha]

    def tokens_issued(self) -> list[Token]:
        """Installation tokens the stand-in created (App auth)."""
        with self._lock:
            return [copy.deepcopy(t) for t in self._tokens.values() if t.token.startswith("ghs_inst_")]

    def assert_no_problems(self) -> None:
        if self.problems:
            raise AssertionError("GitHub stand-in saw problems:\n  " + "\n  ".join(self.problems))

    # -- serving ----------------------------------------------------------------------------------
    def _serve(self, h: _HandlerBase) -> None:
        split = urlsplit(h.path)
        path, query = split.path, parse_qs(split.query, keep_blank_values=True)
        data = h._read_body()
        headers = {k.lower(): v for k, v in h.headers.items()}
        body: object = None
        if data:
            try:
                body = json.loads(data)
            except ValueError:
                body = INVALID_JSON
        req = Request(h.command, path, query, body, headers)
        with self._lock:
            self.requests.append(req)
        status, payload, extra = self._answer(req, path, bool(data), headers)
        if status == 0:  # a dropped connection
            h.close_connection = True
            return
        req.status = status
        h._send(status, payload, extra)

    def _problem(self, req: Request, text: str) -> None:
        line = f"{req.method} {req.path}: {text}"
        req.problems.append(text)
        with self._lock:
            self.problems.append(line)

    def _answer(self, req: Request, path: str, has_body: bool, headers: dict) -> tuple[int, object, dict]:
        if self.prefix and not (path == self.prefix or path.startswith(self.prefix + "/")):
            self._problem(req, f"outside the API prefix {self.prefix!r}")
            return 404, {"message": "Not Found", "documentation_url": DOCS}, {}
        api_path = path[len(self.prefix) :] or "/"
        req.path = api_path
        match, exists = self.openapi.find(req.method, api_path)
        if match is None:
            self._problem(
                req, "no such method for this path in GitHub's API" if exists else "no such path in GitHub's API"
            )
            return 404, {"message": "Not Found", "documentation_url": DOCS}, {}
        req.template = match.operation.template
        if not headers.get("user-agent"):
            self._problem(req, "no User-Agent header (GitHub rejects such requests)")
            return (
                403,
                {
                    "message": "Request forbidden by administrative rules. Please make sure your request "
                    "has a User-Agent header",
                    "documentation_url": DOCS,
                },
                {},
            )
        invalid = self.openapi.validate_request(match, req.query, req.body, has_body, headers.get("content-type"))
        if invalid:
            for text in invalid:
                self._problem(req, f"invalid request ({req.template}): {text}")
            return 422, {"message": "Invalid request.\n\n" + "\n".join(invalid), "documentation_url": DOCS}, {}

        with self._lock:
            fault = next(
                (f for f in self.faults if not f.spent and f.matches(req.method, api_path, req.template)), None
            )
            if fault is not None:
                fault.hits += 1
        if fault is not None and not fault.after:
            req.fault = True
            return self._fault_answer(fault)

        handler = self._routes.get((req.method, req.template))
        if handler is None:
            self._problem(
                req,
                f"{req.method} {req.template} is valid but the stand-in does not implement it (add it with route())",
            )
            return 501, {"message": "Not implemented by the stand-in", "documentation_url": DOCS}, {}
        ctx = Ctx(self, req.method, req.template, match.path_params, req.query, req.body, None)
        try:
            with self._lock:
                ctx.auth = self._authenticate(headers.get("authorization"))
                status, payload = handler(ctx)
        except ApiError as e:
            payload = {"message": e.message, "documentation_url": DOCS}
            if e.errors is not None:
                payload["errors"] = e.errors
            return e.status, payload, e.headers
        except Exception:  # a bug in the stand-in
            self._problem(req, "stand-in handler raised:\n" + traceback.format_exc())
            return 500, {"message": "stand-in error", "documentation_url": DOCS}, {}
        if self.validate_responses:
            for text in self.openapi.validate_response(match, status, payload):
                self._problem(req, f"stand-in answered off the description: {text}")
        if fault is not None:  # done, but the answer is lost
            req.fault = True
            return self._fault_answer(fault)
        return status, payload, ctx.response_headers

    @staticmethod
    def _fault_answer(fault: Fault) -> tuple[int, object, dict]:
        if fault.drop:
            return 0, None, {}
        if fault.message is None and fault.status >= 500:
            page = f"<html><body><h1>{fault.status}</h1>Unicorn! This page is taking too long.</body></html>"
            return fault.status, _Html(page), fault.headers
        return (
            fault.status,
            {"message": fault.message or _REASONS.get(fault.status, "Error"), "documentation_url": DOCS},
            fault.headers,
        )

    # -- auth -------------------------------------------------------------------------------------
    def _authenticate(self, header: str | None) -> Token | App | None:
        if not header:
            return None
        scheme, _, cred = header.partition(" ")
        if scheme.lower() not in ("token", "bearer") or not cred:
            raise ApiError(401, "Bad credentials")
        tok = self._tokens.get(cred)
        if tok is not None:
            if tok.expires_at is not None and tok.expires_at < time.time():
                raise ApiError(401, "Bad credentials")
            return tok
        if cred.count(".") == 2:
            return self._verify_jwt(cred)
        raise ApiError(401, "Bad credentials")

    def _verify_jwt(self, token: str) -> App:
        try:
            claims = jwt.decode(token, options={"verify_signature": False})
            app = self._apps.get(int(claims.get("iss")))
        except (jwt.PyJWTError, TypeError, ValueError):
            raise ApiError(401, "A JSON web token could not be decoded") from None
        if app is None:
            raise ApiError(401, "Integration not found")
        try:
            claims = jwt.decode(token, app.public_key, algorithms=["RS256"], options={"require": ["iat", "exp", "iss"]})
        except jwt.ExpiredSignatureError:
            raise ApiError(
                401,
                "'Expiration time' claim ('exp') must be a numeric value representing the future "
                "time at which the assertion expires",
            ) from None
        except jwt.PyJWTError as e:
            raise ApiError(401, f"A JSON web token could not be decoded ({e})") from None
        if claims["exp"] - time.time() > 600 + 30:
            raise ApiError(401, "'Expiration time' claim ('exp') is too far in the future")
        return app

    def _authorise(self, ctx: Ctx, full_name: str, permissions: tuple[str, ...], level: str) -> Repo:
        repo = self._repos.get(full_name)
        if ctx.auth is None:
            raise ApiError(401, "Requires authentication")
        if isinstance(ctx.auth, App):
            raise ApiError(403, NOT_ACCESSIBLE)  # a JWT is for /app endpoints only
        tok = ctx.auth
        if repo is None or (tok.repos is not None and full_name not in tok.repos):
            raise ApiError(404, "Not Found")
        if permissions and not any(_LEVELS.get(tok.permissions.get(p, ""), 0) >= _LEVELS[level] for p in permissions):
            raise ApiError(
                403, NOT_ACCESSIBLE if tok.app_id is not None else "Resource not accessible by personal access token"
            )
        return repo

    # -- JSON shapes ------------------------------------------------------------------------------
    def _user(self, login: str) -> dict:
        api, web = self.base_url, self.web_url
        uid = int.from_bytes(login.encode()[:6].ljust(6, b"\0"), "big") % 10_000_000 + 1
        return {
            "login": login,
            "id": uid,
            "node_id": node_id("User", uid),
            "avatar_url": f"{web}/avatars/{login}",
            "gravatar_id": "",
            "url": f"{api}/users/{login}",
            "html_url": f"{web}/{login}",
            "followers_url": f"{api}/users/{login}/followers",
            "following_url": f"{api}/users/{login}/following{{/other_user}}",
            "gists_url": f"{api}/users/{login}/gists{{/gist_id}}",
            "starred_url": f"{api}/users/{login}/starred{{/owner}}{{/repo}}",
            "subscriptions_url": f"{api}/users/{login}/subscriptions",
            "organizations_url": f"{api}/users/{login}/orgs",
            "repos_url": f"{api}/users/{login}/repos",
            "events_url": f"{api}/users/{login}/events{{/privacy}}",
            "received_events_url": f"{api}/users/{login}/received_events",
            "type": "Bot" if login.endswith("[bot]") else "User",
            "site_admin": False,
        }

    def _app_json(self, app_id: int | None) -> dict | None:
        if app_id is None:
            return None
        app = self._apps.get(app_id) or App(app_id, "github-actions", "GitHub Actions", "")
        return {
            "id": app.id,
            "slug": app.slug,
            "node_id": node_id("Integration", app.id),
            "owner": self._user("github" if app.id == ACTIONS_APP_ID else app.slug),
            "name": app.name,
            "description": None,
            "external_url": f"{self.web_url}/apps/{app.slug}/home",
            "html_url": f"{self.web_url}/apps/{app.slug}",
            "created_at": iso(0),
            "updated_at": iso(0),
            "permissions": dict(WRITE_PERMISSIONS),
            "events": ["pull_request", "check_run"],
        }

    def _check_run_json(self, repo: Repo, run: dict) -> dict:
        url = f"{self.base_url}/repos/{repo.full_name}/check-runs/{run['id']}"
        prs = []
        for pr in repo.pulls.values():
            if pr["head_sha"] == run["head_sha"] and pr["head_repo"] == repo.full_name:
                side = {
                    "id": repo.id,
                    "url": f"{self.base_url}/repos/{repo.full_name}",
                    "name": repo.full_name.split("/")[1],
                }
                prs.append(
                    {
                        "id": pr["id"],
                        "number": pr["number"],
                        "url": f"{self.base_url}/repos/{repo.full_name}/pulls/{pr['number']}",
                        "head": {"ref": pr["head_ref"], "sha": pr["head_sha"], "repo": side},
                        "base": {"ref": pr["base_ref"], "sha": pr["base_sha"], "repo": side},
                    }
                )
        app = self._app_json(run["app_id"])
        return {
            "id": run["id"],
            "node_id": node_id("CheckRun", run["id"]),
            "head_sha": run["head_sha"],
            "external_id": run["external_id"],
            "url": url,
            "html_url": f"{self.web_url}/{repo.full_name}/runs/{run['id']}",
            "details_url": run["details_url"] or (app or {}).get("external_url"),
            "status": run["status"],
            "conclusion": run["conclusion"],
            "started_at": run["started_at"],
            "completed_at": run["completed_at"],
            "output": {
                **{k: run["output"].get(k) for k in ("title", "summary", "text")},
                "annotations_count": len(run["annotations"]),
                "annotations_url": f"{url}/annotations",
            },
            "name": run["name"],
            "check_suite": {"id": run["check_suite_id"]},
            "app": app,
            "pull_requests": prs,
        }

    def _comment_json(self, repo: Repo, c: dict) -> dict:
        api = f"{self.base_url}/repos/{repo.full_name}"
        return {
            "id": c["id"],
            "node_id": node_id("IssueComment", c["id"]),
            "url": f"{api}/issues/comments/{c['id']}",
            "html_url": f"{self.web_url}/{repo.full_name}/pull/{c['issue_number']}#issuecomment-{c['id']}",
            "body": c["body"],
            "user": self._user(c["login"]),
            "created_at": c["created_at"],
            "updated_at": c["updated_at"],
            "issue_url": f"{api}/issues/{c['issue_number']}",
            "author_association": "NONE",
            "performed_via_github_app": self._app_json(c["app_id"]),
        }

    def _status_json(self, repo: Repo, s: dict) -> dict:
        return {
            "url": f"{self.base_url}/repos/{repo.full_name}/statuses/{s['sha']}",
            "avatar_url": None,
            "id": s["id"],
            "node_id": node_id("StatusContext", s["id"]),
            "state": s["state"],
            "description": s["description"],
            "target_url": s["target_url"],
            "context": s["context"],
            "created_at": s["created_at"],
            "updated_at": s["created_at"],
            "creator": self._user(s["login"]),
        }

    def _installation_json(self, inst: Installation) -> dict:
        app = self._apps[inst.app_id]
        return {
            "id": inst.id,
            "app_id": app.id,
            "app_slug": app.slug,
            "target_id": 1,
            "target_type": "Organization",
            "single_file_name": None,
            "repository_selection": "selected",
            "access_tokens_url": f"{self.base_url}/app/installations/{inst.id}/access_tokens",
            "html_url": f"{self.web_url}/organizations/{inst.account}/settings/installations/{inst.id}",
            "repositories_url": f"{self.base_url}/installation/repositories",
            "events": ["pull_request"],
            "account": self._user(inst.account),
            "permissions": dict(inst.permissions),
            "created_at": iso(0),
            "updated_at": iso(0),
            "suspended_by": None,
            "suspended_at": None,
        }

    def _paginate(self, ctx: Ctx, path: str, items: list) -> list:
        per_page = min(int(ctx.q("per_page", "30")), 100)
        page = max(int(ctx.q("page", "1")), 1)
        last = max((len(items) + per_page - 1) // per_page, 1)
        base = {k: v[0] for k, v in ctx.query.items() if k not in ("page", "per_page")}

        def link(p: int, rel: str) -> str:
            return f'<{self.base_url}{path}?{urlencode({**base, "per_page": per_page, "page": p})}>; rel="{rel}"'

        rels = []
        if page < last:
            rels += [link(page + 1, "next"), link(last, "last")]
        if page > 1:
            rels += [link(1, "first"), link(page - 1, "prev")]
        if rels:
            ctx.response_headers["Link"] = ", ".join(rels)
        return items[(page - 1) * per_page : page * per_page]

    # -- handlers ---------------------------------------------------------------------------------
    def _add_default_routes(self) -> None:
        R = "/repos/{owner}/{repo}"
        for method, template, fn in [
            ("POST", R + "/check-runs", self._create_check_run),
            ("GET", R + "/check-runs/{check_run_id}", self._get_check_run),
            ("PATCH", R + "/check-runs/{check_run_id}", self._update_check_run),
            ("GET", R + "/check-runs/{check_run_id}/annotations", self._list_annotations),
            ("GET", R + "/commits/{ref}/check-runs", self._list_check_runs),
            ("GET", R + "/issues/{issue_number}/comments", self._list_comments),
            ("POST", R + "/issues/{issue_number}/comments", self._create_comment),
            ("GET", R + "/issues/comments/{comment_id}", self._get_comment),
            ("PATCH", R + "/issues/comments/{comment_id}", self._update_comment),
            ("DELETE", R + "/issues/comments/{comment_id}", self._delete_comment),
            ("POST", R + "/statuses/{sha}", self._create_status),
            ("GET", R + "/commits/{ref}/statuses", self._list_statuses),
            ("GET", R + "/installation", self._get_repo_installation),
            ("GET", R + "/pulls", self._list_pulls),
            ("POST", R + "/pulls", self._create_pull),
            ("GET", R + "/pulls/{pull_number}", self._get_pull),
            ("GET", R + "/pulls/{pull_number}/files", self._list_pull_files),
            ("GET", R + "/pulls/{pull_number}/reviews", self._list_reviews),
            ("POST", R + "/pulls/{pull_number}/reviews", self._create_review),
            ("POST", "/app/installations/{installation_id}/access_tokens", self._create_installation_token),
        ]:
            self.route(method, template, fn)

    @staticmethod
    def _need_commit(repo: Repo, sha: str) -> None:
        if sha not in repo.commits:
            raise ApiError(422, f"No commit found for SHA: {sha}")

    def _apply_output(self, run: dict, output: dict | None) -> None:
        if not output:
            return
        for k in ("title", "summary", "text"):
            if k in output:
                run["output"][k] = output[k]
        for a in output.get("annotations", []):
            if ("start_column" in a or "end_column" in a) and a["start_line"] != a["end_line"]:
                raise ApiError(
                    422,
                    "Invalid request.\n\nstart_column and end_column may only be used when start_line equals end_line",
                )
            if a["start_line"] < 1 or a["end_line"] < a["start_line"]:
                raise ApiError(422, "Invalid request.\n\nannotation lines out of range")
        run["annotations"] += [dict(a) for a in output.get("annotations", [])]
        run["annotation_batches"].append(len(output.get("annotations", [])))

    def _apply_status(self, run: dict, body: dict) -> None:
        if "conclusion" in body:
            run["status"], run["conclusion"] = "completed", body["conclusion"]
            run["completed_at"] = body.get("completed_at") or iso()
        elif body.get("status") == "completed":
            raise ApiError(422, "Invalid request.\n\nconclusion is required when status is completed")
        elif "status" in body:
            run["status"] = body["status"]

    def _find_run(self, repo: Repo, ctx: Ctx) -> dict:
        run = repo.check_runs.get(int(ctx.path_params["check_run_id"]))
        if run is None:
            raise ApiError(404, "Not Found")
        return run

    def _create_check_run(self, ctx: Ctx):
        repo = ctx.repo("checks", level="write")
        if ctx.auth.app_id is None:
            raise ApiError(403, "Resource not accessible by personal access token")
        b = ctx.body
        self._need_commit(repo, b["head_sha"])
        suite = repo.check_suites.setdefault((ctx.auth.app_id, b["head_sha"]), next(self._ids))
        run = {
            "id": next(self._ids),
            "name": b["name"],
            "head_sha": b["head_sha"],
            "external_id": b.get("external_id", ""),
            "details_url": b.get("details_url"),
            "status": "queued",
            "conclusion": None,
            "started_at": b.get("started_at") or iso(),
            "completed_at": None,
            "output": {"title": None, "summary": None, "text": None},
            "annotations": [],
            "annotation_batches": [],
            "updates": 0,
            "app_id": ctx.auth.app_id,
            "check_suite_id": suite,
        }
        self._apply_status(run, b)
        self._apply_output(run, b.get("output"))
        repo.check_runs[run["id"]] = run
        return 201, self._check_run_json(repo, run)

    def _get_check_run(self, ctx: Ctx):
        repo = ctx.repo("checks")
        return 200, self._check_run_json(repo, self._find_run(repo, ctx))

    def _update_check_run(self, ctx: Ctx):
        repo = ctx.repo("checks", level="write")
        run = self._find_run(repo, ctx)
        if run["app_id"] != ctx.auth.app_id:
            raise ApiError(
                403,
                f"Invalid app_id `{ctx.auth.app_id}` - check run can only be modified by the GitHub "
                "App that created it.",
            )
        b = ctx.body
        if run["status"] == "completed" and b.get("status") in ("queued", "in_progress") and "conclusion" not in b:
            # a completed run cannot be reopened (reported by integrators; GitHub's reference is silent)
            raise ApiError(422, f"Invalid request.\n\nA completed check run cannot be moved back to {b['status']}")
        for k in ("name", "details_url", "external_id", "started_at"):
            if k in b:
                run[k] = b[k]
        self._apply_status(run, b)
        self._apply_output(run, b.get("output"))
        run["updates"] += 1
        return 200, self._check_run_json(repo, run)

    def _list_annotations(self, ctx: Ctx):
        repo = ctx.repo("checks")
        run = self._find_run(repo, ctx)
        items = [
            {
                "path": a["path"],
                "blob_href": f"{self.web_url}/{repo.full_name}/blob/{run['head_sha']}/{a['path']}",
                "start_line": a["start_line"],
                "end_line": a["end_line"],
                "start_column": a.get("start_column"),
                "end_column": a.get("end_column"),
                "annotation_level": a["annotation_level"],
                "title": a.get("title", ""),
                "message": a["message"],
                "raw_details": a.get("raw_details", ""),
            }
            for a in run["annotations"]
        ]
        return 200, self._paginate(ctx, f"/repos/{repo.full_name}/check-runs/{run['id']}/annotations", items)

    def _list_check_runs(self, ctx: Ctx):
        repo = ctx.repo("checks")
        ref = ctx.path_params["ref"]
        self._need_commit(repo, ref)
        runs = [r for r in repo.check_runs.values() if r["head_sha"] == ref]
        if ctx.q("check_name") is not None:
            runs = [r for r in runs if r["name"] == ctx.q("check_name")]
        if ctx.q("status") is not None:
            runs = [r for r in runs if r["status"] == ctx.q("status")]
        if ctx.q("app_id") is not None:
            runs = [r for r in runs if r["app_id"] == int(ctx.q("app_id"))]
        if ctx.q("filter", "latest") == "latest":  # the most recent run of each name
            newest: dict[str, dict] = {}
            for r in runs:
                newest[r["name"]] = r
            runs = list(newest.values())
        runs = sorted(runs, key=lambda r: -r["id"])
        page = self._paginate(ctx, f"/repos/{repo.full_name}/commits/{ref}/check-runs", runs)
        return 200, {"total_count": len(runs), "check_runs": [self._check_run_json(repo, r) for r in page]}

    def _issue(self, repo: Repo, ctx: Ctx) -> int:
        number = int(ctx.path_params["issue_number"])
        if number not in repo.pulls:
            raise ApiError(404, "Not Found")
        return number

    def _new_comment(self, repo: Repo, issue_number: int, body: str, login: str, app_id: int | None) -> dict:
        now = iso()
        c = {
            "id": next(self._ids),
            "issue_number": issue_number,
            "body": body,
            "login": login,
            "app_id": app_id,
            "created_at": now,
            "updated_at": now,
            "edits": 0,
        }
        repo.comments[c["id"]] = c
        return c

    def _comment(self, repo: Repo, ctx: Ctx) -> dict:
        c = repo.comments.get(int(ctx.path_params["comment_id"]))
        if c is None:
            raise ApiError(404, "Not Found")
        return c

    @staticmethod
    def _check_body(body: str) -> None:
        if len(body) > COMMENT_MAX_CHARS:
            raise ApiError(
                422,
                "Validation Failed",
                errors=[
                    {
                        "resource": "IssueComment",
                        "code": "custom",
                        "field": "body",
                        "message": f"body is too long (maximum is {COMMENT_MAX_CHARS} characters)",
                    }
                ],
            )

    def _list_comments(self, ctx: Ctx):
        repo = ctx.repo("issues", "pull_requests")
        number = self._issue(repo, ctx)
        items = [c for c in repo.comments.values() if c["issue_number"] == number]
        if ctx.q("since"):
            items = [c for c in items if c["updated_at"] >= ctx.q("since")]
        page = self._paginate(ctx, f"/repos/{repo.full_name}/issues/{number}/comments", items)
        return 200, [self._comment_json(repo, c) for c in page]

    def _create_comment(self, ctx: Ctx):
        repo = ctx.repo("issues", "pull_requests", level="write")
        number = self._issue(repo, ctx)
        self._check_body(ctx.body["body"])
        c = self._new_comment(repo, number, ctx.body["body"], ctx.auth.login, ctx.auth.app_id)
        return 201, self._comment_json(repo, c)

    def _get_comment(self, ctx: Ctx):
        repo = ctx.repo("issues", "pull_requests")
        return 200, self._comment_json(repo, self._comment(repo, ctx))

    def _update_comment(self, ctx: Ctx):
        repo = ctx.repo("issues", "pull_requests", level="write")
        c = self._comment(repo, ctx)
        if c["login"] != ctx.auth.login:
            raise ApiError(403, NOT_ACCESSIBLE)
        self._check_body(ctx.body["body"])
        c["body"], c["updated_at"] = ctx.body["body"], iso()
        c["edits"] += 1
        return 200, self._comment_json(repo, c)

    def _delete_comment(self, ctx: Ctx):
        repo = ctx.repo("issues", "pull_requests", level="write")
        c = self._comment(repo, ctx)
        if c["login"] != ctx.auth.login:
            raise ApiError(403, NOT_ACCESSIBLE)
        del repo.comments[c["id"]]
        return 204, None

    def _create_status(self, ctx: Ctx):
        repo = ctx.repo("statuses", level="write")
        sha = ctx.path_params["sha"]
        self._need_commit(repo, sha)
        b = ctx.body
        if len(b.get("description") or "") > STATUS_DESCRIPTION_MAX_CHARS:
            raise ApiError(
                422,
                "Validation Failed",
                errors=[
                    {
                        "resource": "Status",
                        "code": "custom",
                        "field": "description",
                        "message": f"description is too long (maximum is {STATUS_DESCRIPTION_MAX_CHARS} characters)",
                    }
                ],
            )
        s = {
            "id": next(self._ids),
            "sha": sha,
            "state": b["state"],
            "description": b.get("description"),
            "target_url": b.get("target_url"),
            "context": b.get("context", "default"),
            "login": ctx.auth.login,
            "created_at": iso(),
        }
        repo.statuses.append(s)
        return 201, self._status_json(repo, s)

    def _list_statuses(self, ctx: Ctx):
        repo = ctx.repo("statuses")
        ref = ctx.path_params["ref"]
        items = [s for s in reversed(repo.statuses) if s["sha"] == ref]
        page = self._paginate(ctx, f"/repos/{repo.full_name}/commits/{ref}/statuses", items)
        return 200, [self._status_json(repo, s) for s in page]

    def _get_repo_installation(self, ctx: Ctx):
        app = ctx.app()
        full = f"{ctx.path_params['owner']}/{ctx.path_params['repo']}"
        for inst in self._installations.values():
            if inst.app_id == app.id and full in inst.repos:
                return 200, self._installation_json(inst)
        raise ApiError(404, "Not Found")

    def _create_installation_token(self, ctx: Ctx):
        app = ctx.app()
        inst = self._installations.get(int(ctx.path_params["installation_id"]))
        if inst is None or inst.app_id != app.id:
            raise ApiError(404, "Not Found")
        b = ctx.body or {}
        perms = dict(inst.permissions)
        if b.get("permissions"):
            for k, v in b["permissions"].items():
                if _LEVELS.get(inst.permissions.get(k, ""), 0) < _LEVELS.get(v, 9):
                    raise ApiError(422, "The permissions requested are not granted to this installation.")
            perms = dict(b["permissions"])
        repos = set(inst.repos)
        if b.get("repositories"):
            wanted = {f"{inst.account}/{name}" for name in b["repositories"]}
            if not wanted <= inst.repos:
                raise ApiError(
                    422,
                    "There is at least one repository that does not exist or is not accessible "
                    "to the parent installation.",
                )
            repos = wanted
        token = "ghs_inst_" + secrets.token_hex(16)
        expires = time.time() + 3600
        self._tokens[token] = Token(token, perms, repos, f"{app.slug}[bot]", app.id, expires)
        return 201, {
            "token": token,
            "expires_at": iso(expires),
            "permissions": perms,
            "repository_selection": "selected",
        }

    # -- pull requests and reviews ----------------------------------------------------------------
    def _git(self, repo: Repo, *args: str) -> str | None:
        """git's answer in REPO's git_dir, None when it fails (a missing ref)."""
        if repo.git_dir is None:
            return None
        r = subprocess.run(["git", "--git-dir", repo.git_dir, *args], capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None

    def _branch_sha(self, repo: Repo, branch: str) -> str | None:
        out = self._git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}")
        return out.strip() if out else None

    def _repo_json(self, repo: Repo) -> dict:
        api, web = f"{self.base_url}/repos/{repo.full_name}", f"{self.web_url}/{repo.full_name}"
        owner, name = repo.full_name.split("/", 1)
        host = urlsplit(self.web_url).netloc
        d = {
            "id": repo.id,
            "node_id": node_id("Repository", repo.id),
            "name": name,
            "full_name": repo.full_name,
            "license": None,
            "owner": self._user(owner),
            "private": False,
            "html_url": web,
            "description": None,
            "fork": False,
            "url": api,
            "git_url": f"git://{host}/{repo.full_name}.git",
            "ssh_url": f"git@{host}:{repo.full_name}.git",
            "clone_url": f"{web}.git",
            "svn_url": web,
            "mirror_url": None,
            "homepage": None,
            "language": "Python",
            "forks": 0,
            "forks_count": 0,
            "stargazers_count": 0,
            "watchers_count": 0,
            "watchers": 0,
            "size": 1,
            "default_branch": repo.default_branch,
            "open_issues": 0,
            "open_issues_count": 0,
            "has_issues": True,
            "has_projects": True,
            "has_wiki": False,
            "has_pages": False,
            "has_downloads": True,
            "archived": False,
            "disabled": False,
            "pushed_at": iso(0),
            "created_at": iso(0),
            "updated_at": iso(0),
        }
        for k, tail in {
            "archive_url": "/{archive_format}{/ref}",
            "assignees_url": "/assignees{/user}",
            "blobs_url": "/git/blobs{/sha}",
            "branches_url": "/branches{/branch}",
            "collaborators_url": "/collaborators{/collaborator}",
            "comments_url": "/comments{/number}",
            "commits_url": "/commits{/sha}",
            "compare_url": "/compare/{base}...{head}",
            "contents_url": "/contents/{+path}",
            "contributors_url": "/contributors",
            "deployments_url": "/deployments",
            "downloads_url": "/downloads",
            "events_url": "/events",
            "forks_url": "/forks",
            "git_commits_url": "/git/commits{/sha}",
            "git_refs_url": "/git/refs{/sha}",
            "git_tags_url": "/git/tags{/sha}",
            "hooks_url": "/hooks",
            "issue_comment_url": "/issues/comments{/number}",
            "issue_events_url": "/issues/events{/number}",
            "issues_url": "/issues{/number}",
            "keys_url": "/keys{/key_id}",
            "labels_url": "/labels{/name}",
            "languages_url": "/languages",
            "merges_url": "/merges",
            "milestones_url": "/milestones{/number}",
            "notifications_url": "/notifications{?since,all,participating}",
            "pulls_url": "/pulls{/number}",
            "releases_url": "/releases{/id}",
            "stargazers_url": "/stargazers",
            "statuses_url": "/statuses/{sha}",
            "subscribers_url": "/subscribers",
            "subscription_url": "/subscription",
            "tags_url": "/tags",
            "teams_url": "/teams",
            "trees_url": "/git/trees{/sha}",
        }.items():
            d[k] = api + tail
        return d

    def _pull_json(self, repo: Repo, pr: dict, *, full: bool = True) -> dict:
        api = f"{self.base_url}/repos/{repo.full_name}"
        url = f"{api}/pulls/{pr['number']}"
        html = f"{self.web_url}/{repo.full_name}/pull/{pr['number']}"
        head_repo = self._repos.get(pr["head_repo"])

        def side(ref: str, sha: str, r: Repo | None) -> dict:
            owner = (r.full_name if r else pr["head_repo"]).split("/")[0]
            return {
                "label": f"{owner}:{ref}",
                "ref": ref,
                "sha": sha,
                "user": self._user(owner),
                "repo": self._repo_json(r) if r else None,
            }

        d = {
            "url": url,
            "id": pr["id"],
            "node_id": node_id("PullRequest", pr["id"]),
            "html_url": html,
            "diff_url": f"{html}.diff",
            "patch_url": f"{html}.patch",
            "issue_url": f"{api}/issues/{pr['number']}",
            "commits_url": f"{url}/commits",
            "review_comments_url": f"{url}/comments",
            "review_comment_url": f"{api}/pulls/comments{{/number}}",
            "comments_url": f"{api}/issues/{pr['number']}/comments",
            "statuses_url": f"{api}/statuses/{pr['head_sha']}",
            "number": pr["number"],
            "state": pr["state"],
            "locked": False,
            "title": pr["title"],
            "user": self._user(pr["login"]),
            "body": pr["body"],
            "labels": [],
            "milestone": None,
            "active_lock_reason": None,
            "created_at": pr["created_at"],
            "updated_at": pr["updated_at"],
            "closed_at": None,
            "merged_at": None,
            "merge_commit_sha": None,
            "assignee": None,
            "assignees": [],
            "requested_reviewers": [],
            "requested_teams": [],
            "head": side(pr["head_ref"], pr["head_sha"], head_repo),
            "base": side(pr["base_ref"], pr["base_sha"], repo),
            "_links": {
                k: {"href": v}
                for k, v in {
                    "self": url,
                    "html": html,
                    "issue": f"{api}/issues/{pr['number']}",
                    "comments": f"{api}/issues/{pr['number']}/comments",
                    "review_comments": f"{url}/comments",
                    "review_comment": f"{api}/pulls/comments{{/number}}",
                    "commits": f"{url}/commits",
                    "statuses": f"{api}/statuses/{pr['head_sha']}",
                }.items()
            },
            "author_association": "NONE",
            "auto_merge": None,
            "draft": False,
        }
        d["base"]["user"] = self._user(repo.full_name.split("/")[0])
        d["base"]["label"] = f"{repo.full_name.split('/')[0]}:{pr['base_ref']}"
        if full:
            files = self._pull_files(repo, pr)
            d.update(
                {
                    "merged": False,
                    "mergeable": None,
                    "rebaseable": None,
                    "mergeable_state": "unknown",
                    "merged_by": None,
                    "comments": sum(c["issue_number"] == pr["number"] for c in repo.comments.values()),
                    "review_comments": sum(len(r["comments"]) for r in pr["reviews"]),
                    "maintainer_can_modify": False,
                    "commits": 1,
                    "additions": sum(f["additions"] for f in files),
                    "deletions": sum(f["deletions"] for f in files),
                    "changed_files": len(files),
                }
            )
        return d

    def _pull(self, repo: Repo, ctx: Ctx) -> dict:
        pr = repo.pulls.get(int(ctx.path_params["pull_number"]))
        if pr is None:
            raise ApiError(404, "Not Found")
        return pr

    def _pull_files(self, repo: Repo, pr: dict, head_sha: str | None = None) -> list[dict]:
        """The files of PR as GitHub lists them: `git diff base...head`, a `patch` (its hunks) per file."""
        head = head_sha or pr["head_sha"]
        out = self._git(repo, "diff", "--no-renames", "--unified=3", f"{pr['base_sha']}...{head}")
        if not out:
            return []
        files = []
        for block in re.split(r"^diff --git ", out, flags=re.M)[1:]:
            lines = block.split("\n")
            status, name = "modified", None
            for line in lines:
                if line.startswith("new file mode"):
                    status = "added"
                elif line.startswith("deleted file mode"):
                    status = "removed"
                elif line.startswith("+++ b/"):
                    name = line[6:]
                elif line.startswith("--- a/") and name is None:
                    name = line[6:]
                elif line.startswith("@@"):
                    break
            if name is None:
                continue
            start = next((i for i, x in enumerate(lines) if x.startswith("@@")), len(lines))
            hunk_lines = [x for x in lines[start:] if x or False]
            adds = sum(x.startswith("+") for x in hunk_lines)
            dels = sum(x.startswith("-") for x in hunk_lines)
            blob = self._git(repo, "rev-parse", f"{head if status != 'removed' else pr['base_sha']}:{name}")
            ref = head if status != "removed" else pr["base_sha"]
            files.append(
                {
                    "sha": blob.strip() if blob else None,
                    "filename": name,
                    "status": status,
                    "additions": adds,
                    "deletions": dels,
                    "changes": adds + dels,
                    "blob_url": f"{self.web_url}/{repo.full_name}/blob/{ref}/{name}",
                    "raw_url": f"{self.web_url}/{repo.full_name}/raw/{ref}/{name}",
                    "contents_url": f"{self.base_url}/repos/{repo.full_name}/contents/{name}?ref={ref}",
                    "patch": "\n".join(hunk_lines),
                }
            )
        return files

    @staticmethod
    def _hunks(patch: str) -> list[dict[str, tuple[int, int]]]:
        """Per hunk of a file's patch: the line ranges it shows, {"LEFT": (first, last), "RIGHT": ...}."""
        out = []
        for m in re.finditer(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", patch, flags=re.M):
            a, b, c, d = int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1)
            out.append({"LEFT": (a, a + b - 1), "RIGHT": (c, c + d - 1)})
        return out

    def _list_pulls(self, ctx: Ctx):
        repo = ctx.repo("pull_requests")
        state = ctx.q("state", "open")
        items = [pr for pr in repo.pulls.values() if state == "all" or pr["state"] == state]
        if ctx.q("head"):
            owner, _, ref = ctx.q("head").rpartition(":")
            items = [
                pr for pr in items if pr["head_ref"] == ref and (not owner or pr["head_repo"].split("/")[0] == owner)
            ]
        if ctx.q("base"):
            items = [pr for pr in items if pr["base_ref"] == ctx.q("base")]
        items = sorted(items, key=lambda pr: -pr["number"])
        page = self._paginate(ctx, f"/repos/{repo.full_name}/pulls", items)
        return 200, [self._pull_json(repo, pr, full=False) for pr in page]

    def _create_pull(self, ctx: Ctx):
        repo = ctx.repo("pull_requests", level="write")
        b = ctx.body
        if not b.get("title"):
            raise ApiError(
                422,
                "Validation Failed",
                errors=[{"resource": "PullRequest", "field": "title", "code": "missing_field"}],
            )
        owner, _, head_ref = b["head"].rpartition(":")
        if owner and owner != repo.full_name.split("/")[0]:
            raise ApiError(
                422, "Validation Failed", errors=[{"resource": "PullRequest", "field": "head", "code": "invalid"}]
            )
        head_sha = self._branch_sha(repo, head_ref)
        base_sha = self._branch_sha(repo, b["base"])
        for name, sha in (("head", head_sha), ("base", base_sha)):
            if sha is None:
                raise ApiError(
                    422, "Validation Failed", errors=[{"resource": "PullRequest", "field": name, "code": "invalid"}]
                )
        for pr in repo.pulls.values():
            if pr["state"] == "open" and pr["head_ref"] == head_ref and pr["base_ref"] == b["base"]:
                message = f"A pull request already exists for {repo.full_name.split('/')[0]}:{head_ref}."
                raise ApiError(
                    422, "Validation Failed", errors=[{"resource": "PullRequest", "code": "custom", "message": message}]
                )
        if not self._git(repo, "rev-list", f"{base_sha}..{head_sha}").strip():
            message = f"No commits between {b['base']} and {head_ref}"
            raise ApiError(
                422, "Validation Failed", errors=[{"resource": "PullRequest", "code": "custom", "message": message}]
            )
        repo.commits.update({head_sha, base_sha})
        number = max([*repo.pulls, 0]) + 1
        pr = self._new_pull(
            repo,
            number,
            head_sha,
            base_sha,
            head_ref,
            b["base"],
            repo.full_name,
            b["title"],
            b.get("body"),
            ctx.auth.login,
        )
        return 201, self._pull_json(repo, pr)

    def _get_pull(self, ctx: Ctx):
        repo = ctx.repo("pull_requests")
        return 200, self._pull_json(repo, self._pull(repo, ctx))

    def _list_pull_files(self, ctx: Ctx):
        repo = ctx.repo("pull_requests")
        pr = self._pull(repo, ctx)
        page = self._paginate(ctx, f"/repos/{repo.full_name}/pulls/{pr['number']}/files", self._pull_files(repo, pr))
        return 200, page

    def _review_json(self, repo: Repo, pr: dict, r: dict) -> dict:
        url = f"{self.base_url}/repos/{repo.full_name}/pulls/{pr['number']}"
        html = f"{self.web_url}/{repo.full_name}/pull/{pr['number']}#pullrequestreview-{r['id']}"
        return {
            "id": r["id"],
            "node_id": node_id("PullRequestReview", r["id"]),
            "user": self._user(r["login"]),
            "body": r["body"],
            "state": r["state"],
            "html_url": html,
            "pull_request_url": url,
            "_links": {"html": {"href": html}, "pull_request": {"href": url}},
            "submitted_at": r["submitted_at"],
            "commit_id": r["commit_id"],
            "author_association": "NONE",
        }

    def _list_reviews(self, ctx: Ctx):
        repo = ctx.repo("pull_requests")
        pr = self._pull(repo, ctx)
        page = self._paginate(ctx, f"/repos/{repo.full_name}/pulls/{pr['number']}/reviews", pr["reviews"])
        return 200, [self._review_json(repo, pr, r) for r in page]

    def _create_review(self, ctx: Ctx):
        repo = ctx.repo("pull_requests", level="write")
        pr = self._pull(repo, ctx)
        b = ctx.body or {}
        event = b.get("event")
        commit = b.get("commit_id") or pr["head_sha"]
        if commit not in repo.commits and self._git(repo, "cat-file", "-e", f"{commit}^{{commit}}") is None:
            raise ApiError(422, "Unprocessable Entity", errors=["Commit not found"])
        if event in ("COMMENT", "REQUEST_CHANGES") and not b.get("body"):
            raise ApiError(422, "Unprocessable Entity", errors=[f"Body is required for event {event}"])
        if event in ("APPROVE", "REQUEST_CHANGES") and ctx.auth.login == pr["login"]:
            raise ApiError(422, "Unprocessable Entity", errors=["Can not approve your own pull request"])
        files = {f["filename"]: f for f in self._pull_files(repo, pr, commit)}
        comments = []
        for c in b.get("comments", []):
            if "line" not in c:
                raise ApiError(422, "Unprocessable Entity", errors=["the stand-in takes line-based comments only"])
            side = c.get("side", "RIGHT")
            first = c.get("start_line", c["line"])
            if c.get("start_side", side) != side or first > c["line"]:
                raise ApiError(422, "Unprocessable Entity", errors=["start_line must precede line, on the same side"])
            f = files.get(c["path"])
            if f is None:
                raise ApiError(422, "Unprocessable Entity", errors=["Path could not be resolved"])
            hunks = self._hunks(f.get("patch", ""))
            if not any(h[side][0] <= c["line"] <= h[side][1] for h in hunks):
                raise ApiError(
                    422, "Unprocessable Entity", errors=["pull_request_review_thread.line must be part of the diff"]
                )
            if not any(h[side][0] <= first and c["line"] <= h[side][1] for h in hunks):
                raise ApiError(
                    422,
                    "Unprocessable Entity",
                    errors=["pull_request_review_thread.start_line must be part of the same hunk as the line."],
                )
            comments.append({**c, "side": side, "start_line": first})
        state = {"APPROVE": "APPROVED", "REQUEST_CHANGES": "CHANGES_REQUESTED", "COMMENT": "COMMENTED"}.get(
            event, "PENDING"
        )
        r = {
            "id": next(self._ids),
            "body": b.get("body", ""),
            "state": state,
            "commit_id": commit,
            "login": ctx.auth.login,
            "submitted_at": iso(),
            "comments": comments,
        }
        pr["reviews"].append(r)
        return 200, self._review_json(repo, pr, r)


class _Html(str):
    """A response body that is an HTML page, not JSON."""


_REASONS = {
    400: "Bad Request",
    401: "Bad credentials",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    422: "Validation Failed",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _HandlerBase(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall
    owner: GitHubStandIn

    def log_message(self, format, *args):  # quiet
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, payload: object, headers: dict) -> None:
        if payload is None:
            data, ctype = b"", "application/json; charset=utf-8"
        elif isinstance(payload, _Html):
            data, ctype = payload.encode(), "text/html; charset=utf-8"
        else:
            data, ctype = json.dumps(payload).encode(), "application/json; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        out = {
            "X-RateLimit-Limit": "5000",
            "X-RateLimit-Remaining": "4999",
            "X-RateLimit-Reset": str(int(time.time()) + 3600),
            "X-RateLimit-Resource": "core",
        }
        given = {k.lower() for k in headers}
        out = {k: v for k, v in out.items() if k.lower() not in given}
        out.update(headers)
        for k, v in out.items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self):
        self.owner._serve(self)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = do_HEAD = _handle
