"""kernalin-ci history: what the gate recorded for the default branch, per kernel and shape (docs/history.md)."""

from __future__ import annotations

import csv
import json
import os
import sys

from kernalin_ci.errors import UsageError

NAME = "history"
HELP = "the recorded history of the default branch: list the series, show one (table or CSV), record a run"
ORDER = 35
ENV_STORE = "KERNALIN_HISTORY"
COLUMNS = (
    "commit",
    "pr",
    "gate",
    "verification",
    "findings",
    "verdict",
    "ratio",
    "hdi_lo",
    "hdi_hi",
    "base_ms",
    "head_ms",
    "change",
    "base",
    "previous",
)


def add_store(p) -> None:
    p.add_argument(
        "--store",
        metavar="URL",
        help=f"where the history is: PATH or sqlite:///PATH, postgresql://..., "
        f"or git:BRANCH (a data branch of this repository; default "
        f"${ENV_STORE})",
    )


def add_order(p) -> None:
    p.add_argument(
        "--git",
        metavar="DIR",
        help="a clone holding the default branch's history: each series is ordered by its commit graph "
        "(default: a git: store's own repository; else the order recorded)",
    )
    p.add_argument(
        "--ref",
        metavar="REF",
        help="with --git: the default branch's head (default: origin/BRANCH, else BRANCH, of the newest run)",
    )


def ancestry_for(args, store):
    """A function (repo, runs) -> Ancestry | None: the commit graph to order a repository's runs by."""
    from pathlib import Path

    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.history.ancestry import Ancestry

    git_dir = args.git or getattr(store, "repo_dir", None)  # a git: store's own repository
    if git_dir is None:
        return lambda repo, runs: None
    if args.git and not Path(args.git).is_dir():
        raise UsageError(f"--git {args.git}: no such directory")

    def ancestry(repo, runs):
        return Ancestry.for_branch(git_dir, runs[-1].branch if runs else "main", args.ref)

    return ancestry


def arranged(args, store, repo):
    """REPO's runs in the commit graph's order (ancestry.Order)."""
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.history.ancestry import arrange

    runs = store.runs(repo)
    return arrange(runs, ancestry_for(args, store)(repo, runs) if runs else None)


def say_order(repo, order) -> None:
    """On stderr, after the output: how the commits are ordered when not by the graph, what is off the branch."""
    if order.runs and order.by != "git":
        print(f"kernalin-ci history: {repo}: in the order recorded ({order.note})", file=sys.stderr)
    for r in order.off_branch:
        print(
            f"kernalin-ci history: {repo}@{r.commit[:12]} is not on {order.ref} any more (left out of the series)",
            file=sys.stderr,
        )


def add_arguments(p):
    add_store(p)
    add_order(p)
    p.add_argument(
        "--repo",
        metavar="OWNER/NAME",
        help="one repository (needed with --kernel when the history holds several; the repository with --record)",
    )
    p.add_argument("--kernel", metavar="NAME", help="show this kernel's series, a line per recorded commit")
    p.add_argument("--shape", help="with --kernel: one shape (default: all of the kernel's)")
    p.add_argument("--csv", action="store_true", help="with --kernel: CSV on stdout instead of a table")
    p.add_argument("--record", metavar="REPORT", help="add this report.json as a commit of the default branch")
    p.add_argument("--commit", metavar="SHA", help="with --record: the default branch's commit the run stands for")
    p.add_argument("--branch", default="main", help="with --record: the default branch's name (default main)")
    p.add_argument("--pr", type=int, help="with --record: the pull request merged by this commit")
    p.add_argument("--report-url", metavar="URL", help="with --record: where the run's report can be read")


def open_from(args):
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.history.store import open_store

    url = args.store or os.environ.get(ENV_STORE)
    if not url:
        raise UsageError(f"no history: give --store URL or set {ENV_STORE}")
    return open_store(url)


def pick_repo(store, repo: str | None) -> str:
    repos = store.repos()
    if repo:
        if repo not in repos:
            raise UsageError(f"--repo {repo}: no history recorded (recorded: {', '.join(repos) or 'none'})")
        return repo
    if len(repos) != 1:
        raise UsageError(f"--repo: the history holds {len(repos)} repositories: {', '.join(repos) or 'none'}")
    return repos[0]


def run(args) -> int:
    if args.record and not (args.repo and args.commit):
        raise UsageError("--record needs --repo and --commit")
    store = open_from(args)
    try:
        action = _record if args.record else _show if args.kernel else _list
        return action(store, args)
    finally:
        store.close()


def _record(store, args) -> int:
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.history.model import run_from_report

    try:
        with open(args.record) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"--record {args.record}: cannot read it: {e}") from None
    if not isinstance(report, dict) or "kernels" not in report:
        raise UsageError(f"--record {args.record}: not a kernalin-ci report.json")
    try:
        r = run_from_report(
            report, repo=args.repo, commit=args.commit, branch=args.branch, pr=args.pr, report_url=args.report_url
        )
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise UsageError(f"--record {args.record}: not a kernalin-ci report.json ({type(e).__name__}: {e})") from None
    added = store.add(r)
    print(
        f"kernalin-ci history: {args.repo}@{args.commit[:12]}: "
        + (f"recorded ({len(r.points)} points)" if added else "already recorded"),
        file=sys.stderr,
    )
    return 0


def _list(store, args) -> int:
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.history.series import build

    repos = [pick_repo(store, args.repo)] if args.repo else store.repos()
    rows = [("repository", "kernel", "shape", "commits", "latest ms", "latest verdict", "change points")]
    orders = []
    for repo in repos:
        order = arranged(args, store, repo)
        orders.append((repo, order))
        for s in build(order.runs):
            last = s.points[-1]
            rows.append(
                (
                    repo,
                    s.kernel,
                    s.shape or "-",
                    str(len(s.points)),
                    f"{last.head_ms:.4g}" if last.head_ms else "-",
                    last.verdict or "-",
                    ", ".join(f"{c.last_good[:7]}..{c.first_commit[:7]} ({c.ratio - 1:+.2%})" for c in s.changes)
                    or (s.analysed or "none"),
                )
            )
    _table(rows)
    for repo, order in orders:
        say_order(repo, order)
    return 0


def _show(store, args) -> int:
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.history.series import build

    repo = pick_repo(store, args.repo)
    order = arranged(args, store, repo)
    series = [s for s in build(order.runs) if s.kernel == args.kernel and (args.shape is None or s.shape == args.shape)]
    if not series:
        raise UsageError(
            f"no series of kernel {args.kernel!r}" + (f" shape {args.shape!r}" if args.shape else "") + f" in {repo}"
        )
    rows = [(("shape",) if len(series) > 1 else ()) + COLUMNS]
    for s in series:
        starts = {c.index: f"{c.ratio - 1:+.2%} from {c.last_good[:7]}" for c in s.changes}
        for i, p in enumerate(s.points):
            f = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
            row = (
                p.commit,
                str(p.pr or ""),
                p.conclusion,
                p.verification or "",
                str(len(p.findings)),
                p.verdict or "",
                f(p.ratio, ".4f"),
                f(p.hdi[0] if p.hdi else None, ".4f"),
                f(p.hdi[1] if p.hdi else None, ".4f"),
                f(p.base_ms, ".5g"),
                f(p.head_ms, ".5g"),
                starts.get(i, ""),
                p.base or "",
                p.previous or "",
            )
            rows.append(((s.shape,) if len(series) > 1 else ()) + row)
    if args.csv:
        csv.writer(sys.stdout, lineterminator="\n").writerows(rows)
    else:
        shas = {rows[0].index(c) for c in ("commit", "base", "previous")}
        rows = [tuple(c[:12] if j in shas and i else c for j, c in enumerate(r)) for i, r in enumerate(rows)]
        _table(rows)
    say_order(repo, order)
    return 0


def _table(rows) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
