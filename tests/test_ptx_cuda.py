"""The PTX engine on CUDA C++ kernels, no GPU: the structural capture records a launch through
kernalin_ci.cuda.nvrtc (PTX compiled by NVRTC on the CPU, grid, block, typed arguments), the launch facts come
from it like a Triton kernel's, and the catalogue's CUDA kv_append is proved correct or caught."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("z3")
pytest.importorskip("cuda.bindings")

ROOT = Path(__file__).resolve().parents[1]
CUDA = ROOT / "checks" / "cuda"


def _nvrtc_or_skip():
    from kernalin_ci.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except Exception as e:  # no NVRTC library here
        pytest.skip(f"no NVRTC ({e})")


def test_a_cuda_kernel_is_captured_and_proved_for_every_shape_of_the_domain():
    _nvrtc_or_skip()
    os.environ["TRITON_INTERPRET"] = "0"
    from kernalin_ci.catalogue import read_meta
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.verify.structural.capture import capture_at, capture_cases
    from kernalin_ci.verify.structural.in_process import analyze_entry

    path = CUDA / "kv_append" / "correct_per_token.py"
    meta = read_meta(path)
    params = resolve_params(meta.op, get_op(meta.op).params, meta.params)
    fn = load_entry(f"{path}:entry", None)
    cap = capture_at(get_op(meta.op), fn, params, capture_cases(get_op(meta.op), params)[0])
    (la,) = cap.launches
    assert la.kernel == "kv_append16" and la.block == (128, 1, 1) and la.grid[0] == 5  # T = 5 tokens
    assert ".entry kv_append16" in la.ptx and ".entry kv_append32" not in la.ptx  # the launched kernel only
    assert la.path.endswith("kv_append.cu") and la.line > 0
    assert [a.tensor for a in la.args[:5]] == ["key", "value", "k_cache", "v_cache", "slot_mapping"]

    out = analyze_entry(meta.op, fn, params, str(ROOT), engine="ptx")
    assert out["status"]["status"] == "analysed" and not out["findings"], out
    assert "kv_append16: store to k_cache writes key of the token owning the slot" in out["proved"]
    assert len(out["proved"]) == 7  # slot, key, value loads; both stores in bounds; both caches' contract


def test_verify_engine_ptx_catches_a_cuda_bug_on_the_cpu_with_a_counterexample():
    _nvrtc_or_skip()
    from kernalin_ci.cuda.sources import CudaSpec
    from kernalin_ci.verify import verify

    path = CUDA / "kv_append" / "bug_padding_not_skipped.py"
    spec = CudaSpec.from_json({"sources": ["kv_append/kv_append.cu"], "flags": ["-Icommon"]})
    r = verify(
        "kv_append",
        f"{path}:entry",
        {},
        "cpu",
        only="structural",
        engine="ptx",
        progress=False,
        cuda=spec,
        root=str(CUDA),
    )
    assert r.structural.status == "analysed"
    assert any(p.endswith("load from key in bounds") for p in r.structural.proved), r.structural  # listed, as TTIR's
    padding = [f for f in r.findings if f.bug_class == "kv-padding"]
    assert padding and all(f.check.startswith("structural:ptx-") for f in padding)
    f = padding[0]
    assert re.search(r"slot_mapping\[\d+\]=-1", f.message)  # the counterexample: a padding token
    assert f.location.path.endswith("kv_append.cu")  # the CUDA source line, from the PTX's line info
    assert "not replayed (a CUDA C++ kernel runs only on a GPU)" in f.message


def _cuda_launch(rel: str):
    """(PTX, facts, contract) of a CUDA catalogue kernel's launch, as the structural worker makes them."""
    import json
    from dataclasses import replace

    from kernalin_ci.catalogue import read_meta
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.ptx.syntax import parse
    from kernalin_ci.verify.structural.capture import capture_at, capture_cases
    from kernalin_ci.verify.structural.ptx_facts import build

    meta = read_meta(CUDA / rel)
    op = get_op(meta.op)
    params = resolve_params(meta.op, op.params, meta.params)
    fn = load_entry(f"{CUDA / rel}:entry", None)
    case = capture_cases(op, params)[0]
    os.environ["KERNALIN_PARAMS"] = json.dumps(params)
    try:
        cap = capture_at(op, fn, params, case)
        other = capture_at(op, fn, params, replace(case, dims=op.capture_twin(case.dims)))
    finally:
        del os.environ["KERNALIN_PARAMS"]
    twin = {
        "tensors": {n: [list(t.shape), list(t.strides)] for n, t in other.tensors.items()},
        "launches": [
            {"kernel": la.kernel, "grid": list(la.grid), "args": {a.name: a.value for a in la.args if a.kind == "int"}}
            for la in other.launches
        ],
    }
    (la,) = cap.launches
    facts, contract = build(op, params, cap, la, twin, len(parse(la.ptx).params), None)
    return la.ptx, facts, contract


@pytest.mark.parametrize(
    "rel, cls",
    [
        ("attention_decode_paged/correct_online_smem.py", None),
        ("attention_decode_paged/bug_softmax_no_max.py", "softmax-no-max"),
        ("attention_decode_paged/bug_online_no_rescale.py", "online-rescale"),
    ],
)
def test_the_softmax_of_a_cuda_kernel_is_followed_through_its_shared_memory(rel, cls):
    """The CUDA attention's scores go through shared memory at addresses that depend on a loop over the
    runtime head dim (`sm.kv[e / D][e % D]`, `sm.scores[j]`): the engine executes it (shared.py), reads the
    max over the scores and each exponential of the same score (one term per address between stores), CUDA's
    expf (range reduction, 2^n) and the rescale `m == -inf ? 0 : expf(m - m_new)`. The scale is not proved
    (the q.k products are in the tile's shared memory), never passed."""
    _nvrtc_or_skip()
    from kernalin_ci.ptx import softmax, terms
    from kernalin_ci.ptx.context import Context
    from kernalin_ci.ptx.executor import execute
    from kernalin_ci.ptx.syntax import parse

    text, facts, contract = _cuda_launch(rel)
    terms.reset()
    symbols = {f"ctaid.{x}": terms.sym(f"ctaid.{x}", 32) for x in "xyz"}
    symbols |= {name: terms.sym(name, 64) for name in facts.symbols}
    trace = execute(parse(text), facts, symbols)
    results = {r.name: r for r in softmax.check(trace, Context(facts, contract, trace, symbols))}
    violated = {r.bug_class for r in results.values() if r.status == "violated"}
    assert violated == ({cls} if cls else set()), [(r.name, r.status, r.cause) for r in results.values()]
    if cls is None:
        assert {n for n, r in results.items() if r.status == "proved"} == {
            "every exponential is exp(s - m) with m a max over s",
            "every accumulation of exponentials is rescaled when the running max changes",
            "the output is divided by a sum of the exponentials",
        }
        assert results["the scale multiplies q.k once"].status == "not-proved"


QUEUE = """
extern "C" __global__ void queue_copy(const float* q, float* out, int* next, int B) {
    __shared__ int item;
    for (;;) {
        if (threadIdx.x == 0) item = atomicAdd(next, 1) + SKIP;
        __syncthreads();
        const int b = item;
        __syncthreads();
        if (b >= B) return;
        out[b * 128 + threadIdx.x] = q[b * 128 + threadIdx.x];
    }
}
"""


@pytest.mark.parametrize("skip", [0, 1])
def test_a_persistent_work_queue_covers_every_sequence_or_names_the_one_it_skips(tmp_path, skip):
    """atomicAdd's takes of a zeroed counter: the loop over them is followed for every grid G, its accesses
    proved in bounds, and kv-coverage proved, or violated at sequence 0 when the item is the take plus 1."""
    _nvrtc_or_skip()
    from kernalin_ci.cuda import nvrtc
    from kernalin_ci.ptx import analyse, decode_step
    from kernalin_ci.ptx import terms as T
    from kernalin_ci.ptx.context import Context, Contract
    from kernalin_ci.ptx.executor import execute
    from kernalin_ci.ptx.facts import Expr, LaunchFacts, ParamFacts, ShapeSymbol, TensorFacts
    from kernalin_ci.ptx.syntax import parse

    src = tmp_path / "queue.cu"
    src.write_text(QUEUE)
    ptx = nvrtc.compile_source(src, "compute_90", ["-lineinfo", f"-DSKIP={skip}"]).rstrip(b"\0").decode()
    assert "atom.global.add" in ptx
    B = Expr.of("B")

    def rows(name):
        return TensorFacts(name, "float32", 4, (B, Expr.of(128)), (Expr.of(128), Expr.of(1)))

    counter = TensorFacts("next", "int32", 4, (Expr.of(1),), (Expr.of(1),), role="scratch", initial=0)
    facts = LaunchFacts(
        "queue_copy",
        [ParamFacts("pointer", t) for t in ("q", "out", "next")] + [ParamFacts("int", value=B)],
        (Expr.of("G"), Expr.of(1), Expr.of(1)),
        {"q": rows("q"), "out": rows("out"), "next": counter},
        {"B": ShapeSymbol("B", 1, 4096, 3), "G": ShapeSymbol("G", 1, (1 << 31) - 1, 3)},
        block_threads=128,
    )
    contract = Contract("decode_step", query="q")
    out = analyse(ptx, facts, contract)
    assert out.not_analysed is None
    assert {r.name: r.status for r in out.results} == {
        "load from q in bounds": "proved",
        "store to out in bounds": "proved",
        "store to next in bounds": "proved",  # the atomic's write to its counter
        # thread 0 writes `item`, every thread reads it after a barrier, the next write after another (races.py)
        "shared memory: no two threads touch the same bytes between barriers (one writing)": "proved",
    }
    kernel = parse(ptx)
    symbols = {f"ctaid.{x}": T.sym(f"ctaid.{x}", 32) for x in "xyz"} | {n: T.sym(n, 64) for n in facts.symbols}
    trace = execute(kernel, facts, symbols)
    (cov,) = decode_step.queue_coverage(trace, Context(facts, contract, trace, symbols))
    if not skip:
        assert cov.status == "proved", cov
    else:
        assert cov.status == "violated" and cov.bug_class == "kv-coverage", cov
        assert cov.counterexample["sequence"] == 0 and "sequence 0 is never processed" in cov.cause


def test_an_entry_asking_the_device_gets_the_target_and_its_grid_is_a_symbol(monkeypatch):
    """The CUDA fused step sizes its persistent grid from multi_processor_count: the capture answers with the
    sm_90 target's properties, and the launch's grid is the symbol G (proved for every grid)."""
    _nvrtc_or_skip()
    os.environ["TRITON_INTERPRET"] = "0"
    from kernalin_ci.catalogue import read_meta
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.ptx.syntax import parse
    from kernalin_ci.verify.structural import ptx_facts
    from kernalin_ci.verify.structural.capture import DEVICE, capture_at, capture_cases

    path = CUDA / "decode_step" / "correct_persistent_queue.py"
    meta = read_meta(path)
    op = get_op(meta.op)
    params = resolve_params(meta.op, op.params, meta.params)
    monkeypatch.setenv("KERNALIN_PARAMS", json.dumps(params))  # the entry reads current_params()
    cap = capture_at(op, load_entry(f"{path}:entry", None), params, capture_cases(op, params)[0])
    (la,) = cap.launches
    assert la.device_query and la.grid[0] == min(3, 4 * DEVICE.multi_processor_count)  # B = 3 at capture
    assert "atom.global.add" in la.ptx
    facts, _ = ptx_facts.build(op, params, cap, la, None, len(parse(la.ptx).params), None)
    assert str(facts.grid[0]) == "G" and "G in [1, 2147483647]" in facts.domain_text()
    assert [t.initial for t in facts.tensors.values() if t.role == "scratch"] == [0]  # the zeroed queue head


_TILES = """
.version 8.0
.target sm_90
.address_size 64
.shared .align 4 .b8 buf[1024];
.visible .entry tiles(
  .param .u64 out,
  .param .u32 n
)
.maxntid 128, 1, 1
{
  .reg .pred %p<3>;
  .reg .b32 %r<20>;
  .reg .b64 %rd<4>;
  mov.u32 %r1, %tid.x;
  shl.b32 %r2, %r1, 2;
  mov.u32 %r3, buf;
  add.s32 %r4, %r3, %r2;
  xor.b32 %r5, %r1, 32;
  shl.b32 %r6, %r5, 2;
  add.s32 %r7, %r3, %r6;
  ld.param.u32 %r8, [n];
  mov.u32 %r9, 0;
  mov.u32 %r10, 0;
$L_tile:
  st.shared.u32 [%r4], %r9;
  STORED
  ld.shared.u32 %r11, [%r7];
  add.s32 %r10, %r10, %r11;
  READ
  add.s32 %r9, %r9, 1;
  setp.lt.u32 %p1, %r9, %r8;
  @%p1 bra $L_tile;
  ld.param.u64 %rd1, [out];
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd2, %rd2, %rd3;
  st.global.u32 [%rd2], %r10;
  ret;
}
"""


@pytest.mark.parametrize(
    "stored, read, race",
    [
        ("bar.sync 0;", "bar.sync 0;", None),
        ("", "bar.sync 0;", "same"),  # thread t reads t ^ 32's element before it is written
        ("bar.sync 0;", "", "next"),  # ... while t ^ 32, a tile ahead, overwrites it (write after read)
        ("bar.warp.sync -1;", "bar.sync 0;", "same"),  # a warp's barrier does not order another warp
    ],
)
def test_a_shared_memory_race_between_threads_is_found_within_and_across_loop_iterations(stored, read, race):
    """Each tile every thread writes its element of a shared buffer and reads the element of thread t ^ 32
    (another warp): a barrier between the write and the read, and one before the next tile's write, make it
    race-free (proved for every tile count N); without the first, or with only a warp's barrier, t reads before
    t ^ 32 wrote (the same iteration); without the second, t ^ 32's next write lands before t read (iteration k
    against k + 1). The counterexample names both threads and both accesses."""
    from kernalin_ci.ptx import analyse
    from kernalin_ci.ptx.context import Contract
    from kernalin_ci.ptx.facts import Expr, LaunchFacts, ParamFacts, ShapeSymbol, TensorFacts

    out = TensorFacts("out", "int32", 4, (Expr.of(128),), (Expr.of(1),), role="output")
    params = [ParamFacts("pointer", "out"), ParamFacts("int", value=Expr.of("N"))]
    facts = LaunchFacts(
        "tiles", params, (Expr.of(1),) * 3, {"out": out}, {"N": ShapeSymbol("N", 1, 64, 3)}, block_threads=128
    )
    text = _TILES.replace("STORED", stored).replace("READ", read)
    res = analyse(text, facts, Contract("x"))
    assert res.not_analysed is None, res.not_analysed
    (r,) = [r for r in res.results if r.name.startswith("shared memory")]
    if race is None:
        assert r.status == "proved", r.cause
        return
    assert (r.status, r.bug_class) == ("violated", "shared-race"), r.cause
    a, b = (int(x) for x in r.counterexample["__threads"].split(","))
    assert a ^ b == 32 and r.where.opcode == "st" and "reads shared byte" in r.cause, r.cause
    assert ("one iteration" in r.cause) == (race == "next"), r.cause


def test_the_catalogue_of_a_relative_directory_proves_a_cuda_kernel(monkeypatch):
    """`catalogue --dir` named relative to the current directory: a CUDA kernel's entry is still found (it was read
    relative to its root a second time: 'file not found: checks/cuda/checks/cuda/...'), and its proofs list."""
    _nvrtc_or_skip()
    from kernalin_ci import catalogue as cat

    monkeypatch.chdir(ROOT)
    kernel = next(k for k in cat.discover(Path("checks"), ["kv_append"]) if k.cuda and not k.is_bug)
    cell = cat.run_one(kernel, "ptx", "cpu")
    assert cell.error is None and not cell.caught, cell


def test_threads_at_constant_addresses_no_other_thread_touches_need_no_race_query(monkeypatch):
    """Each thread reads back only its own element, with no barrier at all: race-free, and since every shared
    address is a constant of its thread (Triton's layout conversions are such) and no byte is touched by two
    threads, decided without asking the solver (races.py: this took most of a fused step's analysis time)."""
    from kernalin_ci.ptx import analyse, races
    from kernalin_ci.ptx.context import Contract
    from kernalin_ci.ptx.facts import Expr, LaunchFacts, ParamFacts, ShapeSymbol, TensorFacts

    asked = []
    monkeypatch.setattr(races, "_ask", lambda *a, **k: asked.append(a) or pytest.fail("a race query was asked"))
    out = TensorFacts("out", "int32", 4, (Expr.of(128),), (Expr.of(1),), role="output")
    params = [ParamFacts("pointer", "out"), ParamFacts("int", value=Expr.of("N"))]
    facts = LaunchFacts(
        "tiles", params, (Expr.of(1),) * 3, {"out": out}, {"N": ShapeSymbol("N", 1, 64, 3)}, block_threads=128
    )
    text = _TILES.replace("xor.b32 %r5, %r1, 32;", "xor.b32 %r5, %r1, 0;").replace("STORED", "").replace("READ", "")
    res = analyse(text, facts, Contract("x"))
    (r,) = [r for r in res.results if r.name.startswith("shared memory")]
    assert r.status == "proved" and not asked, r.cause
