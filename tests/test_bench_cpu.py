"""The live benchmark on the CPU: real Triton rope kernels under the interpreter, a wall clock, worker children."""

import json
from pathlib import Path

import pytest
from conftest import REPO, cli, has_cuda

from kernalin_ci.bench.pair import aa_copy, bench_pair, micro_note
from kernalin_ci.bench.result import BenchResult, ShapeResult
from kernalin_ci.errors import UsageError

ROPE = "benchmarks/kernels/rope.py:rope"
ROPE_SRC = (REPO / "benchmarks" / "kernels" / "rope.py").read_text()
FAST = ["--param", "tokens=4", "--reps", "2", "--device", "cpu"]


def variant(tmp_path, name, body):
    """A copy of the rope kernels plus one more entry `name` (body: its statements, 4-space indented)."""
    d = tmp_path / name
    d.mkdir()
    (d / "k.py").write_text(ROPE_SRC + f"\n\ndef {name}(q, k, positions):\n{body}\n")
    return f"k.py:{name}", str(d)


def test_slower_head_exits_1_and_its_trace_gives_the_same_verdict(tmp_path):
    head, root = variant(tmp_path, "slow", "    import time\n    time.sleep(0.25)\n    return rope(q, k, positions)")
    out, trace = tmp_path / "v.json", tmp_path / "trace.npz"
    r = cli(
        "bench",
        "--op",
        "rope",
        "--base",
        ROPE,
        "--head",
        head,
        "--head-root",
        root,
        *FAST,
        "--max-rounds",
        "12",
        "--json",
        str(out),
        "--trace",
        str(trace),
    )
    assert r.returncode == 1, r.stdout + r.stderr
    v = json.loads(out.read_text())
    assert v["verdict"] == "slower" and v["p_slower"] >= 0.95 and v["ratio"] > 1.5
    assert {"ratio", "hdi", "p_faster", "p_slower", "p_equivalent", "rope", "shapes", "rounds"} <= set(v)
    assert v["clock"] == "cpu-wall-clock" and "not GPU figures" in v["clock_note"]
    assert v["rounds"] >= 5 and v["stopped"] == "verdict"
    assert v["shapes"][0]["shape"].startswith("T=4 ") and v["shapes"][0]["verdict"] == "slower"
    assert v["floor"] is not None  # the A/A instance was timed in the same rounds
    assert "bench round 5" in r.stderr  # progress lines
    assert "SLOWER" in r.stdout and "not GPU figures" in r.stdout
    c = cli("compare", str(trace), "--json", "-")
    assert c.returncode == 0, c.stderr
    again = json.loads(c.stdout)
    assert again["verdict"] == v["verdict"] and again["ratio"] == pytest.approx(v["ratio"])
    assert again["p_slower"] == pytest.approx(v["p_slower"]) and again["rope"] == pytest.approx(v["rope"])


def test_faster_head_and_the_raw_rounds(tmp_path):
    base, root = variant(tmp_path, "slow", "    import time\n    time.sleep(0.25)\n    return rope(q, k, positions)")
    events = []
    res = bench_pair(
        "rope", base, ROPE, root, str(REPO), {"tokens": [3, 5]}, "cpu", reps=2, max_rounds=10, progress=events.append
    )
    assert not res.failed, res.error
    assert res.verdict.verdict == "faster" and res.stopped == "verdict"
    assert res.to_json()["verdict"] == "faster"
    assert set(res.instances) == {"base", "head", "base2"}
    assert res.instances["base"].shape == (res.rounds, 2, 2)  # [rounds, shapes, reps]
    for row in res.orders.reshape(-1, 3):
        assert sorted(row) == [0, 1, 2]  # every round and shape: the three in some order
    assert len({tuple(r) for r in res.orders.reshape(-1, 3)}) > 1  # and not always the same one
    assert [s.shape.split()[0] for s in res.shapes] == ["T=3", "T=5"]
    assert all(s.verdict is not None and s.base_ms > s.head_ms for s in res.shapes)  # a verdict per shape
    text = json.dumps(res.to_json())  # what report.json holds: read back, it serialises to the same bytes
    assert json.dumps(BenchResult.from_json(json.loads(text)).to_json()) == text
    assert sum(e["event"] == "round" for e in events) == res.rounds
    assert res.bench_seconds > 0.25 * res.rounds * 2 * 2  # the sleeping base was timed 2x2 per round


def test_cached_results_are_caught(tmp_path):
    body = (
        "    key = (q.data_ptr(), k.data_ptr())\n"
        "    if key not in _CACHE:\n        _CACHE[key] = rope(q, k, positions)\n    return _CACHE[key]"
    )
    head, root = variant(tmp_path, "cached", body)
    Path(root, "k.py").write_text(Path(root, "k.py").read_text() + "\n_CACHE = {}\n")
    r = cli(
        "bench",
        "--op",
        "rope",
        "--base",
        ROPE,
        "--head",
        head,
        "--head-root",
        root,
        *FAST,
        "--max-rounds",
        "3",
        "--json",
        "-",
    )
    assert r.returncode == 1
    v = json.loads(r.stdout)
    assert v["error_kind"] == "mismatch" and v["verdict"] is None
    assert "head and base disagree on shape T=4" in v["error"] and "round 1" in v["error"]
    assert "BENCH FAILED (mismatch)" in r.stderr


def test_wrong_output_is_caught(tmp_path):
    head, root = variant(tmp_path, "wrong", "    qo, ko = rope(q, k, positions)\n    return qo.flip(-1), ko")
    res = bench_pair("rope", ROPE, head, str(REPO), root, {"tokens": 4}, "cpu", reps=2, max_rounds=3)
    assert res.failed and res.error_kind == "mismatch"
    assert "output 'q'" in res.error and "rows differ" in res.error
    assert res.verdict is None


def test_in_place_head_agrees_with_out_of_place_base_and_extra_instances_are_timed():
    """The check restores the inputs, so a kernel rotating q in place is compared on the same data.

    An extra instance (what benchmarks/gpu_bench.py uses to record more variants) is checked
    and timed in the same rounds, never judged.
    """
    res = bench_pair(
        "rope",
        ROPE,
        "benchmarks/kernels/rope.py:rope_inplace",
        str(REPO),
        str(REPO),
        {"tokens": 4},
        "cpu",
        reps=2,
        max_rounds=3,
        adaptive=False,
        extra=[("x3", "benchmarks/kernels/rope.py:rope_x3", str(REPO))],
    )
    assert not res.failed, res.error
    assert res.rounds == 3 and res.stopped == "max-rounds"
    assert set(res.instances) == {"base", "head", "base2", "x3"} and res.instances["x3"].shape == (3, 1, 2)
    assert all(sorted(row) == [0, 1, 2, 3] for row in res.orders.reshape(-1, 4))
    assert res.verdict is not None and res.trace.base2 is not None


def test_a_crashing_head_is_contained(tmp_path):
    head, root = variant(tmp_path, "crash", "    import os\n    os.abort()")
    res = bench_pair("rope", ROPE, head, str(REPO), root, {"tokens": 4}, "cpu", reps=2, max_rounds=3)
    assert res.failed and res.error_kind == "crashed"
    assert "SIGABRT" in res.error and "setting up" in res.error


def test_a_hanging_head_is_killed(tmp_path):
    head, root = variant(tmp_path, "hang", "    import time\n    time.sleep(600)")
    res = bench_pair("rope", ROPE, head, str(REPO), root, {"tokens": 4}, "cpu", reps=2, max_rounds=3, timeout_s=8)
    assert res.failed and res.error_kind == "timeout" and "no progress for 8 s" in res.error


@pytest.mark.parametrize(
    "params,budget,needle",
    [
        ({"style": "diagonal"}, 30, "style"),  # an op param with a bad value
        ({"tokens": "zero"}, 30, "tokens"),  # a bench shape param with a bad value
        ({"nonsense": 1}, 30, "nonsense"),  # unknown
        ({}, 0, "budget"),
    ],
)
def test_usage_errors_are_raised_before_anything_runs(params, budget, needle):
    with pytest.raises(UsageError, match=needle):
        bench_pair("rope", ROPE, ROPE, str(REPO), str(REPO), params, "cpu", budget_s=budget)


def test_usage_errors_exit_2_on_the_command_line():
    r = cli("bench", "--op", "rope", "--base", ROPE, "--head", ROPE, "--device", "cpu", "--margin", "1.5")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    r = cli(
        "bench", "--op", "rope", "--base", ROPE, "--head", "nope/missing.py:fn", "--device", "cpu", "--max-rounds", "1"
    )  # found by the child, reported by the parent
    assert r.returncode == 2 and "file not found" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    if not has_cuda():
        r = cli("bench", "--op", "rope", "--base", ROPE, "--head", ROPE, "--device", "cuda")
        assert r.returncode == 2 and "no CUDA GPU" in r.stderr


def test_kv_append_outputs_are_compared_bit_for_bit(tmp_path):
    src = (
        "def good(key, value, k_cache, v_cache, slot_mapping):\n"
        "    s = slot_mapping[slot_mapping >= 0]\n"
        "    bs = k_cache.shape[1]\n"
        "    k_cache[s // bs, s % bs] = key[slot_mapping >= 0]\n"
        "    v_cache[s // bs, s % bs] = value[slot_mapping >= 0]\n\n"
        "def off_by_one(key, value, k_cache, v_cache, slot_mapping):\n"
        "    s = slot_mapping[slot_mapping >= 0]\n"
        "    bs = k_cache.shape[1]\n"
        "    s = (s + 1) % (k_cache.shape[0] * bs)\n"
        "    k_cache[s // bs, s % bs] = key[slot_mapping >= 0]\n"
        "    v_cache[s // bs, s % bs] = value[slot_mapping >= 0]\n"
    )
    (tmp_path / "kv.py").write_text(src)
    ok = bench_pair(
        "kv_append",
        "kv.py:good",
        "kv.py:good",
        str(tmp_path),
        str(tmp_path),
        {"tokens": 6},
        "cpu",
        reps=2,
        max_rounds=2,
        adaptive=False,
    )
    assert not ok.failed, ok.error
    bad = bench_pair(
        "kv_append",
        "kv.py:good",
        "kv.py:off_by_one",
        str(tmp_path),
        str(tmp_path),
        {"tokens": 6},
        "cpu",
        reps=2,
        max_rounds=2,
    )
    assert bad.failed and bad.error_kind == "mismatch" and "bit for bit" in bad.error


def test_aa_copy_is_a_separate_tree(tmp_path):
    root = tmp_path / "repo"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "attn.py").write_text("def entry(**kw):\n    pass\n")
    (root / "kernels" / "common.py").write_text("X = 1\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "big.so").write_bytes(b"\0" * 1000)
    dest = tmp_path / "tmp"
    dest.mkdir()
    entry, new_root, note = aa_copy("kernels/attn.py:entry", str(root), str(dest))
    assert note is None
    assert Path(new_root) != root and Path(new_root, "kernels", "common.py").read_text() == "X = 1\n"
    assert entry == f"{Path(new_root) / 'kernels' / 'attn.py'}:entry"
    assert not Path(new_root, ".git").exists() and not Path(new_root, ".venv").exists()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "k.py").write_text("def f(**kw):\n    pass\n")
    dest2 = tmp_path / "tmp2"
    dest2.mkdir()
    entry, new_root, note = aa_copy(f"{outside / 'k.py'}:f", str(root), str(dest2))
    assert entry == f"{Path(new_root) / 'k.py'}:f" and Path(new_root, "k.py").is_file()


def test_bench_pair_raises_usage_error_for_unknown_op():
    with pytest.raises(UsageError):
        bench_pair("attention.prefill", ROPE, ROPE, device="cpu")


def test_shapes_under_ten_microseconds_per_launch_get_the_micro_kernel_note():
    short, long = ShapeResult("T=1 Hkv=8 D=128", base_ms=0.0016), ShapeResult("T=256 Hkv=8 D=128", base_ms=0.2)
    note = micro_note([short, long, ShapeResult("no verdict")])
    assert note is not None and note.startswith("T=1: 1.6 us per launch") and "T=256" not in note
    assert "Micro-kernels" in note
    assert micro_note([short]).startswith("the shape: 1.6 us per launch")
    assert micro_note([long]) is None and micro_note([]) is None
