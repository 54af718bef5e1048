"""History runs -> the dashboard's HTML. The data of a page is embedded in it as JSON and drawn by
static/dashboard.js with Chart.js, so a built site needs no network and no server.

    page = repo_page("o/r", runs, assets="assets/", badge_src="badge.svg", index_href="index.html")
    build_site(store, out_dir)     # `kernalin-ci dashboard --out DIR`: index.html, a page per repository
"""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path

from kernalin_ci.dashboard.assets import copy_assets
from kernalin_ci.history import series as series_mod
from kernalin_ci.history.ancestry import Ancestry, arrange
from kernalin_ci.history.model import Run
from kernalin_ci.report.badge import badge_svg
from kernalin_ci.report.model import KernelReport, Report


def _brief(run: Run) -> dict:
    return {
        "commit": run.commit,
        "pr": run.pr,
        "recorded_at": run.recorded_at,
        "conclusion": run.conclusion,
        "report_url": run.report_url,
    }


def page_data(repo: str, runs: list[Run], ancestry: Ancestry | None = None) -> dict:
    """What a repository's page draws: RUNS (as recorded) in the order of ANCESTRY (the order recorded
    without one, said in `order`)."""
    order = arrange(runs, ancestry)
    runs = order.runs
    all_series = series_mod.build(runs)
    kernels: dict[str, dict] = {}
    for s in all_series:
        k = kernels.setdefault(s.kernel, {"name": s.kernel, "series": []})
        k["series"].append(s.to_json())
    latest = runs[-1] if runs else None
    return {
        "repo": repo,
        "runs": len(runs),
        "kernels": [kernels[n] for n in sorted(kernels)],
        "order": order.summary(),
        "off_branch": [_brief(r) for r in order.off_branch],
        "latest": None
        if latest is None
        else {
            "commit": latest.commit,
            "conclusion": latest.conclusion,
            "reason": latest.reason,
            "environment": latest.environment,
            "pr": latest.pr,
            "report_url": latest.report_url,
        },
    }


def badge_of(run: Run) -> str:
    """The gate badge (report/badge.py) of the newest recorded run."""

    kernels: dict[str, KernelReport] = {}
    for p in run.points:
        kr = kernels.setdefault(p.kernel, KernelReport(p.kernel, "", "", p.status or "changed"))
        kr.failed_by = sorted(set(kr.failed_by) | set(p.failed_by))
    return badge_svg(
        Report(
            conclusion=run.conclusion,
            reason=run.reason,
            base={},
            head={"sha": run.commit},
            device=run.device,
            policy={},
            kernels=list(kernels.values()),
        )
    )


def _json_script(data: dict) -> str:
    text = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")
    return f'<script id="kernalin-data" type="application/json">{text}</script>'


def _head(title: str, assets: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="stylesheet" href="{escape(assets)}dashboard.css"></head><body>'
    )


def repo_page(
    repo: str,
    runs: list[Run],
    *,
    assets: str,
    badge_src: str | None,
    index_href: str | None,
    ancestry: Ancestry | None = None,
) -> str:
    data = page_data(repo, runs, ancestry)
    nav = f'<a href="{escape(index_href)}">all repositories</a> · ' if index_href else ""
    badge = f'<img class="badge" alt="kernalin-ci badge" src="{escape(badge_src)}">' if badge_src else ""
    return (
        _head(f"kernalin-ci: {repo}", assets)
        + f'<header><h1>{escape(repo)}</h1>{badge}<p class="meta">{nav}{len(runs)} recorded commits of the '
        "default branch</p></header>"
        '<main id="app"><p class="loading">Loading charts…</p></main>'
        "<noscript>The charts need JavaScript; the data is in this page as JSON.</noscript>"
        + _json_script(data)
        + f'<script src="{escape(assets)}chart.umd.min.js"></script>'
        + f'<script src="{escape(assets)}dashboard.js"></script></body></html>\n'
    )


def index_page(repos: list[tuple[str, str, int]], *, assets: str) -> str:
    """REPOS: (name, href, recorded commits)."""
    rows = "".join(
        f'<tr><td><a href="{escape(href)}">{escape(name)}</a></td><td>{n}</td></tr>' for name, href, n in repos
    )
    return (
        _head("kernalin-ci dashboard", assets)
        + "<header><h1>kernalin-ci dashboard</h1></header><main>"
        + (
            '<table class="overview"><thead><tr><th>repository</th><th>recorded commits</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>"
            if repos
            else "<p>No history recorded yet.</p>"
        )
        + "</main></body></html>\n"
    )


def page_file(repo: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", repo.replace("/", "__")) + ".html"


def build_site(store, out: str | Path, repos: list[str] | None = None, ancestry_for=None) -> list[Path]:
    """The static site of every repository in STORE (or REPOS) under OUT; the pages written. A single
    repository's page is index.html itself. ANCESTRY_FOR(repo, runs) -> Ancestry | None orders each
    repository's runs by its commit graph (None: as recorded)."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    copy_assets(out / "assets")
    names = repos or store.repos()
    written = []
    listing = []
    for name in names:
        runs = store.runs(name)
        ancestry = ancestry_for(name, runs) if ancestry_for and runs else None
        newest = arrange(runs, ancestry).runs[-1:] if runs else []  # the head's newest recorded commit
        fname = "index.html" if len(names) == 1 else page_file(name)
        badge_name = fname.replace(".html", "-badge.svg")
        if newest:
            (out / badge_name).write_text(badge_of(newest[0]))
        html = repo_page(
            name,
            runs,
            assets="assets/",
            badge_src=badge_name if newest else None,
            index_href=None if len(names) == 1 else "index.html",
            ancestry=ancestry,
        )
        (out / fname).write_text(html)
        written.append(out / fname)
        listing.append((name, fname, len(runs)))
    if len(names) != 1:
        (out / "index.html").write_text(index_page(listing, assets="assets/"))
        written.append(out / "index.html")
    (out / ".nojekyll").write_text("")  # GitHub Pages: serve the files as they are
    return written
