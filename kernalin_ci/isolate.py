"""Run a worker task in a child process with a per-step timeout.

A kernel under test can hang, segfault, or poison the CUDA context; none of
that may take the gate down. The parent streams the child's events; each event
restarts the step clock; silence past `timeout_s` kills the whole process group.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field

from kernalin_ci import sandbox
from kernalin_ci.device import DEVICES
from kernalin_ci.errors import InternalError, UsageError
from kernalin_ci.jobs import WorkerJob
from kernalin_ci.launch import make_undumpable, module_argv


@dataclass
class ChildOutcome:
    status: str  # "ok" | "timeout" | "crashed" | "usage-error" | "internal-error" | "restart" | "refused"
    events: list = field(default_factory=list)
    detail: str = ""
    output_tail: str = ""

    def raise_for_error(self, what: str) -> None:
        """The one way a worker's end becomes an error: the child's UsageError is raised again here
        (exit 2), its unexpected exception becomes an InternalError carrying the child's traceback
        (exit 3). Any other status (ok, timeout, crashed, restart) is the caller's to judge: a kernel
        that hangs or crashes is a finding, not an error."""

        if self.status == "usage-error":
            setting = next((e.get("setting") for e in self.events if e.get("event") == "usage-error"), None)
            raise UsageError(self.detail, setting=setting)
        if self.status == "internal-error":
            tb = next((e.get("traceback", "") for e in self.events if e.get("event") == "internal-error"), "")
            raise InternalError(f"the {what} worker failed: {self.detail}", detail=tb)

    def ended(self) -> str:
        """How a child that did not finish ended, in one line: the cause and, for a crash, the last
        of its output (a segfault's message, an assertion)."""
        return self.detail + self.last_output()

    def last_output(self) -> str:
        """'; last output: ...' after a crash (empty otherwise)."""
        tail = " ".join(self.output_tail.split()[-40:])[-300:]
        return f"; last output: {tail}" if tail and self.status == "crashed" else ""


# The kernel worker's environment is an allowlist: what Python, torch, Triton and CUDA need, and the
# daemon's job marker. Everything else the gate process holds (cloud keys, GITHUB_TOKEN, HF_TOKEN,
# OPENAI_API_KEY, the App key, ...) stays out of reach of the kernel code under test.
PASS_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TERM",
        "LD_LIBRARY_PATH",
        "CC",
        "CXX",
        "XDG_CACHE_HOME",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "KERNALIN_DAEMON_JOB",
        "KERNALIN_CHECKS",
        "KERNALIN_NVCC",  # the CUDA compiler the workers build with (kernalin_ci/cuda/toolchain.py)
    }
)
PASS_PREFIXES = ("LC_", "TRITON_", "CUDA_", "NVIDIA_", "PYTORCH_", "TORCH_")

# Credentials named here are refused even where a prefix above would let them through.
_SECRET_PREFIXES = ("KERNALIN_GITHUB_APP_", "ACTIONS_RUNTIME_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_")
_SECRET_NAMES = {
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "INPUT_GITHUB-TOKEN",
    "INPUT_GITHUB_TOKEN",
    "KERNALIN_WEBHOOK_SECRET",
    "KERNALIN_WEBHOOK_SECRET_FILE",
    "ACTIONS_CACHE_URL",
    "ACTIONS_RESULTS_URL",
}


def is_secret(name: str) -> bool:
    return name.upper() in _SECRET_NAMES or name.upper().startswith(_SECRET_PREFIXES)


def passes(name: str) -> bool:
    """Whether the variable NAME may reach a kernel worker."""
    return (name in PASS_NAMES or name.startswith(PASS_PREFIXES)) and not is_secret(name)


def child_env(device: str, extra: dict | None = None) -> dict:
    """The kernel worker's environment: the allowlisted part of ours, the device's Triton mode set."""
    env = DEVICES[device].worker_env({k: v for k, v in os.environ.items() if passes(k)})
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silences Triton 3.9's warning; keeps its default
    env.update(extra or {})
    return env


def run_task(
    job: WorkerJob,
    device: str,
    timeout_s: float,
    on_event=None,
    env: dict | None = None,
    cwd: str | None = None,
    writable: tuple[sandbox.CappedFolder, ...] = (),
    wrap: tuple[str, ...] = (),
    readonly: tuple[str, ...] = (),
) -> ChildOutcome:
    """Run JOB's task (`job.TASK`, kernalin_ci/jobs.py) on DEVICE in `python -m kernalin_ci.kernel_worker`
    (isolated: launch.module_argv), in the worker sandbox where bubblewrap can make one
    (sandbox.worker_plan); call on_event per event (when it returns False, the child is killed: status
    "refused"). `writable`: the folders the parent made for the worker's results, the only ones it may
    write (sandboxed, each a tmpfs of its cap that the parent reads through the folder's `view`:
    sandbox.CappedFolder). `wrap`: a command that starts the worker (a profiler: `ncu ARGS`), inside the
    sandbox with it; `readonly`: folders it needs (its installation). This process is made non-dumpable
    first (the child must not read our /proc/PID/environ)."""
    make_undumpable()
    with tempfile.TemporaryDirectory(prefix="kernalin-job-") as tmp:
        os.chmod(tmp, 0o711)  # searchable, not listable: a worker of its own uid (sandbox.UID) reaches its job file
        work = os.path.join(tmp, "work")  # the job file, read-only in the sandbox
        os.mkdir(work, 0o755)
        job_path = os.path.join(work, "job.json")
        sent = job.to_json()
        with open(os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w") as f:
            json.dump({"task": job.TASK, "device": device, "job": sent}, f)
        plan, sandbox_env = sandbox.worker_plan(sent, device, work, cwd, writable, readonly)
        argv = [*wrap, *module_argv("kernalin_ci.kernel_worker", cwd=cwd, pycache=plan and plan.pycache), job_path]
        r, w = os.pipe()
        try:  # the parent attaches the sandbox's capped folders before the worker runs
            proc, unready = sandbox.start(
                plan,
                [*argv, str(w)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,  # read by `tail` below: the worker's output never reaches a file
                stderr=subprocess.STDOUT,
                pass_fds=(w,),
                env=child_env(device, {**(env or {}), **sandbox_env}),
                cwd=cwd,
                start_new_session=True,
            )
        finally:
            os.close(w)
        tail = _Tail(proc.stdout)
        if unready:
            _kill(proc)
        folders = plan.folders if plan else []
        sampling = threading.Event()
        sampler = threading.Thread(target=_sample, args=(folders, sampling), daemon=True)
        sampler.start()
        events: queue.Queue = queue.Queue()

        def reader():
            with os.fdopen(r) as f:
                for line in f:
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        ev = None
                    # a line that is no JSON object reaches on_event as "malformed" (never a crash here)
                    events.put(ev if isinstance(ev, dict) else {"event": "malformed", "line": line[:200]})
            events.put(None)

        threading.Thread(target=reader, daemon=True).start()
        outcome = ChildOutcome("crashed")
        while True:
            try:
                ev = events.get(timeout=timeout_s)
            except queue.Empty:
                _kill(proc)
                outcome.status = "timeout"
                outcome.detail = f"no progress for {timeout_s:g} s"
                break
            if ev is None:
                break
            outcome.events.append(ev)
            kind = ev.get("event")
            if kind in ("done", "usage-error", "internal-error", "restart") and outcome.status != "restart":
                # a task that asks for a fresh worker (the CUDA context is lost) still ends with "done"
                outcome.status = "ok" if kind == "done" else kind
                outcome.detail = ev.get("message", ev.get("reason", ""))
            if on_event and on_event(ev) is False:  # the parent refuses the child's reports: stop it
                _kill(proc)
                outcome.status = "refused"
                break
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill(proc)
            rc = proc.wait()
        sampling.set()
        sampler.join()
        for folder in folders:
            folder.sample()
        sandbox.end_worker(plan)
        if plan is not None and rc is not None and 128 < rc < 160:
            rc = 128 - rc  # bubblewrap exits 128 + N for a child killed by signal N
        if outcome.status == "crashed":
            outcome.detail = f"the sandbox: {unready}" if unready else _describe_exit(rc)
        outcome.output_tail = tail.text()
        return outcome


class _Tail:
    """The last KEEP bytes of a worker's output (stdout and stderr), read as it comes: kept in memory, never
    in a file (a worker printing without end would fill the disk)."""

    def __init__(self, stream, keep: int = 4000):
        self.keep, self.data = keep, bytearray()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        with stream:
            while chunk := stream.read1(1 << 16):
                self.data += chunk
                del self.data[: -self.keep]

    def text(self) -> str:
        self.thread.join(5)  # the output ends with the sandbox (a process it left is killed with it)
        return self.data[-self.keep :].decode(errors="replace")


def _sample(folders, stop: threading.Event, every_s: float = 0.1) -> None:
    """Note the least free space of each capped folder while its worker runs (CappedFolder.full)."""
    while not stop.wait(every_s):
        for folder in folders:
            folder.sample()


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _describe_exit(rc: int) -> str:
    if rc is not None and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc} before finishing"
