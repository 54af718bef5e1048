"""The kernel worker's sandbox (verify, bench, the Action): `worker_plan` says how a worker starts under
`worker_isolation()` (bubblewrap, its own uid, or none) and with what environment, `end_worker` cleans up
after it; the compiled-kernel cache its workers of the same code share (`compile_cache`)."""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
import threading
from pathlib import Path

from kernalin_ci import bytecode
from kernalin_ci.cuda import caches as cuda_caches
from kernalin_ci.device import DEVICES
from kernalin_ci.launch import child_path
from kernalin_ci.sandbox.bwrap import Plan, gpu_device_nodes, prepare
from kernalin_ci.sandbox.capped import CappedFolder
from kernalin_ci.sandbox.cgroup import cleanup
from kernalin_ci.sandbox.isolation import proc_args, worker_isolation
from kernalin_ci.sandbox.options import worker_settings
from kernalin_ci.sandbox.staging import staged
from kernalin_ci.sandbox.uid import harvest_cache, kill_uid, others_can_read, uid_plan
from kernalin_ci.trust import NONE, UID

_worker_ids = itertools.count(1)  # next() is atomic: workers start from several threads at once


def worker_plan(
    job: dict,
    device: str,
    workdir: str,
    cwd: str | None,
    writable: tuple[CappedFolder, ...] = (),
    readonly: tuple[str, ...] = (),
) -> tuple[Plan | None, dict]:
    """How to start a kernel worker under `worker_isolation()`: a Plan (None: unsandboxed) and the
    environment it needs.

    In the bubblewrap sandbox the worker sees the system and the Python installation read-only, the
    folders its job names (the checkout, entry files), WORKDIR (its job file) and READONLY (a profiler's
    installation) read-only; each of WRITABLE (the folders the parent reads its raw results from) as a
    tmpfs of the folder's cap (CappedFolder); the Triton cache it shares with this process's workers of
    the same code (compile_cache) as a tmpfs seeded from it, whose new files the parent copies back after
    the worker ended; fresh tmpfs for HOME and /tmp; each of KERNALIN_SANDBOX_DISK bytes: nothing of the
    host is writable; no network; its own PID namespace; the gate's process and every other file of the
    user (SSH keys, a runner's credentials) do not exist inside. As root its user is uid 65534; a folder
    that user cannot read is shown as a copy (`staged`), never skipped.

    With KERNALIN_SANDBOX=uid (or as root where bubblewrap cannot run) the worker runs as an unprivileged
    uid of its own (`uid_plan`)."""
    iso = worker_isolation()
    here = os.path.realpath(cwd or os.getcwd())  # relative entries resolve against it, as outside
    if iso.mode == NONE:  # Triton's own cache; the CUDA builds (torch extensions, ...) per view still
        named = _named_paths(job) - {os.path.realpath(f.path) for f in writable}
        return None, cuda_caches.cache_env(compile_cache((device, NONE, here, *sorted(named))))
    rw = {os.path.realpath(f.path) for f in writable}  # named in the job too, but a capped tmpfs (below)

    readonly = sorted(
        {os.path.realpath(p) for p in child_path(cwd) if os.path.isdir(p)}
        | (_named_paths(job) - rw)
        | {here}
        | {os.path.realpath(p) for p in readonly if os.path.exists(p)}
    )
    if iso.mode == UID:  # the run's compile cache of this view: a copy in the worker's HOME, harvested after it
        plan, env = uid_plan(readonly, workdir, here, writable, compile_cache((device, UID, *readonly)))
        return plan, {**env, **cuda_caches.cache_env(plan.limits["cache"][0])}
    settings = worker_settings()
    worker_id = f"worker-{os.getpid()}-{next(_worker_ids)}"  # its own cgroup: end_worker kills all of it
    copies = []
    if os.geteuid() == 0:  # the job drops to uid 65534: what it cannot read, it sees as a copy
        copies = [(staged(p), p) for p in readonly if not others_can_read(p)]
        readonly = [p for p in readonly if others_can_read(p)]
    pycache = bytecode.worker_prefix()  # torch's bytecode, compiled once by a trusted child: read-only here
    if pycache and (os.geteuid() != 0 or others_can_read(pycache)):
        readonly.append(os.path.realpath(pycache))
    else:
        pycache = None
    settings.extra_ro = [*readonly, os.path.realpath(workdir)]  # its job file: read-only too
    cache = compile_cache((device, *readonly, *(p for _, p in copies)))
    # each a tmpfs of its cap in the sandbox; the run's Triton cache too, seeded from and copied back to it
    folders = [*writable, CappedFolder(shared=cache)]
    plan = prepare(
        settings,
        worker_id,
        [],
        gpu_device_nodes(None) if DEVICES[device].gpu else [],
        capped=[(f.path, f.cap) for f in folders],
        copies=copies,
        proc=proc_args(settings),
    )
    plan.folders = folders
    plan.pycache = pycache
    plan.argv_prefix[1:1] = ["--chdir", here]
    env = {
        "HOME": plan.home,
        "TMPDIR": plan.tmp,
        "XDG_CACHE_HOME": f"{plan.home}/.cache",
        "TRITON_CACHE_DIR": cache,
        **cuda_caches.cache_env(cache),  # torch extensions, CuPy, NVRTC: built once per view, as Triton's kernels
    }
    return plan, env


def _named_paths(value) -> set[str]:
    """Absolute paths that exist among the strings of a job (its roots, entry files, sources)."""
    out: set[str] = set()
    if isinstance(value, dict):
        for v in value.values():
            out |= _named_paths(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out |= _named_paths(v)
    elif isinstance(value, str) and value.startswith(os.sep):
        path = os.path.realpath(value.split(":", 1)[0])  # an entry "FILE:FUNCTION"
        folder = os.path.dirname(path)
        if os.path.isfile(path) and folder not in _SHARED_DIRS and os.stat(folder).st_mode & 0o001:
            path = folder  # the modules beside it too (when others may search it, as the job's uid must)
        if os.path.exists(path):
            out.add(path)
    return out


_SHARED_DIRS = ("/", "/tmp", "/var/tmp", "/dev/shm")  # a file named there is bound alone


_caches: dict[tuple[str, ...], str] = {}
_caches_lock = threading.Lock()


def compile_cache(view: tuple[str, ...]) -> str:
    """The Triton cache (compiled kernels, the launcher and driver stubs gcc builds; and the CUDA builds of
    kernalin_ci/cuda/caches.py: torch extensions, CuPy, NVRTC, PTX) shared by this process's sandboxed
    workers that see the same files (VIEW: the device and every folder bound into the worker), each through
    a copy of its own (bubblewrap: a tmpfs; KERNALIN_SANDBOX=uid: in its HOME). Each worker would otherwise
    compile all of it again in an empty cache: seconds per worker on a GPU. Code a worker runs can write to
    the cache, so it can poison it only for workers that run the same code as itself (the base and head of
    a pull request see different checkouts: two caches); none outlives this process, so nothing reaches a
    later run."""
    with _caches_lock:
        if view not in _caches:
            path = tempfile.mkdtemp(prefix="kernalin-triton-")
            os.chmod(path, 0o700)  # prepare() hands it to the worker's uid when it drops to one
            atexit.register(shutil.rmtree, path, True)
            _caches[view] = path
        return _caches[view]


def end_worker(plan: Plan | None) -> None:
    """After a sandboxed worker: kill whatever it left in its cgroup, remove the cgroup; then (nothing of
    the sandbox runs any more) copy back what it added to its shared folders, and let go of their tmpfs.
    After a worker of its own uid: kill every process of that uid, remove its HOME."""
    if plan is not None and plan.limits.get("home"):
        if kill_uid(plan.limits["uid"]) == 0:  # a survivor could race root's walk: its additions are dropped
            harvest_cache(plan)
        shutil.rmtree(plan.limits["home"], ignore_errors=True)
        return
    if plan is not None and plan.limits.get("cgroup"):
        job_id = Path(plan.limits["cgroup"][0]).name.removeprefix("job-")
        cleanup(job_id)
    for folder in plan.folders if plan is not None else []:
        if folder.shared:
            folder.harvest()
            folder.close()
