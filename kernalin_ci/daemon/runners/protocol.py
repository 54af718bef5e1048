"""The runner protocol and what every backend shares: the request and result, the job's environment, the
capped log, the gate's command line."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kernalin_ci.daemon.gpus import Slot
from kernalin_ci.sandbox import shm_share, size_text

JOB_MARKER = "KERNALIN_DAEMON_JOB"  # in every job process's environment: how leftovers are found
POLL_S = 0.25
LOG_TAIL_BYTES = 8192
# the gate itself; a runner fills the placeholders with paths as the job sees them. "{kernalin}" stands for
# the argv that runs the kernalin_ci package of the daemon's installation in isolated mode (launch.py):
# the checkout is the working directory and must not be able to shadow the tool
GATE_COMMAND = [
    "{kernalin}",
    "run",
    "--config",
    "{config}",
    "--base",
    "{base}",
    "--head",
    "{head}",
    "--out",
    "{out}",
    "--device",
    "{device}",
    "--quiet",
]
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

    def argv(self, kernalin: list[str], **paths: str) -> list[str]:
        """The command with its placeholders filled; KERNALIN is the argv prefix that runs kernalin_ci."""
        values = {"base": self.base_sha, "head": self.head_sha, "device": self.slot.device, **paths}
        out: list[str] = []
        for part in self.command or GATE_COMMAND:
            out += kernalin if part == "{kernalin}" else [part.format(**values)]
        return out


@dataclass
class RunResult:
    exit_code: int | None  # None: it never ran, or was killed
    seconds: float
    log_tail: str = ""
    stopped: str | None = None  # the stop reason, when it was stopped
    timed_out: bool = False
    infra_error: str | None = None  # the engine failed (not the job): worth another try
    oom_killed: bool = False
    job_error: str | None = None  # the job broke a cap the runner enforces (its disk, its out/): it failed


# a job's writable file system with less free space than this after the job: it hit the disk cap
DISK_FULL_BELOW = 64 * 1024


def disk_full_message(cap: int) -> str:

    return (
        f"disk cap {size_text(cap)} reached (runner.disk_max_bytes): the job filled its writable space "
        f"(its checkout, out/, HOME and /tmp, or /dev/shm, which has {size_text(shm_share(cap))} of the cap); "
        f"nothing of it reached the host's disk"
    )


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
    env.update(
        {
            "HOME": home,
            "TMPDIR": tmp,
            "XDG_CACHE_HOME": f"{home}/.cache",
            "TRITON_CACHE_DIR": f"{home}/.triton",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            JOB_MARKER: req.job_id,
        }
    )
    # the kernel workers inside the job get a sandbox of their own (nested in the local runner's; required in a
    # job: kernalin_ci/sandbox/), unless the daemon's runner.env says otherwise
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


class CappedLog:
    """A job's output into job.log: the first MAX_BYTES, then a note of how much was dropped and the
    last LOG_TAIL_BYTES. The tail the daemon posts comes from memory, never from re-reading the file."""

    def __init__(self, f, max_bytes: int):
        self.f, self.max_bytes = f, max_bytes
        self.written = 0
        self.dropped = 0
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._closed = False

    def pump(self, stream) -> None:
        with stream:
            while True:
                chunk = stream.read1(65536)
                if not chunk:
                    return
                self._add(chunk)

    def _add(self, chunk: bytes) -> None:
        with self._lock:
            if self._closed:
                return
            self._tail += chunk
            del self._tail[:-LOG_TAIL_BYTES]
            room = max(self.max_bytes - self.written, 0)
            if room:
                self.f.write(chunk[:room])
                self.f.flush()  # job.log is live: someone may follow it while the job runs
                self.written += min(room, len(chunk))
            self.dropped += max(len(chunk) - room, 0)

    def note(self, text: str | bytes) -> None:
        self._add(text.encode() if isinstance(text, str) else text)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self.dropped:
                self.f.write(
                    f"\n[kernalin-ci daemon: {self.dropped} bytes of output over the {self.max_bytes}-byte "
                    f"log limit were dropped; the last {len(self._tail)} bytes follow]\n".encode()
                )
                self.f.write(bytes(self._tail))
            self.f.flush()

    def tail(self) -> str:
        return bytes(self._tail).decode("utf-8", "replace")
