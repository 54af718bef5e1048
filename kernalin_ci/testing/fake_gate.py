"""A stand-in for `kernalin-ci run` (the daemon's runner.command) for queue, scheduler and load tests.

It reads what to do from the checkout (verdict.txt: success|failure|error; sleep.txt: seconds;
benchmark.json: the kernel's benchmark verdict, for history tests),
records its environment and working directory, and writes a real report.json through the report
writer: `python -m kernalin_ci.testing.fake_gate OUT BASE HEAD DEVICE`.
"""

import json
import os
import sys
import time
from pathlib import Path

from kernalin_ci.bench.result import BenchResult

out, base, head, device = sys.argv[1:5]
Path(out).mkdir(parents=True, exist_ok=True)
Path(out, "env.json").write_text(json.dumps(dict(os.environ)))
Path(out, "cwd.txt").write_text(os.getcwd())
Path(out, "started").write_text(str(os.getpid()))
print(f"kernalin-fake-gate: started {os.getpid()}", flush=True)  # job.log is live; out/ reaches the host at the end
verdict = Path("verdict.txt").read_text().strip() if Path("verdict.txt").exists() else "success"
time.sleep(float(Path("sleep.txt").read_text()) if Path("sleep.txt").exists() else 0)
if verdict == "error":
    print("kernalin-ci run: error: .kernalin.yml:3: kernels: required", file=sys.stderr)
    sys.exit(2)
from kernalin_ci.findings import Finding, VerifyResult
from kernalin_ci.report.model import KernelReport, Report
from kernalin_ci.report.writer import write_all


def benchmark():
    """benchmark.json's verdict, typed (kernalin_ci.bench imports numpy: only when there is one)."""
    if not Path("benchmark.json").exists():
        return None

    return BenchResult.from_json(json.loads(Path("benchmark.json").read_text()))


kernel = KernelReport(
    "kv_append",
    "kv_append",
    "kernels/kv_cache.py:append",
    "changed",
    ["kernels/kv_cache.py changed"],
    verification=VerifyResult(
        "kv_append",
        "kernels/kv_cache.py:append",
        findings=[Finding("fake-gate", "wrong-output", "fake gate: failure")] if verdict == "failure" else [],
    ),
    failed_by=["finding"] if verdict == "failure" else [],
    benchmark=benchmark(),
)
write_all(
    Report(
        conclusion=verdict,
        reason=f"fake gate: {verdict}",
        base={"ref": base, "sha": base},
        head={"ref": head, "sha": head},
        device=device,
        policy={},
        kernels=[kernel],
    ),
    out,
)
sys.exit(1 if verdict == "failure" else 0)
