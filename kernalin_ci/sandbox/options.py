"""What configures a sandbox: the daemon's `SandboxSettings` (`runner.sandbox`), the kernel workers'
environment (KERNALIN_SANDBOX, KERNALIN_SANDBOX_DISK, KERNALIN_SANDBOX_COPY_MAX, KERNALIN_BWRAP), sizes and
their words, and `SandboxError`, the one error of a sandbox that cannot be set up as configured."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kernalin_ci.errors import UsageError

SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
WORKER_MODES = ("auto", "on", "uid", "off")
ENV_WORKER_SANDBOX = "KERNALIN_SANDBOX"  # auto (default) | on | uid | off, for the kernel workers of this process
ENV_WORKER_DISK = "KERNALIN_SANDBOX_DISK"  # the size of each writable file system of a kernel worker
ENV_COPY_MAX = "KERNALIN_SANDBOX_COPY_MAX"  # the most a sandbox copies of folders its user cannot read
ENV_BWRAP = "KERNALIN_BWRAP"  # the bubblewrap binary kernel workers use (a name on PATH or a path; default bwrap)
WORKER_DISK = "8g"
COPY_MAX = "1g"
SANDBOX_UID = 65534  # the bubblewrap sandbox's user when kernalin-ci runs as root (SandboxSettings.user)


class SandboxError(UsageError):
    """The sandbox cannot be set up as configured (bwrap missing, bad size): a configuration error."""


def parse_size(text: str) -> int:
    s = str(text).strip().lower().removesuffix("b").removesuffix("i")
    unit = s[-1] if s and s[-1] in SIZE_UNITS else ""
    num = s[: len(s) - len(unit)]
    try:
        value = float(num)
    except ValueError:
        raise SandboxError(f"not a size: {text!r} (e.g. 16g, 512m)") from None
    if value <= 0:
        raise SandboxError(f"a size must be positive: {text!r}")
    return int(value * SIZE_UNITS[unit])


def size_text(n: int) -> str:
    """N bytes for a message: '4 MiB', '8 GiB', '1500 bytes'."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit and n % (unit // 16) == 0:
            return f"{n / unit:g} {name}"
    return f"{n} bytes"


@dataclass
class SandboxSettings:
    enabled: bool = True
    memory: str = "16g"  # the job's cgroup: RAM (and its tmpfs pages)
    pids: int = 4096  # the job's cgroup: processes and threads
    tmpfs_size: str = "8g"  # HOME and /tmp inside the sandbox, each
    user: str = "65534:65534"  # uid:gid the job runs as when the daemon is root
    bwrap: str = "bwrap"  # the bubblewrap binary (a name on PATH or a path)
    extra_ro: list[str] = field(default_factory=list)  # more read-only paths (a CUDA toolkit elsewhere)


def worker_mode() -> str:
    mode = os.environ.get(ENV_WORKER_SANDBOX, "auto").strip().lower() or "auto"
    if mode not in WORKER_MODES:
        raise SandboxError(f"{ENV_WORKER_SANDBOX}={mode!r}: expected one of {', '.join(WORKER_MODES)}")
    return mode


def worker_disk() -> int:
    """Bytes for each writable file system of a kernel worker: its results folders, HOME, /tmp, /dev/shm
    (KERNALIN_SANDBOX_DISK, default 8 GiB: a result file the parent reads is at most 8 GiB)."""
    text = os.environ.get(ENV_WORKER_DISK, "").strip() or WORKER_DISK
    try:
        return parse_size(text)
    except SandboxError as e:
        raise SandboxError(f"{ENV_WORKER_DISK}: {e}") from None


def worker_settings() -> SandboxSettings:
    return SandboxSettings(
        memory=_worker_memory(), tmpfs_size=str(worker_disk()), bwrap=os.environ.get(ENV_BWRAP, "").strip() or "bwrap"
    )


def _worker_memory() -> str:
    """A kernel worker's memory cap: 90% of this machine's RAM (it guards the host, not the kernel)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return "64g"
    return str(max(1 << 30, int(total * 0.9)))
