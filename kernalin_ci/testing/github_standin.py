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

import copy
import itertools
import json
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt

from kernalin_ci.testing.openapi import INVALID_JSON, OpenAPI
from kernalin_ci.testing.standin_checks import ChecksAndComments
from kernalin_ci.testing.standin_pulls import PullsAndApps
from kernalin_ci.testing.standin_state import (
    _LEVELS,
    ACTIONS_APP_ID,
    DOCS,
    NOT_ACCESSIBLE,
    WRITE_PERMISSIONS,
    ApiError,
    App,
    Ctx,
    Fault,
    Handler,
    Installation,
    Repo,
    Request,
    Token,
    iso,
    node_id,
)


class GitHubStandIn(ChecksAndComments, PullsAndApps):
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

    # -- pull requests and reviews ----------------------------------------------------------------


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
