"""Files in job directories and checkouts, opened without ever following a symbolic link.

A job runs code from a pull request, and that code (or the checkout itself) can put symbolic
links where the daemon reads or writes: `.kernalin.yml`, `out/report.json`, `job.log`, the job
directory's own sub-directories. Every such path is opened here, one component at a time from
a directory the daemon owns (`within`), each with O_NOFOLLOW: a link anywhere on the way, a
`..`, or a path outside `within` is refused with UnsafePath, never followed.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path


class UnsafePath(OSError):
    """A symbolic link, `..` or a foreign file type where the daemon expected its own file."""


def _parts(path: Path, within: Path) -> tuple[str, ...]:
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(within))
    except ValueError:
        raise UnsafePath(f"{path} is not inside {within}") from None
    if not rel.parts or ".." in rel.parts:
        raise UnsafePath(f"{path} is not a file inside {within}")
    return rel.parts


def _open_dir(parts: tuple[str, ...], within: Path) -> int:
    fd = os.open(within, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                raise UnsafePath(f"{part}: not a plain directory ({os.strerror(e.errno)})") from None
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_fd(path: Path, flags: int, within: Path, mode: int = 0o644) -> int:
    """os.open(PATH, FLAGS | O_NOFOLLOW), every directory from WITHIN down opened without following links."""
    parts = _parts(path, within)
    dfd = _open_dir(parts[:-1], within)
    try:
        try:
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        except OSError as e:
            if e.errno in (40, 20):  # ELOOP: the file is a link; ENOTDIR
                raise UnsafePath(f"{path} is a symbolic link") from None
            raise
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(f"{path} is not a regular file")
    return fd


def read_bytes(path: Path, within: Path, limit: int) -> bytes:
    """PATH's bytes (a regular file, reached without links); UnsafePath when it is larger than LIMIT."""
    fd = open_fd(path, os.O_RDONLY, within)
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise UnsafePath(f"{path.name} is larger than {limit} bytes")
        return f.read(limit + 1)[:limit]


def append(path: Path, within: Path):
    """PATH opened for appending (created 0600 if missing), as a binary file object."""
    return os.fdopen(open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, within, 0o600), "ab")


def replace(path: Path, data: bytes, within: Path, mode: int = 0o644) -> None:
    """Write DATA as a new file at PATH: whatever is there (a link, a file, a directory) is removed first,
    never written through."""
    parts = _parts(path, within)
    dfd = _open_dir(parts[:-1], within)
    try:
        name = parts[-1]
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            shutil.rmtree(os.path.join(os.path.abspath(within), *parts))  # rmtree never follows links
        elif st is not None:
            os.unlink(name, dir_fd=dfd)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    finally:
        os.close(dfd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def remove(path: Path) -> None:
    """Remove PATH whatever it is (a link is removed, not followed); nothing if it is missing."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path)
    except FileNotFoundError:
        pass


def tree_size(top: Path) -> int:
    """Bytes under TOP (links counted as themselves, never followed)."""
    total = 0
    for root, dirs, files in os.walk(top, followlinks=False):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total
