"""History: the stores (SQLite, a real PostgreSQL server, a data branch of a real git repository) with
concurrent writers, change points, the CLI, and the daemon recording merged pull requests."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from history_support import bench, kernel, report

from kernalin_ci.cli import main
from kernalin_ci.history import changepoints
from kernalin_ci.history.gitbranch import GitBranchHistory
from kernalin_ci.history.model import run_from_report
from kernalin_ci.history.series import build
from kernalin_ci.history.store import SQLiteHistory, open_store

CLI = [sys.executable, "-m", "kernalin_ci"]


def sha(i: int, w: int = 0) -> str:
    return f"{w:02x}{i:038x}"


def a_run(i: int, w: int = 0, repo: str = "acme/k"):
    return run_from_report(
        report([kernel("rope", bench(1.0, 1.0 + i / 1000))]), repo=repo, commit=sha(i, w), branch="main", pr=i
    )


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


def test_a_new_sqlite_history_goes_to_wal_while_another_connection_writes(tmp_path):
    """The cause of a flaky test_sqlite_history_concurrent_writers_lose_nothing: switching a new database to
    WAL upgrades a read transaction to a write one, for which SQLite calls no busy handler, so a connection
    opened while another writes failed at once with "database is locked" (whatever its busy timeout).
    Made deterministic here: a writer holds the RESERVED lock while a second connection opens the history."""
    import sqlite3

    path = tmp_path / "h.sqlite3"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    plain = sqlite3.connect(path, isolation_level=None, timeout=30)
    with pytest.raises(sqlite3.OperationalError, match="locked"):  # no waiting, despite timeout=30
        plain.execute("PRAGMA journal_mode=WAL")
    plain.close()
    timer = threading.Timer(0.2, lambda: writer.execute("COMMIT"))
    timer.start()
    store = SQLiteHistory(path)  # waits for the writer, then switches
    timer.join()
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.add(a_run(1)) and [r.commit for r in store.runs("acme/k")] == [sha(1)]


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout


WRITERS, EACH = 3, 4


def test_data_branch_concurrent_writers_lose_nothing(tmp_path):
    """Three CI jobs (three clones) record at once; refused pushes are retried; nothing is lost, and the
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
    for w in range(WRITERS):
        c = tmp_path / f"clone{w}"
        subprocess.run(["git", "clone", "-q", str(remote), str(c)], check=True, capture_output=True)
        clones.append(c)
    errors = []

    def write(w, clone):  # each writer is a CI job with its own clone
        try:
            store = GitBranchHistory(clone, "kernalin-history")
            for i in range(EACH):
                assert store.add(
                    run_from_report(json.loads(rep.read_text()), repo="acme/k", commit=sha(i, w), branch="main")
                )
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w, c)) for w, c in enumerate(clones)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store = open_store(f"git:kernalin-history@{clones[0]}")
    assert sorted(r.commit for r in store.runs("acme/k")) == sorted(
        sha(i, w) for w in range(WRITERS) for i in range(EACH)
    )
    log = git(remote, "log", "--format=%s", "kernalin-history").splitlines()
    assert len(log) == WRITERS * EACH  # one commit per run: no write replaced another
    assert git(clones[0], "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git(clones[0], "status", "--porcelain") == ""
    # a writer whose push is overtaken (another job pushes between its fetch and its push) retries
    other = GitBranchHistory(clones[1], "kernalin-history")

    class Overtaken(GitBranchHistory):
        def _push(self, commit):
            if self.attempts_used == 1:
                assert other.add(
                    run_from_report(json.loads(rep.read_text()), repo="acme/k", commit=sha(90), branch="main")
                )
            return super()._push(commit)

    late = Overtaken(clones[0], "kernalin-history")
    assert late.add(run_from_report(json.loads(rep.read_text()), repo="acme/k", commit=sha(91), branch="main"))
    assert late.attempts_used == 2
    assert {sha(90), sha(91)} <= {r.commit for r in late.runs("acme/k")}
    # the same commit again: not recorded twice
    p = subprocess.run(
        CLI
        + [
            "history",
            "--store",
            "git:kernalin-history",
            "--record",
            str(rep),
            "--repo",
            "acme/k",
            "--commit",
            sha(0, 0),
        ],
        cwd=clones[1],
        capture_output=True,
        text=True,
    )
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
    runs = [
        run_from_report(
            report([kernel("rope", bench(1.0, float(t)))]),
            repo="acme/k",
            commit=sha(i),
            branch="main",
            recorded_at=1000.0 + i,
        )
        for i, t in enumerate(times)
    ]
    (s,) = build(runs)
    (c,) = s.changes
    assert (c.last_good, c.first_commit, c.index) == (sha(11), sha(12), 12)
    assert s.points[0].band == pytest.approx([0.998 * s.points[0].base_ms, 1.002 * s.points[0].base_ms])


def test_history_cli_list_show_csv_and_bad_input(tmp_path, monkeypatch, capsys):
    db = tmp_path / "h.sqlite3"
    store = SQLiteHistory(db)
    for i, t in enumerate(series_with_step(n=20, at=12)):
        store.add(
            run_from_report(
                report([kernel("rope", bench(1.0, float(t)))]), repo="acme/k", commit=sha(i), branch="main", pr=100 + i
            )
        )
    env = {**os.environ, "KERNALIN_HISTORY": str(db)}
    out = subprocess.run(CLI + ["history"], env=env, capture_output=True, text=True, check=True).stdout
    assert "rope" in out and "decode" in out and f"{sha(11)[:7]}..{sha(12)[:7]} (+2." in out, out
    monkeypatch.setenv("KERNALIN_HISTORY", str(db))
    assert main(["history", "--kernel", "rope", "--csv"]) == 0
    out = capsys.readouterr().out
    rows = list(__import__("csv").DictReader(out.splitlines()))
    assert len(rows) == 20 and rows[12]["commit"] == sha(12) and rows[12]["change"].startswith("+2.")
    assert rows[0]["pr"] == "100" and rows[0]["verification"] == "pass"
    for bad in (
        ["history", "--kernel", "nope"],
        ["history", "--repo", "x/y"],
        ["history", "--record", "r.json"],
        ["history", "--record", str(tmp_path / "missing.json"), "--repo", "a/b", "--commit", "c"],
    ):
        assert main(bad) == 2, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err, (bad, err)


def test_report_environment_is_what_is_installed_and_fits_the_schema():
    from importlib import metadata

    import jsonschema

    from kernalin_ci.history.model import environment
    from kernalin_ci.report.schema import REPORT_SCHEMA

    env = environment("cpu")
    assert env["torch"] == metadata.version("torch") and env["triton"] == metadata.version("triton")
    assert env["gpu"] == "none (CPU interpreter)"
    jsonschema.validate(report([kernel("rope")]) | {"environment": env}, REPORT_SCHEMA)


def test_daemon_history_settings():
    from kernalin_ci.daemon.settings import parse
    from kernalin_ci.errors import UsageError

    s = parse({"state_dir": "/srv/k"}, "d.yml", {})
    assert s.history and s.history_location == "/srv/k/jobs.sqlite3"  # in the job database
    s = parse({"history": {"url": "postgresql://a@h/db"}}, "d.yml", {"KERNALIN_HISTORY_URL": "postgresql://b@h/db"})
    assert s.history_location == "postgresql://b@h/db"  # the environment wins (a password belongs there)
    assert not parse({"history": {"enabled": False}}, "d.yml", {}).history
    with pytest.raises(UsageError, match="history.url"):
        parse({"history": {"url": "mysql://h/db"}}, "d.yml", {})
    with pytest.raises(UsageError, match="secrets are never passed"):
        parse({"runner": {"env": {"KERNALIN_HISTORY_URL": "x"}}}, "d.yml", {})


def test_a_series_follows_the_gpu_the_timings_were_taken_on():
    """The GPU of explain.provenance (where the kernel was timed) wins over the report's environment; times
    of another GPU are not one series with these."""
    runs = []
    for i, t in enumerate(series_with_step(n=20, at=12)):
        k = kernel("rope", bench(1.0, float(t) * (2.0 if i < 4 else 1.0)))  # the first 4 on a slower GPU
        k["explain"] = {
            "provenance": {
                "start": {
                    "gpu_name": "NVIDIA A10" if i < 4 else "NVIDIA H200",
                    "driver": "580.1",
                    "clocks": {"sm": 1980},
                }
            }
        }
        runs.append(run_from_report(report([k]), repo="acme/k", commit=sha(i), branch="main"))
    assert runs[0].points[0].provenance == {"gpu_name": "NVIDIA A10", "driver": "580.1"}
    (s,) = build(runs)
    assert [c.first_commit for c in s.changes] == [sha(12)]  # not the GPU switch at commit 4


def linear_repo(path, n: int, name: str = "c") -> list[str]:
    """A real git repository with N empty commits on main; their shas, oldest first. Empty commits with the
    same message made in the same second are the same commit: another repository needs another NAME."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    out = []
    for i in range(n):
        git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", f"{name}{i}")
        out.append(git(path, "rev-parse", "HEAD").strip())
    return out


def test_series_follow_the_commit_graph_not_the_order_recorded(tmp_path, capsys):
    """20 commits on main with a +2% step at commit 12, recorded in another order (commit 12 after the
    newer ones, commit 5 the very last); one more commit recorded and then force-pushed away. Ordered by the
    graph: the change is c11..c12, each point's previous commit is its parent, the force-pushed commit is
    off the branch. The CLI orders the same way; pointed at another repository it says it cannot."""
    from kernalin_ci.dashboard.site import page_data
    from kernalin_ci.history.ancestry import Ancestry, arrange

    repo = tmp_path / "repo"
    c = linear_repo(repo, 20)
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "dropped")
    dropped = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "reset", "-q", "--hard", c[-1])  # the force-push: `dropped` is no longer on main
    times = series_with_step(n=20, at=12)
    recorded = [i for i in range(20) if i not in (5, 12)] + [12, 5]  # two older commits recorded late
    db = tmp_path / "h.sqlite3"
    store = SQLiteHistory(db)
    runs = []
    for k, i in enumerate(recorded[:10] + [20] + recorded[10:]):  # `dropped` recorded in the middle
        commit, t = (dropped, 1.5) if i == 20 else (c[i], float(times[i]))
        r = run_from_report(
            report([kernel("rope", bench(1.0, t))], base=c[i - 1] if 0 < i < 20 else "0" * 40),
            repo="acme/k",
            commit=commit,
            branch="main",
            pr=100 + i,
            recorded_at=1000.0 + k,
        )
        assert store.add(r)
        runs.append(r)
    assert [r.commit for r in store.runs("acme/k")] == [r.commit for r in runs]

    order = arrange(store.runs("acme/k"), Ancestry.from_git(repo, "main"))
    assert order.by == "git" and order.head == c[-1]
    assert [r.commit for r in order.runs] == c and [r.commit for r in order.off_branch] == [dropped]
    (s,) = build(order.runs)
    (change,) = s.changes
    assert (change.last_good, change.first_commit) == (c[11], c[12])
    assert [p.previous for p in s.points] == [None] + c[:-1]
    assert all(p.base == p.previous for p in s.points[1:])  # each verdict was against the previous commit
    (unordered,) = build(store.runs("acme/k"))  # as recorded, the step is not where it is
    assert [(x.last_good, x.first_commit) for x in unordered.changes] != [(c[11], c[12])]

    data = page_data("acme/k", store.runs("acme/k"), Ancestry.for_branch(repo, "main"))
    assert data["order"] == {"by": "git", "ref": "refs/heads/main", "head": c[-1], "note": ""}
    assert [r["commit"] for r in data["off_branch"]] == [dropped] and data["latest"]["commit"] == c[-1]

    assert main(["history", "--store", str(db), "--git", str(repo)]) == 0
    out, err = capsys.readouterr()
    assert f"{c[11][:7]}..{c[12][:7]} (+2." in out and f"{dropped[:12]} is not on refs/heads/main any more" in err
    assert main(["history", "--store", str(db), "--git", str(repo), "--kernel", "rope", "--csv"]) == 0
    rows = list(__import__("csv").DictReader(capsys.readouterr().out.splitlines()))
    assert [r["commit"] for r in rows] == c and rows[12]["change"].startswith("+2.")
    assert rows[12]["previous"] == rows[12]["base"] == c[11]
    other = tmp_path / "other"
    linear_repo(other, 2, name="other")
    assert main(["history", "--store", str(db), "--git", str(other), "--kernel", "rope", "--csv"]) == 0
    out, err = capsys.readouterr()
    assert "in the order recorded (none of the 21 recorded commits is an ancestor of refs/heads/main" in err
    assert [r["commit"] for r in __import__("csv").DictReader(out.splitlines())][-1] == c[5]
    assert main(["history", "--store", str(db), "--git", str(tmp_path / "nowhere")]) == 2
