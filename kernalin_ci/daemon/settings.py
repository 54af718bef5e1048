"""The daemon's configuration: one YAML file plus environment variables (docs/daemon.md).

Secrets (the webhook secret, the GitHub App private key) come from the environment or from
files named in the YAML or the environment, never from the YAML itself; they are kept out
of every repr, log line and job environment.

    settings = load("daemon.yml")                 # or load(None): defaults + environment
    settings.listen, settings.queue.backend, settings.runner.backend, ...
    settings.secrets.webhook                      # bytes; only webhook.py reads it
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kernalin_ci import yamlcheck
from kernalin_ci.errors import UsageError
from kernalin_ci.sandbox import SandboxError, SandboxSettings, parse_size

ENV_CONFIG = "KERNALIN_DAEMON_CONFIG"
ENV_LISTEN = "KERNALIN_DAEMON_LISTEN"
ENV_STATE_DIR = "KERNALIN_DAEMON_STATE_DIR"
ENV_WEBHOOK_SECRET = "KERNALIN_WEBHOOK_SECRET"
ENV_WEBHOOK_SECRET_FILE = "KERNALIN_WEBHOOK_SECRET_FILE"
ENV_APP_ID = "KERNALIN_GITHUB_APP_ID"  # the same names kernalin_ci.github.auth reads
ENV_APP_KEY = "KERNALIN_GITHUB_APP_PRIVATE_KEY"
ENV_APP_KEY_PATH = "KERNALIN_GITHUB_APP_PRIVATE_KEY_PATH"
ENV_API_URL = "KERNALIN_GITHUB_API_URL"
ENV_REDIS_URL = "KERNALIN_REDIS_URL"
ENV_RESULT_KEY = "KERNALIN_RESULT_KEY"  # Redis mode: the key that signs results and seals fetch tokens
ENV_RESULT_KEY_FILE = "KERNALIN_RESULT_KEY_FILE"
ENV_HISTORY_URL = "KERNALIN_HISTORY_URL"  # a postgresql:// URL holds a password
# every environment variable above that holds or points at a secret: never passed to a job
SECRET_ENV = (
    ENV_WEBHOOK_SECRET,
    ENV_WEBHOOK_SECRET_FILE,
    ENV_APP_KEY,
    ENV_APP_KEY_PATH,
    "GITHUB_TOKEN",
    ENV_REDIS_URL,
    ENV_RESULT_KEY,
    ENV_RESULT_KEY_FILE,
    ENV_HISTORY_URL,
)

GITHUB_MAX_BODY = 25 * 1024 * 1024  # GitHub caps webhook payloads at 25 MB


@dataclass
class Secrets:
    webhook: bytes = b""
    app_private_key: str = ""
    result_key: bytes = b""  # Redis mode: shared by serve and its workers, never by a job
    files: list[str] = field(default_factory=list)  # where they were read from (masked in job sandboxes)

    def __repr__(self) -> str:  # never show a secret, not even by accident in a traceback
        return (
            f"Secrets(webhook={'***' if self.webhook else 'unset'}, "
            f"app_private_key={'***' if self.app_private_key else 'unset'}, "
            f"result_key={'***' if self.result_key else 'unset'})"
        )


@dataclass
class GitHubSettings:
    api_url: str = "https://api.github.com"
    app_id: int | None = None
    check_name: str = "kernalin-ci"
    clone_url: str = "https://github.com/{repo}.git"  # {repo} = owner/name, {owner}, {name}
    retry_attempts: int = 6  # per request (kernalin_ci.github.retry)
    retry_base_delay_s: float = 1.0
    retry_budget_s: float = 120.0
    min_write_interval_s: float = 1.0  # GitHub asks integrators to keep writes a second apart
    min_request_interval_s: float = 0.25


@dataclass
class QueueSettings:
    backend: str = "sqlite"  # sqlite (embedded, this host's GPUs) | redis (RQ workers on many hosts)
    redis_url: str = "redis://127.0.0.1:6379/0"
    name: str = "kernalin-ci"  # the RQ queue


@dataclass
class HttpSettings:
    """Limits of the HTTP front (server.py): what one unauthenticated client can hold."""

    max_connections: int = 1024  # connections open at once (a socket each, no thread); then the slowest is cut
    request_deadline_s: float = 10.0  # a request (headers and body) must arrive whole within this
    max_buffered_bytes: int = 64 * 1024 * 1024  # request bodies held in memory at once, all connections


@dataclass
class DockerSettings:
    image: str = "kernalin-ci:latest"
    memory: str = "16g"
    pids: int = 4096
    tmpfs_size: str = "8g"
    url: str | None = None  # the engine (default: DOCKER_HOST, else the local socket)
    user: str | None = None  # uid[:gid] in the container (default: the daemon's, or the image's when root)


@dataclass
class RunnerSettings:
    backend: str = "local"  # local | docker
    timeout_s: float = 3600.0  # the whole job; the process or container is killed after it
    command: list[str] | None = None  # replaces `kernalin-ci run ...` (a hook for tests and smoke checks)
    env: dict[str, str] = field(default_factory=dict)  # extra job environment (never secrets)
    log_max_bytes: int = 16 * 1024 * 1024  # job.log keeps this much of the job's output (and its end)
    out_max_bytes: int = 256 * 1024 * 1024  # a larger out/ fails the job and is removed
    disk_max_bytes: int = 8 << 30  # the job's writable files while it runs (a tmpfs: checkout, out/, HOME, /tmp)
    docker: DockerSettings = field(default_factory=DockerSettings)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)  # the local runner's


@dataclass
class Backoff:
    attempts: int
    base_delay_s: float
    max_delay_s: float

    def delay(self, attempt: int, jitter: float = 1.0) -> float:
        """The wait after failed attempt ATTEMPT (1-based): base * 2^(attempt-1), capped, times JITTER."""
        return min(self.max_delay_s, self.base_delay_s * 2 ** max(attempt - 1, 0)) * jitter


@dataclass
class Settings:
    path: str | None = None
    listen: str = "127.0.0.1:8080"
    public_url: str | None = None  # where the daemon is reachable; check runs link to /jobs/ID
    state_dir: str = "/var/lib/kernalin-ci"
    webhook_path: str = "/webhook"
    max_body_bytes: int = GITHUB_MAX_BODY
    http: HttpSettings = field(default_factory=HttpSettings)
    github: GitHubSettings = field(default_factory=GitHubSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    gpus: object = "auto"  # auto | cpu | a count | a list of indexes or UUIDs
    cpu_slots: int = 1
    runner: RunnerSettings = field(default_factory=RunnerSettings)
    retries: Backoff = field(default_factory=lambda: Backoff(3, 30.0, 900.0))  # infrastructure failures
    posting: Backoff = field(default_factory=lambda: Backoff(10, 5.0, 600.0))  # GitHub unavailable
    fork_label: str = "safe-to-test"
    private_badges: bool = False  # serve badges and job pages of private repositories too
    retention_days: float = 14.0
    history: bool = True  # merged pull requests' results are kept (docs/history.md)
    history_url: str | None = None  # None: in the job database (SQLite); else postgresql://... shared by hosts
    secrets: Secrets = field(default_factory=Secrets, repr=False)

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host or "127.0.0.1", int(port)

    @property
    def db_path(self) -> Path:
        return Path(self.state_dir) / "jobs.sqlite3"

    @property
    def history_location(self) -> str:
        return self.history_url or str(self.db_path)

    @property
    def jobs_dir(self) -> Path:
        return Path(self.state_dir) / "jobs"

    def private_paths(self) -> list[str]:
        """What a job must never see: the state folder (database, other jobs), the secret files and the
        folder systemd keeps credentials in, this configuration file."""
        paths = [self.state_dir, *self.secrets.files, os.environ.get("CREDENTIALS_DIRECTORY", "")]
        if self.path and os.path.isfile(self.path):
            paths.append(self.path)
        return [os.path.abspath(p) for p in paths if p]


_POS_INT = {"type": "integer", "exclusiveMinimum": 0}
_POS = {"type": "number", "exclusiveMinimum": 0}
_STR = {"type": "string"}
_BACKOFF = {
    "type": "object",
    "properties": {"attempts": _POS_INT, "base_delay_s": _POS, "max_delay_s": _POS},
    "additionalProperties": False,
}


def _section(**properties) -> dict:
    return {"type": "object", "properties": properties, "additionalProperties": False}


# the daemon's YAML as a schema (docs/daemon.md); what it cannot say (HOST:PORT, GPUs, sizes, secrets in the
# job environment) is checked in `parse`
SCHEMA = _section(
    listen={"type": ["string", "integer"]},
    public_url=_STR,
    state_dir=_STR,
    webhook=_section(path=_STR, max_body_bytes=_POS_INT, secret_file=_STR),
    github=_section(
        api_url=_STR,
        app_id={"type": ["integer", "string"]},
        private_key_file=_STR,
        check_name=_STR,
        clone_url=_STR,
        retry=_section(attempts=_POS_INT, base_delay_s=_POS, budget_s=_POS),
        min_write_interval_s={"type": "number"},
        min_request_interval_s={"type": "number"},
    ),
    queue=_section(backend={"enum": ["sqlite", "redis"]}, redis_url=_STR, name=_STR, result_key_file=_STR),
    gpus={},
    cpu_slots=_POS_INT,
    runner=_section(
        backend={"enum": ["local", "docker"]},
        timeout_s=_POS,
        command={
            "type": "array",
            "minItems": 1,
            "items": _STR,
            "x-message": "expected a non-empty list of strings",
        },
        env={
            "type": "object",
            "propertyNames": {"pattern": r"^[A-Za-z_]\w*$", "x-message": "{value!r}: expected NAME: value"},
            "additionalProperties": {"type": ["string", "integer", "number"], "x-message": "expected NAME: value"},
        },
        docker=_section(image=_STR, memory=_STR, pids=_POS_INT, tmpfs_size=_STR, url=_STR, user=_STR),
        sandbox=_section(
            enabled={"type": "boolean"},
            memory=_STR,
            pids=_POS_INT,
            tmpfs_size=_STR,
            user={"type": "string", "pattern": r"^\d+(:\d+)?$", "x-message": "expected uid[:gid] (numbers)"},
            bwrap=_STR,
            extra_ro={"type": "array", "items": _STR},
        ),
        log_max_bytes=_POS_INT,
        out_max_bytes=_POS_INT,
        disk_max_bytes=_POS_INT,
    ),
    retries=_BACKOFF,
    posting=_BACKOFF,
    policy=_section(fork_label=_STR),
    badges=_section(private_repos={"type": "boolean"}),
    retention_days=_POS,
    http=_section(max_connections=_POS_INT, request_deadline_s=_POS, max_buffered_bytes=_POS_INT),
    history=_section(enabled={"type": "boolean"}, url=_STR),
)
SCHEMA["x-message"] = "expected a mapping"


def _read_secret_file(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read the {what} file {path}: {e.strerror}") from None


def _unset(value):
    """A key written with no value (`public_url:`) means its default: left out, at every level."""
    if isinstance(value, dict):
        return {k: _unset(v) for k, v in value.items() if v is not None}
    return value


def parse(data, where: str = "daemon.yml", env: Mapping[str, str] | None = None) -> Settings:
    """Settings from the daemon's YAML (a yamlcheck.Document: errors name its lines) or a parsed mapping
    (named WHERE), and ENV (default os.environ); the environment wins."""
    env = os.environ if env is None else env
    doc = data if isinstance(data, yamlcheck.Document) else yamlcheck.Document(where, data)
    doc.data = _unset(doc.data if doc.data is not None else {})
    yamlcheck.check(doc, SCHEMA)
    d = doc.data

    def sec(*keys) -> dict:
        out = d
        for k in keys:
            out = out.get(k) or {}
        return out

    s = Settings(path=doc.path)
    s.listen = str(env.get(ENV_LISTEN) or d.get("listen", s.listen))
    if not re.fullmatch(r"[^:\s]*:\d{1,5}", s.listen) or not 0 <= s.host_port[1] < 65536:
        raise doc.error(("listen",), f"expected HOST:PORT, got {s.listen!r}")
    s.public_url = (d.get("public_url") or "").rstrip("/") or None
    s.state_dir = env.get(ENV_STATE_DIR) or d.get("state_dir", s.state_dir)
    s.gpus = d.get("gpus", "auto")
    v = s.gpus
    if not (
        v in ("auto", "cpu")
        or (isinstance(v, int) and not isinstance(v, bool) and v > 0)
        or (isinstance(v, list) and v and all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in v))
    ):
        raise doc.error(("gpus",), f"expected auto, cpu, a count or a list of GPU indexes/UUIDs, got {v!r}")
    s.cpu_slots = d.get("cpu_slots", s.cpu_slots)
    s.retention_days = float(d.get("retention_days", s.retention_days))

    wh = sec("webhook")
    s.webhook_path = wh.get("path", s.webhook_path)
    if not s.webhook_path.startswith("/"):
        raise doc.error(("webhook", "path"), "must start with /")
    s.max_body_bytes = wh.get("max_body_bytes", s.max_body_bytes)
    secret_file = env.get(ENV_WEBHOOK_SECRET_FILE) or wh.get("secret_file")
    secret = env.get(ENV_WEBHOOK_SECRET) or (_read_secret_file(secret_file, "webhook secret") if secret_file else "")
    s.secrets.webhook = secret.strip().encode()
    if secret_file:
        s.secrets.files.append(secret_file)

    gh, g = sec("github"), s.github
    g.api_url = (env.get(ENV_API_URL) or gh.get("api_url", g.api_url)).rstrip("/")
    app_id = env.get(ENV_APP_ID) or gh.get("app_id")
    if app_id is not None:
        try:
            g.app_id = int(app_id)
        except ValueError:
            raise doc.error(("github", "app_id"), f"must be a number, not {app_id!r}") from None
    key_file = env.get(ENV_APP_KEY_PATH) or gh.get("private_key_file")
    s.secrets.app_private_key = env.get(ENV_APP_KEY) or (
        _read_secret_file(key_file, "GitHub App private key") if key_file else ""
    )
    if key_file:
        s.secrets.files.append(key_file)
    g.check_name = gh.get("check_name", g.check_name)
    g.clone_url = gh.get("clone_url", g.clone_url)
    try:
        g.clone_url.format(repo="o/n", owner="o", name="n")
    except (KeyError, IndexError, ValueError) as e:
        raise doc.error(("github", "clone_url"), f"bad template ({e}); use {{repo}}, {{owner}}, {{name}}") from None
    rt = sec("github", "retry")
    g.retry_attempts = rt.get("attempts", g.retry_attempts)
    g.retry_base_delay_s = float(rt.get("base_delay_s", g.retry_base_delay_s))
    g.retry_budget_s = float(rt.get("budget_s", g.retry_budget_s))
    g.min_write_interval_s = float(gh.get("min_write_interval_s", g.min_write_interval_s))
    g.min_request_interval_s = float(gh.get("min_request_interval_s", g.min_request_interval_s))

    q = sec("queue")
    s.queue.backend = q.get("backend", s.queue.backend)
    s.queue.redis_url = env.get(ENV_REDIS_URL) or q.get("redis_url", s.queue.redis_url)
    s.queue.name = q.get("name", s.queue.name)
    key_file = env.get(ENV_RESULT_KEY_FILE) or q.get("result_key_file")
    result_key = env.get(ENV_RESULT_KEY) or (_read_secret_file(key_file, "result key") if key_file else "")
    s.secrets.result_key = result_key.strip().encode()
    if key_file and not env.get(ENV_RESULT_KEY):
        s.secrets.files.append(key_file)

    h = sec("http")
    s.http = HttpSettings(
        h.get("max_connections", s.http.max_connections),
        float(h.get("request_deadline_s", s.http.request_deadline_s)),
        h.get("max_buffered_bytes", s.http.max_buffered_bytes),
    )

    r = sec("runner")
    s.runner.backend = r.get("backend", s.runner.backend)
    s.runner.timeout_s = float(r.get("timeout_s", s.runner.timeout_s))
    s.runner.command = r.get("command")
    for k in r.get("env", {}):
        if k in SECRET_ENV or k.startswith("KERNALIN_GITHUB_"):
            raise doc.error(("runner", "env", k), "secrets are never passed to jobs", key=True)
    s.runner.env = {k: str(v) for k, v in r.get("env", {}).items()}
    s.runner.log_max_bytes = r.get("log_max_bytes", s.runner.log_max_bytes)
    s.runner.out_max_bytes = r.get("out_max_bytes", s.runner.out_max_bytes)
    s.runner.disk_max_bytes = r.get("disk_max_bytes", s.runner.disk_max_bytes)
    dk, dflt_docker = sec("runner", "docker"), DockerSettings()
    s.runner.docker = DockerSettings(
        dk.get("image", dflt_docker.image),
        dk.get("memory", dflt_docker.memory),
        dk.get("pids", dflt_docker.pids),
        dk.get("tmpfs_size", dflt_docker.tmpfs_size),
        dk.get("url"),
        dk.get("user"),
    )
    b, dflt = sec("runner", "sandbox"), SandboxSettings()
    s.runner.sandbox = SandboxSettings(
        b.get("enabled", dflt.enabled),
        b.get("memory", dflt.memory),
        b.get("pids", dflt.pids),
        b.get("tmpfs_size", dflt.tmpfs_size),
        b.get("user", dflt.user),
        b.get("bwrap", dflt.bwrap),
        [str(x) for x in b.get("extra_ro", [])],
    )
    for key in ("memory", "tmpfs_size"):
        try:
            parse_size(getattr(s.runner.sandbox, key))
        except SandboxError as e:
            raise doc.error(("runner", "sandbox", key), str(e)) from None

    s.retries = _backoff(sec("retries"), s.retries)
    s.posting = _backoff(sec("posting"), s.posting)
    s.fork_label = sec("policy").get("fork_label", s.fork_label)
    s.private_badges = sec("badges").get("private_repos", False)
    hi = sec("history")
    s.history = hi.get("enabled", s.history)
    s.history_url = env.get(ENV_HISTORY_URL) or hi.get("url")
    if s.history_url and not s.history_url.startswith(("postgresql://", "postgres://", "sqlite://")):
        raise doc.error(("history", "url"), "expected postgresql://USER@HOST/DB or sqlite:///PATH")
    return s


def _backoff(m: dict, default: Backoff) -> Backoff:
    return Backoff(
        m.get("attempts", default.attempts),
        float(m.get("base_delay_s", default.base_delay_s)),
        float(m.get("max_delay_s", default.max_delay_s)),
    )


def parse_gpus(text: str):
    """--gpus on the command line: auto, cpu, a count, or indexes/UUIDs separated by commas."""
    text = text.strip()
    if text in ("auto", "cpu"):
        return text
    if text.isdigit():
        if int(text) < 1:
            raise UsageError("gpus: a count must be at least 1", setting="gpus")
        return int(text)
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"gpus: expected auto, cpu, a count or a list, got {text!r}", setting="gpus")
    return [int(t) if t.isdigit() else t for t in items]


def load(path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from PATH (else $KERNALIN_DAEMON_CONFIG, else defaults) and the environment."""
    env = os.environ if env is None else env
    path = path or env.get(ENV_CONFIG)
    if not path:
        return parse({}, "(defaults)", env)
    doc = yamlcheck.load(path, "daemon configuration", empty=None)  # empty: the defaults
    return parse(doc, str(path), env)


def require_serving_secrets(s: Settings) -> None:
    """`serve` refuses to start without what it needs to trust deliveries and to post results."""
    if not s.secrets.webhook:
        raise UsageError(
            f"no webhook secret: set {ENV_WEBHOOK_SECRET} or {ENV_WEBHOOK_SECRET_FILE} (or webhook.secret_file)"
        )
    if s.github.app_id is None or not s.secrets.app_private_key:
        raise UsageError(
            f"no GitHub App: set {ENV_APP_ID} and {ENV_APP_KEY} or {ENV_APP_KEY_PATH} "
            "(or github.app_id and github.private_key_file)"
        )
