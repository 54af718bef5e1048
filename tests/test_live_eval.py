"""benchmarks/live_eval.py and its kernel-only reference on the CPU (Triton interpreter): real benchmark calls,
real copies and variants, the reference profiled inside the worker, the tables and the JSON; the aggregation
into the goal table on the recorded H200 run. Figures on the CPU mean nothing; the GPU run is the
coordinator's (docs/statistics.md, "Live evaluation")."""

import gzip
import importlib.util
import json
import subprocess
import sys

import numpy as np
from conftest import REPO

from kernalin_ci.bench import stats
from kernalin_ci.bench.kernel_time import PREFIX, Event, attribute


def _live():
    spec = importlib.util.spec_from_file_location("live_eval", REPO / "benchmarks" / "live_eval.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
            "--passes",
            "kernel-clock",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for title in ("Goals", "Known-effect pairs", "Per-launch time of the base"):
        assert f"## {title}" in r.stdout
    res = json.loads(out.read_text())
    run = res["runs"]["kernel-clock/cold/kv_append"]
    call = run["calls"][0]
    assert call["clock"] == "cpu-wall-clock"  # the kernel clock's code path; the interpreter has no kernels
    assert set(call["instances"]) == {"base", "head", "base2", "num_warps=1"}
    # the reference: measured inside the worker, per shape, for every instance, 2 profiled replays each
    assert len(call["reference"]) == 2
    for ref in call["reference"]:
        assert ref["method"] == "wall-clock"  # no device events under the interpreter
        assert set(ref["kernel_ms"]) == set(call["instances"])
        assert all(len(v) == 2 and min(v) > 0 for v in ref["kernel_ms"].values())
    assert {t["budget"] for t in run["aa"]} == {"run", 5, "all"}  # 5 rounds on the CPU: no 10-round window
    assert all(len(t["shapes"]) == 2 for t in run["aa"])  # tokens 1 and 4: a verdict per shape
    eff = next(e for e in run["effects"] if e["budget"] == "all")
    assert eff["variant"] == "num_warps=1" and len(eff["reference_shapes"]) == 2
    want = [
        np.median(ref["kernel_ms"]["num_warps=1"]) / np.median(ref["kernel_ms"]["base"]) for ref in call["reference"]
    ]
    assert np.allclose(eff["reference_shapes"], want)
    assert eff["verdict"] in ("faster", "slower", "equivalent", "inconclusive") and isinstance(eff["inside"], bool)


def test_attribution_by_link_by_time_and_by_wall_clock():
    rng = [Event(False, PREFIX + "0/0", 1000, 500, 11, 0), Event(False, PREFIX + "1/0", 2000, 500, 12, 0)]
    other = Event(False, "aten::zero_", 1800, 100, 13, 0)
    flush = Event(True, "fill", 1810, 80, 0, 13)  # the L2 flush between ranges belongs to neither
    linked = [Event(True, "k", 1100, 30, 0, 11), Event(True, "k", 1140, 30, 0, 11), Event(True, "k", 2100, 50, 0, 12)]
    got = attribute(rng + [other, flush] + linked)
    assert got["0/0"].kernel_ns == 60 and got["0/0"].span_ns == 70 and got["0/0"].kernels == 2
    assert got["1/0"].kernel_ns == 50 and got["1/0"].kernels == 1 and got["0/0"].method == "linked"
    # an eager entry's own torch op inside a range: its kernel counts for the range
    nested = [Event(False, "aten::zero_", 2200, 50, 14, 0), Event(True, "fill", 2300, 20, 0, 14)]
    got = attribute(rng + [other, flush] + linked + nested)
    assert got["1/0"].kernel_ns == 70 and got["1/0"].kernels == 2 and got["0/0"].kernel_ns == 60
    # no links recorded: a range owns the device kernels that start inside it
    unlinked = [Event(True, e.name, e.start_ns, e.dur_ns, 0, 0) for e in linked + [flush]]
    got = attribute(rng + unlinked)
    assert got["0/0"].kernel_ns == 60 and got["1/0"].kernel_ns == 50 and got["1/0"].method == "time"
    # links for one range only: the other falls back to time, and the flush (linked elsewhere) stays out
    got = attribute(rng + [other, flush] + linked[:2] + unlinked[2:3])
    assert got["0/0"].method == "linked" and got["1/0"].method == "time" and got["1/0"].kernel_ns == 50
    # no device events at all (the CPU): the range's own duration, said so
    got = attribute(rng)
    assert got["0/0"].kernel_ns == 500 and got["0/0"].method == "wall-clock" and got["0/0"].kernels == 0


def test_live_runs_are_consecutive_and_the_goal_table_adds_up():
    live = _live()
    rec = json.load(gzip.open(REPO / "benchmarks" / "data" / "live_quiet_h200.json.gz"))
    results = {"runs": {}}
    for key, r in rec["runs"].items():
        call = dict(r["calls"][0], variants=["num_warps=1"] if "num_warps=1" in r["calls"][0]["instances"] else [])
        results["runs"][key] = {
            "pass": r["pass"],
            "regime": r["regime"],
            "op": r["op"],
            "calls": [call],
            "aa": live.aa_trials(call, cap=8),
            "effects": live.effect_trials(call),  # the recorded run has no in-graph reference
        }
    run = results["runs"]["quiet/warm/rope"]
    arr = {k: np.asarray(v) for k, v in run["calls"][0]["instances"].items()}
    for tri in live.triples(run["calls"][0]):
        runs = [t for t in run["aa"] if t["budget"] == "run" and t["triple"] == list(tri)]
        assert runs and runs[0]["start"] == 0
        for a, b in zip(runs, runs[1:]):
            assert b["start"] == a["start"] + a["rounds"]  # the next run starts where the last one stopped
        for t in runs:
            assert 5 <= t["rounds"] <= 8
            s, n = t["start"], t["rounds"]
            v, per = stats.compare_run(*(arr[x][s : s + n] for x in tri))
            assert (t["verdict"], t["shapes"]) == (v.verdict, [p.verdict for p in per])
    assert all(e["reference"] is None and e["inside"] is None for e in run["effects"])
    rows = live.goal_rows(results)
    for regime in ("warm", "cold"):
        ops = [r for r in rows if r["regime"] == regime and r["op"] != "all ops"]
        (total,) = [r for r in rows if r["regime"] == regime and r["op"] == "all ops"]
        for b in ("run", 5, 10, "all"):
            for k in ("trials", "false", "shape_verdicts", "false_shapes"):
                assert total[b][k] == sum(r[b][k] for r in ops)
        assert total["inside"] == (0, 0)  # no reference: nothing counted as inside, nothing as outside
    assert {r["op"] for r in rows if r["regime"] == "warm"} == set(rec["ops"]) | {"all ops"}


def test_bad_arguments_exit_2():
    r = subprocess.run(
        [sys.executable, "benchmarks/live_eval.py", "--device", "cpu", "--ops", "softmax"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "bad arguments" in r.stderr
