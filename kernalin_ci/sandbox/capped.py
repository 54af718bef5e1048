"""The folders a kernel worker writes and its parent reads (`CappedFolder`: a tmpfs of its own in the worker
sandbox), bubblewrap's handshake that lets the parent open them before the worker runs (`Handshake`), and
`start`, which starts a command in a Plan's sandbox with its folders attached."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import shutil
import stat
import tempfile
import time
from typing import TYPE_CHECKING

from kernalin_ci.sandbox.options import ENV_WORKER_DISK, size_text, worker_disk

if TYPE_CHECKING:
    from kernalin_ci.sandbox.bwrap import Plan

FULL_BELOW = 64 * 1024  # a capped folder with less free space than this: its worker reached the cap
ATTACH_S = 30.0  # how long bubblewrap may take to set a sandbox up
_temp_ids = itertools.count(1)  # next() is atomic: several threads copy at once


class CappedFolder:
    """A folder a kernel worker writes and its parent reads (its raw results), of at most `cap` bytes.

    In the worker sandbox the worker sees at `path` a tmpfs of `cap` bytes of its own: nothing it writes
    there reaches the host's disk, and a write past the cap fails (ENOSPC). The host folder `path` stays
    empty: the parent opens that tmpfs through /proc/<sandbox pid>/root after bubblewrap set it up and
    before the worker runs (`Handshake`), and reads it through `view`; the descriptor keeps the tmpfs,
    files and all, after the worker ended, until the folder's next worker starts or `close()`. `full()`
    says whether the worker reached the cap. Unsandboxed (KERNALIN_SANDBOX=off, or no bubblewrap: said
    on stderr), `view` is `path`, on the host's disk, with no cap.

    SHARED names a host folder that several workers share and that outlives them (a Triton cache)
    instead of a fresh one: its worker's tmpfs is mounted at that folder's path and starts as a copy of
    it (made by the parent before the worker runs), and after the worker ended the parent copies back
    the plain files it added (`harvest`: never a link, never over an existing file, at most the cap).
    `close()` then leaves the folder in place. One object serves one worker at a time (workers started
    at once take one each; several may name the same SHARED folder)."""

    def __init__(self, prefix: str = "kernalin-", cap: int | None = None, *, shared: str | None = None):
        self.cap = worker_disk() if cap is None else cap
        self.shared = shared is not None
        self.path = os.path.realpath(shared if shared is not None else tempfile.mkdtemp(prefix=prefix))
        self._fd: int | None = None
        self.least_free: int | None = None  # the least free space seen on the attached tmpfs

    @property
    def view(self) -> str:
        """Where the parent reads what the worker wrote."""
        return f"/proc/self/fd/{self._fd}" if self._fd is not None else self.path

    def attach(self, fd: int) -> None:
        """FD (a directory) is the sandbox's tmpfs at `path` from now on; the previous one is dropped."""
        self._release()
        self._fd, self.least_free = fd, None
        self.sample()
        if self.shared:  # the worker starts with what the folder holds (what does not fit is left out)
            copy_new(self.path, self.view, self.cap, dir_mode=0o777, file_mode=0o666)

    def harvest(self) -> int:
        """After a worker of a SHARED folder ended: copy the plain files it added to the host folder (at
        most `cap` bytes by their sizes); the bytes copied."""
        if not self.shared or self._fd is None:
            return 0
        return copy_new(self.view, self.path, self.cap, dir_mode=0o755, file_mode=0o644)

    def sample(self) -> None:
        if self._fd is not None:
            try:
                st = os.statvfs(self._fd)
            except OSError:
                return
            free = st.f_bavail * st.f_frsize
            self.least_free = free if self.least_free is None else min(self.least_free, free)

    def full(self) -> str | None:
        """Why the worker's results stop here, when it filled the folder to its cap (else None)."""
        if self.least_free is None or self.least_free >= FULL_BELOW:
            return None
        return (
            f"the worker filled its results folder to its disk cap of {size_text(self.cap)} ({ENV_WORKER_DISK}): "
            f"writes past it failed; nothing of it reached the host's disk"
        )

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._release()
        if not self.shared:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> CappedFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start(plan: Plan | None, argv: list[str], **popen):
    """Start ARGV in PLAN's sandbox (unsandboxed for None; POPEN: subprocess.Popen's arguments, `preexec_fn`
    and the pass_fds bubblewrap needs added) with PLAN's capped folders attached before anything of ARGV
    runs: (the process, None), or (the process, why the sandbox could not be readied: kill it)."""
    import subprocess

    hs = Handshake() if plan is not None and plan.folders else None
    prefix = [*plan.argv_prefix[:1], *(hs.argv() if hs else []), *plan.argv_prefix[1:]] if plan else []
    popen["pass_fds"] = (*popen.get("pass_fds", ()), *(hs.child_fds() if hs else ()))
    try:
        proc = subprocess.Popen([*prefix, *argv], preexec_fn=plan.preexec if plan else None, **popen)
    except BaseException:
        if hs:
            hs.close()
        raise
    return proc, (hs.attach(proc, plan.folders) if hs else None)


def copy_new(src: str, dst: str, budget: int, dir_mode: int, file_mode: int) -> int:
    """Copy each plain file under SRC that DST lacks into DST, at most BUDGET bytes by the files' sizes
    (a sparse file counts whole); never a link, never through one, never over an existing file. The
    bytes copied; a file that cannot be copied (the destination is full) is left out."""
    copied = 0
    for folder, _, files in os.walk(src):  # links to folders are not followed
        rel = os.path.relpath(folder, src)
        parts = [] if rel == "." else rel.split(os.sep)
        for name in files:
            source = os.path.join(folder, name)
            try:
                st = os.lstat(source)
                if not stat.S_ISREG(st.st_mode) or copied + st.st_size > budget:
                    continue
                target = os.path.join(mkdirs(dst, parts, dir_mode), name)
                if os.path.lexists(target):
                    continue
                _copy_file(source, target, st.st_size, file_mode)
            except OSError:
                continue
            copied += st.st_size
    return copied


def mkdirs(root: str, parts: list[str], mode: int) -> str:
    """ROOT/PARTS, the missing folders made with MODE; OSError where a part is not a folder (a link)."""
    path = root
    for part in parts:
        path = os.path.join(path, part)
        if not os.path.lexists(path):
            os.mkdir(path)
            os.chmod(path, mode)
        elif os.path.islink(path) or not os.path.isdir(path):
            raise OSError(f"not a folder: {path}")
    return path


def _copy_file(source: str, target: str, size: int, mode: int) -> None:
    """SOURCE's first SIZE bytes as the new file TARGET (written beside it, then linked into place)."""
    temp = f"{target}.kernalin-{os.getpid()}-{next(_temp_ids)}"
    fin = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fout = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with open(fout, "wb") as out:
            os.fchmod(fout, mode)
            left = size
            while left > 0 and (chunk := os.read(fin, min(left, 1 << 20))):
                out.write(chunk)
                left -= len(chunk)
        os.link(temp, target)  # FileExistsError: another worker's copy came first
    finally:
        os.close(fin)
        with contextlib.suppress(OSError):
            os.unlink(temp)


class Handshake:
    """bubblewrap's --info-fd (the sandbox's pid) and --block-fd (it waits, set up, before running the
    command): the parent opens the sandbox's capped folders in between (`attach`)."""

    def __init__(self) -> None:
        self.info_r, self.info_w = os.pipe()
        self.block_r, self.block_w = os.pipe()

    def argv(self) -> list[str]:
        """bubblewrap's options; pass child_fds() to the process."""
        return ["--info-fd", str(self.info_w), "--block-fd", str(self.block_r)]

    def child_fds(self) -> tuple[int, int]:
        return self.info_w, self.block_r

    def close(self) -> None:
        """Close what is still open of both pipes (after attach, or when bubblewrap could not start)."""
        for name in ("info_r", "info_w", "block_r", "block_w"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def attach(self, proc, folders, timeout_s: float = ATTACH_S) -> str | None:
        """After PROC (bubblewrap) started: attach each of FOLDERS to its tmpfs in the sandbox, then let
        the command run. None, or why not (PROC is then the caller's to kill)."""
        os.close(self.info_w)
        os.close(self.block_r)
        self.info_w = self.block_r = -1
        deadline = time.monotonic() + timeout_s
        try:
            info = b""
            while select.select([self.info_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                chunk = os.read(self.info_r, 4096)
                if not chunk:
                    break
                info += chunk
            try:
                pid = int(json.loads(info)["child-pid"])
            except (ValueError, KeyError, TypeError):
                return "bubblewrap did not start the sandbox"
            for f in folders:
                why = _open_in(pid, f, proc, deadline)
                if why:
                    return why
            return None
        finally:
            try:
                os.write(self.block_w, b"x")
            except OSError:
                pass
            self.close()


def _open_in(pid: int, folder: CappedFolder, proc, deadline: float) -> str | None:
    """Attach FOLDER to the tmpfs at its path in PID's sandbox: the directory there on another file
    system than the host's folder, of the folder's cap (bubblewrap mounts it before it waits)."""
    host = os.stat(folder.path).st_dev
    where = f"/proc/{pid}/root{folder.path}"
    while True:
        try:
            fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            fd = -1
        if fd >= 0:
            st = os.statvfs(fd)
            if os.fstat(fd).st_dev != host and st.f_blocks * st.f_frsize >= folder.cap:
                folder.attach(fd)
                return None
            os.close(fd)
        if proc.poll() is not None:
            return "bubblewrap ended before the sandbox was set up"
        if time.monotonic() > deadline:
            return f"the worker's results folder could not be opened in its sandbox ({where})"
        time.sleep(0.002)
