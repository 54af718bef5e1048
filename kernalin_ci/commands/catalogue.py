"""kernalin-ci catalogue: run every catalogue kernel and print the catch matrix."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kernalin_ci.commands._common import resolve_device, write_json, write_text
from kernalin_ci.device import DEVICES
from kernalin_ci.errors import UsageError

NAME = "catalogue"
HELP = "run the bug catalogue (checks/) and print the catch matrix: pos-0 probe vs dynamic vs structural"
ORDER = 20


def add_arguments(p):
    p.add_argument("--dir", metavar="DIR", help="catalogue directory (default: the checks/ beside the package)")
    p.add_argument("--op", action="append", metavar="OP", help="only this op (repeatable)")
    p.add_argument(
        "--kinds",
        default=None,
        help="comma-separated subset of probe,dynamic,structural,sanitizer,ptx (default: all available but ptx; "
        "sanitizer on a GPU only; ptx: the PTX engine)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="kernels verified at once")
    p.add_argument("--json", metavar="PATH|-")
    p.add_argument("--markdown", metavar="PATH", help="also write the matrix as a markdown table")


def run(args) -> int:
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci import catalogue as cat

    device = resolve_device(args.device)
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {args.jobs}")
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.verify.supervisor import threads_each

    os.environ.update(threads_each(args.jobs) or {})  # each job's workers get their share of the cores
    kinds = tuple(args.kinds.split(",")) if args.kinds else available_kinds(device)
    for k in kinds:
        if k not in cat.KINDS:
            raise UsageError(f"--kinds: {k!r} is not one of {', '.join(cat.KINDS)}")
    kernels = cat.discover(Path(args.dir) if args.dir else cat.default_dir(), args.op)
    if not kernels:
        raise UsageError("no catalogue kernels found")
    for flag, dest in (("--json", args.json), ("--markdown", args.markdown)):
        if dest and dest != "-" and Path(dest).is_dir():  # before the minutes of work, not after
            raise UsageError(f"{flag} {dest}: is a folder")
    print(f"catalogue: {len(kernels)} kernels x {', '.join(kinds)} on {device}", file=sys.stderr)
    done = [0]

    def on_row(row):
        done[0] += 1
        flag = "ok" if not row.mismatches() else "MISMATCH: " + "; ".join(row.mismatches())
        print(f"  [{done[0]}/{len(kernels)}] {row.kernel.name}: {flag}", file=sys.stderr, flush=True)

    rows = cat.matrix(kernels, kinds, device, args.jobs, on_row)
    text = render(rows, kinds)
    write_json({"device": device, "kinds": list(kinds), "rows": [cat.row_json(r) for r in rows]}, args.json)
    print(text, file=sys.stderr if args.json == "-" else sys.stdout)
    if args.markdown:
        write_text(args.markdown, text + "\n", "--markdown")
    return 1 if any(r.mismatches() for r in rows) else 0


def available_kinds(device: str = "cpu") -> tuple[str, ...]:
    """Compute Sanitizer needs a GPU: on the CPU it is left out unless asked for."""
    return (
        ("probe", "dynamic", "structural", "sanitizer") if DEVICES[device].gpu else ("probe", "dynamic", "structural")
    )


def _cell(row, kind) -> str:
    c = row.cells[kind]
    if c.error:
        return "error"
    if c.not_checked:
        return c.not_checked
    if not c.caught:
        return "pass" if not row.kernel.is_bug else "missed"
    label = "caught" if row.kernel.is_bug else "FLAGGED"
    return f"{label} ({', '.join(c.classes)})" if kind != "probe" else label


def render(rows, kinds) -> str:
    titles = {
        "probe": "pos-0 probe",
        "dynamic": "dynamic",
        "structural": "structural",
        "sanitizer": "Compute Sanitizer",
        "ptx": "PTX engine",
    }
    head = ["kernel", "bug class", *(titles[k] for k in kinds), "as labelled"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"`{r.kernel.name}`", r.kernel.bug_class or "(correct)"]
        cells += [_cell(r, k) for k in kinds]
        unjudged = all(r.cells[k].not_checked for k in kinds if k != "structural")
        cells.append("NO" if r.mismatches() else "not checked here" if unjudged else "yes")
        lines.append("| " + " | ".join(cells) + " |")
    bugs = [r for r in rows if r.kernel.is_bug]
    summary = [f"{len(rows)} kernels ({len(rows) - len(bugs)} correct, {len(bugs)} with a bug)."]
    for k in kinds:
        caught = sum(r.cells[k].caught for r in bugs)
        false = sum(r.cells[k].caught for r in rows if not r.kernel.is_bug)
        unchecked = sum(bool(r.cells[k].not_checked) for r in rows)
        summary.append(
            f"{k}: caught {caught} of {len(bugs)} bugs, {false} false findings on correct kernels"
            + (f", {unchecked} not checked." if unchecked else ".")
        )
    return "\n".join(lines) + "\n\n" + " ".join(summary)
