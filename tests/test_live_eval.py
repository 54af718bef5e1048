"""benchmarks/live_eval.py's code path on the CPU (Triton interpreter): real benchmark calls, real copies and
variants, the reference, the tables and the JSON. Its figures mean nothing on the CPU; the GPU run is the
coordinator's (docs/statistics.md, "Live evaluation")."""

import json
import subprocess
import sys

from conftest import REPO


def test_live_eval_runs_on_the_cpu_and_writes_every_table(tmp_path):
    out = tmp_path / "live.json"
    r = subprocess.run(
        [
            sys.executable,
            "benchmarks/live_eval.py",
            "--device",
            "cpu",
            "--quick",
            "--ops",
            "kv_append",
            "--regimes",
            "cold",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for title in ("A/A false verdicts", "Known-effect pairs", "Power and false alarms", "Regime summary", "Regimes:"):
        assert f"## {title}" in r.stdout
    res = json.loads(out.read_text())
    run = res["runs"]["quiet/cold/kv_append"]
    call = run["calls"][0]
    assert set(call["instances"]) == {"base", "head", "base2", "num_warps=1"}
    assert {t["budget"] for t in run["aa"]} == {"all", "adaptive"}  # 5 rounds on the CPU: no shorter window
    assert all(len(t["shapes"]) == 2 for t in run["aa"])  # tokens 1 and 4: a verdict per shape
    eff = run["effects"][0][0]
    assert eff["variant"] == "num_warps=1" and eff["reference"] > 0 and len(eff["reference_shapes"]) == 2
    assert eff["verdict"] in ("faster", "slower", "equivalent", "inconclusive") and isinstance(eff["inside"], bool)


def test_bad_arguments_exit_2():
    r = subprocess.run(
        [sys.executable, "benchmarks/live_eval.py", "--device", "cpu", "--ops", "softmax"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "bad arguments" in r.stderr
