"""kernalin-ci pipeline: the decode-loop check over kv_append + attention.decode_paged (+ rope)."""

from __future__ import annotations

import sys

from kernalin_ci.commands._common import parse_params, positive_seconds, resolve_device, write_json
from kernalin_ci.commands.verify import print_result
from kernalin_ci.ops.base import DTYPES
from kernalin_ci.ops.roles import PIPELINE, pipeline_op

NAME = "pipeline"
HELP = "run rope -> kv_append -> paged attention as a many-step decode loop against a float64 reference"
ORDER = 15


def add_arguments(p):
    p.add_argument("--kv-append", required=True, metavar="ENTRY", help="the kv_append entry")
    p.add_argument("--attention", required=True, metavar="ENTRY", help="the attention.decode_paged entry")
    p.add_argument("--rope", metavar="ENTRY", help="the rope entry (optional)")
    p.add_argument("--param", action="append", metavar="K=V", help="op parameter of any of the three ops")
    p.add_argument("--device", choices=("cpu", "cuda"))
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--steps", type=int, default=64, help="decode steps (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=positive_seconds, metavar="S", help="seconds the whole loop may go without a step")
    p.add_argument(
        "--cuda-source", action="append", metavar="FILE",
        help="a CUDA C++ source the entries build (repeatable): built once before the loop; without a GPU the "
        "loop is not checked (docs/cuda.md)",
    )  # fmt: skip
    p.add_argument("--cuda-flag", action="append", metavar="FLAG", help="a compiler flag of the CUDA sources")
    p.add_argument("--json", metavar="PATH|-")
    p.add_argument("--quiet", action="store_true")


def run(args) -> int:
    device = resolve_device(args.device)
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.commands.verify import cuda_spec
    from kernalin_ci.verify import verify_pipeline

    entries = {pipeline_op(role): getattr(args, role) for role in PIPELINE}
    result = verify_pipeline(
        entries,
        parse_params(args.param),
        device,
        dtype=args.dtype,
        steps=args.steps,
        seed=args.seed,
        timeout_s=args.timeout,
        progress=not args.quiet,
        cuda=cuda_spec(args.cuda_source, args.cuda_flag),
    )
    write_json(result.to_json(), args.json)
    print_result(result, sys.stderr if args.json == "-" else sys.stdout)
    return 1 if result.findings else 0
