"""The daemon job's sandbox: `prepare(disk=..., checkout=...)` of bwrap.py puts everything a job writes under
one disk cap, a tmpfs at JOB_DIR (its copy of the checkout bound at CHECKOUT_DIR, out/, HOME, /tmp) and
its /dev/shm (`shm_share`); `describe` is the job log's line of what is in force."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernalin_ci.sandbox.options import size_text

if TYPE_CHECKING:
    from kernalin_ci.sandbox.bwrap import Plan

JOB_DIR = "/job"  # prepare(disk=...): the job's capped tmpfs inside the sandbox
CHECKOUT_DIR = "/checkout"  # prepare(checkout=...): the host's checkout, read-only, copied into JOB_DIR
SHM_SHARE_MAX = 64 << 20  # a daemon job's /dev/shm: this much of its disk cap at most (Docker's own default size)


def shm_share(disk: int) -> int:
    """The part of a daemon job's disk cap DISK that is its /dev/shm (an eighth, at most SHM_SHARE_MAX): the
    rest holds everything else it writes, so that the two together never exceed DISK."""
    return min(disk // 8, SHM_SHARE_MAX)


def describe(plan: Plan) -> str:
    """One line for the job log: what is in force, and what is not."""
    lim = plan.limits
    parts = [f"bubblewrap, uid {lim['uid']}, no network, PID namespace"]
    if lim.get("disk") is not None:
        shm = shm_share(lim["disk"])
        parts.append(
            f"disk {size_text(lim['disk'])} in all (a tmpfs of {size_text(lim['disk'] - shm)} for the checkout, "
            f"out/, HOME and /tmp, {size_text(shm)} for /dev/shm)"
        )
    else:
        parts.append(f"tmpfs {lim['tmpfs'] >> 20} MiB for HOME and /tmp")
    if lim["memory"] is not None:
        parts.append(f"memory {lim['memory'] >> 20} MiB, {lim['pids']} processes")
    parts += [f"NOT ENFORCED: {w}" for w in plan.not_enforced]
    return "; ".join(parts)
