"""Runner backends: where a job's command runs. One short protocol, one module per backend.

    local   a subprocess in the job's checkout, in its own session (killed as a group)
    docker  a container of the kernalin image: no network, the checkout read-only, memory and pid
            limits, the GPU by a device request, removed afterwards

A runner gets a RunRequest and a `stop_reason()` callable it polls (a newer push cancelled the
job, or the daemon is stopping) and returns a RunResult. It never sees a secret: the job's
environment is built from nothing (`job_env`), not inherited.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from kernalin_ci.daemon.gpus import Slot

JOB_MARKER = "KERNALIN_DAEMON_JOB"  # in every job process's environment: how leftovers are found
POLL_S = 0.25
LOG_TAIL_BYTES = 8192
# the gate itself; a runner fills the placeholders with paths as the job sees them
GATE_COMMAND = ["{python}", "-m", "kernalin_ci", "run", "--config", "{config}", "--base", "{base}", "--head", "{head}",
                "--out", "{out}", "--device", "{device}", "--quiet"]
# inherited from the daemon when set: nothing else is (no tokens, no App key, no webhook secret)
PASS_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH")


@dataclass
class RunRequest:
    job_id: str
    job_dir: Path
    repo: Path  # the checkout at the PR head (base configuration in place)
    out: Path
    base_sha: str
    head_sha: str
    slot: Slot
    timeout_s: float
    command: list[str] | None = None  # None: GATE_COMMAND
    env: dict[str, str] = field(default_factory=dict)  # runner.env from the daemon's configuration

    @property
    def log(self) -> Path:
        return self.job_dir / "job.log"

    def argv(self, **paths: str) -> list[str]:
        values = {"base": self.base_sha, "head": self.head_sha, "device": self.slot.device, **paths}
        return [part.format(**values) for part in (self.command or GATE_COMMAND)]


@dataclass
class RunResult:
    exit_code: int | None  # None: it never ran, or was killed
    seconds: float
    log_tail: str = ""
    stopped: str | None = None  # the stop reason, when it was stopped
    timed_out: bool = False
    infra_error: str | None = None  # the engine failed (not the job): worth another try
    oom_killed: bool = False


StopReason = Callable[[], "str | None"]


class Runner(Protocol):
    name: str

    def run(self, req: RunRequest, stop_reason: StopReason, on_start: Callable[[int | None], None]) -> RunResult:
        """Run REQ to the end, a timeout, or until stop_reason() says why to stop."""

    def cleanup(self, job_id: str) -> int:
        """Stop and remove whatever a dead daemon left running for JOB_ID; how many things it removed."""


def job_env(req: RunRequest, *, home: str, tmp: str, visible: str | None) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    env.update(req.env)
    env.update({"HOME": home, "TMPDIR": tmp, "XDG_CACHE_HOME": f"{home}/.cache",
                "TRITON_CACHE_DIR": f"{home}/.triton", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                JOB_MARKER: req.job_id})
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def tail(path: Path, n: int = LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - n, 0))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def get_runner(settings) -> Runner:
    """The backend named in settings.runner.backend."""
    if settings.runner.backend == "docker":
        from kernalin_ci.daemon.runners.docker import DockerRunner

        return DockerRunner(settings.runner.docker)
    from kernalin_ci.daemon.runners.local import LocalRunner

    return LocalRunner(settings.runner.sandbox, hide=settings.private_paths())
