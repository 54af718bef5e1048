"""NVIDIA Compute Sanitizer over a few of a kernel's cases, CUDA C++ and Triton kernels alike.

Each tool (memcheck: out-of-bounds and misaligned accesses; racecheck: shared-memory hazards; initcheck: reads of
device memory nothing wrote; synccheck: barriers in divergent code) runs as its own worker, wrapped by
`compute-sanitizer --tool T` inside the worker sandbox, and launches the chosen cases once each (task
`verify-launch`: no poison, no guard zones, torch's caching allocator off, so that every tensor is an allocation of
its own and an access past its end is outside any allocation, as memcheck needs). The tool's report goes to a file
in the worker's results folder; the parent reads it and maps each error to a bug class (`CLASSES`): an
out-of-bounds read is `unmasked-load` (a tail or a padded lane read without a mask), an out-of-bounds write
`stray-write`, a shared-memory race `shared-race`, an uninitialised read `uninitialized-read`, a barrier error
`barrier-divergence`. A racecheck *warning* (a hazard the tool judges benign, such as threads writing the same value)
is a notice, never a finding. Where the tool is missing or no GPU is there, the result says "not checked" and why.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kernalin_ci.cuda import toolchain
from kernalin_ci.device import DEVICES
from kernalin_ci.findings import Finding, Location, Notice, SanitizerStatus
from kernalin_ci.isolate import run_task
from kernalin_ci.jobs import LaunchJob
from kernalin_ci.sandbox import CappedFolder

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
CASES = 2  # cases per kernel: the first two of its plan (not the huge ones)
PREFIX = re.compile(r"^=+ ?")
WHERE = re.compile(r"(?:in|at) (?P<path>/?[^\s:()]+\.(?:cu|cuh|h|hpp|cpp|cc|py)):(?P<line>\d+)")
KERNEL = re.compile(r"(?:at (?:0x[0-9a-f]+ in )?)(?P<name>[A-Za-z_][\w:<>, ]*?)(?:\(|\+0x)")
HAZARDS = re.compile(r"\[(\d+) hazards?\]")
# the first words of an error, per tool -> bug class (the first that matches)
CLASSES: dict[str, list[tuple[re.Pattern, str]]] = {
    "memcheck": [
        (re.compile(r"^Invalid __(global|shared|local)__ read"), "unmasked-load"),
        (re.compile(r"^Invalid __(global|shared|local)__ (write|atomic)"), "stray-write"),
        (re.compile(r"^(Out-of-range Shared or Local Address|Misaligned|Invalid )"), "cuda-error"),
    ],
    "racecheck": [(re.compile(r"^Error: Race reported|^ERROR: Potential \w+ hazard"), "shared-race")],
    "initcheck": [(re.compile(r"^Uninitialized"), "uninitialized-read")],
    "synccheck": [
        (re.compile(r"Barrier error|Invalid __syncwarp|Invalid arguments|divergent", re.I), "barrier-divergence")
    ],
}
WARNING = re.compile(r"^Warning: Race reported|^WARNING: Potential \w+ hazard")


@dataclass
class Error:
    """One error of a report: its first line, where (file, line), the kernel, and how many it stands for."""

    tool: str
    text: str
    path: str | None = None
    line: int | None = None
    kernel: str | None = None
    hazards: int = 0  # racecheck: the "[N hazards]" of its lines, summed
    detail: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return self.hazards or 1

    @property
    def bug_class(self) -> str | None:
        for pattern, cls in CLASSES.get(self.tool, []):
            if pattern.search(self.text):
                return cls
        return None


PADDING = 65536  # memcheck: bytes of red zone after every allocation


def argv(binary: str, tool: str, log: str) -> list[str]:
    """The command that wraps a worker: TOOL's report to LOG, API errors (torch's own probing) not reported.
    memcheck pads every allocation (`--padding`): small allocations lie next to each other, so without a pad a
    write just before one tensor (a padding token's slot -1) lands inside the tensor allocated before it, where
    no tool can tell it from a legal access."""
    out = [binary, "--tool", tool, "--log-file", log, "--print-limit", "200", "--report-api-errors", "no"]
    if tool == "memcheck":
        out += ["--leak-check", "no", "--padding", str(PADDING)]
    return out


def parse(tool: str, text: str) -> tuple[list[Error], list[Error]]:
    """The errors of a report and its warnings (racecheck's benign hazards)."""
    errors: list[Error] = []
    warnings: list[Error] = []
    current: Error | None = None
    for raw in text.splitlines():
        if not PREFIX.match(raw):
            continue
        body = PREFIX.sub("", raw, count=1)
        if not body.strip() or body.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "Target")):
            current = None
            continue
        if not body.startswith(" "):  # a new error (or warning) starts
            current = Error(tool, body.strip())
            if WARNING.search(current.text):
                warnings.append(current)
            elif current.bug_class is not None:
                errors.append(current)
            else:
                current = None  # a line the tool prints that is no error (a note, a program's exit)
                continue
        elif current is None:
            continue
        else:
            current.detail.append(body.strip())
        m = WHERE.search(body)
        if m and current.path is None:
            current.path, current.line = m["path"], int(m["line"])
        k = KERNEL.search(body)
        if k and current.kernel is None and not k["name"].startswith("0x"):
            current.kernel = k["name"]
        h = HAZARDS.search(body)
        if h:
            current.hazards += int(h[1])
    return errors, warnings


def findings(errors: list[Error], cases: list[str]) -> list[Finding]:
    """One finding per (tool, class, place), counting the rest."""
    groups: dict[tuple, list[Error]] = {}
    for e in errors:
        groups.setdefault((e.tool, e.bug_class, e.path, e.line, e.text.split(" of size")[0]), []).append(e)
    out = []
    for (tool, cls, path, line, _), group in groups.items():
        first = group[0]
        total = sum(e.count for e in group)
        where = f" at {os.path.basename(path)}:{line}" if path else ""
        kernel = f" in {first.kernel}" if first.kernel else ""
        more = f" ({total} reports)" if total > 1 else ""
        detail = next((d for d in first.detail if d.startswith(("by thread", "and ", "Address"))), "")
        msg = f"Compute Sanitizer {tool}: {first.text}{where}{kernel}{more}" + (f"; {detail}" if detail else "")
        msg += f" (cases: {', '.join(cases)})"
        out.append(
            Finding(f"sanitizer:{tool}", cls, msg, Location(path, line) if path and line else None, kind="sanitizer")
        )
    return out


def choose_cases(cases: list) -> list:
    """The cases Compute Sanitizer runs: the first CASES of the plan that are not huge."""
    return [c for c in cases if "huge" not in c.tags][:CASES]


def check(
    op: str,
    entry: str,
    params: dict,
    cases: list,
    device: str,
    root: str | None,
    timeout_s: float,
    tools: tuple[str, ...] = TOOLS,
) -> tuple[list[Finding], list[Notice], SanitizerStatus]:
    """Run each tool over CASES (a few of the plan: choose_cases) at once, one worker each."""
    if not DEVICES[device].gpu:
        return [], [], SanitizerStatus("not-checked", "needs a GPU")
    binary = toolchain.compute_sanitizer()
    if binary is None:
        return [], [], SanitizerStatus("not-checked", "no compute-sanitizer")
    t0 = time.perf_counter()
    chosen = choose_cases(cases)
    names = [c.name for c in chosen]
    with ThreadPoolExecutor(max_workers=len(tools)) as pool:
        runs = list(pool.map(lambda t: _run_tool(t, binary, op, entry, params, chosen, root, timeout_s), tools))
    found: list[Finding] = []
    notices: list[Notice] = []
    per_tool = {}
    for tool, (errors, warnings, info) in zip(tools, runs):
        per_tool[tool] = info
        found += findings(errors, names)
        for w in warnings[:3]:
            notices.append(Notice(f"sanitizer:{tool}", f"Compute Sanitizer {tool} (a warning, not judged): {w.text}"))
    ran = [t for t, info in per_tool.items() if info["status"] == "ok"]
    if not ran:
        why = "; ".join(f"{t}: {info['status']}" for t, info in per_tool.items())
        return [], notices, SanitizerStatus("not-checked", f"compute-sanitizer could not run ({why})", per_tool, names)
    return found, notices, SanitizerStatus("checked", None, per_tool, names, time.perf_counter() - t0)


def _run_tool(tool, binary, op, entry, params, cases, root, timeout_s) -> tuple[list[Error], list[Error], dict]:

    t0 = time.perf_counter()
    with CappedFolder("kernalin-sanitizer-") as folder:
        job = LaunchJob(op=op, entry=entry, root=root, params=params, cases=tuple(cases), results=folder.path)
        log = os.path.join(folder.path, "report.txt")
        outcome = run_task(
            job,
            "cuda",
            timeout_s * 4,  # the tools slow a kernel down many times
            env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
            cwd=root,
            writable=(folder,),
            wrap=tuple(argv(binary, tool, log)),
            readonly=(toolchain.install_dir(binary),),
        )
        try:
            with open(os.path.join(folder.view, "report.txt"), errors="replace") as f:
                text = f.read(8 << 20)
        except OSError:
            text = ""
    launched = sum(1 for e in outcome.events if e.get("event") == "case-done")
    if not text and outcome.status != "ok":
        info = {"status": f"no report ({outcome.ended()[:200]})", "seconds": time.perf_counter() - t0, "errors": 0}
        return [], [], info
    errors, warnings = parse(tool, text)
    info = {"status": "ok", "seconds": round(time.perf_counter() - t0, 2), "errors": len(errors), "cases": launched}
    return errors, warnings, info
