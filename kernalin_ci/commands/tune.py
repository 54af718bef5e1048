"""kernalin-ci tune: verify every candidate config, race the survivors, report (docs/tune.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kernalin_ci import config as config_mod
from kernalin_ci.commands._common import (
    add_margin_arguments,
    at_least_one,
    margins,
    output_dir,
    parse_params,
    positive_seconds,
    resolve_device,
    write_json,
)
from kernalin_ci.errors import UsageError
from kernalin_ci.ops import NAMES

NAME = "tune"
HELP = "find a faster kernel config: every candidate verified first, survivors raced (Bayesian benchmark)"
ORDER = 25


def add_arguments(p):
    p.add_argument("kernel", nargs="?", metavar="KERNEL", help="a kernel name of .kernalin.yml")
    p.add_argument("--config", metavar="PATH", help="configuration (default: .kernalin.yml in the current directory)")
    p.add_argument("--op", choices=NAMES, metavar="OP", help=f"without KERNEL: one of {', '.join(NAMES)}")
    p.add_argument("--entry", help="without KERNEL: path/to/file.py:function or package.module:function")
    p.add_argument("--param", action="append", metavar="K=V", help="op or bench-shape parameter (repeatable)")
    p.add_argument(
        "--domain",
        action="append",
        metavar="K=V[,V]",
        help="the shapes verification covers (as kernalin-ci verify --domain)",
    )
    p.add_argument(
        "--space",
        action="append",
        metavar="NAME=V1,V2",
        help="candidate values of an entry keyword (repeatable; adds to the kernel's tune.params)",
    )
    p.add_argument(
        "--autotune",
        metavar="KERNEL",
        help="the @triton.autotune kernel whose configs to race (default: the only one the entry reaches)",
    )
    p.add_argument("--no-autotune", action="store_true", help="ignore autotune configs; tune only --space/params")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when a GPU is visible, else cpu")
    p.add_argument(
        "--budget-s",
        type=float,
        metavar="SECONDS",
        help="time for the race (screening and final rounds; default 120 on a GPU, 60 on the CPU)",
    )
    p.add_argument("--finalists", type=int, default=3, metavar="N", help="configs in the final race (default 3)")
    add_margin_arguments(p)
    p.add_argument(
        "--reps", type=at_least_one, metavar="N", help="samples per instance per round (default 5; 1 on cpu)"
    )
    p.add_argument("--jobs", type=int, metavar="N", help="candidates verified at once (default 4 on a GPU, 1 on cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--timeout", type=positive_seconds, metavar="S", help="seconds without progress before a worker is killed"
    )
    p.add_argument("--out", metavar="DIR", default=".", help="where tune.json, tune.md and tune.patch go (default .)")
    p.add_argument(
        "--write", action="store_true", help="apply the chosen config to the source (tune.patch is written either way)"
    )
    p.add_argument(
        "--github",
        action="store_true",
        help="post the patch: suggestions on the current pull request (a pull_request run, or --pr), "
        "else a branch and a new pull request",
    )
    p.add_argument("--pr", type=int, metavar="N", help="with --github: review pull request N")
    p.add_argument(
        "--base", metavar="BRANCH", help="with --github, a new pull request's base branch (default: the current branch)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def target_from_args(args):
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.tune.run import Target
    from kernalin_ci.tune.space import TuneSpec, parse_space_args

    space = parse_space_args(args.space)
    raw_params = parse_params(args.param)
    if args.kernel:
        if args.op or args.entry:
            raise UsageError("give a KERNEL name or --op/--entry, not both")

        path = Path(args.config or config_mod.DEFAULT_FILE)
        cfg = config_mod.load(path)
        k = cfg.kernel(args.kernel)
        if k is None:
            raise UsageError(
                f"{path}: no kernel named {args.kernel!r} (kernels: {', '.join(x.name for x in cfg.kernels)})"
            )
        # deferred: keeps the CLI's startup light (`--help` loads every command module)
        from kernalin_ci.bench.shapes import split_params

        op_raw, bench_raw = split_params(raw_params)
        spec = TuneSpec.from_config(k.tune)
        spec.params.update(space)
        domain = dict(k.domain)
        root = str(path.resolve().parent)
        target = Target(k.op, k.entry, root, {**k.params, **op_raw}, domain, k.dtype, {**k.bench, **bench_raw}, k.name)
    else:
        if not (args.op and args.entry):
            raise UsageError("give a KERNEL name from .kernalin.yml, or both --op and --entry")
        # deferred: keeps the CLI's startup light (`--help` loads every command module)
        from kernalin_ci.bench.shapes import split_params

        op_raw, bench_raw = split_params(raw_params)
        spec = TuneSpec(space)
        target = Target(args.op, args.entry, os.getcwd(), op_raw, {}, None, bench_raw)
    if args.domain:
        # deferred: keeps the CLI's startup light (`--help` loads every command module)
        from kernalin_ci.domain import parse_cli

        target.domain = {**target.domain, **parse_cli(args.domain)}
    if args.autotune:
        spec.autotune = args.autotune
    if args.no_autotune:
        spec.use_autotune = False
    return target, spec


def run(args) -> int:
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.tune import patch as patch_mod
    from kernalin_ci.tune import render
    from kernalin_ci.tune.run import tune

    target, spec = target_from_args(args)
    device = resolve_device(args.device)
    for flag, v in (("--finalists", args.finalists), ("--reps", args.reps), ("--jobs", args.jobs)):
        if v is not None and v < 1:
            raise UsageError(f"{flag} must be at least 1")
    out = output_dir(args.out)
    if (args.pr is not None or args.base is not None) and not args.github:
        raise UsageError("--pr and --base go with --github")
    dest = None
    if args.github:  # credentials and the repository are checked before any GPU time is spent
        # deferred: keeps the CLI's startup light (`--help` loads every command module)
        from kernalin_ci.entry import parse_entry
        from kernalin_ci.tune import post

        dest = post.resolve(target.root, pr=args.pr, base=args.base)
        es = parse_entry(target.entry)
        if es.is_file:
            post.check_clean(dest, es.file_path(Path(target.root)))
    result = tune(
        target,
        spec,
        device,
        budget_s=args.budget_s,
        rope_min=margins(args)[1],
        rope=margins(args)[0],
        finalists=args.finalists,
        reps=args.reps,
        seed=args.seed,
        timeout_s=args.timeout,
        jobs=args.jobs,
        progress=not args.quiet,
    )
    patch, why = patch_mod.make_patch(result)
    out.mkdir(parents=True, exist_ok=True)
    write_json(render.to_json(result, patch, why), str(out / "tune.json"))
    (out / "tune.md").write_text(render.markdown(result, patch, why))
    if patch:
        (out / "tune.patch").write_text(patch.diff)
    print(render.table(result))
    if patch and args.write:
        patch_mod.apply(patch, target.root)
        print(f"  wrote the chosen config to {patch.path} (the diff is in {out / 'tune.patch'})")
    elif patch:
        print(f"  patch: {out / 'tune.patch'} (apply with --write or `git apply`)")
    else:
        print(f"  no patch: {why}")
    code = 0 if result.chosen is not None or result.stopped in ("single",) else 1
    if dest is not None:
        code = max(code, _post(dest, patch, why, result, target, out))
    sys.stdout.flush()
    return code


def _post(dest, patch, why: str, result, target, out: Path) -> int:
    """--github, after the outputs are written: 0 posted (or nothing to post), 1 when GitHub refused or failed."""
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.github.errors import GitHubError
    from kernalin_ci.tune import post

    if patch is None:
        print(f"  --github: nothing to post ({why})")
        return 0
    try:
        done = post.post(
            dest,
            patch,
            target.root,
            kernel=target.name or target.entry,
            label=result.label(result.chosen),
            markdown=(out / "tune.md").read_text(),
        )
    except GitHubError as e:
        print(f"kernalin-ci tune: --github: {e} (tune.md and tune.patch are in {out})", file=sys.stderr)
        return 1
    print(f"  {done.line()}")
    return 0
