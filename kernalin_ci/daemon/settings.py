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

import yaml

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

    max_connections: int = 64  # connections handled at once; more wait in the kernel's backlog
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


_KEYS = {
    "": (
        "listen",
        "public_url",
        "state_dir",
        "webhook",
        "github",
        "queue",
        "gpus",
        "cpu_slots",
        "runner",
        "retries",
        "posting",
        "policy",
        "badges",
        "retention_days",
        "http",
        "history",
    ),
    "http": ("max_connections", "request_deadline_s", "max_buffered_bytes"),
    "webhook": ("path", "max_body_bytes", "secret_file"),
    "github": (
        "api_url",
        "app_id",
        "private_key_file",
        "check_name",
        "clone_url",
        "retry",
        "min_write_interval_s",
        "min_request_interval_s",
    ),
    "github.retry": ("attempts", "base_delay_s", "budget_s"),
    "queue": ("backend", "redis_url", "name", "result_key_file"),
    "runner": (
        "backend",
        "timeout_s",
        "command",
        "env",
        "docker",
        "sandbox",
        "log_max_bytes",
        "out_max_bytes",
        "disk_max_bytes",
    ),
    "runner.sandbox": ("enabled", "memory", "pids", "tmpfs_size", "user", "bwrap", "extra_ro"),
    "runner.docker": ("image", "memory", "pids", "tmpfs_size", "url", "user"),
    "retries": ("attempts", "base_delay_s", "max_delay_s"),
    "posting": ("attempts", "base_delay_s", "max_delay_s"),
    "policy": ("fork_label",),
    "badges": ("private_repos",),
    "history": ("enabled", "url"),
}


class _Reader:
    """Typed access to one mapping of the YAML; errors name the file and the dotted key."""

    def __init__(self, where: str, data, key: str):
        self.where, self.key = where, key
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise self.err(key, "expected a mapping")
        for k in data:
            if k not in _KEYS[key]:
                raise self.err(self.dot(k), f"unknown key (allowed: {', '.join(_KEYS[key])})")
        self.data = data

    def dot(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key else name

    def err(self, key: str, msg: str) -> UsageError:
        return UsageError(f"{self.where}: {key or '(top level)'}: {msg}")

    def sub(self, name: str) -> _Reader:
        return _Reader(self.where, self.data.get(name), self.dot(name))

    def get(self, name: str, kind, default):
        if name not in self.data or self.data[name] is None:
            return default
        v = self.data[name]
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, kind) or (kind is not bool and isinstance(v, bool)):
            raise self.err(self.dot(name), f"expected {getattr(kind, '__name__', 'a number')}, got {v!r}")
        return v

    def positive(self, name: str, kind, default):
        v = self.get(name, kind, default)
        if v is not None and v <= 0:
            raise self.err(self.dot(name), "must be positive")
        return v

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        v = self.get(name, str, default)
        if v not in choices:
            raise self.err(self.dot(name), f"must be one of {', '.join(choices)}, not {v!r}")
        return v


def _backoff(r: _Reader, default: Backoff) -> Backoff:
    return Backoff(
        r.positive("attempts", int, default.attempts),
        r.positive("base_delay_s", float, default.base_delay_s),
        r.positive("max_delay_s", float, default.max_delay_s),
    )


def _read_secret_file(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read the {what} file {path}: {e.strerror}") from None


def parse(data, where: str = "daemon.yml", env: Mapping[str, str] | None = None) -> Settings:
    """Settings from a parsed YAML mapping and ENV (default os.environ); the environment wins."""
    env = os.environ if env is None else env
    top = _Reader(where, data, "")
    s = Settings(path=where)
    s.listen = str(env.get(ENV_LISTEN) or top.get("listen", (str, int), s.listen))
    if not re.fullmatch(r"[^:\s]*:\d{1,5}", s.listen) or not 0 <= s.host_port[1] < 65536:
        raise top.err("listen", f"expected HOST:PORT, got {s.listen!r}")
    s.public_url = (top.get("public_url", str, None) or "").rstrip("/") or None
    s.state_dir = env.get(ENV_STATE_DIR) or top.get("state_dir", str, s.state_dir)
    s.gpus = top.data.get("gpus", "auto")
    _check_gpus(top, s.gpus)
    s.cpu_slots = top.positive("cpu_slots", int, s.cpu_slots)
    s.retention_days = top.positive("retention_days", float, s.retention_days)

    wh = top.sub("webhook")
    s.webhook_path = wh.get("path", str, s.webhook_path)
    if not s.webhook_path.startswith("/"):
        raise wh.err("webhook.path", "must start with /")
    s.max_body_bytes = wh.positive("max_body_bytes", int, s.max_body_bytes)
    secret_file = env.get(ENV_WEBHOOK_SECRET_FILE) or wh.get("secret_file", str, None)
    secret = env.get(ENV_WEBHOOK_SECRET) or (_read_secret_file(secret_file, "webhook secret") if secret_file else "")
    s.secrets.webhook = secret.strip().encode()
    if secret_file:
        s.secrets.files.append(secret_file)

    gh = top.sub("github")
    g = s.github
    g.api_url = (env.get(ENV_API_URL) or gh.get("api_url", str, g.api_url)).rstrip("/")
    app_id = env.get(ENV_APP_ID) or gh.get("app_id", (int, str), None)
    if app_id is not None:
        try:
            g.app_id = int(app_id)
        except ValueError:
            raise gh.err("github.app_id", f"must be a number, not {app_id!r}") from None
    key_file = env.get(ENV_APP_KEY_PATH) or gh.get("private_key_file", str, None)
    s.secrets.app_private_key = env.get(ENV_APP_KEY) or (
        _read_secret_file(key_file, "GitHub App private key") if key_file else ""
    )
    if key_file:
        s.secrets.files.append(key_file)
    g.check_name = gh.get("check_name", str, g.check_name)
    g.clone_url = gh.get("clone_url", str, g.clone_url)
    try:
        g.clone_url.format(repo="o/n", owner="o", name="n")
    except (KeyError, IndexError, ValueError) as e:
        raise gh.err("github.clone_url", f"bad template ({e}); use {{repo}}, {{owner}}, {{name}}") from None
    rt = gh.sub("retry")
    g.retry_attempts = rt.positive("attempts", int, g.retry_attempts)
    g.retry_base_delay_s = rt.positive("base_delay_s", float, g.retry_base_delay_s)
    g.retry_budget_s = rt.positive("budget_s", float, g.retry_budget_s)
    g.min_write_interval_s = gh.get("min_write_interval_s", float, g.min_write_interval_s)
    g.min_request_interval_s = gh.get("min_request_interval_s", float, g.min_request_interval_s)

    q = top.sub("queue")
    s.queue.backend = q.choice("backend", ("sqlite", "redis"), s.queue.backend)
    s.queue.redis_url = env.get(ENV_REDIS_URL) or q.get("redis_url", str, s.queue.redis_url)
    s.queue.name = q.get("name", str, s.queue.name)
    key_file = env.get(ENV_RESULT_KEY_FILE) or q.get("result_key_file", str, None)
    result_key = env.get(ENV_RESULT_KEY) or (_read_secret_file(key_file, "result key") if key_file else "")
    s.secrets.result_key = result_key.strip().encode()
    if key_file and not env.get(ENV_RESULT_KEY):
        s.secrets.files.append(key_file)

    h = top.sub("http")
    s.http = HttpSettings(
        h.positive("max_connections", int, s.http.max_connections),
        h.positive("request_deadline_s", float, s.http.request_deadline_s),
        h.positive("max_buffered_bytes", int, s.http.max_buffered_bytes),
    )

    r = top.sub("runner")
    s.runner.backend = r.choice("backend", ("local", "docker"), s.runner.backend)
    s.runner.timeout_s = r.positive("timeout_s", float, s.runner.timeout_s)
    cmd = r.get("command", list, None)
    if cmd is not None and (not cmd or not all(isinstance(a, str) for a in cmd)):
        raise r.err("runner.command", "expected a non-empty list of strings")
    s.runner.command = cmd
    job_env = r.get("env", dict, {})
    for k, v in job_env.items():
        if not isinstance(k, str) or not isinstance(v, (str, int, float)) or not re.fullmatch(r"[A-Za-z_]\w*", k):
            raise r.err(f"runner.env.{k}", "expected NAME: value")
        if k in SECRET_ENV or k.startswith("KERNALIN_GITHUB_"):
            raise r.err(f"runner.env.{k}", "secrets are never passed to jobs")
    s.runner.env = {k: str(v) for k, v in job_env.items()}
    s.runner.log_max_bytes = r.positive("log_max_bytes", int, s.runner.log_max_bytes)
    s.runner.out_max_bytes = r.positive("out_max_bytes", int, s.runner.out_max_bytes)
    s.runner.disk_max_bytes = r.positive("disk_max_bytes", int, s.runner.disk_max_bytes)
    d = r.sub("docker")
    s.runner.docker = DockerSettings(
        d.get("image", str, s.runner.docker.image),
        d.get("memory", str, "16g"),
        d.positive("pids", int, 4096),
        d.get("tmpfs_size", str, "8g"),
        d.get("url", str, None),
        d.get("user", str, None),
    )
    b, dflt = r.sub("sandbox"), SandboxSettings()
    s.runner.sandbox = SandboxSettings(
        b.get("enabled", bool, dflt.enabled),
        b.get("memory", str, dflt.memory),
        b.positive("pids", int, dflt.pids),
        b.get("tmpfs_size", str, dflt.tmpfs_size),
        b.get("user", str, dflt.user),
        b.get("bwrap", str, dflt.bwrap),
        [str(x) for x in b.get("extra_ro", list, [])],
    )
    for key in ("memory", "tmpfs_size"):
        try:
            parse_size(getattr(s.runner.sandbox, key))
        except SandboxError as e:
            raise b.err(f"runner.sandbox.{key}", str(e)) from None
    if not re.fullmatch(r"\d+(:\d+)?", s.runner.sandbox.user):
        raise b.err("runner.sandbox.user", "expected uid[:gid] (numbers)")

    s.retries = _backoff(top.sub("retries"), s.retries)
    s.posting = _backoff(top.sub("posting"), s.posting)
    s.fork_label = top.sub("policy").get("fork_label", str, s.fork_label)
    s.private_badges = top.sub("badges").get("private_repos", bool, False)
    hi = top.sub("history")
    s.history = hi.get("enabled", bool, s.history)
    s.history_url = env.get(ENV_HISTORY_URL) or hi.get("url", str, None)
    if s.history_url and not s.history_url.startswith(("postgresql://", "postgres://", "sqlite://")):
        raise hi.err("history.url", "expected postgresql://USER@HOST/DB or sqlite:///PATH")
    return s


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


def _check_gpus(top: _Reader, v) -> None:
    ok = (
        v in ("auto", "cpu")
        or (isinstance(v, int) and not isinstance(v, bool) and v > 0)
        or (isinstance(v, list) and v and all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in v))
    )
    if not ok:
        raise top.err("gpus", f"expected auto, cpu, a count or a list of GPU indexes/UUIDs, got {v!r}")


def load(path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from PATH (else $KERNALIN_DAEMON_CONFIG, else defaults) and the environment."""
    env = os.environ if env is None else env
    path = path or env.get(ENV_CONFIG)
    if not path:
        return parse({}, "(defaults)", env)
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UsageError(f"{p}: cannot read the daemon configuration: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise UsageError(
            f"{p}:{mark.line + 1 if mark else 1}: not valid YAML: {getattr(e, 'problem', None) or e}"
        ) from None
    return parse(data, str(p), env)


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
