"""FlashInfer-Bench workload files drive `verify` and `bench` (kernalin_ci/workload.py, docs/cli.md).

The dataset is written in the test with FlashInfer-Bench's own data models (Definition, Workload, Trace of
flashinfer-bench 0.1.2, fetched from the package registry as the real-world corpus is, sha256 in
tests/realworld/manifest.json): a paged decode definition and two workloads whose batch lives in a safetensors
blob. Their cases then run through the real CLI against a real Triton kernel under the interpreter, and the
traces `verify --trace` writes are read back with FlashInfer-Bench's own reader (json_utils.load_jsonl_file of
its Trace model, as its TraceSet reads traces/).
"""

from __future__ import annotations

import importlib
import json
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import CHECKS

from kernalin_ci import workload
from kernalin_ci.errors import UsageError

sys.path.insert(0, str(Path(__file__).resolve().parent / "realworld"))
import corpus  # noqa: E402

DIST = "flashinfer-bench-0.1.2"
NAME = "gqa_paged_decode_h4_kv2_d64_ps16"
ENTRY = f"{CHECKS / 'attention_decode_paged' / 'correct_online_paged.py'}:entry"


@pytest.fixture(scope="module")
def fib():
    """FlashInfer-Bench's data models (flashinfer_bench.data's definition, workload and trace modules), loaded
    from the fetched wheel without the package's __init__ (which imports its runtime)."""
    dists = json.loads(corpus.MANIFEST.read_text())["distributions"]
    dist = corpus.Dist(key=DIST, **dists[DIST])
    root = corpus.extract(
        dist,
        {
            f"flashinfer_bench/{m}.py"
            for m in ("utils", "data/utils", "data/definition", "data/workload", "data/trace", "data/json_utils")
        },
    )
    for name, folder in (("flashinfer_bench", root / "flashinfer_bench"), ("flashinfer_bench.data", None)):
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(folder or root / "flashinfer_bench" / "data")]
            sys.modules[name] = pkg
    return types.SimpleNamespace(
        **{
            m: importlib.import_module(f"flashinfer_bench.data.{m}")
            for m in ("definition", "workload", "trace", "json_utils")
        }
    )


def safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    """int32 tensors in the safetensors format (header length, JSON header, data)."""
    header, data = {}, b""
    for key, values in tensors.items():
        blob = struct.pack(f"<{len(values)}i", *values)
        header[key] = {"dtype": "I32", "shape": [len(values)], "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    head = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)


def dataset(fib, root: Path, batches: list[tuple[list[int], list[int]]], page_size: int = 16) -> Path:
    """A FlashInfer-Bench dataset: the definition and one workload per (pages per sequence, last page lengths)."""
    d, w, t = fib.definition, fib.workload, fib.trace
    name = f"gqa_paged_decode_h4_kv2_d64_ps{page_size}"
    var = d.AxisVar
    definition = d.Definition(
        name=name,
        op_type="gqa_paged",
        axes={
            "batch_size": var(),
            "num_qo_heads": d.AxisConst(value=4),
            "num_kv_heads": d.AxisConst(value=2),
            "head_dim": d.AxisConst(value=64),
            "num_pages": var(),
            "page_size": d.AxisConst(value=page_size),
            "len_indptr": var(),
            "num_kv_indices": var(),
        },
        inputs={
            "q": d.TensorSpec(shape=["batch_size", "num_qo_heads", "head_dim"], dtype="float16"),
            "k_cache": d.TensorSpec(shape=["num_pages", "page_size", "num_kv_heads", "head_dim"], dtype="float16"),
            "v_cache": d.TensorSpec(shape=["num_pages", "page_size", "num_kv_heads", "head_dim"], dtype="float16"),
            "kv_indptr": d.TensorSpec(shape=["len_indptr"], dtype="int32"),
            "kv_indices": d.TensorSpec(shape=["num_kv_indices"], dtype="int32"),
            "kv_last_page_len": d.TensorSpec(shape=["batch_size"], dtype="int32"),
            "sm_scale": d.TensorSpec(shape=None, dtype="float32"),
        },
        outputs={"output": d.TensorSpec(shape=["batch_size", "num_qo_heads", "head_dim"], dtype="float16")},
        reference="def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):\n    return q\n",
    )
    (root / "definitions" / "gqa_paged").mkdir(parents=True, exist_ok=True)
    (root / "definitions" / "gqa_paged" / f"{name}.json").write_text(definition.model_dump_json(indent=2))
    lines = []
    for i, (pages, last) in enumerate(batches):
        uuid = f"{i:08d}-feed-beef"
        indptr = [0]
        for p in pages:
            indptr.append(indptr[-1] + p)
        blob = f"blob/workloads/gqa_paged/{name}/{name}_{uuid}.safetensors"
        safetensors(root / blob, {"kv_indptr": indptr, "kv_indices": list(range(indptr[-1])), "kv_last_page_len": last})

        def stored(key, blob=blob):
            return w.SafetensorsInput(path=blob, tensor_key=key)

        wl = w.Workload(
            axes={"batch_size": len(pages), "num_pages": indptr[-1] + 1, "len_indptr": len(indptr),
                  "num_kv_indices": indptr[-1]},
            inputs={"q": w.RandomInput(), "k_cache": w.RandomInput(), "v_cache": w.RandomInput(),
                    "kv_indptr": stored("kv_indptr"), "kv_indices": stored("kv_indices"),
                    "kv_last_page_len": stored("kv_last_page_len"), "sm_scale": w.ScalarInput(value=0.125)},
            uuid=uuid,
        )  # fmt: skip
        lines.append(t.Trace(definition=name, workload=wl).model_dump_json())
    path = root / "workloads" / "gqa_paged" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "kernalin_ci", *args], capture_output=True, text=True, cwd=cwd, timeout=900
    )


def test_workloads_become_cases_with_their_batch_heads_page_size_and_scale(fib, tmp_path):
    path = dataset(fib, tmp_path, [([1, 3], [5, 16]), ([2], [1])])
    wl = workload.load(path)
    assert (wl.definition, wl.op_type, wl.dtype) == (NAME, "gqa_paged", "float16")
    assert wl.params == {"block_size": 16, "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 64}
    assert [c.dims["kv_lens"] for c in wl.cases] == [[5, 48], [17]]
    assert {c.dims["scale"] for c in wl.cases} == {0.125}
    assert [c.name for c in wl.cases] == ["workload-0-00000000", "workload-1-00000001"]
    params, cases = workload.for_op(wl, "attention.decode_paged", {"block_size": "16"}, "float32")
    assert params["block_size"] == 16 and {c.dtype for c in cases} == {"float32"}


@pytest.mark.slow
def test_verify_and_bench_take_the_workload_files_cases(fib, tmp_path):
    path = dataset(fib, tmp_path, [([1, 20], [5, 16]), ([9], [1])])  # kv_lens [5, 320], [129]
    r = cli("verify", "--op", "attention.decode_paged", "--entry", ENTRY, "--workload", str(path), "--device", "cpu",
            "--json", "-", "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert res["verdict"] == "pass" and res["cases_run"] == 2
    assert res["coverage"]["block_sizes"] == [16] and res["coverage"]["dtypes"] == ["float16"]
    bug = f"{CHECKS / 'attention_decode_paged' / 'bug_online_l_not_rescaled.py'}:entry"
    r = cli("verify", "--op", "attention.decode_paged", "--entry", bug, "--workload", str(path), "--device", "cpu",
            "--only", "dynamic", "--json", "-", "--quiet")  # fmt: skip
    assert r.returncode == 1 and {f["case"]["name"] for f in json.loads(r.stdout)["findings"]} <= {
        "workload-0-00000000",
        "workload-1-00000001",
    }
    r = cli("bench", "--op", "attention.decode_paged", "--base", ENTRY, "--head", ENTRY, "--workload", str(path),
            "--device", "cpu", "--budget-s", "3", "--max-rounds", "2", "--json", "-", "--quiet")  # fmt: skip
    assert r.returncode in (0, 1), r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["error"] is None and [s["shape"] for s in out["shapes"]] == [
        "workload-0-00000000",
        "workload-1-00000001",
    ]


BUG = f"{CHECKS / 'attention_decode_paged' / 'bug_online_l_not_rescaled.py'}:entry"


def read_trace(fib, path: Path) -> list:
    """The trace file as FlashInfer-Bench reads it: every line validated by its Trace model (a line the schema
    refuses, e.g. PASSED without performance, raises)."""
    return fib.json_utils.load_jsonl_file(fib.trace.Trace, path)


@pytest.mark.slow
def test_verify_writes_each_workloads_evaluation_as_a_flashinfer_bench_trace(fib, tmp_path):
    # kv_len 5 fits one tile: the unrescaled running sum never matters there; kv_lens 5 and 320 need the rescale
    path = dataset(fib, tmp_path, [([1], [5]), ([1, 20], [5, 16])])
    trace = tmp_path / "bug.jsonl"
    r = cli("verify", "--op", "attention.decode_paged", "--entry", BUG, "--workload", str(path), "--device", "cpu",
            "--only", "dynamic", "--trace", str(trace), "--quiet")  # fmt: skip
    assert r.returncode == 1, r.stderr[-2000:]
    assert "trace: 1 workload written" in r.stdout and "1 INCORRECT_NUMERICAL" in r.stdout, r.stdout
    assert "left out: 1 passed, not timed" in r.stdout, r.stdout
    (bad,) = read_trace(fib, trace)
    ev = bad.evaluation
    assert bad.definition == NAME and bad.solution == BUG and bad.workload.uuid == "00000001-feed-beef"
    assert ev.status == fib.trace.EvaluationStatus.INCORRECT_NUMERICAL and ev.performance is None
    # the judge's measured errors: the sum of only the last tile's weights divides, so the output is far off
    assert 0.01 < ev.correctness.max_absolute_error < 1e3 and 0.05 < ev.correctness.max_relative_error
    assert "online-rescale" in ev.log or "wrong-output" in ev.log, ev.log
    assert ev.environment.hardware.endswith("(Triton interpreter)") and "torch" in ev.environment.libs
    # the workload object is the file's own, key for key
    assert json.loads(trace.read_text())["workload"] == json.loads(path.read_text().splitlines()[1])["workload"]

    good = tmp_path / "good.jsonl"
    r = cli("verify", "--op", "attention.decode_paged", "--entry", ENTRY, "--workload", str(path), "--device", "cpu",
            "--only", "dynamic", "--trace", str(good), "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    # on the CPU nothing is timed: PASSED needs performance, so the passing workloads are left out, and said so
    assert read_trace(fib, good) == [] and "left out: 2 passed, not timed" in r.stdout, r.stdout

    timings = tmp_path / "bench.json"
    r = cli("bench", "--op", "attention.decode_paged", "--base", ENTRY, "--head", ENTRY, "--workload", str(path),
            "--device", "cpu", "--budget-s", "2", "--max-rounds", "2", "--json", str(timings), "--quiet")  # fmt: skip
    assert r.returncode in (0, 1) and timings.is_file(), r.stderr[-2000:]
    r = cli("verify", "--op", "attention.decode_paged", "--entry", ENTRY, "--workload", str(path), "--device", "cpu",
            "--only", "dynamic", "--trace", str(good), "--timings", str(timings))  # fmt: skip
    assert r.returncode == 2 and "measure the Triton interpreter" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.gpu  # conftest skips it without a CUDA GPU
def test_a_workload_verified_and_timed_on_a_gpu_is_a_passed_trace_with_its_latency(fib, tmp_path):
    path = dataset(fib, tmp_path, [([1, 20], [5, 16]), ([9], [1])])
    timings, trace = tmp_path / "bench.json", tmp_path / "trace.jsonl"
    r = cli("bench", "--op", "attention.decode_paged", "--base", ENTRY, "--head", ENTRY, "--workload", str(path),
            "--device", "cuda", "--budget-s", "20", "--json", str(timings), "--quiet")  # fmt: skip
    assert r.returncode in (0, 1), r.stderr[-2000:]
    head_ms = {s["shape"]: s["head_ms"] for s in json.loads(timings.read_text())["shapes"] if s.get("head_ms")}
    r = cli("verify", "--op", "attention.decode_paged", "--entry", ENTRY, "--workload", str(path), "--device", "cuda",
            "--only", "dynamic", "--sanitizer", "off", "--trace", str(trace), "--timings", str(timings),
            "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    lines = read_trace(fib, trace)
    assert len(lines) == len(head_ms) > 0, r.stdout
    names = {f"workload-{i}-{t.workload.uuid[:8]}": t for i, t in enumerate(read_trace(fib, path))}
    for name, ms in head_ms.items():
        t = next(x for x in lines if x.workload.uuid == names[name].workload.uuid)
        assert t.evaluation.status == fib.trace.EvaluationStatus.PASSED and t.evaluation.performance.latency_ms == ms
        assert t.evaluation.correctness.max_absolute_error < 0.01  # float16 against the float64 reference


def test_bad_workload_input_is_one_line_and_exit_2(fib, tmp_path):
    path = dataset(fib, tmp_path / "ok", [([1], [3])])
    lonely = tmp_path / "lonely.jsonl"
    lonely.write_text(path.read_text())
    broken = path.parent / "broken.jsonl"
    broken.write_text("{not json\n")
    cases = [
        (["--workload", str(lonely)], "no definitions/ folder"),
        (["--workload", str(broken)], "line 1: not JSON"),
        (["--workload", str(tmp_path / "none.jsonl")], "no such file"),
        (["--workload", str(path), "--param", "block_size=1"], "but definition"),
        (["--workload", str(path), "--case", "{}"], "not with --case"),
        (["--trace", str(tmp_path / "t.jsonl")], "--trace: needs --workload"),
        (["--workload", str(path), "--trace", str(tmp_path / "no" / "such" / "t.jsonl")], "--trace: cannot write"),
        (["--workload", str(path), "--trace", str(tmp_path)], "--trace: cannot write"),
        (["--workload", str(path), "--timings", str(path)], "--timings: only with --trace"),
        (["--workload", str(path), "--trace", str(tmp_path / "t.jsonl"), "--timings", str(path)], "not a bench"),
    ]
    for extra, says in cases:
        r = cli("verify", "--op", "attention.decode_paged", "--entry", ENTRY, "--device", "cpu", *extra)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, (extra, r.stderr)
    r = cli("verify", "--op", "rope", "--entry", ENTRY, "--device", "cpu", "--workload", str(path))
    assert r.returncode == 2 and "is not a definition of op rope" in r.stderr
    r = cli("bench", "--op", "attention.decode_paged", "--base", ENTRY, "--head", ENTRY, "--device", "cpu",
            "--workload", str(path), "--param", "batch=4")  # fmt: skip
    assert r.returncode == 2 and "the workload gives the shapes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    prefill = json.loads(next((tmp_path / "ok" / "definitions").rglob("*.json")).read_text())
    prefill["inputs"]["qo_indptr"] = {"shape": ["len_indptr"], "dtype": "int32"}
    next((tmp_path / "ok" / "definitions").rglob("*.json")).write_text(json.dumps(prefill))
    with pytest.raises(UsageError, match="shares only paged decode attention"):
        workload.load(path)
