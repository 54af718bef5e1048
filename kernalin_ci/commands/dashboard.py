"""kernalin-ci dashboard: the history as a static site (GitHub Pages; docs/history.md)."""

from __future__ import annotations

import sys

from kernalin_ci.commands._common import output_dir
from kernalin_ci.commands.history import add_order, add_store, ancestry_for, open_from
from kernalin_ci.errors import UsageError
from kernalin_ci.report.text import plural

NAME = "dashboard"
HELP = "build the history dashboard as a static site: charts per kernel, change points, verdicts, the badge"
ORDER = 36


def add_arguments(p):
    p.add_argument("--out", metavar="DIR", help="where the site is written (index.html and assets/)")
    add_store(p)
    add_order(p)
    p.add_argument("--repo", metavar="OWNER/NAME", action="append", help="only these repositories (repeatable)")
    p.add_argument(
        "--fetch-assets",
        action="store_true",
        help="first fetch Chart.js with `npm pack` (pinned and checked) if it is not installed",
    )


def run(args) -> int:
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.dashboard import assets
    from kernalin_ci.dashboard.site import build_site

    if args.fetch_assets:
        path = assets.fetch_chartjs()
        print(f"kernalin-ci dashboard: Chart.js {assets.CHARTJS_VERSION} at {path}", file=sys.stderr)
        if not args.out:
            return 0
    if not args.out:
        raise UsageError("--out DIR is required")
    output_dir(args.out)
    assets.chartjs()  # before anything is read: say what to install
    store = open_from(args)
    try:
        if args.repo:
            known = set(store.repos())
            missing = [r for r in args.repo if r not in known]
            if missing:
                raise UsageError(f"--repo {', '.join(missing)}: no history recorded")
        pages = build_site(store, args.out, args.repo, ancestry_for(args, store))
    finally:
        store.close()
    print(
        f"kernalin-ci dashboard: {plural(len(pages), 'page')} in {args.out}/ (open {args.out}/index.html)",
        file=sys.stderr,
    )
    return 0
