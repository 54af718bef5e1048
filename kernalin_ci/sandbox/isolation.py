"""Which isolation this process's kernel workers get (`worker_isolation`, from KERNALIN_SANDBOX): the
bubblewrap sandbox where it can be made here (probed once), an unprivileged uid of its own, or none."""

from __future__ import annotations

import os
import shutil
import signal
import sys

from kernalin_ci.sandbox.capped import CappedFolder, Handshake
from kernalin_ci.sandbox.options import (
    ENV_WORKER_SANDBOX,
    SANDBOX_UID,
    SandboxError,
    SandboxSettings,
    worker_mode,
    worker_settings,
)
from kernalin_ci.sandbox.uid import UID_BASE, uid_mode_missing
from kernalin_ci.trust import BUBBLEWRAP, NONE, UID, Isolation

# what a user can do when the sandbox that kernel code needs cannot be made
FIXES = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or, as root, set KERNALIN_SANDBOX=uid "
    "(an unprivileged uid without namespaces), or set KERNALIN_SANDBOX=off to run kernel code unsandboxed "
    "(trusted code only; docs/security.md)"
)
NESTED = "inside another sandbox (a daemon job's): the job's PID namespace and /proc, shared"
_probe: dict = {}
_warned: list = []
_isolation: dict = {}


def in_ci() -> str | None:
    """The CI this process gates in (GitHub Actions, a daemon job), where kernel code is a pull request's and
    the worker sandbox is required unless KERNALIN_SANDBOX says otherwise; None elsewhere."""
    if os.environ.get("KERNALIN_DAEMON_JOB"):
        return "a kernalin-ci daemon job"
    if os.environ.get("GITHUB_ACTIONS") == "true":
        return "GitHub Actions"
    return None


def worker_isolation() -> Isolation:
    """The isolation this process's kernel workers run under (KERNALIN_SANDBOX, decided once per value):

    - `on`: the bubblewrap sandbox, or an error naming the cause and the fixes;
    - `auto` (the default): the sandbox where bubblewrap can make one; else, in CI (GitHub Actions, a daemon
      job), the same error: kernel code is a pull request's there; as root elsewhere, an unprivileged uid
      of its own (`uid`), or that error where it cannot have one: kernel code never runs as root; as
      another user elsewhere, unsandboxed, said once on stderr;
    - `uid` (root only): an unprivileged uid of its own per worker, no namespaces (network and the
      processes of the host visible, nothing of root's readable or writable);
    - `off`: unsandboxed, as this process's user (trusted code only).
    Raises SandboxError (a usage error: exit 2) where the mode cannot be had."""
    mode = worker_mode()
    if mode not in _isolation:
        _isolation[mode] = _decide(mode)
    return _isolation[mode]


def _decide(mode: str) -> Isolation:
    root = os.geteuid() == 0
    me = os.geteuid()
    if mode == "off":
        return Isolation(NONE, me, True, f"{ENV_WORKER_SANDBOX}=off")
    if mode == "uid":
        why = uid_mode_missing()
        if why:
            raise SandboxError(f"{ENV_WORKER_SANDBOX}=uid: {why}")
        return Isolation(UID, UID_BASE, True, f"{ENV_WORKER_SANDBOX}=uid")
    settings = worker_settings()
    why = bwrap_works(settings)
    if why is None:
        nested = (proc_args(settings) or ["--proc"])[0] != "--proc"
        return Isolation(BUBBLEWRAP, SANDBOX_UID if root else me, False, NESTED if nested else "")
    ci = in_ci()
    if mode == "on" or ci:
        required = f"{ENV_WORKER_SANDBOX}=on" if mode == "on" else f"in {ci} the worker sandbox is required"
        raise SandboxError(f"kernel code cannot be sandboxed: {why} ({required}): {FIXES}")
    if root:
        missing = uid_mode_missing()
        if missing:
            raise SandboxError(
                f"kernel code would run as root: {why}, and an unprivileged uid cannot be used either ({missing}): "
                f"{FIXES}"
            )
        return Isolation(UID, UID_BASE, True, why)
    if why not in _warned:
        _warned.append(why)
        print(
            f"kernalin-ci: kernel workers run without a sandbox: {why} (install bubblewrap, or set "
            f"{ENV_WORKER_SANDBOX}=off to say that this is intended)",
            file=sys.stderr,
        )
    return Isolation(NONE, me, True, why)


def bwrap_works(settings: SandboxSettings) -> str | None:
    """None if bubblewrap can start a worker's sandbox here (probed once per binary), else why not. Inside
    another sandbox (a daemon job's) a fresh /proc cannot be mounted: the worker's sandbox then keeps the
    enclosing sandbox's PID namespace and its /proc (`proc_args`): the processes it sees
    are the job's own, and the job's first process kills what outlives a worker (daemon/jobwrap.py)."""
    if settings.bwrap not in _probe:
        bwrap = shutil.which(settings.bwrap)
        found: tuple[str | None, list[str] | None] = (f"bubblewrap ({settings.bwrap}) is not installed", None)
        if bwrap:
            # the enclosing /proc writable: CUDA writes to its own /proc/self (read-only: error 304, seen on an H100)
            for proc in (["--proc", "/proc"], ["--bind", "/proc", "/proc"]):
                found = (_probe_once(bwrap, proc), proc)
                if found[0] is None:
                    break
        _probe[settings.bwrap] = found
    return _probe[settings.bwrap][0]


def proc_args(settings: SandboxSettings) -> list[str] | None:
    """How the worker's sandbox gets its /proc (after bwrap_works found that it can)."""
    return _probe[settings.bwrap][1] if settings.bwrap in _probe else None


def _probe_once(bwrap: str, proc: list[str]) -> str | None:
    """Start the sandbox a worker gets, in short: a capped tmpfs the parent opens before the command runs."""
    import subprocess

    flags = ["--unshare-pid", "--unshare-net"] if os.geteuid() == 0 else ["--unshare-all"]
    if proc[0] != "--proc":  # the enclosing sandbox's /proc: its PID namespace too
        flags = ["--unshare-net"] if os.geteuid() == 0 else ["--unshare-user", "--unshare-net"]
    folder, hs = CappedFolder("kernalin-probe-", 1 << 20), Handshake()
    argv = [bwrap, *flags, "--ro-bind", "/", "/", *proc, "--dev", "/dev"]
    argv += ["--size", str(folder.cap), "--tmpfs", folder.path, *hs.argv(), "true"]
    try:
        p = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=hs.child_fds(), text=True,
        )  # fmt: skip
        attached = hs.attach(p, [folder])
        if attached:
            p.kill()
        err = p.communicate(timeout=30)[1]
        if p.returncode not in (0, -signal.SIGKILL):  # it failed by itself (not killed here)
            return f"bubblewrap cannot make a sandbox here ({' '.join(err.split())[:200]})"
        if attached:
            return f"the parent cannot open the sandbox's results folder: {attached}"
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap cannot run ({e})"
    finally:
        hs.close()
        folder.close()


def workers_sandboxed() -> bool:
    """Whether kernel workers start in the bubblewrap sandbox here."""
    return worker_isolation().sandboxed
