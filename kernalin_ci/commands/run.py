"""kernalin-ci run: the PR gate, locally or in CI (docs/cli.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kernalin_ci.commands._common import output_dir, resolve_device
from kernalin_ci.config import FAIL_ON
from kernalin_ci.errors import UsageError
from kernalin_ci.report.writer import step_summary, write_all
from kernalin_ci.throughput.spec import from_cli

NAME = "run"
HELP = "the PR gate: verify and benchmark the kernels changed between two revisions, write the report"
ORDER = 1


def add_arguments(p):
    p.add_argument(
        "--config",
        metavar="PATH",
        help="configuration (default: .kernalin.yml at the repository root); a file in the repository is read "
        "as committed at the base revision, one outside it is used as it is",
    )
    p.add_argument(
        "--base",
        metavar="REF",
        help="base revision (default: the PR base in Actions, else the merge base with the default branch)",
    )
    p.add_argument("--head", metavar="REF", help="head revision (default: the PR head in Actions, else HEAD)")
    p.add_argument(
        "--head-branch",
        metavar="NAME",
        help="the head's branch, matched against the base configuration's gate.trust_head_config (default: the "
        "PR's head branch in Actions, else the branch --head names or HEAD has checked out)",
    )
    p.add_argument("--out", metavar="DIR", default="kernalin-out", help="report directory (default kernalin-out)")
    p.add_argument("--device", choices=("cpu", "cuda"))
    p.add_argument("--github", action="store_true", help="also post the check run, annotations and PR comment")
    p.add_argument(
        "--fail-on",
        metavar="LIST",
        help="what fails the gate, overriding gate.fail_on: a comma-separated "
        "list of finding, slower, inconclusive, or 'none'",
    )
    p.add_argument(
        "--budget-s", type=float, metavar="SECONDS", help="benchmark budget per kernel pair, overriding gate.budget_s"
    )
    p.add_argument(
        "--model",
        metavar="PRESET|FILE",
        help="decode tokens/s and $/Mtok of this model with the changed kernels in their places, in place of "
        "the configuration's model: shapes (docs/tokens.md; GPU only)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-case progress lines")
    p.add_argument(
        "--profile",
        action="store_true",
        help="Nsight Compute metrics for the changed kernels (where ncu is on PATH; the report says otherwise)",
    )


def run(args) -> int:
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.gate.run import log, run_gate
    from kernalin_ci.github import actions

    overrides = gate_overrides(args)  # bad values fail before anything runs
    output_dir(args.out)
    model = None
    if args.model is not None:
        model = from_cli(args.model)
    device = resolve_device(args.device)
    repo = _repo(args.config)
    in_actions = actions.in_actions()
    ctx = actions.context() if in_actions else None
    event_path = os.environ.get("GITHUB_EVENT_PATH") if in_actions else None
    poster = _Poster(ctx) if args.github else None

    report = run_gate(
        repo,
        args.config,
        args.base,
        args.head,
        device,
        event_path=event_path,
        progress=not args.quiet,
        on_start=poster.begin if poster else None,
        gate_overrides=overrides,
        profile=args.profile,
        model=model,
        head_branch=args.head_branch,
    )
    paths = write_all(report, args.out)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        actions.append_step_summary(step_summary(report))
    if os.environ.get("GITHUB_OUTPUT"):
        # deferred: keeps the CLI's startup light (`--help` loads every command module)
        from kernalin_ci.gate.post import verdict_output

        actions.set_output("conclusion", report.conclusion)
        actions.set_output("verdict", verdict_output(report))
        actions.set_output("report", str(Path(paths["report.json"]).resolve()))
    log(f"{report.conclusion}: {report.reason} ({report.seconds:.0f} s); report in {args.out}/")
    annotated = poster.finish(report) if poster else 0
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.gate.summary import emit

    emit(report, sys.stdout, annotate=in_actions and not annotated)  # the findings, where a CI log shows them
    return 1 if report.conclusion == "failure" else 0


def _repo(config: str | None) -> Path:
    """The repository: the one holding CONFIG's folder, else the working directory's."""
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.gate.diff import repo_root

    if config:
        folder = Path(config).resolve().parent
        if folder.is_dir():
            try:
                return repo_root(folder)
            except UsageError:
                pass
    return repo_root(Path.cwd())


def gate_overrides(args) -> dict:
    """--fail-on / --budget-s -> fields of config.Gate that replace the configuration's."""

    out: dict = {}
    if args.fail_on is not None:
        items = [x.strip() for x in args.fail_on.split(",") if x.strip()]
        if items == ["none"]:
            items = []
        elif not items or any(x not in FAIL_ON for x in items):
            raise UsageError(
                f"--fail-on {args.fail_on!r}: expected a comma-separated list of {', '.join(FAIL_ON)}, or 'none'"
            )
        out["fail_on"] = tuple(items)
    if args.budget_s is not None:
        if not args.budget_s > 0:
            raise UsageError(f"--budget-s {args.budget_s:g}: must be positive")
        out["budget_s"] = args.budget_s
    return out


class _Poster:
    """--github: a check run in progress at the start, the results at the end. Local reports are
    written before anything is posted, so an API failure never loses them."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.client = None
        self.started = None
        self.repo = None
        self.sha = None
        self.pr = None

    def begin(self, refs) -> None:
        # deferred: keeps the CLI's startup light (`--help` loads every command module)
        from kernalin_ci.github.auth import client_from_env
        from kernalin_ci.github.publish import begin

        pr = self.ctx.pull_request if self.ctx else None
        self.repo = (
            (pr.repo if pr else None)
            or refs.repo
            or (self.ctx.repository if self.ctx else None)
            or os.environ.get("GITHUB_REPOSITORY")
        )
        if not self.repo:
            raise UsageError("--github: no repository (set GITHUB_REPOSITORY=owner/name)")
        self.sha = pr.head_sha if pr else refs.head
        self.pr = pr.number if pr else refs.pr
        self.client = client_from_env(self.repo)
        self.started = begin(self.client, self.repo, self.sha, details_url=self.ctx.run_url if self.ctx else None)
        for w in self.started.warnings:
            print(f"kernalin-ci run: warning: {w}", file=sys.stderr)

    def finish(self, report) -> int:
        """Post the results; how many findings got an annotation on the check run."""
        # deferred: keeps the CLI's startup light (`--help` loads every command module)
        from kernalin_ci.gate.post import publication
        from kernalin_ci.github.errors import GitHubError
        from kernalin_ci.github.publish import publish

        if self.client is None:
            return 0
        pub = publication(report, self.repo, self.sha, self.pr, details_url=self.ctx.run_url if self.ctx else None)
        try:
            res = publish(self.client, pub, check_run_id=self.started.check_run_id if self.started else None)
        except GitHubError as e:
            print(
                f"kernalin-ci run: warning: posting to GitHub failed: {e} (the report is in the output directory)",
                file=sys.stderr,
            )
            return 0
        for w in res.warnings:
            print(f"kernalin-ci run: warning: {w}", file=sys.stderr)
        return res.annotations_posted if res.check_run is not None else 0
