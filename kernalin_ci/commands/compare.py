"""kernalin-ci compare: offline verdicts on timing traces (docs/cli.md)."""

from __future__ import annotations

import json
import sys

from kernalin_ci.bench import stats
from kernalin_ci.commands._common import add_margin_arguments, margins
from kernalin_ci.errors import UsageError
from kernalin_ci.report.text import verdict_line

NAME = "compare"
HELP = "judge timing traces (base vs head, interleaved rounds) with a Bayesian bootstrap against the noise floor"
ORDER = 30


def add_arguments(p):
    p.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE",
        help=".npz or .json with arrays base, head [rounds, reps] (optional base2)",
    )
    add_margin_arguments(p, "; default: the larger of --margin-min and a multiple of the A/A floor")
    p.add_argument("--shapes", action="store_true", help="also judge every shape of a multi-shape trace")
    p.add_argument("--json", metavar="PATH|-", help="one JSON verdict object per line, in the order given")
    p.add_argument("--quiet", action="store_true", help="no human-readable lines")


def run(args) -> int:
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.bench.trace import load_trace

    rope, rope_min = margins(args)
    traces = [load_trace(p) for p in args.traces]
    # a multi-shape trace is judged as the benchmark judged it: overall and per shape by one function, one floor
    multi = [i for i, t in enumerate(traces) if t.per_shape is not None and t.per_shape["base"].shape[1] > 1]
    runs = {
        i: stats.compare_run(
            traces[i].per_shape["base"],
            traces[i].per_shape["head"],
            traces[i].per_shape.get("base2"),
            rope=rope,
            rope_min=rope_min,
        )
        for i in multi
    }
    plain = [i for i in range(len(traces)) if i not in runs]
    verdicts: list = [None] * len(traces)
    for i, v in zip(
        plain,
        stats.compare_many(
            [(traces[i].base, traces[i].head, traces[i].base2) for i in plain], rope=rope, rope_min=rope_min
        ),
    ):
        verdicts[i] = v
    for i, (overall, _) in runs.items():
        verdicts[i] = overall
    objs = []
    for i, (path, tr, v) in enumerate(zip(args.traces, traces, verdicts)):
        obj = {**v.to_json(), "trace": path}
        for key in ("clock", "regime"):
            if tr.meta.get(key):
                obj[key] = tr.meta[key]
        if args.shapes and tr.per_shape is not None:
            labels = tr.meta.get("shapes") or [f"shape {i}" for i in range(tr.per_shape["base"].shape[1])]
            per = runs[i][1] if i in runs else [v]
            obj["shapes"] = [{"shape": lab, **pv.to_json()} for lab, pv in zip(labels, per)]
        objs.append(obj)
    if args.json:
        text = "".join(json.dumps(o) + "\n" for o in objs)
        if args.json == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            try:
                with open(args.json, "w") as f:
                    f.write(text)
            except OSError as e:
                raise UsageError(f"--json {args.json}: {e.strerror}") from None
    if not args.quiet:
        out = sys.stderr if args.json == "-" else sys.stdout
        for path, v, obj in zip(args.traces, verdicts, objs):
            print(verdict_line(v, path), file=out)
            for s in obj.get("shapes", []):
                print(verdict_line(stats.Verdict.from_json(s), f"    {s['shape']}"), file=out)
    return 0
