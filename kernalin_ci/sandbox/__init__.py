"""The sandboxes: a pull request's code runs where it can reach nothing it could misuse.

A job runs under bubblewrap (`bwrap`) with

- its own user, PID, network, IPC, UTS and cgroup namespaces: it sees only its own processes (no
  /proc/<daemon pid>/environ), has no network but its own loopback, and when the sandbox's PID 1 ends
  (the job ended, or the daemon died: `--die-with-parent`) the kernel kills everything left in it;
- an allowlisted file system: the system (/usr, /etc, /opt; read-only), the Python installation and
  the kernalin_ci package (read-only); for a daemon's job one disk cap holds everything it writes: a
  size-capped tmpfs for its checkout (copied in from a read-only bind), out/, HOME and /tmp, and the
  rest of the cap for /dev/shm (`shm_share`), nothing of the host is writable; a kernel worker gets size-capped tmpfs
  for HOME, /tmp, /dev/shm and each folder it hands results back in (CappedFolder), nothing of the
  host writable either. bwrap's own root and /dev are read-only. The daemon's state folder (database,
  other jobs) and the credential files it reads are never bound, so nothing there exists inside;
- when the daemon runs as root, an unprivileged uid (`runner.sandbox.user`, default 65534) outside the
  namespace too, so even a file bound by mistake is read with no privilege;
- a cgroup per job with a memory and a process cap, where the daemon may create cgroups (root, or a
  systemd unit with `Delegate=yes`); a job's cgroup is also how a restarted daemon finds and kills
  anything a previous run left behind.

`prepare()` returns how to start the job (argv prefix, a pre-exec hook that joins the cgroup and drops
the uid) and the limits actually in force; what could not be enforced is stated, never skipped silently.

The modules, bottom up: `options.py` (settings, the KERNALIN_SANDBOX* environment, sizes, SandboxError),
`cgroup.py`, `job.py` (the daemon job's disk layout and log line), `bwrap.py` (`prepare`: the bubblewrap
command of both sandboxes), `capped.py` (a worker's capped results folders, bubblewrap's handshake,
`start`), `uid.py` (what others can read; KERNALIN_SANDBOX=uid), `staging.py` (readable copies for root's
sandbox), `isolation.py` (which isolation workers get here), `workers.py` (`worker_plan`, `end_worker`).
The names other packages use are imported here: `from kernalin_ci import sandbox; sandbox.worker_plan(...)`.
"""

from kernalin_ci.sandbox.bwrap import Plan, gpu_device_nodes, prepare
from kernalin_ci.sandbox.capped import CappedFolder, start
from kernalin_ci.sandbox.cgroup import cleanup, kill_cgroup, oom_killed, remove_cgroup
from kernalin_ci.sandbox.isolation import bwrap_works, worker_isolation, workers_sandboxed
from kernalin_ci.sandbox.job import CHECKOUT_DIR, JOB_DIR, describe, shm_share
from kernalin_ci.sandbox.options import (
    ENV_WORKER_SANDBOX,
    SANDBOX_UID,
    SandboxError,
    SandboxSettings,
    parse_size,
    size_text,
    worker_disk,
)
from kernalin_ci.sandbox.uid import UID_BASE, others_can_read, uid_mode_missing
from kernalin_ci.sandbox.workers import compile_cache, end_worker, worker_plan

__all__ = [
    "CHECKOUT_DIR",
    "ENV_WORKER_SANDBOX",
    "JOB_DIR",
    "SANDBOX_UID",
    "UID_BASE",
    "CappedFolder",
    "Plan",
    "SandboxError",
    "SandboxSettings",
    "bwrap_works",
    "cleanup",
    "compile_cache",
    "describe",
    "end_worker",
    "gpu_device_nodes",
    "kill_cgroup",
    "oom_killed",
    "others_can_read",
    "parse_size",
    "prepare",
    "remove_cgroup",
    "shm_share",
    "size_text",
    "start",
    "uid_mode_missing",
    "worker_disk",
    "worker_isolation",
    "worker_plan",
    "workers_sandboxed",
]
