"""Issue 13, attack 8 (disk) under `kernalin-ci verify` (and so `run`, `bench`, the Action): a kernel tries to
fill the host's disk through the folder its worker hands raw results back in, and through its output.

Sandboxed, that folder is a tmpfs of KERNALIN_SANDBOX_DISK bytes inside the worker's sandbox, which the
parent opens before the worker runs (sandbox.CappedFolder), and the parent keeps only the last 4000 bytes
of the worker's output, in memory. Before, the folder was a host folder bound read-write and the output a
file beside it: the kernel below put twice the cap into each. With KERNALIN_SANDBOX=off (no sandbox, said
on stderr) the folder is still the host's, which shows the attack is real."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from kernalin_ci import sandbox

NO_SANDBOX = sandbox.bwrap_works(sandbox.SandboxSettings())  # why bubblewrap cannot make a worker's sandbox here
pytestmark = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no worker sandbox here: {NO_SANDBOX}")

CAP = 8 << 20
# a rope entry that writes twice the cap into its worker's results folder (named in the job file, whose
# path is on the worker's command line), keeps it, and raises with what it got through
ENTRY = """import json, os, sys


def entry(q, k, positions):
    job = json.load(open(sys.argv[-2]))["job"]
    written, error = 0, None
    try:
        with open(os.path.join(job["results"], "fill.bin"), "wb", buffering=0) as f:
            while written < 2 * CAP:
                written += f.write(b"x" * 65536)
    except OSError as e:
        error = e.strerror
    for _ in range(2 * CAP // 65536):
        sys.stdout.write("y" * 65535 + "\\n")
    raise RuntimeError("ATTACK" + json.dumps({"written": written, "error": error}) + "ATTACK")
"""
CASE = {
    "name": "p",
    "dims": {"D": 64, "Hq": 2, "Hkv": 1, "T": 3, "positions": [0, 1, 2]},
    "dtype": "float32",
    "seed": 1,
}


@pytest.fixture
def open_dir():
    """A folder the sandbox's uid 65534 can read (pytest's tmp_path lies under a root-only folder)."""
    d = Path(tempfile.mkdtemp(prefix="kernalin-hostile-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def verify(folder: Path, mode: str, disk: str, only: str = "dynamic") -> tuple[subprocess.CompletedProcess, int]:
    """verify's run, and the most disk its temporary folder (TMPDIR: the parent's work and results
    folders) held meanwhile, sampled every 20 ms."""
    (folder / "evil.py").write_text(ENTRY.replace("CAP", str(CAP)))
    tmp = folder.with_name(folder.name + "-tmp")  # beside the checkout, as /tmp is
    tmp.mkdir(mode=0o755, exist_ok=True)
    peak, done = [0], threading.Event()

    def watch():
        while not done.wait(0.02):
            used = 0
            for d, _, files in os.walk(tmp):
                for f in files:
                    try:
                        used += os.lstat(os.path.join(d, f)).st_blocks * 512
                    except OSError:
                        pass
            peak[0] = max(peak[0], used)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "kernalin_ci", "verify", "--op", "rope", "--entry", f"{folder / 'evil.py'}:entry"]
            + ["--only", only, *(["--case", json.dumps(CASE)] if only == "dynamic" else [])]
            + ["--json", str(folder / "result.json")],
            cwd=folder,
            env=dict(os.environ, KERNALIN_SANDBOX=mode, KERNALIN_SANDBOX_DISK=disk, TMPDIR=str(tmp)),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        done.set()
        watcher.join()
        shutil.rmtree(tmp, ignore_errors=True)
    return p, peak[0]


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_kernel_cannot_fill_the_hosts_disk_through_its_results_folder(open_dir, mode):
    p, peak = verify(open_dir, mode, str(CAP))
    out = p.stdout + p.stderr
    assert "ATTACK" in out, out[-3000:]
    got = json.loads(out.split("ATTACK")[1].replace('\\"', '"'))
    result = json.loads((open_dir / "result.json").read_text())
    messages = [f["message"] for f in result["findings"]]
    assert p.returncode == 1 and result["verdict"] == "fail"
    if mode == "off":  # the attack is real: unsandboxed, the results folder is the host's disk
        assert got == {"written": 2 * CAP, "error": None}
        return
    assert peak < 1 << 20, f"{peak} bytes reached the host's disk"  # the job file only
    # the write stopped at the cap, inside the sandbox; the run says so, naming the cap and its setting
    assert got["written"] <= CAP and got["error"] == "No space left on device", got
    assert any("disk cap of 8 MiB (KERNALIN_SANDBOX_DISK)" in m for m in messages), messages
    assert "disk cap of 8 MiB" in p.stderr


def test_the_structural_worker_cannot_either(open_dir):
    """The structural worker (it calls the entry to capture its launches) has a capped results folder too."""
    p, peak = verify(open_dir, "on", str(CAP), only="structural")
    result = json.loads((open_dir / "result.json").read_text())
    assert peak < 1 << 20, f"{peak} bytes reached the host's disk"
    assert result["verdict"] == "fail" and p.returncode == 1
    assert "its disk cap of 8 MiB (KERNALIN_SANDBOX_DISK)" in result["structural"]["cause"], result["structural"]


def test_a_bad_disk_cap_is_a_usage_error(open_dir):
    p, _ = verify(open_dir, "on", "lots")
    assert p.returncode == 2 and "KERNALIN_SANDBOX_DISK" in p.stderr, p.stderr[-2000:]


def test_a_shared_folder_is_a_capped_copy_and_only_new_plain_files_come_back(open_dir, monkeypatch):
    """A folder several workers share (a Triton cache): the worker sees a copy of it on its own capped tmpfs;
    afterwards only the plain files it added come back, at most the cap (a real sandbox; the wrapper
    script plays the worker)."""
    from kernalin_ci.isolate import run_task
    from kernalin_ci.jobs import EnvJob

    monkeypatch.setenv(sandbox.ENV_WORKER_SANDBOX, "on")
    shared = open_dir / "cache"
    (shared / "old").mkdir(parents=True)
    (shared / "old" / "k.bin").write_text("seeded")
    script = (
        'cat "$0/old/k.bin" > "$0/seen"; echo changed > "$0/old/k.bin"; mkdir "$0/new"; echo fresh > "$0/new/k.bin"; '
        'ln -s /etc/passwd "$0/link"; truncate -s 100G "$0/sparse"; head -c 3000000 /dev/zero > "$0/big"'
    )
    with sandbox.CappedFolder(cap=1 << 20, shared=str(shared)) as folder:
        run_task(
            EnvJob(),
            "cpu",
            60,
            writable=(folder,),
            wrap=("/bin/sh", "-c", script, folder.path),
        )
    got = {str(p.relative_to(shared)): p.stat().st_size for p in shared.rglob("*") if p.is_file() or p.is_symlink()}
    assert (shared / "seen").read_text() == "seeded"  # the worker started with the folder's files
    assert (shared / "old" / "k.bin").read_text() == "seeded"  # an existing file is never replaced
    assert (shared / "new" / "k.bin").read_text() == "fresh\n"
    assert "link" not in got and "sparse" not in got  # no link, nothing past the cap (a sparse file counts whole)
    assert sum(got.values()) <= 1 << 20, got
