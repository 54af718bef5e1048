"""`kernalin-ci compare` through the real command line (SPEC-cli.md)."""

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import cli

from kernalin_ci.bench import stats
from kernalin_ci.bench.trace import Trace, from_shapes, load_trace, save_trace

TRACES = Path(__file__).resolve().parent / "data" / "gpu-traces"
SPEC_FIELDS = {"verdict", "ratio", "hdi", "p_faster", "p_slower", "p_equivalent", "rope"}


@pytest.fixture(scope="module")
def attn():
    return np.load(TRACES / "timings_attn.npz")["t"]


def write(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def test_one_trace_gives_the_spec_json(tmp_path, attn):
    p = write(tmp_path / "t.npz", base=attn[:, 0], head=attn[:, 3], base2=attn[:, 1])
    r = cli("compare", p, "--json", "-")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert SPEC_FIELDS <= set(obj)
    assert obj["verdict"] == "slower"
    v = stats.compare_trace(attn[:, 0], attn[:, 3], attn[:, 1])
    assert obj["ratio"] == pytest.approx(v.ratio) and obj["hdi"] == pytest.approx(list(v.hdi))
    assert obj["p_slower"] == pytest.approx(v.p_slower) and obj["rope"] == pytest.approx(list(v.rope))
    assert "SLOWER" in r.stderr  # the human line goes to stderr when the JSON takes stdout


def test_many_traces_one_line_each_in_order(tmp_path, attn):
    paths = [
        write(tmp_path / "faster.npz", base=attn[:, 5], head=attn[:, 0]),
        write(tmp_path / "aa.npz", base=attn[:, 0], head=attn[:, 1]),
        write(tmp_path / "slower.npz", base=attn[:, 0], head=attn[:, 4], base2=attn[:, 1]),
    ]
    out = tmp_path / "out.jsonl"
    r = cli("compare", *paths, "--json", str(out))
    assert r.returncode == 0, r.stderr
    objs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [o["verdict"] for o in objs] == ["faster", "equivalent", "slower"]
    assert [o["trace"] for o in objs] == paths
    assert r.stdout.count("\n") == 3 and "FASTER" in r.stdout and "EQUIVALENT" in r.stdout


def test_json_trace_and_fixed_rope(tmp_path, attn):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"base": attn[:40, 0].tolist(), "head": attn[:40, 2].tolist()}))
    r = cli("compare", str(p), "--margin", "0.02", "--json", "-")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["verdict"] == "equivalent" and obj["rope"] == pytest.approx([0.98, 1.02])
    assert obj["rope_source"] == "fixed"
    assert "margin ±2%" in r.stderr and "ROPE" not in r.stderr  # the equivalence margin, in users' words
    old = cli("compare", str(p), "--rope", "0.02", "--json", "-")  # the old name still works, with a warning
    assert json.loads(old.stdout) == obj
    assert old.stderr.splitlines()[0] == (
        "kernalin-ci compare: warning: --rope is deprecated: use --margin (the equivalence margin)"
    )


def test_slower_still_exits_zero(tmp_path, attn):
    p = write(tmp_path / "t.npz", base=attn[:, 0], head=attn[:, 5])
    r = cli("compare", p)
    assert r.returncode == 0 and "SLOWER" in r.stdout


def test_multi_shape_trace_round_trips(tmp_path, attn):
    rope_t = np.load(TRACES / "timings_rope.npz")["t"]
    base = np.stack([attn[:50, 0], rope_t[:50, 0]], axis=1)  # [rounds, shapes, reps]
    head = np.stack([attn[:50, 2], rope_t[:50, 3]], axis=1)
    base2 = np.stack([attn[:50, 1], rope_t[:50, 1]], axis=1)
    tr = from_shapes(base, head, base2, {"shapes": ["attn B=32", "rope T=256"], "clock": "cuda-events"})
    for suffix in ("npz", "json"):
        path = str(tmp_path / f"multi.{suffix}")
        save_trace(tr, path)
        back = load_trace(path)
        np.testing.assert_allclose(back.base, tr.base)
        np.testing.assert_allclose(back.per_shape["head"], head)
        assert back.meta["shapes"] == ["attn B=32", "rope T=256"]
        r = cli("compare", path, "--shapes", "--json", "-")
        assert r.returncode == 0, r.stderr
        obj = json.loads(r.stdout)
        overall = stats.compare_trace(tr.base, tr.head, tr.base2)
        assert obj["ratio"] == pytest.approx(overall.ratio)  # the geometric mean over shapes per repetition
        assert overall.ratio == pytest.approx(np.sqrt(1.0111 * 1.0438), rel=3e-3)
        assert [s["shape"] for s in obj["shapes"]] == ["attn B=32", "rope T=256"]
        assert [s["verdict"] for s in obj["shapes"]] == ["slower", "slower"]
        assert obj["clock"] == "cuda-events"


def bad_cases(tmp_path, attn):
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"PK\x03\x04 not really a zip")
    text = tmp_path / "notes.npz"
    text.write_text("base and head, from my notes\n")
    ragged = tmp_path / "ragged.json"
    ragged.write_text('{"base": [[1, 2], [3]], "head": [[1, 2], [3, 4]]}')
    nan_head = attn[:10, 1].copy()
    nan_head[3, 2] = np.nan
    neg = attn[:10, 1].copy()
    neg[0, 0] = -1.0
    return {
        "missing": (str(tmp_path / "nope.npz"), "no such file"),
        "no head": (write(tmp_path / "nohead.npz", base=attn[:, 0]), "no array 'head'"),
        "rounds": (write(tmp_path / "rounds.npz", base=attn[:10, 0], head=attn[:12, 1]), "rounds"),
        "base2 rounds": (write(tmp_path / "b2.npz", base=attn[:10, 0], head=attn[:10, 1], base2=attn[:9, 1]), "rounds"),
        "1-D": (write(tmp_path / "flat.npz", base=attn[:10, 0, 0], head=attn[:10, 1, 0]), "2-D"),
        "NaN": (write(tmp_path / "nan.npz", base=attn[:10, 0], head=nan_head), "NaN"),
        "negative": (write(tmp_path / "neg.npz", base=attn[:10, 0], head=neg), "<= 0"),
        "empty": (write(tmp_path / "empty.npz", base=np.zeros((0, 3)), head=np.zeros((0, 3))), "empty"),
        "corrupt": (str(corrupt), "not a readable"),
        "ragged": (str(ragged), "not an array of numbers"),
        "text": (str(text), "is not one"),  # numpy's own advice (allow_pickle) is no help here
    }


def test_bad_input_is_one_line_and_exit_2(tmp_path, attn):
    good = write(tmp_path / "good.npz", base=attn[:10, 0], head=attn[:10, 1])
    for what, (path, needle) in bad_cases(tmp_path, attn).items():
        r = cli("compare", good, path)
        assert r.returncode == 2, (what, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (what, r.stderr)
        assert needle in r.stderr and Path(path).name in r.stderr, (what, r.stderr)
        assert "allow_pickle" not in r.stderr, (what, r.stderr)
        assert r.stdout == "", what  # nothing judged when one input is bad


def test_bad_margin_is_exit_2(tmp_path, attn):
    good = write(tmp_path / "good.npz", base=attn[:10, 0], head=attn[:10, 1])
    for value in ("2", "-0.1", "abc"):
        r = cli("compare", good, "--margin", value)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        assert r.stderr.startswith(f"kernalin-ci compare: error: --margin {value}: expected a fraction"), r.stderr


def test_npz_is_a_real_zip_with_named_arrays(tmp_path, attn):
    """The saved trace is plain numpy npz: other tools can read base/head without kernalin-ci."""
    path = str(tmp_path / "t.npz")
    save_trace(Trace(attn[:5, 0], attn[:5, 1], None, {"unit": "ms"}), path)
    with zipfile.ZipFile(path) as z:
        assert {"base.npy", "head.npy", "meta.npy"} <= set(z.namelist())
    z = np.load(path)
    np.testing.assert_array_equal(z["base"], attn[:5, 0])
