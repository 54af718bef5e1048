"""The kernel workers' Triton cache is kept across runs, one per code (kernalin_ci/sandbox.py:compile_cache).

A worker writes into its compile cache whatever it likes (a kernel under test can forge a compiled kernel
or a driver stub there). The cache is kept between runs under $XDG_CACHE_HOME/kernalin-ci/triton/KEY,
KEY the fingerprint of every file the worker can read outside the trusted installation: a later run of
the same files gets it back (no compile), any other code gets another one. Each run below is a new
Python process, as a second `kernalin-ci verify` is."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kernalin_ci import sandbox

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

# one run: a worker of the code in CWD runs SCRIPT in its sandbox, then ends as verify's workers do
RUN = """import json, os, subprocess, sys
from kernalin_ci import sandbox
cwd, work, script = sys.argv[1:4]
plan, env = sandbox.worker_plan({}, "cpu", work, cwd)
proc, why = sandbox.start(plan, [sys.executable, "-c", script], env=dict(os.environ, **env),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
out, err = proc.communicate(timeout=60)
sandbox.end_worker(plan)
print(json.dumps({"why": why, "rc": proc.returncode, "out": out, "err": err, "cache": env["TRITON_CACHE_DIR"]}))
"""
WRITE = "import os; open(os.path.join(os.environ['TRITON_CACHE_DIR'], 'stub.so'), 'w').write('forged')"
SEES = "import os; print(os.path.exists(os.path.join(os.environ['TRITON_CACHE_DIR'], 'stub.so')))"


@pytest.fixture
def open_dir():
    """A folder the sandbox's uid 65534 can read (pytest's tmp_path lies under a root-only folder)."""
    d = Path(tempfile.mkdtemp(prefix="kernalin-ccache-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run(code: Path, work: Path, script: str, **env: str) -> dict:
    """One run (a new process) of a worker whose working directory is CODE."""
    r = subprocess.run(
        [sys.executable, "-c", RUN, str(code), str(work), script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["why"] is None and got["rc"] == 0, got
    return got


def _code(path: Path, text: str) -> Path:
    path.mkdir()
    path.chmod(0o755)
    (path / "pkg").mkdir()
    (path / "pkg" / "kernel.py").write_text(text)
    (path / "entry.py").write_text("from pkg.kernel import *\n")
    for p in (path / "pkg", path / "pkg" / "kernel.py", path / "entry.py"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return path


@needs_bwrap
def test_a_later_run_of_the_same_files_gets_the_cache_back_and_other_files_never_see_it(open_dir, monkeypatch):
    monkeypatch.setenv(sandbox.ENV_WORKER_SANDBOX, "on")
    monkeypatch.setenv("XDG_CACHE_HOME", str(open_dir / "xdg"))
    monkeypatch.delenv(sandbox.ENV_COMPILE_CACHE, raising=False)
    work = open_dir / "work"
    work.mkdir()
    code = _code(open_dir / "code", "X = 1\n")
    copy = _code(open_dir / "copy", "X = 1\n")  # the same files at another path

    first = _run(code, work, WRITE)  # the first run's worker leaves a (forged) file in its cache
    assert _run(code, work, SEES)["out"].strip() == "True"  # a later run of the same files gets it
    root = Path(first["cache"]).parent
    assert root == Path(sandbox.cache_root()).resolve() and oct(root.stat().st_mode & 0o777) == "0o700"
    assert _run(copy, work, SEES)["out"].strip() == "False"  # the same files elsewhere: another cache

    (code / "pkg" / "kernel.py").write_text("X = 2\n")  # one file of the code changed
    changed = _run(code, work, SEES)
    assert changed["out"].strip() == "False" and changed["cache"] != first["cache"]
    (code / "pkg" / "kernel.py").write_text("X = 1\n")  # written again as it was: the same code again
    assert _run(code, work, SEES)["out"].strip() == "True"

    off = _run(code, work, SEES, **{sandbox.ENV_COMPILE_CACHE: "off"})  # today's cache of one process
    assert off["out"].strip() == "False" and not off["cache"].startswith(str(root))


def test_the_key_covers_every_entry_of_the_code_and_only_the_path_of_the_installation(open_dir, monkeypatch):
    code = _code(open_dir / "code", "X = 1\n")
    (code / ".venv").mkdir()
    (code / ".venv" / "lib.py").write_text("installed\n")
    (code / "big.bin").write_bytes(b"0" * 64)
    monkeypatch.setattr(sandbox, "WALK_CONTENT_BYTES", 32)  # big.bin counts by its identity

    def key():
        view = ("cpu", (str(code.resolve()),), ())
        return sandbox._fingerprint(view, {str((code / ".venv").resolve())})

    first, why = key()
    assert first and not why
    (code / ".venv" / "lib.py").write_text("changed\n")  # the installation: listed by its path only
    assert key()[0] == first
    os.utime(code / "entry.py", ns=(1, 1))  # a small file: by its content
    assert key()[0] == first
    for change in (
        lambda: os.utime(code / "big.bin", ns=(1, 1)),  # a large file: by its identity
        lambda: (code / "new.py").write_text(""),
        lambda: os.symlink("/etc", code / "link"),
        lambda: os.replace(code / "link", code / "link2"),
        lambda: (code / "pkg" / "kernel.py").chmod(0o600),
    ):
        change()
        now, _ = key()
        assert now != first
        first = now
    monkeypatch.setattr(sandbox, "WALK_MAX_ENTRIES", 3)
    none, why = key()
    assert none is None and "too many files" in why


def test_pruning_removes_the_least_recently_used_keys_beyond_the_caps(open_dir, monkeypatch):
    root = open_dir / "triton"
    root.mkdir()
    now = time.time()
    for i, age in enumerate([5000, 4000, 3000, 2000, 10]):  # seconds since last used
        key = root / f"key{i}"
        key.mkdir()
        (key / "k.bin").write_bytes(b"x" * 1000)
        os.utime(key, (now - age, now - age))
    (root / ".trash-1-1").mkdir()  # a prune that was killed halfway
    monkeypatch.setattr(sandbox, "CACHE_MAX_KEYS", 3)
    assert sandbox.prune_compile_caches(str(root), now) == ["key1", "key0"]
    monkeypatch.setattr(sandbox, "CACHE_MAX_BYTES", 500)  # less than one key: but one used just now stays
    assert sandbox.prune_compile_caches(str(root), now) == ["key3", "key2"]
    assert os.listdir(root) == ["key4"]
    monkeypatch.setattr(sandbox, "CACHE_MAX_KEYS", 0)
    monkeypatch.setattr(sandbox, "CACHE_KEEP_S", 0)
    sandbox.prune_compile_caches(str(root), now)
    assert os.listdir(root) == []


COPY = """import sys
from kernalin_ci import sandbox
sandbox._copy_new(sys.argv[1], sys.argv[2], 1 << 30, 0o755, 0o644)
"""


def test_concurrent_harvests_into_one_key_never_show_a_partial_file(open_dir):
    """Two runs of the same code harvest the same file into their kept cache at once while a third seeds
    a worker from it: the file is there whole or not at all, under its own name only."""
    size = 48 << 20
    key, seeds = open_dir / "key", open_dir / "seeds"
    key.mkdir()
    seeds.mkdir()
    srcs = []
    for i in range(2):
        src = open_dir / f"worker{i}" / "abc"
        src.mkdir(parents=True)
        (src / "kernel.cubin").write_bytes(bytes([i + 1]) * size)
        srcs.append(src.parent)
    writers = [subprocess.Popen([sys.executable, "-c", COPY, str(s), str(key)]) for s in srcs]
    seen = 0
    while any(w.poll() is None for w in writers) or seen == 0:
        seed = seeds / str(seen)
        seed.mkdir()
        sandbox._copy_new(str(key), str(seed), 1 << 30, 0o755, 0o644)  # as a worker's tmpfs is seeded
        published = [f for f in key.rglob("kernel.cubin")]
        assert all(f.stat().st_size == size for f in published)  # whole, or not there yet
        taken = [f for f in seed.rglob("*") if f.is_file()]
        assert [f.name for f in taken] in ([], ["kernel.cubin"]), taken  # never a copy in the making
        assert all(f.stat().st_size == size for f in taken)
        shutil.rmtree(seed)
        seen += 1
    assert [w.wait() for w in writers] == [0, 0]
    data = (key / "abc" / "kernel.cubin").read_bytes()
    assert len(data) == size and data in (b"\1" * size, b"\2" * size)
    assert [p.name for p in (key / "abc").iterdir()] == ["kernel.cubin"]
