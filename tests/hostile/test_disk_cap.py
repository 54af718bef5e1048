"""Issue 13, attack 8 (disk): a pull request's job tries to fill the host's disk through the local runner.

The job's files live on its sandbox's own tmpfs, /dev/shm on another, and the two share
`runner.disk_max_bytes` (sandbox.prepare(disk=...), sandbox.shm_share); out/ comes back through a pipe
the daemon reads only up to its caps (daemon/outstream.py). Without that, out/ and the checkout were
host folders bound into the sandbox: the attack below wrote twice the cap into each; then (issue 29)
/dev/shm, and /tmp where the Python installation lives under /tmp (a fresh clone with its venv there),
each had a tmpfs of the whole cap. The docker runner's test is tests/test_daemon_docker.py (where an
engine is up)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from hostile_support import PAYLOAD_COMMAND, check_run_text, pr_with_payload, serve, world  # noqa: F401

from kernalin_ci.daemon import outstream
from kernalin_ci.daemon.safefile import tree_size
from kernalin_ci.testing.daemon_world import wait_job

CAP = 4 << 20
DISK_ATTACK = (Path(__file__).parent / "disk_attack.py").read_text()
# writes its own "out/" stream onto the hand-back pipe (the fd number is on its parent's command line)
FORGED_STREAM = r"""
import io, os, tarfile
argv = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\0")
fd = int(argv[argv.index(b"--") - 1])
with open(f"/proc/{os.getppid()}/fd/{fd}", "wb") as f:
    f.write(b'{"free": 999999999}\n')
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("out/../../escaped.txt")
        info.size = 7
        t.addfile(info, io.BytesIO(b"escaped"))
    f.write(buf.getvalue())
print("forged", flush=True)
"""

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@needs_bwrap
def test_a_job_cannot_fill_the_hosts_disk(tmp_path, world, serve):  # noqa: F811
    state = tmp_path / "state"
    daemon = serve(
        world.daemon_config(
            state,
            runner={"command": [*PAYLOAD_COMMAND, str(CAP)], "disk_max_bytes": CAP, "out_max_bytes": 64 << 20},
        )
    )
    _, filler = daemon.deliver("pull_request", pr_with_payload(world, 1, DISK_ATTACK))
    _, forger = daemon.deliver("pull_request", pr_with_payload(world, 2, FORGED_STREAM))
    job = wait_job(daemon.get, filler["jobs"][0], timeout=120)
    job_dir = state / "jobs" / job["id"]
    log = (job_dir / "job.log").read_text()
    found = json.loads(log.split("DISK-ATTACK ", 1)[1].splitlines()[0])
    # every write stopped at the cap: together they got less than the cap through (the checkout is there too),
    # wherever this checkout and its Python installation live (under /tmp or not)
    assert sum(f["written"] for f in found.values()) <= CAP, found
    assert all(f["error"] == "No space left on device" for f in found.values()), found
    assert tree_size(job_dir) <= CAP + (1 << 20)  # what reached the host: out/ (at most the cap) and job.log
    assert job["state"] == "failed" and "disk cap 4 MiB reached" in check_run_text(world, job["id"])
    assert "disk cap 4 MiB reached" in log

    job = wait_job(daemon.get, forger["jobs"][0], timeout=120)
    log = (state / "jobs" / job["id"] / "job.log").read_text()
    if "PermissionError" in log:  # a root daemon's job: the wrapper changed uid (setpriv), so it is not dumpable
        assert os.geteuid() == 0 and job["state"] == "failed"
    else:
        assert "forged" in log and job["state"] == "failed"
        assert "a path outside out/" in check_run_text(world, job["id"])
    assert not list(state.rglob("escaped.txt")) and not (state / "jobs" / job["id"] / "out" / "escaped.txt").exists()


def tar_of(*entries) -> io.BytesIO:
    """A tar archive of ENTRIES: (name, data) for a file, (name, None) for a folder, (name, 'link:TARGET')."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data.removeprefix("link:")
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


@pytest.mark.parametrize(
    "entries, why",
    [
        ([("out/report.json", "link:/etc/passwd")], "link"),
        ([("out/../escaped", b"x")], "a path outside out/"),
        ([("/etc/escaped", b"x")], "a path outside out/"),
        ([("other/x", b"x")], "an entry outside out/"),
        ([("out/a", b"x"), ("out/a", b"y")], "appears twice"),
        ([("out/a", b"x" * 5000)], "over the limit"),
        ([(f"out/{i}", b"") for i in range(30)], "more than 20 files"),
        ([("out/a", b"x"), ("out/a/b", b"y")], "is not a folder"),
    ],
)
def test_the_out_stream_is_unpacked_as_hostile(tmp_path, entries, why):
    dest = tmp_path / "job" / "out"
    dest.mkdir(parents=True)
    with pytest.raises(outstream.BadOutput, match=why):
        outstream.unpack(tar_of(*entries), dest, max_bytes=4096, max_files=20)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "job" / "escaped").exists()
    assert all(not p.is_symlink() for p in dest.rglob("*"))


def test_the_out_stream_refuses_what_is_not_a_tar_or_too_long(tmp_path):
    with pytest.raises(outstream.BadOutput, match="not a tar archive"):
        outstream.unpack(io.BytesIO(b"junk" * 1000), tmp_path, max_bytes=4096)
    huge = io.BytesIO()  # one entry whose name (a pax header) is 600 kB: the stream is never read past its bound
    with tarfile.open(fileobj=huge, mode="w", format=tarfile.PAX_FORMAT) as t:
        t.addfile(tarfile.TarInfo("out/" + "a" * 600_000))
    huge.seek(0)
    with pytest.raises(outstream.BadOutput, match="larger than"):
        outstream.unpack(huge, tmp_path, max_bytes=1024, max_files=1)


def test_pack_then_unpack_keeps_files_and_refuses_links(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "report.json").write_text("{}")
    (src / "sub" / "trace.bin").write_bytes(os.urandom(3000))

    def round_trip(dest: Path) -> None:
        buf = io.BytesIO()
        outstream.pack(str(src), buf)
        buf.seek(0)
        dest.mkdir()
        outstream.unpack(buf, dest, max_bytes=1 << 20)

    round_trip(tmp_path / "dest")
    got = sorted(str(p.relative_to(tmp_path / "dest")) for p in (tmp_path / "dest").rglob("*"))
    assert got == ["report.json", "sub", "sub/trace.bin"]
    assert (tmp_path / "dest" / "sub" / "trace.bin").read_bytes() == (src / "sub" / "trace.bin").read_bytes()
    (src / "link").symlink_to("/etc/passwd")
    with pytest.raises(outstream.BadOutput, match="is a symbolic link"):
        round_trip(tmp_path / "again")
