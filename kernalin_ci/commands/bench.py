"""kernalin-ci bench: time head against base, interleaved, and give the verdict (docs/cli.md)."""

from __future__ import annotations

import sys

from kernalin_ci import workload
from kernalin_ci.bench.regime import DEFAULT_REGIME, REGIMES
from kernalin_ci.commands._common import (
    add_margin_arguments,
    at_least_one,
    margins,
    parse_params,
    positive_seconds,
    resolve_device,
    write_json,
)
from kernalin_ci.errors import UsageError
from kernalin_ci.ops import NAMES, get_op
from kernalin_ci.ops.base import resolve_params
from kernalin_ci.ops.roles import ROLES, role_ops
from kernalin_ci.report.text import mass_sentence, shape_line, verdict_line
from kernalin_ci.report.tokens import text_lines
from kernalin_ci.throughput.spec import from_cli

NAME = "bench"
HELP = "benchmark a head kernel entry against its base: interleaved rounds, Bayesian bootstrap verdict"
ORDER = 20


def add_arguments(p):
    p.add_argument("--op", required=True, choices=NAMES, metavar="OP", help=f"one of: {', '.join(NAMES)}")
    p.add_argument("--base", required=True, metavar="ENTRY", help="the baseline entry (file.py:fn or module:fn)")
    p.add_argument("--head", required=True, metavar="ENTRY", help="the entry under test")
    p.add_argument("--base-root", metavar="DIR", help="directory the base entry resolves against (default: .)")
    p.add_argument("--head-root", metavar="DIR", help="directory the head entry resolves against (default: .)")
    p.add_argument(
        "--param",
        action="append",
        metavar="K=V",
        help="op or bench-shape parameter, e.g. batch=64 kv_len=8192 (repeatable)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when a GPU is visible, else cpu")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        metavar="SECONDS",
        help="timing budget; rounds stop earlier once a verdict is reached (default 30)",
    )
    p.add_argument("--max-rounds", type=int, metavar="N", help="stop after N rounds at the latest")
    add_margin_arguments(p)
    p.add_argument(
        "--reps", type=at_least_one, metavar="N", help="samples per instance per round (default 5; 3 on cpu)"
    )
    p.add_argument(
        "--l2-flush",
        dest="l2_flush",
        action="store_true",
        default=None,
        help="flush the L2 cache before every sample (default on)",
    )
    p.add_argument("--no-l2-flush", dest="l2_flush", action="store_false")
    p.add_argument(
        "--regime",
        choices=REGIMES,
        default=None,
        help="warm: back-to-back launches on the same inputs; cold: every launch on inputs not in L2 "
        f"(default: {DEFAULT_REGIME})",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the timing order")
    p.add_argument(
        "--timeout", type=positive_seconds, metavar="S", help="seconds without progress before the run is killed"
    )
    p.add_argument("--json", metavar="PATH|-", help="write the verdict JSON")
    p.add_argument("--trace", metavar="PATH", help="save the raw trace (.npz or .json, the compare format)")
    p.add_argument(
        "--model",
        metavar="PRESET|FILE",
        help="time a decode step of this model with the kernel in its "
        "place instead of the op's shapes; report tokens/s and $/Mtok (docs/tokens.md)",
    )
    p.add_argument(
        "--workload",
        metavar="FILE",
        help="time the shapes of a FlashInfer-Bench workload file (JSONL of a paged decode definition, in its "
        "dataset folder) instead of the op's shapes",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args) -> int:
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.bench.pair import DEFAULT_BUDGET_S, bench_pair
    from kernalin_ci.bench.trace import save_trace

    device = resolve_device(args.device)
    if args.max_rounds is not None and args.max_rounds < 1:
        raise UsageError("--max-rounds must be at least 1")
    if args.model is not None:
        if args.workload:
            raise UsageError("--workload: not with --model (the model's serving points give the shapes)")
        return run_model(args, device)
    params, cases = parse_params(args.param), None
    if args.workload:
        params, cases = workload.for_op(workload.load(args.workload), args.op, params)
    result = bench_pair(
        args.op,
        args.base,
        args.head,
        args.base_root,
        args.head_root,
        params,
        device,
        budget_s=args.budget_s if args.budget_s is not None else DEFAULT_BUDGET_S,
        rope_min=margins(args)[1],
        rope=margins(args)[0],
        reps=args.reps,
        l2_flush=args.l2_flush,
        max_rounds=args.max_rounds,
        seed=args.seed,
        regime=args.regime,
        timeout_s=args.timeout,
        progress=not args.quiet,
        cases=cases,
    )
    if args.trace and result.trace is not None:
        save_trace(result.trace, args.trace)
    write_json(result.to_json(), args.json)
    print_result(result, sys.stderr if args.json == "-" else sys.stdout)
    if result.failed:
        return 1
    return 1 if result.verdict.verdict == "slower" else 0


def print_result(result, out) -> None:

    if result.failed:
        print(
            f"BENCH FAILED ({result.error_kind}) {result.op} {result.head} vs {result.base}: {result.error}", file=out
        )
        return
    v = result.verdict
    print(verdict_line(v, f"{result.op} {result.head} vs {result.base}"), file=out)
    print(f"  {mass_sentence(v)}", file=out)
    clock = "GPU seconds" if result.clock == "cuda-events" else "CPU wall-clock seconds"
    print(
        f"  {result.rounds} rounds, {result.bench_seconds:.1f} {clock} timing, {result.regime} regime "
        f"(stopped: {result.stopped}), "
        f"{result.setup_seconds:.1f} s setup, {result.seconds:.1f} s in all",
        file=out,
    )
    for s in result.shapes:
        if s.verdict is not None:
            print(f"  {shape_line(s)}", file=out)
    for n in result.notes:
        print(f"  note: {n}", file=out)


def run_model(args, device: str) -> int:
    """--model: the kernel pair in its place in a decode step of the model (docs/tokens.md)."""
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.bench.shapes import split_params

    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.throughput.bench import Role, bench_model

    spec = from_cli(args.model)
    role = get_op(args.op).decode_role
    if role is None:
        raise UsageError(
            f"--model: op {args.op} has no place in the decode step (ops: "
            f"{', '.join(op for r in ROLES for op in role_ops(r))})"
        )
    op_params, shape_params = split_params(parse_params(args.param))
    if shape_params:
        raise UsageError(
            f"--model: --param {', '.join(sorted(shape_params))}: the serving points of the model give the shapes"
        )
    params = resolve_params(args.op, get_op(args.op).params, op_params)
    if args.trace:
        raise UsageError("--trace: not with --model (the step times are in --json)")
    result = bench_model(
        spec,
        [Role(role, args.op, args.head, args.base, args.head, params)],
        args.base_root,
        args.head_root,
        device,
        budget_s=args.budget_s if args.budget_s is not None else (spec.budget_s or 30.0),
        rope_min=margins(args)[1],
        rope=margins(args)[0],
        reps=args.reps,
        l2_flush=args.l2_flush if args.l2_flush is not None else True,
        max_rounds=args.max_rounds,
        seed=args.seed,
        timeout_s=args.timeout,
        progress=not args.quiet,
    )
    out = result.to_json()
    write_json(out, args.json)
    print("\n".join(text_lines(result)), file=sys.stderr if args.json == "-" else sys.stdout)
    if result.failed:
        return 1
    return 1 if result.verdict is not None and result.verdict.verdict == "slower" else 0
