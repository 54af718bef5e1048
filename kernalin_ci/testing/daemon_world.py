"""A local world for running the daemon end to end without GitHub: the GitHub stand-in (which
checks every request against GitHub's OpenAPI description) with the daemon registered as a
GitHub App, real git repositories served from a directory (`file://` clone URLs), signed
deliveries, and `kernalin-ci serve` as a real process. Used by tests/test_daemon*.py,
benchmarks/daemon_load.py and benchmarks/daemon_gpu.py; needs the test extra (the stand-in).

    world = World(tmp_path).start()
    repo = world.add_repo("acme/kernels", {"kernels/k.py": "..."})      # base commit on main
    head = repo.commit({"kernels/k.py": "..."}, branch="pr-7")
    payload = world.pull_request("acme/kernels", 7, head, repo.main)
    cfg = world.daemon_config(runner={"command": fake_gate_command(tmp_path)})
    proc = ServeProcess(world, cfg).start();  proc.deliver("pull_request", payload)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kernalin_ci.daemon.deliver import deliver, get_json
from kernalin_ci.daemon.settings import parse
from kernalin_ci.testing.github_standin import GitHubStandIn
from kernalin_ci.testing.payloads import pull_request_event

APP_ID = 424242
INSTALLATION_ID = 9090
WEBHOOK_SECRET = "whsec-kernalin-test-0123456789"
GIT_ID = ["-c", "user.name=kernalin-test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]


def git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", *GIT_ID, *args], cwd=repo, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


def app_key() -> tuple[str, str]:
    """(private PEM, public PEM) of a fresh RSA key for the App."""
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


class GitRepo:
    """A working repository whose pushes go to a bare 'remote' the daemon fetches from."""

    def __init__(self, work: Path, remote: Path):
        self.work, self.remote = work, remote
        self.main = ""

    def commit(
        self, files: dict[str, str | None], message: str = "change", *, branch: str = "main", start: str = "main"
    ) -> str:
        """Commit FILES (None deletes one) on BRANCH (made from START if new), push it; the new sha."""
        existing = git(self.work, "branch", "--list", branch)
        git(self.work, "checkout", "-q", branch if existing else "-b", *([] if existing else [branch, start]))
        for rel, text in files.items():
            p = self.work / rel
            if text is None:
                p.unlink()
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "--allow-empty", "-m", message)
        git(self.work, "push", "-q", "origin", f"{branch}:{branch}")
        sha = git(self.work, "rev-parse", "HEAD")
        if branch == "main":
            self.main = sha
        return sha


class World:
    def __init__(self, root: Path, standin: GitHubStandIn | None = None):
        self.root = Path(root)
        self.standin = standin
        self._own_standin = standin is None
        self.private_key, self.public_key = app_key()
        self.repos: dict[str, GitRepo] = {}

    def start(self) -> World:
        if self.standin is None:
            self.standin = GitHubStandIn().start()
        self.standin.add_app(APP_ID, self.public_key)
        (self.root / "remotes").mkdir(parents=True, exist_ok=True)
        return self

    def stop(self) -> None:
        if self._own_standin and self.standin:
            self.standin.stop()

    @property
    def clone_url(self) -> str:
        return f"file://{self.root}/remotes/{{repo}}.git"

    def add_repo(self, full_name: str, files: dict[str, str] | None = None, *, source: Path | None = None) -> GitRepo:
        """A repository with a first commit on main (FILES, or a copy of the directory SOURCE)."""
        remote = self.root / "remotes" / f"{full_name}.git"
        work = self.root / "work" / full_name
        remote.parent.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
        git(work, "init", "-q", "-b", "main")
        git(work, "remote", "add", "origin", str(remote))
        repo = GitRepo(work, remote)
        if source is not None:
            subprocess.run(["cp", "-r", f"{source}/.", str(work)], check=True)
        for rel, text in (files or {}).items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        git(work, "add", "-A")
        git(work, "commit", "-qm", "base")
        git(work, "push", "-q", "origin", "main:main")
        repo.main = git(work, "rev-parse", "HEAD")
        self.repos[full_name] = repo
        self.standin.add_repo(full_name)
        self.standin.add_installation(INSTALLATION_ID, APP_ID, list(self.repos))
        return repo

    def pull_request(
        self,
        repo: str,
        number: int,
        head_sha: str,
        base_sha: str,
        *,
        action: str = "opened",
        fork: str | None = None,
        label: str | None = None,
    ) -> dict:
        """A pull_request payload (GitHub's webhook shape), the PR registered with the stand-in."""
        self.standin.add_pull_request(repo, number, head_sha=head_sha, base_sha=base_sha, head_repo=fork)
        ev = pull_request_event(
            action=action,
            repo=repo,
            number=number,
            head_sha=head_sha,
            base_sha=base_sha,
            head_repo=fork,
            installation_id=INSTALLATION_ID,
        )
        if label is not None:
            ev["label"] = {
                "id": 7100001,
                "node_id": "LA_kwDOlabel",
                "url": f"https://api.github.com/repos/{repo}/labels/{label}",
                "name": label,
                "color": "0e8a16",
                "default": False,
                "description": "a maintainer read this fork's change",
            }
            ev["pull_request"]["labels"] = [ev["label"]]
        return ev

    def daemon_config(self, state_dir: Path, **overrides) -> dict:
        """The daemon's YAML (as a dict) for this world; OVERRIDES replace top-level sections."""
        cfg = {
            "listen": "127.0.0.1:0",
            "state_dir": str(state_dir),
            "gpus": "cpu",
            "cpu_slots": 1,
            "github": {
                "api_url": self.standin.base_url,
                "app_id": APP_ID,
                "clone_url": self.clone_url,
                "min_write_interval_s": 0.0,
                "min_request_interval_s": 0.0,
                "retry": {"attempts": 4, "base_delay_s": 0.05, "budget_s": 10},
            },
            "retries": {"attempts": 3, "base_delay_s": 0.2, "max_delay_s": 1},
            "posting": {"attempts": 5, "base_delay_s": 0.2, "max_delay_s": 1},
        }
        cfg.update(overrides)
        queue = cfg.get("queue") or {}
        if queue.get("backend") == "redis" and "result_key_file" not in queue:  # shared by serve and workers
            key = self.root / "result.key"
            if not key.exists():
                key.write_text(os.urandom(24).hex())
                key.chmod(0o600)
            cfg["queue"] = {**queue, "result_key_file": str(key)}
        return cfg

    def secret_env(self) -> dict[str, str]:
        return {"KERNALIN_WEBHOOK_SECRET": WEBHOOK_SECRET, "KERNALIN_GITHUB_APP_PRIVATE_KEY": self.private_key}


def settings_for(world: World, cfg: dict):
    """Settings as `serve` would build them from CFG and the secret environment."""

    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNALIN_")}
    env.update(world.secret_env())
    return parse(cfg, "test-daemon.yml", env)


def fake_gate_command() -> list[str]:
    """A stand-in for `kernalin-ci run` (runner.command) for queue, scheduler and load tests
    (kernalin_ci/testing/fake_gate.py); it runs inside the job's sandbox like the real gate."""
    return ["{python}", "-m", "kernalin_ci.testing.fake_gate", "{out}", "{base}", "{head}", "{device}"]


def job_started(job_dir: Path) -> bool:
    """Whether the fake gate of the job in JOB_DIR has started: its line in job.log, which the runner
    writes as the job runs (the job's out/ reaches the host only when it ends)."""
    try:
        return "kernalin-fake-gate: started" in (job_dir / "job.log").read_text(errors="replace")
    except OSError:
        return False


class ServeProcess:
    """`kernalin-ci serve` in a child process (its own session), for kill -9 and load tests."""

    def __init__(self, world: World, cfg: dict, *, extra_env: dict | None = None, python: str = sys.executable):
        self.world, self.cfg = world, cfg
        self.path = Path(cfg["state_dir"]).parent / f"{Path(cfg['state_dir']).name}.yml"
        self.extra_env = extra_env or {}
        self.python = python
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log = Path(cfg["state_dir"]).parent / f"{Path(cfg['state_dir']).name}.log"

    def start(self, timeout: float = 60) -> ServeProcess:
        self.path.write_text(yaml.safe_dump(self.cfg))
        env = {k: v for k, v in os.environ.items() if not k.startswith("KERNALIN_")}
        env.update(self.world.secret_env())
        env.update(self.extra_env)
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [self.python, "-m", "kernalin_ci", "serve", "--config", str(self.path)],
            stdout=subprocess.PIPE,
            stderr=self._logf,
            env=env,
            start_new_session=True,
        )
        end = time.monotonic() + timeout
        line = b""
        while time.monotonic() < end:
            line = self.proc.stdout.readline()
            if b"listening on" in line or not line:
                break
        if b"listening on" not in line:
            self.stop()
            raise RuntimeError(f"serve did not start: {self.log.read_text()[-2000:]}")
        self.url = line.decode().split("listening on", 1)[1].strip()
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def deliver(self, event: str, payload, **kw):
        return deliver(self.url + "/webhook", event, payload, WEBHOOK_SECRET, **kw)

    def get(self, path: str):
        return get_json(self.url + path)

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the daemon and, like a crash of the host's unit, its children
        self.proc.wait()

    def kill9_daemon_only(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if getattr(self, "_logf", None):
            self._logf.close()
        return self.proc.returncode if self.proc else None


def wait_job(
    get, job_id: str, states=("done", "failed", "cancelled"), timeout: float = 120, posted: bool = True
) -> dict:
    """Poll GET /jobs/JOB_ID until it is in one of STATES (and posted, when POSTED)."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        status, last = get(f"/jobs/{job_id}")
        if (
            status == 200
            and last["state"] in states
            and (not posted or last["post_state"] in ("posted", "none", "failed"))
        ):
            return last
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} did not finish in {timeout} s: {json.dumps(last)}")
