"""History: the stores (SQLite, a real PostgreSQL server, a data branch of a real git repository) with
concurrent writers, change points, the CLI, and the daemon recording merged pull requests."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from kernalin_ci.history import changepoints
from kernalin_ci.history.model import run_from_report
from kernalin_ci.history.series import build
from kernalin_ci.history.gitbranch import GitBranchHistory
from kernalin_ci.history.store import PostgresHistory, SQLiteHistory, open_store
from history_support import PG_BIN, Postgres, bench, kernel, report

CLI = [sys.executable, "-m", "kernalin_ci"]


def sha(i: int, w: int = 0) -> str:
    return f"{w:02x}{i:038x}"


def a_run(i: int, w: int = 0, repo: str = "acme/k"):
    return run_from_report(report([kernel("rope", bench(1.0, 1.0 + i / 1000))]), repo=repo, commit=sha(i, w),
                           branch="main", pr=i)


@pytest.fixture(scope="module")
def postgres():
    if PG_BIN is None:
        pytest.skip("PostgreSQL server binaries are not installed (apt-get install postgresql)")
    pg = Postgres().start()
    yield pg
    pg.stop()


def concurrent_adds(make_store, writers: int = 4, each: int = 10) -> None:
    errors = []

    def write(w):
        try:
            store = make_store()
            for i in range(each):
                assert store.add(a_run(i, w))
                assert not store.add(a_run(i, w))  # a commit is recorded once
            store.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def check_all_there(store, writers: int = 4, each: int = 10) -> None:
    runs = store.runs("acme/k")
    assert sorted(r.commit for r in runs) == sorted(sha(i, w) for w in range(writers) for i in range(each))
    p = runs[0].points[0]
    assert (p.kernel, p.shape, p.verdict, p.verification) == ("rope", "decode", "equivalent", "pass")
    assert runs[0].environment["gpu"] == "NVIDIA H200" and store.repos() == ["acme/k"]


def test_sqlite_history_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "h.sqlite3"
    concurrent_adds(lambda: SQLiteHistory(path))
    check_all_there(open_store(f"sqlite://{path}"))


def test_postgres_history_concurrent_writers_lose_nothing(postgres):
    concurrent_adds(lambda: PostgresHistory(postgres.url))
    check_all_there(open_store(postgres.url))


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout


def test_data_branch_concurrent_writers_lose_nothing(tmp_path):
    """Four CI jobs (four clones) record at once; refused pushes are retried; nothing is lost, and the
    checked-out branch and work tree are untouched. The CLI records through the same path."""
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    seed = tmp_path / "seed"
    subprocess.run(["git", "clone", "-q", str(remote), str(seed)], check=True, capture_output=True)
    (seed / "README").write_text("x\n")
    git(seed, "add", "README")
    git(seed, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    git(seed, "push", "-q", "origin", "main")
    rep = tmp_path / "report.json"
    rep.write_text(json.dumps(report([kernel("rope", bench(1.0, 1.0))])))
    clones = []
    for w in range(4):
        c = tmp_path / f"clone{w}"
        subprocess.run(["git", "clone", "-q", str(remote), str(c)], check=True, capture_output=True)
        clones.append(c)
    errors = []

    def write(w, clone):  # each writer is a CI job with its own clone
        try:
            store = GitBranchHistory(clone, "kernalin-history")
            for i in range(5):
                assert store.add(run_from_report(json.loads(rep.read_text()), repo="acme/k", commit=sha(i, w),
                                                 branch="main"))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w, c)) for w, c in enumerate(clones)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store = open_store(f"git:kernalin-history@{clones[0]}")
    assert sorted(r.commit for r in store.runs("acme/k")) == sorted(sha(i, w) for w in range(4) for i in range(5))
    log = git(remote, "log", "--format=%s", "kernalin-history").splitlines()
    assert len(log) == 20  # one commit per run: no write replaced another
    assert git(clones[0], "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git(clones[0], "status", "--porcelain") == ""
    # the same commit again: not recorded twice
    p = subprocess.run(CLI + ["history", "--store", "git:kernalin-history", "--record", str(rep),
                              "--repo", "acme/k", "--commit", sha(0, 0)], cwd=clones[1], capture_output=True, text=True)
    assert p.returncode == 0 and "already recorded" in p.stderr


def series_with_step(n=40, at=24, step=0.02, seed=3):
    rng = np.random.default_rng(seed)
    x = 1.0 + rng.normal(0, 0.001, n)
    x[at:] *= 1 + step
    return x


def test_change_points_find_a_step_and_not_noise():
    (cp,) = changepoints.detect(series_with_step())
    assert cp.index == 24 and 1.015 < cp.ratio < 1.025
    assert changepoints.detect(series_with_step(step=0.0)) == []
    assert changepoints.detect([1.0, 1.1, 1.0]) is None  # too short to analyse


def test_series_report_the_commit_range_of_a_change():
    times = series_with_step(n=20, at=12)
    runs = [run_from_report(report([kernel("rope", bench(1.0, float(t)))]), repo="acme/k", commit=sha(i),
                            branch="main", recorded_at=1000.0 + i) for i, t in enumerate(times)]
    (s,) = build(runs)
    (c,) = s.changes
    assert (c.last_good, c.first_commit, c.index) == (sha(11), sha(12), 12)
    assert s.points[0].band == pytest.approx([0.998 * s.points[0].base_ms, 1.002 * s.points[0].base_ms])


def test_history_cli_list_show_csv_and_bad_input(tmp_path):
    db = tmp_path / "h.sqlite3"
    store = SQLiteHistory(db)
    for i, t in enumerate(series_with_step(n=20, at=12)):
        store.add(run_from_report(report([kernel("rope", bench(1.0, float(t)))]), repo="acme/k", commit=sha(i),
                                  branch="main", pr=100 + i))
    env = {**os.environ, "KERNALIN_HISTORY": str(db)}
    out = subprocess.run(CLI + ["history"], env=env, capture_output=True, text=True, check=True).stdout
    assert "rope" in out and "decode" in out and f"{sha(11)[:7]}..{sha(12)[:7]} (+2." in out, out
    out = subprocess.run(CLI + ["history", "--kernel", "rope", "--csv"], env=env, capture_output=True, text=True,
                         check=True).stdout
    rows = list(__import__("csv").DictReader(out.splitlines()))
    assert len(rows) == 20 and rows[12]["commit"] == sha(12) and rows[12]["change"].startswith("+2.")
    assert rows[0]["pr"] == "100" and rows[0]["verification"] == "pass"
    for bad in (["history", "--kernel", "nope"], ["history", "--repo", "x/y"], ["history", "--record", "r.json"],
                ["history", "--record", str(tmp_path / "missing.json"), "--repo", "a/b", "--commit", "c"]):
        p = subprocess.run(CLI + bad, env=env, capture_output=True, text=True)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (bad, p.stderr)
