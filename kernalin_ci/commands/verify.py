"""kernalin-ci verify: check one entry against its op (docs/cli.md)."""

from __future__ import annotations

import json
import os
import platform
import sys
import textwrap
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from kernalin_ci import workload
from kernalin_ci.commands._common import parse_params, positive_seconds, resolve_device, write_json
from kernalin_ci.cuda.sources import CudaSpec
from kernalin_ci.device import DEVICES
from kernalin_ci.errors import UsageError
from kernalin_ci.ops import NAMES
from kernalin_ci.ops.base import DTYPES
from kernalin_ci.report.text import finding_text, isolation_text, not_checked_text, notice_text, plural

NAME = "verify"
HELP = "verify one kernel entry: structural and multi-position dynamic checks"
ORDER = 10


def add_arguments(p):
    p.add_argument("--op", required=True, choices=NAMES, metavar="OP", help=f"one of: {', '.join(NAMES)}")
    p.add_argument("--entry", required=True, help="path/to/file.py:function or package.module:function")
    p.add_argument("--param", action="append", metavar="K=V", help="op parameter (repeatable)")
    p.add_argument(
        "--domain",
        action="append",
        metavar="K=V[,V]",
        help="the shapes your model uses, e.g. head_dim=64,128 or dtype=float16 (repeatable; keys: "
        "head_dim, num_q_heads, num_kv_heads, dtype, block_size, max_position; default: found)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when a GPU is visible, else cpu")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help="run every case in this dtype (default: float32 cases plus a float16/bfloat16 sweep)",
    )
    p.add_argument(
        "--only", choices=("dynamic", "structural", "sanitizer"), help="run only one kind of check (sanitizer: GPU)"
    )
    p.add_argument(
        "--engine",
        choices=("ttir", "ptx"),
        default="ttir",
        help="structural engine: ttir (the TTIR at the capture shape, default) or ptx (symbolic over PTX, "
        "every shape of the domain; needs z3-solver)",
    )
    p.add_argument(
        "--probe",
        choices=("pos0",),
        help="run only the single demo probe most tools use (batch 1, kv_len 1 / position 0 / slot 0)",
    )
    p.add_argument("--case", metavar="JSON", help="run exactly this case (from a finding's reproduce command)")
    p.add_argument(
        "--workload",
        metavar="FILE",
        help="the dynamic cases from a FlashInfer-Bench workload file (JSONL of a paged decode definition, "
        "in its dataset folder): one case per workload, instead of the op's plan",
    )
    p.add_argument(
        "--trace",
        metavar="PATH",
        help="with --workload: write each workload's evaluation as a FlashInfer-Bench trace (JSONL): status "
        "and errors per workload; PASSED needs a latency (--timings)",
    )
    p.add_argument(
        "--timings",
        metavar="BENCH_JSON",
        help="with --trace: the latencies, from `bench --workload FILE --device cuda --json` of this entry (head)",
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        metavar="S",
        help="seconds one case may take (default 600 on the CPU, 180 on a GPU)",
    )
    p.add_argument(
        "--cuda-source",
        action="append",
        metavar="FILE",
        help="a CUDA C++ source the entry builds (repeatable): the kernel is built once before the checks; "
        "without a GPU its dynamic cases are not checked (docs/cuda.md)",
    )
    p.add_argument(
        "--cuda-flag",
        action="append",
        metavar="FLAG",
        help="a compiler flag of the CUDA sources (repeatable; --cuda-flag=-I.)",
    )
    p.add_argument(
        "--sanitizer",
        choices=("on", "off"),
        default="on",
        help="Compute Sanitizer over a few cases on a GPU (default on; docs/cuda.md)",
    )
    p.add_argument("--json", metavar="PATH|-", help="write the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args) -> int:
    device = resolve_device(args.device)
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.domain import parse_cli
    from kernalin_ci.verify import verify

    params, cases, wl = parse_params(args.param), None, None
    latencies = trace_inputs(args, device)
    if args.workload:
        if args.case or args.probe:
            raise UsageError("--workload: takes the cases from the file; not with --case or --probe")
        wl = workload.load(args.workload)
        params, cases = workload.for_op(wl, args.op, params, args.dtype)
    result = verify(
        args.op,
        args.entry,
        params,
        device,
        dtype=args.dtype,
        only=args.only,
        probe=bool(args.probe),
        case_json=args.case,
        timeout_s=args.timeout,
        progress=not args.quiet,
        raw_domain=parse_cli(args.domain),
        cuda=cuda_spec(args.cuda_source, args.cuda_flag),
        sanitizer=args.sanitizer == "on",
        engine=args.engine,
        cases=cases,
    )
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.sandbox import worker_isolation

    isolation = worker_isolation()  # decided before the first worker started: the same answer
    write_json({**result.to_json(), "isolation": isolation.to_json()}, args.json)
    out = sys.stderr if args.json == "-" else sys.stdout
    print_result(result, out)
    print(f"  kernel code ran {isolation_text(isolation)}", file=out)
    if wl is not None and args.trace:
        write_trace(args.trace, wl, result, args.entry, device, latencies, out)
    return 1 if result.findings else 0


def trace_inputs(args, device: str) -> dict[str, float]:
    """Check --trace and --timings before anything runs (bad input: exit 2); the latencies by case name."""
    if args.timings and not args.trace:
        raise UsageError("--timings: only with --trace (it gives the trace's latencies)")
    if not args.trace:
        return {}
    if not args.workload:
        raise UsageError("--trace: needs --workload (a trace line is the evaluation of one workload)")
    path = Path(args.trace)
    folder = path.parent
    if (
        path.is_dir()
        or not folder.is_dir()
        or not os.access(folder, os.W_OK)
        or (path.exists() and not os.access(path, os.W_OK))
    ):
        raise UsageError(f"--trace: cannot write {path}")
    return latencies_of(args.timings, args.entry, device) if args.timings else {}


def latencies_of(timings: str, entry: str, device: str) -> dict[str, float]:
    """The head's median milliseconds per launch of each shape a `bench --json` result of this entry timed."""
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.bench.result import BenchResult

    try:
        d = json.loads(Path(timings).read_text())
        if not isinstance(d, dict) or not {"op", "head", "device", "shapes"} <= set(d):
            raise ValueError("no op, head, device and shapes")
        bench = BenchResult.from_json(d)
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise UsageError(f"--timings: {timings}: not a bench --json result ({e})") from None
    if bench.head != entry:
        raise UsageError(f"--timings: the benchmark timed head {bench.head or '?'}, not the entry verified {entry}")
    if bench.device != device:
        raise UsageError(f"--timings: the benchmark ran on {bench.device or '?'}, this verify on {device}")
    if not DEVICES[device].timed:
        raise UsageError(f"--timings: times on {device} measure the Triton interpreter, not the kernel's latency")
    return {s.shape: s.head_ms for s in bench.shapes if s.head_ms is not None}


def write_trace(path: str, wl, result, entry: str, device: str, latencies: dict[str, float], out) -> None:
    """The trace lines of the workloads verify could give a true evaluation; one line says what was left out."""
    environment = {"hardware": hardware(device), "libs": libraries()}
    stamp = datetime.now(timezone.utc).isoformat()
    kernel_wide = tuple(f"kernel: {f.kind} {f.bug_class}: {f.message}" for f in result.findings if f.kind != "dynamic")
    lines, left = workload.trace(wl, result.cases, entry, environment, stamp, latencies, kernel_wide)
    try:
        Path(path).write_text("".join(json.dumps(line, allow_nan=False) + "\n" for line in lines))
    except OSError as e:
        raise UsageError(f"--trace: cannot write {path} ({e.strerror})") from None
    counts: dict[str, int] = {}
    for line in lines:
        counts[line["evaluation"]["status"]] = counts.get(line["evaluation"]["status"], 0) + 1
    said = ", ".join(f"{n} {st}" for st, n in counts.items()) or "none"
    gone = "; ".join(f"{len(names)} {why}" for why, names in left.items())
    print(
        f"  trace: {plural(len(lines), 'workload')} written to {path} ({said})"
        + (f"; left out: {gone}" if gone else ""),
        file=out,
    )


def hardware(device: str) -> str:
    """The hardware the kernels ran on: the GPU's name, else the CPU's model (kernels under the interpreter)."""
    if DEVICES[device].gpu:
        import torch  # deferred: torch, only where a trace is written

        return torch.cuda.get_device_name()
    model = next((ln.split(":", 1)[1].strip() for ln in _cpuinfo() if ln.startswith("model name")), platform.machine())
    return f"{model or 'CPU'} (Triton interpreter)"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def libraries() -> dict[str, str]:
    """The versions of the libraries that ran the kernels, and of kernalin-ci."""
    found = {}
    for name in ("torch", "triton", "kernalin-ci"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def cuda_spec(sources: list[str] | None, flags: list[str] | None):
    """--cuda-source / --cuda-flag as a CudaSpec (None: not a CUDA kernel)."""

    if not sources:
        if flags:
            raise UsageError("cuda_flag: needs --cuda-source (the sources the flags build)", setting="cuda_flag")
        return None
    return CudaSpec(tuple(sources), tuple(flags or ()))


def print_result(result, out) -> None:
    n = len(result.findings)
    head = {"pass": "PASS", "not-checked": "NOT CHECKED"}.get(result.verdict, f"FAIL  {n} finding" + "s" * (n != 1))
    print(
        f"{head}  {result.op} {result.entry} "
        f"({plural(result.cases_run, 'case')} on {result.device}, {result.seconds:.1f} s)",
        file=out,
    )
    for f in result.findings:
        print(textwrap.indent(finding_text(f), "  "), file=out)
    if result.cases_run:
        print(f"  coverage: {result.coverage.summary()}", file=out)
    for n in result.not_checked:
        print(f"  not checked: {not_checked_text(n)}", file=out)
    print(f"  structural: {result.structural.summary()}", file=out)
    if result.build is not None:
        b = result.build
        print(f"  CUDA build: {b['status']} ({', '.join(b['sources'])}; {b['seconds']:.1f} s)", file=out)
    if result.sanitizer.status != "not-run":
        print(f"  Compute Sanitizer: {result.sanitizer.summary()}", file=out)
    for n in result.notices:
        print(f"  note: {notice_text(n)}", file=out)
