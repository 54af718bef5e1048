"""A job's `out/` handed back as a tar stream, read only up to caps and unpacked safely.

While a job runs, its files live on a size-capped tmpfs inside its sandbox or container (the disk cap,
`runner.disk_max_bytes`); nothing of the job is on the host's disk. At the end its `out/` comes back as
a tar stream (a pipe from the local runner's sandbox, the engine's archive from the docker runner). The
stream is the job's own output, so it is read as untrusted: at most `max_bytes` of file contents and
`max_files` entries, plain files and folders only (a link, a device, an absolute path or a `..` part
fails it), every file created new (`O_EXCL`, `O_NOFOLLOW`) inside a fresh folder the daemon owns.

`pack()` is the writing side; it runs inside the sandbox (standard library only).
"""

from __future__ import annotations

import os
import tarfile

MAX_FILES = 10_000  # entries in a job's out/
HEADER_BYTES = 1536  # tar's overhead per entry, at most (a header, a long-name header, padding)


class BadOutput(Exception):
    """The stream breaks a cap or a rule; the message says which (one line)."""


class _Capped:
    """A binary stream read through at most LIMIT bytes; past it, BadOutput."""

    def __init__(self, stream, limit: int):
        self.stream, self.limit, self.read_bytes = stream, limit, 0

    def read(self, n: int = -1) -> bytes:
        room = self.limit - self.read_bytes
        data = self.stream.read(room + 1 if n is None or n < 0 else min(n, room + 1))
        self.read_bytes += len(data)
        if self.read_bytes > self.limit:
            raise BadOutput(f"its output stream is larger than {self.limit} bytes")
        return data


def _parts(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise BadOutput(f"a path outside out/ refused: {name[:200]!r}")
    return parts


def unpack(stream, dest: str | os.PathLike, max_bytes: int, max_files: int = MAX_FILES) -> None:
    """Unpack the tar STREAM (a binary file object; its entries named `out/...`) into DEST, an empty
    folder. Raises BadOutput (what is unpacked so far stays: the caller removes it)."""
    raw = _Capped(stream, max_bytes + max_files * HEADER_BYTES + 10240)
    total = files = 0
    root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        try:
            tar = tarfile.open(fileobj=raw, mode="r|")
            for member in tar:
                parts = _parts(member.name)
                if parts[:1] != ["out"]:
                    raise BadOutput(f"an entry outside out/ refused: {member.name[:200]!r}")
                parts = parts[1:]
                files += 1
                if files > max_files:
                    raise BadOutput(f"out/ holds more than {max_files} files")
                if member.isdir():
                    if parts:
                        _mkdirs(root, parts)
                    continue
                if member.issym() or member.islnk():
                    kind = "symbolic" if member.issym() else "hard"
                    raise BadOutput(f"out/ may not hold links: {member.name[:200]!r} is a {kind} link")
                if not member.isfile() or not parts:
                    raise BadOutput(f"out/ may hold plain files and folders only: {member.name[:200]!r} refused")
                total += member.size
                if total > max_bytes:
                    raise BadOutput(f"out/ holds more than {max_bytes} bytes, over the limit")
                _write(root, parts, tar.extractfile(member))
        except (tarfile.TarError, EOFError) as e:
            raise BadOutput(f"its output stream is not a tar archive ({' '.join(str(e).split())[:200]})") from None
    finally:
        os.close(root)


def _mkdirs(root: int, parts: list[str]) -> int:
    """The folder ROOT/PARTS (made where missing, never through a link), opened."""
    fd = os.dup(root)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                raise BadOutput(f"out/: {'/'.join(parts)[:200]} is not a folder") from None
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write(root: int, parts: list[str], src) -> None:
    dfd = _mkdirs(root, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
        except FileExistsError:
            raise BadOutput(f"out/: {'/'.join(parts)[:200]} appears twice") from None
    finally:
        os.close(dfd)
    with os.fdopen(fd, "wb") as f:
        while chunk := src.read(1 << 20):
            f.write(chunk)


def pack(folder: str, fileobj) -> None:
    """FOLDER as a tar stream named `out/...` onto the binary file object FILEOBJ (a link goes in as a link,
    never followed: unpack() refuses it)."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        tar.add(folder, arcname="out", recursive=True, filter=keep)
