"""Readable copies, for root's sandbox, of the folders its user (uid 65534) cannot read (`staged`)."""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import sys
import tempfile
import threading

from kernalin_ci.sandbox.capped import mkdirs
from kernalin_ci.sandbox.options import COPY_MAX, ENV_COPY_MAX, SANDBOX_UID, SandboxError, parse_size, size_text

_stages: dict[str, tuple[tuple, str]] = {}
_stage_lock = threading.Lock()
_stage_root: list[str] = []
_warned: list = []


def staged(path: str) -> str:
    """A copy of PATH (a file, or a folder without its hidden entries: `.git`, `.env`, ...) that the
    sandbox's user can read, made where root's sandbox binds it at PATH; the same copy while PATH does not
    change. SandboxError where the folder is larger than KERNALIN_SANDBOX_COPY_MAX."""
    limit = parse_size(os.environ.get(ENV_COPY_MAX, "").strip() or COPY_MAX)
    with _stage_lock:
        files = _visible_files(path)
        key = tuple((rel, st.st_size, st.st_mtime_ns) for rel, st in files)
        old = _stages.get(path)
        if old is not None and old[0] == key:
            return old[1]
        total = sum(st.st_size for _, st in files)
        if total > limit:
            raise SandboxError(
                f"{path} is not readable by uid {SANDBOX_UID}, the sandbox's user when kernalin-ci runs as root, "
                f"and too large to copy for it ({size_text(total)}, over {ENV_COPY_MAX}={size_text(limit)}): make it "
                f"readable (chmod -R o+rX), or run kernalin-ci as another user"
            )
        if not _stage_root:
            _stage_root.append(tempfile.mkdtemp(prefix="kernalin-copies-"))
            atexit.register(shutil.rmtree, _stage_root[0], True)
        dest = tempfile.mkdtemp(dir=_stage_root[0])
        os.chmod(dest, 0o755)
        target = os.path.join(dest, "copy")
        if os.path.isdir(path):
            os.mkdir(target, 0o755)
            for rel, st in files:
                mkdirs(target, rel.split(os.sep)[:-1], 0o755)
                shutil.copyfile(os.path.join(path, rel), os.path.join(target, rel), follow_symlinks=False)
                os.chmod(os.path.join(target, rel), 0o755 if st.st_mode & 0o111 else 0o644)
        else:
            shutil.copyfile(path, target)
            os.chmod(target, 0o644)
        if path not in _warned:
            _warned.append(path)
            print(
                f"kernalin-ci: {path} is not readable by uid {SANDBOX_UID} (the sandbox's user as root): kernel "
                f"workers see a copy of it, hidden files left out ({len(files)} files, {size_text(total)})",
                file=sys.stderr,
            )
        _stages[path] = (key, target)
        return target


def _visible_files(path: str) -> list[tuple[str, os.stat_result]]:
    """The plain files under PATH (PATH itself for a file) that are not hidden and not under a hidden folder,
    with their stats; links are not followed."""
    if not os.path.isdir(path):
        return [("", os.stat(path))]
    out = []
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            full = os.path.join(folder, name)
            st = os.lstat(full)
            if not name.startswith(".") and stat.S_ISREG(st.st_mode):
                out.append((os.path.relpath(full, path), st))
    return out
