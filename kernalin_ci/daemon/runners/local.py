"""The local runner: the job's command as a subprocess in the job's checkout, inside the sandbox.

By default the job runs under bubblewrap (kernalin_ci/sandbox.py): its own PID, network and
user namespaces, an allowlisted read-only file system with only its checkout and output writable,
an unprivileged uid, and a cgroup with memory and process caps. When the sandbox's first process
ends, or the daemon dies, the kernel kills everything the job started; stopping, a timeout, or a
restart after a crash also kill what is left in the job's cgroup.

With `runner.sandbox.enabled: false` (trusted repositories only) the process starts in a session
of its own with a parent-death signal (`setpriv --pdeathsig KILL`, where util-linux has it), and
cleanup finds its processes by the job's marker in their environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from kernalin_ci import sandbox
from kernalin_ci.daemon import safefile
from kernalin_ci.daemon.runners import JOB_MARKER, POLL_S, CappedLog, RunRequest, RunResult, StopReason, job_env
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
    ):
        self._setpriv = shutil.which("setpriv")
        self.sandbox = sandbox_settings or sandbox.SandboxSettings()
        self.hide = list(hide)  # the daemon's private paths, masked inside the sandbox
        self.log_max_bytes = log_max_bytes

    def run(self, req: RunRequest, stop_reason: StopReason, on_start) -> RunResult:
        # the gate runs isolated (python -I, the daemon's kernalin_ci first): the checkout cannot shadow it
        argv = req.argv(
            module_argv("kernalin_ci", cwd=req.repo),
            python=sys.executable,
            config=str(req.repo / ".kernalin.yml"),
            out=str(req.out),
            repo=str(req.repo),
        )
        try:
            log = safefile.append(req.log, req.job_dir)
        except OSError as e:
            return RunResult(None, 0.0, infra_error=f"cannot open the job's log: {e}")
        with log:
            capture = CappedLog(log, self.log_max_bytes)
            preexec = None
            if self.sandbox.enabled:
                try:
                    plan = sandbox.prepare(
                        self.sandbox,
                        req.job_id,
                        [req.repo, req.out],
                        sandbox.gpu_device_nodes(req.slot.visible) if req.slot.device == "cuda" else [],
                        hide=self.hide,
                    )
                except sandbox.SandboxError as e:
                    return RunResult(None, 0.0, infra_error=f"cannot start the job's sandbox: {e}")
                argv, preexec = plan.argv_prefix + argv, plan.preexec
                home, tmp = plan.home, plan.tmp
                capture.note(f"kernalin-ci daemon: sandbox: {sandbox.describe(plan)}\n")
            else:
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
                    cwd=req.repo,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=preexec,
                )
            except (OSError, subprocess.SubprocessError) as e:
                sandbox.cleanup(req.job_id)
                return RunResult(None, 0.0, infra_error=f"cannot start the job: {e}")
            reader = threading.Thread(target=capture.pump, args=(proc.stdout,), name=f"log-{req.job_id}", daemon=True)
            reader.start()
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
            if timed_out:
                capture.note(f"\nkernalin-ci daemon: the job ran past {req.timeout_s:.0f} s and was killed\n")
            capture.close()
        return RunResult(
            None if (stopped or timed_out) else code,
            seconds,
            capture.tail(),
            stopped=stopped,
            timed_out=timed_out,
            oom_killed=oom,
        )

    def cleanup(self, job_id: str) -> int:
        return kill_marked(job_id) + sandbox.cleanup(job_id)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
