"""The local runner: the job's command as a subprocess in the job's checkout, inside the sandbox.

By default the job runs under bubblewrap (kernalin_ci/sandbox/): its own PID, network and
user namespaces, an allowlisted read-only file system, an unprivileged uid, and a cgroup with
memory and process caps. Nothing of the host is writable: the job's files (its checkout, copied in
by daemon/jobwrap.py, out/, HOME, /tmp) live on the sandbox's tmpfs of runner.disk_max_bytes, and
out/ comes back at the end through a pipe, read up to runner.out_max_bytes (daemon/outstream.py).
When the sandbox's first process ends, or the daemon dies, the kernel kills everything the job
started; stopping, a timeout, or a restart after a crash also kill what is left in the job's cgroup.

With `runner.sandbox.enabled: false` (trusted repositories only) the process starts in a session
of its own with a parent-death signal (`setpriv --pdeathsig KILL`, where util-linux has it), and
cleanup finds its processes by the job's marker in their environment.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from kernalin_ci import sandbox
from kernalin_ci.daemon import outstream, safefile
from kernalin_ci.daemon.runners.protocol import (
    DISK_FULL_BELOW,
    JOB_MARKER,
    POLL_S,
    CappedLog,
    RunRequest,
    RunResult,
    StopReason,
    disk_full_message,
    job_env,
)
from kernalin_ci.device import DEVICES
from kernalin_ci.launch import module_argv


def marked_pids(job_id: str) -> list[int]:
    """Processes whose environment carries JOB_MARKER=JOB_ID (readable ones: this user's)."""
    needle = f"{JOB_MARKER}={job_id}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(entry.name))
        except OSError:
            continue
    return out


def kill_marked(job_id: str) -> int:
    """SIGKILL every process of JOB_ID; how many there were."""
    pids = [p for p in marked_pids(job_id) if p != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


class LocalRunner:
    name = "local"

    def __init__(
        self,
        sandbox_settings: sandbox.SandboxSettings | None = None,
        hide: list[str] = (),
        log_max_bytes: int = 16 * 1024 * 1024,
        disk_max_bytes: int = 8 << 30,
        out_max_bytes: int = 256 << 20,
    ):
        self._setpriv = shutil.which("setpriv")
        self.sandbox = sandbox_settings or sandbox.SandboxSettings()
        self.hide = list(hide)  # the daemon's private paths, masked inside the sandbox
        self.log_max_bytes = log_max_bytes
        self.disk_max_bytes, self.out_max_bytes = disk_max_bytes, out_max_bytes

    def run(self, req: RunRequest, stop_reason: StopReason, on_start) -> RunResult:
        try:
            log = safefile.append(req.log, req.job_dir)
        except OSError as e:
            return RunResult(None, 0.0, infra_error=f"cannot open the job's log: {e}")
        # the gate runs isolated (python -I, the daemon's kernalin_ci first): the checkout cannot shadow it
        gate = module_argv("kernalin_ci", cwd=req.repo)
        with log:
            capture = CappedLog(log, self.log_max_bytes)
            preexec, cwd, handback = None, req.repo, None
            if self.sandbox.enabled:
                # the job's files on the sandbox's tmpfs of disk_max_bytes; out/ comes back through a pipe
                try:
                    plan = sandbox.prepare(
                        self.sandbox,
                        req.job_id,
                        [],
                        sandbox.gpu_device_nodes(req.slot.visible) if DEVICES[req.slot.device].gpu else [],
                        hide=self.hide,
                        disk=self.disk_max_bytes,
                        checkout=req.repo,
                    )
                except sandbox.SandboxError as e:
                    return RunResult(None, 0.0, infra_error=f"cannot start the job's sandbox: {e}")
                handback = os.pipe()
                repo, out = f"{plan.job}/repo", f"{plan.job}/out"
                argv = req.argv(gate, python=sys.executable, config=f"{repo}/.kernalin.yml", out=out, repo=repo)
                wrap = module_argv("kernalin_ci.daemon.jobwrap", cwd=req.repo)
                argv = [*plan.argv_prefix, *wrap, sandbox.CHECKOUT_DIR, plan.job, str(handback[1]), "--", *argv]
                preexec, cwd = plan.preexec, req.job_dir
                home, tmp = plan.home, plan.tmp
                capture.note(f"kernalin-ci daemon: sandbox: {sandbox.describe(plan)}\n")
            else:
                argv = req.argv(
                    gate,
                    python=sys.executable,
                    config=str(req.repo / ".kernalin.yml"),
                    out=str(req.out),
                    repo=str(req.repo),
                )
                home, tmp = str(req.job_dir / "home"), str(req.job_dir / "tmp")
                for d in (home, tmp):
                    os.makedirs(d, exist_ok=True)
                if self._setpriv:
                    argv = [self._setpriv, "--pdeathsig", "KILL", "--", *argv]
            env = job_env(req, home=home, tmp=tmp, visible=req.slot.visible)
            t0 = time.monotonic()
            try:  # the output comes through a pipe, so job.log keeps at most log_max_bytes of it
                proc = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=preexec,
                    pass_fds=handback[1:] if handback else (),
                )
            except (OSError, subprocess.SubprocessError) as e:
                sandbox.cleanup(req.job_id)
                if handback:
                    os.close(handback[0])
                    os.close(handback[1])
                return RunResult(None, 0.0, infra_error=f"cannot start the job: {e}")
            reader = threading.Thread(target=capture.pump, args=(proc.stdout,), name=f"log-{req.job_id}", daemon=True)
            reader.start()
            received: dict = {}
            if handback:
                os.close(handback[1])  # the job holds the only writing end: EOF when it is gone
                receiver = threading.Thread(
                    target=_receive_out,
                    args=(handback[0], req.out, self.out_max_bytes, received),
                    name=f"out-{req.job_id}",
                    daemon=True,
                )
                receiver.start()
            on_start(proc.pid)
            stopped, timed_out = None, False
            try:
                while True:
                    try:
                        proc.wait(POLL_S)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    stopped = stop_reason()
                    timed_out = time.monotonic() - t0 > req.timeout_s
                    if stopped or timed_out:
                        break
            finally:
                _kill_group(proc.pid)  # the job's own session (its process may be non-dumpable: no marker read)
                kill_marked(req.job_id)  # the job, and anything it left behind in sessions of its own
                if preexec is not None:
                    sandbox.kill_cgroup(req.job_id)
                code = proc.wait()
                oom = preexec is not None and sandbox.oom_killed(req.job_id)
                sandbox.remove_cgroup(req.job_id)
            reader.join(5)
            seconds = time.monotonic() - t0
            job_error = None
            if handback:
                receiver.join(60)
                if not (stopped or timed_out):
                    job_error = self._handback_error(received, receiver.is_alive(), req)
            if timed_out:
                capture.note(f"\nkernalin-ci daemon: the job ran past {req.timeout_s:.0f} s and was killed\n")
            elif job_error:
                capture.note(f"\nkernalin-ci daemon: {job_error}\n")
            capture.close()
        return RunResult(
            None if (stopped or timed_out) else code,
            seconds,
            capture.tail(),
            stopped=stopped,
            timed_out=timed_out,
            oom_killed=oom,
            job_error=job_error,
        )

    def _handback_error(self, received: dict, stuck: bool, req: RunRequest) -> str | None:
        """Why the job failed for its disk or its out/ stream (None: it did not); a refused out/ is removed."""
        error = "its out/ stream did not end" if stuck else received.get("error")
        if error:
            safefile.remove(req.out)
            req.out.mkdir()
        free = received.get("free")
        if isinstance(free, int) and free < DISK_FULL_BELOW:
            return disk_full_message(self.disk_max_bytes)
        return f"out/ refused: {error}" if error else None

    def cleanup(self, job_id: str) -> int:
        return kill_marked(job_id) + sandbox.cleanup(job_id)


def _receive_out(fd: int, dest, max_bytes: int, received: dict) -> None:
    """Read the job's hand-back pipe (jobwrap.py): a status line, then out/ as a tar stream into DEST."""
    with os.fdopen(fd, "rb") as f:
        try:
            line = f.readline(4096)
            if not line:
                received["error"] = "the job ended without handing it back"
                return
            status = json.loads(line)
            if not isinstance(status, dict) or not isinstance(status.get("free"), int):
                raise ValueError
            received["free"] = status["free"]
            outstream.unpack(f, dest, max_bytes)
        except outstream.BadOutput as e:
            received["error"] = str(e)
        except ValueError:
            received["error"] = "its stream does not start with a status line"
        except OSError as e:
            received["error"] = f"cannot unpack it ({e.strerror or e})"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
