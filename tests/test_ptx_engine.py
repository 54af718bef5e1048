"""The PTX engine (kernalin_ci/ptx) on real Triton PTX compiled here for sm_90, no GPU: the parser, the
solver's exact arithmetic, and the properties proved or violated with a counterexample."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from kernalin_ci.ops import get_op

pytest.importorskip("z3")

ROOT = Path(__file__).resolve().parents[1]


# Captures, PTX texts and analyses are computed once per module (functools.cache) and shared by the tests that
# read the same kernel: the suite's time is the engine's, not repeated compilation.


@functools.cache
def _capture(path: str, name: str = "entry"):
    """(op name, params, capture, twin) of a catalogue kernel, as the structural worker makes them."""
    os.environ["TRITON_INTERPRET"] = "0"
    from kernalin_ci.catalogue import read_meta
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.verify.structural.capture import capture_at, capture_cases

    meta = read_meta(ROOT / path)
    op = get_op(meta.op)
    params = resolve_params(meta.op, op.params, meta.params)
    fn = load_entry(f"{ROOT / path}:{name}", None)
    case = capture_cases(op, params)[0]
    before = os.environ.get("KERNALIN_PARAMS")
    os.environ["KERNALIN_PARAMS"] = json.dumps(params)  # what the worker gives the entry (current_params())
    try:
        cap = capture_at(op, fn, params, case)
        other = capture_at(op, fn, params, replace(case, dims=op.capture_twin(case.dims)))
    finally:
        if before is None:
            del os.environ["KERNALIN_PARAMS"]
        else:
            os.environ["KERNALIN_PARAMS"] = before
    twin = {
        "tensors": {n: [list(t.shape), list(t.strides)] for n, t in other.tensors.items()},
        "launches": [
            {"kernel": la.kernel, "grid": list(la.grid), "args": {a.name: a.value for a in la.args if a.kind == "int"}}
            for la in other.launches
        ],
    }
    return meta.op, params, cap, twin


@functools.cache
def _launch(path: str, index: int = 0, name: str = "entry"):
    """(PTX text, facts, contract) of a launch (the first by default) of a catalogue kernel."""
    from kernalin_ci.ptx.syntax import parse
    from kernalin_ci.verify.structural.compile import ptx
    from kernalin_ci.verify.structural.ptx_facts import build

    op_name, params, cap, twin = _capture(path, name)
    la = cap.launches[index]
    text = la.ptx or ptx(la)  # a CUDA C++ kernel's is NVRTC's, recorded at its launch
    facts, contract = build(get_op(op_name), params, cap, la, twin, len(parse(text).params), None)
    return text, facts, contract


@functools.cache
def _analyse(path: str):
    from kernalin_ci import ptx as engine

    text, facts, contract = _launch(path)
    return engine.analyse(text, facts, contract), facts


def test_the_parser_reads_a_triton_kernel_with_its_parameters_guards_and_lines():
    from kernalin_ci.ptx.syntax import Mem, parse

    k = parse(_launch("checks/kv_append/correct_per_token.py")[0])
    assert k.name == "_kv_append_token_kernel" and k.threads == 128
    # 5 pointers and 12 integers of the launch, then Triton's two scratch pointers
    assert [p.type for p in k.params[:6]] == ["u64"] * 5 + ["u32"] and len(k.params) == 19
    stores = [i for i in k.instrs if i.opcode == "st"]
    assert len(stores) == 2 and all(i.guard is not None and isinstance(i.operands[0], Mem) for i in stores)
    assert {i.line for i in stores} == {43, 44} and stores[0].file.endswith("correct_per_token.py")
    assert any(i.opcode == "bra" and i.guard == ("%p1", True) for i in k.instrs)  # `if slot < 0: return`


def test_the_solver_computes_modulo_the_register_width():
    """96 * x wraps in 32 bits: it is below 2^31 for every x < 2^20 only because x is small."""
    from kernalin_ci.ptx import solver
    from kernalin_ci.ptx import terms as T

    x = T.sym("x", 32)
    prod = T.bv("mul", x, T.const(96, 32))
    small = T.cmp("ult", x, T.const(1 << 20, 32))
    q = solver.Query()
    q.add(small, T.cmp("slt", prod, T.const(0, 32)))
    assert q.check().status == "unsat"
    q = solver.Query()
    q.add(T.cmp("slt", prod, T.const(0, 32)))
    ans = q.check()
    assert ans.status == "sat" and (ans.model["x"] * 96) & 0x80000000


def test_a_remainder_spelled_with_a_division_is_a_remainder_and_shares_its_quotient():
    """nvcc writes e % D as e - (e / D) * D: the intervals read it as urem (in [0, D - 1]), and the quotient
    of x / 48 is one witness wherever it appears (a signed division of a non-negative x included), so
    x == 48 * (x / 48) + x % 48 is proved at once."""
    from kernalin_ci.ptx import solver
    from kernalin_ci.ptx import terms as T

    x, c = T.sym("x", 32), T.const(48, 32)
    rem = T.bv("sub", x, T.bv("mul", T.bv("sdiv", x, c), c))
    iv = solver.Intervals({"x": (0, 100_000)})
    simple = iv.simplify(rem)
    assert simple.op == "urem" and iv.span(simple) == (0, 47)
    q = solver.Query({"x": (0, 100_000)})
    whole = T.bv("add", T.bv("mul", T.bv("udiv", x, c), c), simple)
    q.add(T.not_(T.cmp("eq", whole, x)))
    assert q.check().status == "unsat"


def test_a_remainder_by_a_runtime_size_is_below_it_and_the_dividend_below_it_is_itself():
    """LMDeploy's rope indexes its tables with `pos % seq_len`, seq_len a kernel argument (signed, as Triton
    emits it): the remainder is below seq_len (a load of row pos % seq_len of a seq_len-row table is in bounds),
    it is pos itself where pos < seq_len, and nothing more is claimed: a model of it is no counterexample."""
    from kernalin_ci.ptx import solver
    from kernalin_ci.ptx import terms as T

    pos, n = T.sym("pos", 32), T.sym("n", 32)
    bounds = {"pos": (0, 1 << 20), "n": (1, 1 << 16)}
    for op in ("srem", "urem"):
        rem = T.bv(op, pos, n)
        assert solver.Intervals(bounds).span(rem) == (0, (1 << 16) - 1)
        q = solver.Query(bounds)
        q.add(T.not_(T.cmp("ult", rem, n)))
        assert q.check().status == "unsat"
        q = solver.Query(bounds)
        q.add(T.cmp("ult", pos, n), T.not_(T.cmp("eq", rem, pos)))
        assert q.check().status == "unsat"
        q = solver.Query(bounds)
        q.add(T.cmp("eq", rem, T.const(5, 32)))  # true of some pos and n; the answer says it is approximated
        ans = q.check()
        assert ans.status == "sat" and ans.approximated == (op,)
    neg = T.bv("srem", T.bv("sub", T.const(0, 32), pos), n)  # of a negative dividend: never positive
    q = solver.Query(bounds)
    q.add(T.cmp("slt", T.const(0, 32), neg))
    assert q.check().status == "unsat"


def test_an_or_of_bits_no_operand_shares_is_their_sum():
    """Triton writes pid * 4 + (tid >> 3) % 4 as `shl` then `or`: no bit can be 1 in both, so the or is the sum
    (exact, proved below 4 * P); with bits both can set (tid | 2) it stays an operation not modelled exactly,
    and a model through it is no counterexample."""
    from kernalin_ci.ptx import solver
    from kernalin_ci.ptx import terms as T

    pid, tid, P = T.sym("pid", 32), T.sym("tid", 32), T.sym("P", 32)
    lane = T.bv("and", T.bv("lshr", tid, T.const(3, 32)), T.const(3, 32))
    row = T.bv("or", lane, T.bv("shl", pid, T.const(2, 32)))
    bounds = {"pid": (0, 1000), "tid": (0, 127), "P": (1, 1001)}
    q = solver.Query(bounds)
    q.add(T.cmp("ult", pid, P), T.not_(T.cmp("ult", row, T.bv("mul", P, T.const(4, 32)))))
    assert q.check().status == "unsat"
    q = solver.Query(bounds)
    q.add(T.cmp("ult", T.const(127, 32), T.bv("or", tid, T.const(2, 32))))
    ans = q.check()
    assert ans.status == "sat" and ans.approximated == ("or",)


def test_queries_sharing_a_translator_each_assert_the_witnesses_their_terms_use():
    """A context's queries share one translation: x % 16 reuses the quotient witness that x / 16 made in
    an earlier query, and a later query with only x % 16 still bounds it (else x % 16 > 15 would be sat).
    A model names only the query's own symbols."""
    from kernalin_ci.ptx import solver
    from kernalin_ci.ptx import terms as T

    tr = solver.Translator({"x": (0, 1000), "y": (0, 7)})
    x, y, c = T.sym("x", 64), T.sym("y", 64), T.const(16, 64)
    first = solver.Query(translator=tr)
    first.add(T.cmp("eq", T.bv("udiv", x, c), T.bv("add", y, T.const(3, 64))))
    assert first.check().status == "sat"
    second = solver.Query(translator=tr)
    second.add(T.cmp("ult", T.const(15, 64), T.bv("urem", x, c)))
    assert second.check().status == "unsat"
    third = solver.Query(translator=tr)
    third.add(T.cmp("ult", T.const(990, 64), x))
    ans = third.check()
    assert ans.status == "sat" and set(ans.model) == {"x"} and ans.model["x"] <= 1000


def test_the_solver_keeps_wraps_only_where_a_declared_range_allows_them():
    """Address arithmetic within the symbols' declared ranges gets no wrap witness (the solver's case
    splits); beyond them the wrap is still exact: 96 * x + y wraps in 32 bits for a large x."""
    from kernalin_ci.ptx import solver
    from kernalin_ci.ptx import terms as T

    x, y = T.sym("x", 32), T.sym("y", 32)
    addr = T.bv("add", T.bv("mul", x, T.const(96, 32)), y)
    negative = T.cmp("slt", addr, T.const(0, 32))
    q = solver.Query({"x": (0, (1 << 20) - 1), "y": (0, 95)})
    q.add(negative)
    assert q.check().status == "unsat"
    assert not re.search(r"\bo\d+\b", q.solver.sexpr())  # no wrap witness (o<n>) at all
    q = solver.Query({"y": (0, 95)})
    q.add(negative)
    ans = q.check()
    assert ans.status == "sat" and (ans.model["x"] * 96 + ans.model["y"]) & 0x80000000


def _exprs(xs: tuple) -> tuple:
    from kernalin_ci.ptx.facts import Expr

    return tuple(Expr.of(x) for x in xs)


def _frame(tensors: dict, symbols: dict):
    """A Context over plain facts and no trace: what the query builders see."""
    from kernalin_ci.ptx import terms as T
    from kernalin_ci.ptx.context import Context, Contract
    from kernalin_ci.ptx.executor import PtxTrace
    from kernalin_ci.ptx.facts import Expr, LaunchFacts, ShapeSymbol, TensorFacts

    facts = LaunchFacts(
        "k",
        [],
        (Expr.of("B"), Expr.of(1), Expr.of(1)),
        {n: TensorFacts(n, "float16", 2, _exprs(a), _exprs(b)) for n, (a, b) in tensors.items()},
        {n: ShapeSymbol(n, lo, hi, lo) for n, (lo, hi) in symbols.items()},
    )
    syms = {f"ctaid.{x}": T.sym(f"ctaid.{x}", 32) for x in "xyz"} | {n: T.sym(n, 64) for n in symbols}
    trace = PtxTrace(None, 1, [], {}, [], syms)  # type: ignore[arg-type]
    return Context(facts, Contract("attention.decode"), trace, syms), syms


def test_an_offset_is_decoded_from_its_linear_form_and_a_lane_past_its_row_stays_exact():
    """k[B, 2, 48]: the offset 2 * (96 b + 48 h + d) gives the coordinates (b, h, d) as terms, no symbols for
    the solver to find. A dim d in [0, 63] (a padded tile) is not shown below 48: then the coordinates are
    symbols with the lemma "(b, h, d) when d < 48", the same models as the plain decomposition, so d = 50
    still lands in the next head, and from the last head in the next row."""
    from kernalin_ci.ptx import terms as T
    from kernalin_ci.ptx.context import decode

    ctx, syms = _frame({"k": (("B", 2, 48), (96, 48, 1))}, {"B": (1, 4096), "D": (0, 63)})
    b, d = T.zext(syms["ctaid.x"], 64), syms["D"]
    info = ctx.facts.tensors["k"]

    def off(h: int, d: T.Term) -> T.Term:
        flat = T.bv("add", T.bv("add", T.bv("mul", b, T.const(96, 64)), T.const(48 * h, 64)), d)
        return T.bv("mul", flat, T.const(2, 64))

    coords, _ = decode(ctx, info, off(1, T.const(5, 64)), "t")
    assert coords[0] is b and [T.value(c) for c in coords[1:]] == [1, 5]
    for h, want in ((0, (b, T.const(1, 64))), (1, (T.bv("add", b, T.const(1, 64)), T.const(0, 64)))):
        coords, ok = decode(ctx, info, off(h, d), "t")
        assert coords[0].op == "sym"
        at50 = T.cmp("eq", d, T.const(50, 64))
        right = T.and_(*(T.cmp("eq", c, w) for c, w in zip(coords, (*want, T.const(2, 64)))))
        assert ctx.ask(T.and_(ok, at50, T.not_(right))).status == "unsat"
        assert ctx.ask(T.and_(ok, at50, right)).status == "sat"
        # and where d < 48 the coordinates are (b, h, d)
        plain = T.and_(T.cmp("eq", coords[0], b), T.cmp("eq", coords[1], T.const(h, 64)), T.cmp("eq", coords[2], d))
        assert ctx.ask(T.and_(ok, T.cmp("ult", d, T.const(48, 64)), T.not_(plain))).status == "unsat"


def test_signed_idioms_of_non_negative_values_become_unsigned_and_sizes_bound_the_symbols():
    """Compilers divide by 16 as `(x + (x >> 31 >>> 28)) >> 4`: for x known non-negative that is x / 16 and
    `x - (x & -16)` is x % 16; for x of any sign nothing changes. The frame's tensor sizes bound the shape
    symbols: 12582912 * B elements under 2^31 keeps B <= 170, and the block index below it."""
    from kernalin_ci.ptx import solver
    from kernalin_ci.ptx import terms as T

    x = T.sym("x", 32)
    bias = T.bv("lshr", T.bv("ashr", x, T.const(31, 32)), T.const(28, 32))
    q = T.bv("ashr", T.bv("add", x, bias), T.const(4, 32))
    r = T.mk("sub", (x, T.bv("and", T.bv("add", x, bias), T.const(-16, 32))), "bv", 32)
    small = solver.Intervals({"x": (0, 1 << 20)})
    assert small.simplify(q) is T.bv("lshr", x, T.const(4, 32))
    assert small.simplify(r) is T.bv("and", x, T.const(15, 32))
    assert solver.Intervals({}).simplify(q) is q

    ctx, _ = _frame({"k": (("B", 2, 131072, 48), (12582912, 6291456, 48, 1))}, {"B": (1, 4096)})
    assert ctx.bounds["B"] == (1, 170) and ctx.bounds["ctaid.x"] == (0, 169)


_MOV_PRED = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<3>;
	mov.pred 	%p1, -1;
	mov.pred 	%p2, 0;
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, 7;
	@%p1 st.global.b32 	[%rd1], %r1;
	@%p2 st.global.b32 	[%rd1+4], %r1;
	ret;
}
"""


def test_an_immediate_predicate_is_a_boolean():
    """`mov.pred %p1, -1` (Triton emits it: rope/bug_mrope_section_boundary): the store it guards always
    runs and is proved in bounds; the one under `mov.pred %p2, 0` never runs (it would be out of bounds)."""
    from kernalin_ci import ptx as engine
    from kernalin_ci.ptx.facts import Expr, LaunchFacts, ParamFacts, TensorFacts

    one = (Expr.of(1),)
    facts = LaunchFacts(
        "k",
        [ParamFacts("pointer", tensor="out")],
        (Expr.of(1), Expr.of(1), Expr.of(1)),
        {"out": TensorFacts("out", "int32", 4, one, one, role="output")},
        {},
        block_threads=1,
    )
    out = engine.analyse(_MOV_PRED, facts, engine.Contract("custom"))
    assert out.not_analysed is None
    assert [(r.name, r.status) for r in out.results] == [("store to out in bounds", "proved")]


_LDMATRIX = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(
	.param .u64 k_param_0
)
.reqntid 32, 1, 1
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<20>;
	.reg .b64 	%rd<5>;
	.shared .align 16 .b8 smem[1024];
	mov.u32 	%r1, %tid.x;
	shl.b32 	%r2, %r1, 2;
	add.s32 	%r3, %r2, 1;
	add.s32 	%r4, %r2, 2;
	add.s32 	%r5, %r2, 3;
	shl.b32 	%r6, %r1, 4;
	st.shared.v4.b32 	[%r6], {%r2, %r3, %r4, %r5};
	bar.sync 	0;
	ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r7, %r8, %r9, %r10}, [%r6];
	ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%r11}, [%r6];
	add.s32 	%r12, %r6, 512;
	stmatrix.sync.aligned.m8n8.x4.shared.b16 [%r12], {%r7, %r8, %r9, %r10};
	ld.shared.v4.b32 	{%r13, %r14, %r15, %r16}, [%r12];
	ld.param.u64 	%rd1, [k_param_0];
	mul.wide.u32 	%rd2, %r1, 16;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.v4.b32 	[%rd3], {%r8, %r11, %r13, %r16};
	ret;
}
"""


def test_ldmatrix_and_stmatrix_move_each_lanes_words_exactly():
    """The layout conversions Triton compiles through shared memory (`ldmatrix`/`stmatrix` .m8n8, no mma):
    lane t's register i holds row t // 4 of tile i, word t % 4 (with .trans, its 16-bit halves come from
    rows 2 (t % 4) and 2 (t % 4) + 1, column t // 4); stmatrix is the inverse, so a round trip is the
    identity. Shared word w holds 2w .. 2w + 1 as 16-bit halves here (word w = w, little-endian)."""
    from kernalin_ci.ptx import terms as T
    from kernalin_ci.ptx.executor import execute
    from kernalin_ci.ptx.facts import Expr, LaunchFacts, ParamFacts, TensorFacts
    from kernalin_ci.ptx.syntax import parse

    n = (Expr.of(128),)
    facts = LaunchFacts(
        "k",
        [ParamFacts("pointer", tensor="out")],
        (Expr.of(1), Expr.of(1), Expr.of(1)),
        {"out": TensorFacts("out", "int32", 4, n, (Expr.of(1),), role="output")},
        {},
        block_threads=32,
    )
    T.reset()
    trace = execute(parse(_LDMATRIX), facts, {f"ctaid.{x}": T.sym(f"ctaid.{x}", 32) for x in "xyz"})
    got = {(a.lane, T.value(a.offset) // 4 % 4): a.value for a in trace.accesses if a.kind == "st"}
    for t in range(32):
        assert got[(t, 0)] is T.const(4 * (8 + t // 4) + t % 4, 32)  # x4: tile 1, row t // 4, word t % 4
        lo, hi = (4 * (2 * (t % 4) + h) + t // 8 for h in (0, 1))  # .trans: the words holding column t // 4
        halves = [(w >> (16 * (t // 4 % 2))) & 0xFFFF for w in (lo, hi)]  # the 16-bit half of that column
        assert T.value(got[(t, 1)]) == halves[0] | halves[1] << 16
        assert got[(t, 2)] is T.const(4 * t, 32) and got[(t, 3)] is T.const(4 * t + 3, 32)  # stmatrix: back


def test_a_correct_kv_append_is_proved_for_every_shape_of_the_domain():
    out, facts = _analyse("checks/kv_append/correct_per_token.py")
    assert out.not_analysed is None
    assert {r.status for r in out.results} == {"proved"}, [(r.name, r.status, r.cause) for r in out.results]
    names = {r.name for r in out.results}
    assert "store to k_cache writes key of the token owning the slot" in names
    assert "store to v_cache in bounds" in names
    assert set(facts.symbols) == {"T", "NB"}  # the batch and the cache are symbols, not the capture's sizes


@pytest.mark.parametrize(
    "path, cls, slot",
    [
        ("checks/kv_append/bug_padding_not_skipped.py", "kv-padding", -1),
        ("checks/kv_append/bug_value_from_key.py", "kv-source", None),
        ("checks/kv_append/bug_offset_int32.py", "offset-overflow", None),
    ],
)
def test_a_kv_append_bug_is_a_violation_with_a_counterexample(path, cls, slot):
    out, _ = _analyse(path)
    violated = [r for r in out.results if r.status == "violated"]
    assert cls in {r.bug_class for r in violated}
    if slot is not None:
        r = next(r for r in violated if r.bug_class == cls)
        assert any(k.startswith("slot_mapping[") and v == slot for k, v in r.counterexample.items())


def test_verify_engine_ptx_runs_the_engine_in_the_structural_worker():
    from kernalin_ci.verify import verify

    r = verify(
        "kv_append",
        str(ROOT / "checks/kv_append/bug_padding_not_skipped.py") + ":entry",
        {},
        "cpu",
        only="structural",
        engine="ptx",
        progress=False,
    )
    assert r.structural.status == "analysed"
    assert {f.bug_class for f in r.findings} == {"kv-padding", "stray-write"}
    assert all(f.check.startswith("structural:ptx-") and "slot_mapping[" in f.message for f in r.findings)
    # each counterexample is an op case at the capture shape (the padding slot where the model put it),
    # replayed through the dynamic checker: the kernel fails there too
    for f in r.findings:
        slot = int(re.search(r"slot_mapping\[(\d+)\]=-1", f.message).group(1))
        assert f.case["dims"]["slots"][slot] == -1 and f.case["dims"]["T"] == 5
        assert re.search(r"replayed: fails dynamically at case ptx-counterexample-\d+ \(kv-padding", f.message)
        assert "--case" in f.reproduce


@pytest.mark.parametrize(
    "path, cls",
    [
        ("checks/attention_decode/correct_online_softmax.py", None),
        ("checks/attention_decode/bug_softmax_no_max.py", "softmax-no-max"),
        ("checks/attention_decode/bug_online_no_rescale.py", "online-rescale"),
        ("checks/attention_decode/bug_softmax_no_normalize.py", "softmax-no-normalize"),
        ("checks/attention_decode/bug_scale_after_max.py", "scale"),
    ],
)
def test_the_softmax_is_read_from_the_float_dataflow_of_the_ptx(path, cls):
    """The softmax properties alone (the K/V reads: test_paged_kv_reads_are_proved_through_the_block_table)."""
    from dataclasses import replace as dc_replace

    from kernalin_ci import ptx as engine

    text, facts, contract = _launch(path)
    out = engine.analyse(text, facts, dc_replace(contract, query=""))
    soft = [r for r in out.results if r.name.startswith(("every exponential", "every accumulation", "the output is"))]
    assert soft and all(r.status != "not-proved" for r in soft)
    found = {r.bug_class for r in soft if r.status == "violated"}
    assert found == ({cls} if cls else set()), [(r.name, r.status, r.cause) for r in soft]


@pytest.mark.parametrize("name, status", [("entry", "proved"), ("entry_no_rescale", "violated")])
def test_an_unrolled_online_combine_rescales_what_it_accumulated(name, status):
    """A combine over a constant number of splits, unrolled by the compiler (SGLang's stage 2): no loop is
    left in the PTX, so the rescale is read from the sums themselves. Adding the exponentials of a new max
    to an accumulation of earlier maxima's without multiplying it by exp(old max - new max) is
    `online-rescale` (SGLang's mutant: `old_scale = 1.0`); the correct combine is proved."""
    from kernalin_ci import ptx as engine

    text, facts, contract = _launch("tests/kernels/split_online_combine.py", 1, name)
    out = engine.analyse(text, facts, contract)
    rescale = [r for r in out.results if r.name.startswith("every accumulation")]
    assert [(r.status, r.bug_class) for r in rescale] == [
        (status, "online-rescale" if status == "violated" else None)
    ], [(r.name, r.status, r.cause) for r in out.results]
    assert all(r.status == "proved" for r in out.results if r not in rescale), [
        (r.name, r.status, r.cause) for r in out.results if r.status != "proved"
    ]


def test_paged_kv_reads_are_proved_through_the_block_table():
    """Every K/V read of a paged kernel, for every program, lane, kv_len and block table of the domain: q's
    sequence, KV head h // group, below kv_len, through the block table (the offsets decoded from their
    linear form: the solver used to give up on these six)."""
    out, _ = _analyse("checks/attention_decode_paged/correct_online_paged.py")
    reads = [r for r in out.results if r.name.startswith(("k_cache", "v_cache"))]
    assert len(reads) == 6 and all(r.status == "proved" for r in reads), [(r.name, r.cause) for r in reads]


@pytest.mark.parametrize(
    "path, cls",
    [
        ("checks/attention_decode/correct_gqa_dot.py", None),
        ("checks/attention_decode/bug_gqa_interleaved.py", "gqa-mapping"),
    ],
)
def test_a_tl_dot_attention_is_followed_through_its_mma(path, cls):
    """A GQA decode kernel whose q.k and p.v are `tl.dot`s (`mma.sync.m16n8k16` between `ldmatrix` moves, one
    `.trans`ed at a symbolic address): followed. The correct one has no violation: its bounds, K/V reads, max
    subtraction, rescale and normalisation proved through the mma's products; two properties stay *not
    proved* with their causes (the scores reach the exponentials through a layout conversion in shared
    memory at symbolic addresses, and the race check's query cap). The interleaved head mapping is a
    `gqa-mapping` violation. Before, both were *not analysed* (the mma, then the `.trans` address)."""
    out, _ = _analyse(path)
    assert out.not_analysed is None
    bad = {r.bug_class for r in out.results if r.status == "violated"}
    if cls is not None:
        assert cls in bad, bad
        return
    assert not bad, bad
    status = {r.name: r.status for r in out.results if "in bounds" not in r.name}
    for name in (
        "every exponential is exp(s - m) with m a max over s",
        "every accumulation of exponentials is rescaled when the running max changes",
        "the output is divided by a sum of the exponentials",
        "k_cache head h // 3 for query head h",
        "v_cache read only below kv_len",
    ):
        assert status[name] == "proved", (name, status)
    assert all(r.status == "proved" for r in out.results if "in bounds" in r.name)
    assert status["the scale multiplies q.k once"] == "not-proved"


def test_a_fused_decode_step_is_followed_through_its_layout_conversions():
    """The fused step compiles its tile reshapes to ldmatrix/stmatrix through shared memory; followed
    exactly, its properties are proved (the new slots hold the rotated k and v at the token's slot, head and
    dim; the softmax; the K/V reads) but one: its store moved after the attention loop reads the new token's
    slot before writing it (`step-order`, with a kv_len in the counterexample). One kernel for both sides:
    the correct parent differs only in the store's place (the catalogue run: 0 false findings on it)."""
    out, _ = _analyse("checks/decode_step/bug_read_before_write.py")
    assert out.not_analysed is None
    # every property but race freedom (races.py: its queries get a tenth of the solver's resources here)
    unproved = [r for r in out.results if r.status == "not-proved" and not r.name.startswith("shared memory")]
    assert not unproved, [r.name for r in unproved]
    step = [r for r in out.results if "new token" in r.name or "holds" in r.name or "owning the slot" in r.name]
    assert len(step) >= 10 and {r.name for r in out.results if r.status == "violated"} == {
        "every read of the new token's slot of k_cache comes after its write",
        "every read of the new token's slot of v_cache comes after its write",
    }
    r = next(r for r in out.results if r.status == "violated")
    assert r.bug_class == "step-order" and any(k.startswith("kv_lens[") for k in r.counterexample)
    assert {r.status for r in out.results if r.name.startswith("every exponential")} == {"proved"}


# ---------------------------------------------------------------- a CUDA C++ kernel, compiled by NVRTC


def _libnvrtc() -> str | None:
    """libnvrtc from an installed NVIDIA wheel (the `cuda` extra's nvidia-cuda-nvrtc, or a cu12 one)."""
    import glob

    try:
        import nvidia
    except ImportError:
        return None
    found = sorted(p for d in nvidia.__path__ for p in glob.glob(f"{d}/**/libnvrtc.so*", recursive=True))
    found = [p for p in found if "builtins" not in p and ".alt." not in p]
    return found[0] if found else None


@functools.cache
def _nvrtc_ptx(defines: tuple[str, ...] = ()) -> str:
    """tests/cuda/kv_append.cu compiled to PTX for sm_90 by NVRTC (no GPU needed)."""
    import ctypes

    lib = ctypes.CDLL(_libnvrtc())
    src = (ROOT / "tests/cuda/kv_append.cu").read_bytes()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"kv_append.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=compute_90", b"-lineinfo", *(f"-D{d}".encode() for d in defines)]
    assert lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)) == 0
    n = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, buf)
    return buf.value.decode()


def _cuda_facts():
    """The launch facts of kv_append.cu, written by hand: plain data, nothing from Triton."""
    from kernalin_ci.ptx.context import Contract
    from kernalin_ci.ptx.facts import Expr, LaunchFacts, ParamFacts, ShapeSymbol, TensorFacts

    E = Expr.of
    row = (E("T"), E(2), E(48))
    strides = (E(96), E(48), E(1))
    cache_shape, cache_strides = (E("NB"), E(16), E(2), E(48)), (E(1536), E(96), E(48), E(1))
    big = 1 << 36
    tensors = {
        "key": TensorFacts("key", "float16", 2, row, strides),
        "value": TensorFacts("value", "float16", 2, row, strides),
        "k_cache": TensorFacts("k_cache", "float16", 2, cache_shape, cache_strides, role="written", max_elements=big),
        "v_cache": TensorFacts("v_cache", "float16", 2, cache_shape, cache_strides, role="written", max_elements=big),
        "slot_mapping": TensorFacts(
            "slot_mapping", "int64", 8, (E("T"),), (E(1),), True, (E(0), E("NB") * 16 + (-1)), True
        ),
    }
    params = [ParamFacts("pointer", n) for n in ("key", "value", "k_cache", "v_cache", "slot_mapping")]
    params += [ParamFacts("int", value=E(96)), ParamFacts("int", value=E(16))]
    symbols = {"T": ShapeSymbol("T", 1, 65536, 5), "NB": ShapeSymbol("NB", 1, 1 << 21, 7)}
    facts = LaunchFacts("kv_append", params, (E("T"), E(1), E(1)), tensors, symbols, distinct=("slot_mapping",))
    facts.block_threads = 128
    contract = Contract("kv_append", {"k_cache": "key", "v_cache": "value"}, "slot_mapping", 16)
    return facts, contract


@pytest.mark.parametrize(
    "defines, cls",
    [((), None), (("SKIP_PADDING=0",), "kv-padding"), (("OFFSET_T=int",), "offset-overflow")],
)
def test_a_cuda_kernel_compiled_by_nvrtc_is_analysed_from_the_same_facts(defines, cls):
    if _libnvrtc() is None:
        pytest.skip("no NVRTC (pip install 'kernalin-ci[cuda]')")
    from kernalin_ci import ptx as engine

    facts, contract = _cuda_facts()
    out = engine.analyse(_nvrtc_ptx(defines), facts, contract)
    assert out.not_analysed is None
    violated = {r.bug_class for r in out.results if r.status == "violated"}
    if cls is None:
        assert {r.status for r in out.results} == {"proved"}, [(r.name, r.status, r.cause) for r in out.results]
        assert len(out.results) == 7  # slot, key, value loads; both stores in bounds; both caches' contract
    else:
        assert cls in violated


def test_rope_reads_are_proved_against_the_pairing_of_the_configured_style():
    """A gptj kernel checked as neox (the file's params say neox) rotates (i, i xor 1): rope-pairing."""
    out, _ = _analyse("checks/rope/bug_pairing_style_ignored.py")
    by_class = {r.bug_class for r in out.results if r.status == "violated"}
    assert by_class == {"rope-pairing"}
    assert any(r.status == "proved" and "reads q of its own token and head" in r.name for r in out.results)


def _rope_angles(path: str):
    """rope_angles alone on a catalogue kernel's trace (the rope_reads proofs take the solver minutes)."""
    from kernalin_ci.ptx import rope_angles, terms
    from kernalin_ci.ptx.context import Context
    from kernalin_ci.ptx.executor import execute
    from kernalin_ci.ptx.syntax import parse

    text, facts, contract = _launch(path)
    terms.reset()
    symbols = {f"ctaid.{x}": terms.sym(f"ctaid.{x}", 32) for x in "xyz"}
    symbols |= {name: terms.sym(name, 64) for name in facts.symbols}
    trace = execute(parse(text), facts, symbols)
    return rope_angles.rope_angles(trace, Context(facts, contract, trace, symbols))


@pytest.mark.parametrize(
    "path, cls",
    [
        ("checks/rope/correct_neox.py", None),
        ("checks/rope/bug_sign_one_output.py", "rope-sign"),
        ("checks/rope/bug_frequency_head_dim.py", "rope-frequency"),
        ("checks/rope/bug_table_row_stride.py", "stride"),
        # CUDA C++ (NVRTC): sincosf and expf inlined, a thread striding over (head, pair) by blockDim (its
        # dims differ between iterations: one instance per iteration), q or k chosen by a pointer select
        ("checks/cuda/rope/correct_neox.py", None),
        ("checks/cuda/rope/bug_sign_inverse.py", "rope-sign"),
        ("checks/cuda/rope/bug_position_token_index.py", "rope-position"),
        ("checks/cuda/rope/bug_frequency_head_dim.py", "rope-frequency"),
    ],
)
def test_the_rotation_is_read_from_libdevice_sin_cos_or_a_cos_sin_table(path, cls):
    """Signs, the angle's position, frequency and precision, a table's row: from the float graph."""
    if path.startswith("checks/cuda/") and (_libnvrtc() is None or importlib.util.find_spec("cuda.bindings") is None):
        pytest.skip("no NVRTC (pip install 'kernalin-ci[cuda]')")
    out = _rope_angles(path)
    found = {r.bug_class for r in out if r.status == "violated"}
    assert found == ({cls} if cls else set()), [(r.name, r.status, r.cause) for r in out]
    if path.startswith("checks/cuda/"):  # the store is a helper of common/kernalin_cuda.cuh: the line calling it
        assert all(r.where.file.endswith("rope.cu") for r in out), {r.where.file for r in out}
    if cls is None:  # every property of the in-kernel angle proved on the correct kernel
        names = {r.name.split(" ", 1)[1] for r in out if r.status == "proved"}
        assert any("cos a -/+" in n for n in names) and any("frequency" in n for n in names)
        assert any("positions[t]" in n for n in names)
        assert all(r.status == "proved" for r in out), [(r.name, r.cause) for r in out if r.status != "proved"]


def test_evaluation_follows_only_the_branch_taken():
    """evaluate.py: float32 rounding, integer wrap, and an unknown atom on the untaken side of an ite."""
    import numpy as np

    from kernalin_ci.ptx import terms as T
    from kernalin_ci.ptx.evaluate import Unknown, evaluate

    x, n = T.mk("fparam", ("x", 0.1), "f", 32), T.sym("n", 32)
    unknown = T.fresh("havoc", 32, "f")
    big = T.fop("fadd", T.fop("fmul", x, x), T.fconst(1.0))
    t = T.fite(T.cmp("ult", n, T.const(4, 32)), big, unknown)
    assert evaluate(t, {n: 3}) == float(np.float32(np.float32(0.1) * np.float32(0.1)) + np.float32(1.0))
    with pytest.raises(Unknown):
        evaluate(t, {n: 5})
    assert evaluate(T.bv("add", n, T.const(-1, 32)), {n: 0}) == 2**32 - 1
    both = T.and_(T.cmp("ult", n, T.const(4, 32)), T.mk("fcmp", ("lt", unknown, big), "bool", 1))
    assert evaluate(both, {n: 9}) is False  # a false conjunct decides, the unknown one is never needed


def test_a_counterexample_becomes_the_ops_case_at_its_values():
    """Op.counterexample_case: the capture case with the model's shape symbols and index entries."""
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.verify.structural.capture import capture_cases

    op = get_op("kv_append")
    params = resolve_params("kv_append", op.params, {})
    case = op.counterexample_case(capture_cases(op, params)[0], params, {"T": 6, "NB": 3}, {"slot_mapping": {(4,): -1}})
    slots = case.dims["slots"]
    assert len(slots) == 6 and slots[4] == -1 and case.dims["num_blocks"] == 3
    valid = [s for s in slots if s >= 0]
    assert len(set(valid)) == 5 and all(s < 3 * params["block_size"] for s in valid)
    assert op.validate_case(case) is None

    op = get_op("attention.decode")
    params = resolve_params("attention.decode", op.params, {})
    base = capture_cases(op, params)[0]
    case = op.counterexample_case(base, params, {"B": 3}, {"kv_lens": {(1,): 65}})
    assert case.dims["kv_lens"] == [base.dims["kv_lens"][0], 65, base.dims["kv_lens"][0]]
    assert op.validate_case(case) is None


def test_shared_memory_keeps_stored_values_and_one_unknown_per_address_between_stores():
    """shared.py: a value stored then read back at the same (constant or symbolic) address is that value;
    two reads of unknown content with no store between them are one term, a read after a store is not; a
    store at a symbolic address may land anywhere (the constant entries go)."""
    from kernalin_ci.ptx import terms as T
    from kernalin_ci.ptx.shared import SharedMemory, merge

    T.reset()
    x, y, i = T.sym("x", 32), T.sym("y", 32), T.sym("i", 32)
    at = T.bv("add", T.const(64, 32), T.bv("mul", i, T.const(4, 32)))
    m = SharedMemory.unknown().store([(at, x, T.TRUE)])  # sm[16 + i] = x (a loop over a runtime size)
    assert m.read(at, 32) is x
    first = m.read(T.const(8, 32), 32)
    assert first.op == "fresh" and m.read(T.const(8, 32), 32) is first  # the score read twice: one value
    m2 = m.store([(T.const(0, 32), y, T.TRUE)])
    assert m2.read(T.const(0, 32), 32) is y and m2.read(T.const(8, 32), 32) is not first  # a store between
    assert m2.read(at, 32) is not x  # the constant store may have landed on sm[16 + i]
    m3 = m2.store([(at, x, T.TRUE)])
    assert m3.read(T.const(0, 32), 32) is not y  # and the symbolic one on sm[0]
    joined = merge(m2, m2.store([(T.const(0, 32), x, T.TRUE)]), T.sym("c", 1))
    assert joined.read(T.const(0, 32), 32).op == "ite"


def _one_thread_storing_to_eight_ints(text: str) -> str:
    """The status of the one property of a one-thread kernel whose only access is a store into out[8] (int32)."""
    from kernalin_ci import ptx as engine
    from kernalin_ci.ptx.facts import Expr, LaunchFacts, ParamFacts, TensorFacts

    facts = LaunchFacts(
        "k",
        [ParamFacts("pointer", tensor="out")],
        (Expr.of(1), Expr.of(1), Expr.of(1)),
        {"out": TensorFacts("out", "int32", 4, (Expr.of(8),), (Expr.of(1),), role="output")},
        {},
        block_threads=1,
    )
    out = engine.analyse(text, facts, engine.Contract("custom"))
    assert out.not_analysed is None
    ((name, status),) = [(r.name, r.status) for r in out.results]
    assert name == "store to out in bounds"
    return status


_COUNTED = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<4>;
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, COUNT;
	mov.u32 	%r2, 0;
$L_loop:
	mul.wide.u32 	%rd2, %r2, 4;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.b32 	[%rd3], %r2;
	add.s32 	%r3, %r2, 1;
	add.s32 	%r2, %r3, 1;
	add.s32 	%r1, %r1, -1;
	setp.ne.s32 	%p1, %r1, 0;
	@%p1 bra 	$L_loop;
	ret;
}
"""


@pytest.mark.parametrize("count, status", [(4, "proved"), (5, "violated")])
def test_a_counted_loop_stops_at_its_count_and_a_chained_index_is_an_induction_variable(count, status):
    """nvcc's counted loops (a counter down to 0, `!= 0` at the back edge) run exactly COUNT times, and an
    index advanced by a chain of additions (an unrolled loop: i + 1 + 1) is an induction variable: 4
    iterations of out[2k] stay in out's 8 elements, 5 do not."""
    assert _one_thread_storing_to_eight_ints(_COUNTED.replace("COUNT", str(count))) == status


_PIPELINED = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<4>;
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r2, 0;
$L_loop:
	add.s32 	%r3, %r2, 2;
	setp.lt.s32 	%p2, %r3, LIMIT;
	mul.wide.s32 	%rd2, %r3, 4;
	add.s64 	%rd3, %rd1, %rd2;
	@%p2 st.global.b32 	[%rd3], %r2;
	setp.lt.s32 	%p1, %r3, 8;
	mov.b32 	%r2, %r3;
	@%p1 bra 	$L_loop;
	ret;
}
"""


@pytest.mark.parametrize("limit, status", [(8, "proved"), (9, "violated")])
def test_an_index_copied_back_at_the_latch_is_an_induction_variable(limit, status):
    """Triton's pipelined `tl.range` loops compute the next index in the body and copy it back at the latch
    (`x = i + 2; ...; mov i, x`): i is 0, 2, 4, ..., so the look-ahead store to out[i + 2] masked by i + 2 < 8
    stays in out's 8 elements, and one masked by < 9 does not. Before, i was an unknown of the iteration
    (a phi): any int, negative ones included, so the first was a false finding (vLLM's decode attention)."""
    assert _one_thread_storing_to_eight_ints(_PIPELINED.replace("LIMIT", str(limit))) == status


def test_an_analysis_asks_the_same_queries_in_the_same_order_every_time(monkeypatch):
    """The solver's time (and, at its resource limit, its answer) depends on the order of what it is given:
    terms are ordered by when they were made, never by their address. Before, a sum's operands were sorted
    by address: the same CUDA RoPE kernel took 4.4 to 23.9 s in one process, its queries different each run."""
    from kernalin_ci import ptx as engine
    from kernalin_ci.ptx import solver

    asked: list[str] = []
    check = solver.Query.check

    def recording(self, extra=None):
        self.solver.push()
        self.solver.add(*[self.tr(c) for c in extra or []])
        asked.append(self.solver.sexpr())
        self.solver.pop()
        return check(self, extra)

    monkeypatch.setattr(solver.Query, "check", recording)
    text, facts, contract = _launch("checks/attention_decode/correct_online_softmax.py")
    engine.analyse(text, facts, contract)
    first, asked[:] = list(asked), []
    keep = [[object() for _ in range(97)] for _ in range(300)]  # other addresses for the next run's terms
    del keep[::2]
    engine.analyse(text, facts, contract)
    assert len(first) > 5 and first == asked


@pytest.mark.parametrize(
    "fn, cls",
    [("entry", None), ("entry_by_position", None), ("entry_sign", "rope-sign"), ("entry_swapped", "rope-sign"),
     ("entry_row0", "stride")],
)  # fmt: skip
def test_separate_cos_and_sin_tables_are_read_as_the_capture_call_filled_them(fn, cls, monkeypatch):
    """A kernel given separate cos and sin tensors only loads them: which is which comes from their data at the
    capture call (verify/structural/trig_tables.py). The rotation's signs, each column's frequency and each
    row's token (or position) are then proved, or violated; before, every such kernel was *not proved (separate
    tables?)* and a flipped sign (LightLLM's, Liger's, LMDeploy's, Unsloth's mutants) was missed."""
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.verify.structural.in_process import analyze_entry

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    params = resolve_params("rope", get_op("rope").params, {"head_dim": 64, "max_position": 2048})
    monkeypatch.setenv("KERNALIN_PARAMS", json.dumps(params))
    fn_ = load_entry(f"tests/kernels/rope_cos_sin_tables.py:{fn}", str(ROOT))
    out = analyze_entry("rope", fn_, params, str(ROOT), engine="ptx")
    found = {f["bug_class"] for f in out["findings"]}
    assert found == ({cls} if cls else set()), out["findings"]
    if cls is None:
        proved = " | ".join(out["proved"])
        assert "cos a -/+ x[partner] sin a (the neox signs)" in proved and "frequency base^" in proved, proved
        row = "row is its position" if fn == "entry_by_position" else "rows are its own token's"
        assert row in proved, proved
    else:  # the domain says what the proof assumes of the tables
        assert all("of each token's angles (as at the capture call)" in f["message"] for f in out["findings"])


@pytest.mark.parametrize("k, ty", [(16, "f16"), (16, "bf16"), (8, "f16")])
def test_an_mma_gives_each_lane_its_elements_of_the_warps_product(k, ty):
    """`mma.sync.aligned.m16n8k{16,8}.row.col.f32` (Triton's tl.dot on sm_80+): from the PTX ISA's fragment
    layouts, each lane's four D registers are its elements of A @ B + C. A (16 x k) and B (k x 8) of small
    integers (exact in f16 and bf16) are packed into each lane's registers as the ISA places them, C is a
    constant; every lane's D, evaluated, is numpy's product. Other types (tf32, integers) are refused."""
    import numpy as np

    from kernalin_ci.ptx import mma
    from kernalin_ci.ptx import terms as T
    from kernalin_ci.ptx.evaluate import evaluate

    rng = np.random.default_rng(k)
    a, b = rng.integers(-4, 5, (16, k)), rng.integers(-4, 5, (k, 8))
    c = np.arange(128).reshape(16, 8) / 4
    lanes = [divmod(L, 4) for L in range(32)]  # lane L is in group g = L >> 2, thread t = L & 3
    f32 = lambda v: int(np.float32(v).view(np.uint32))  # noqa: E731
    half = {"f16": lambda v: int(np.float16(v).view(np.uint16)), "bf16": lambda v: f32(v) >> 16}[ty]
    pack = lambda lo, hi: T.const(half(lo) | half(hi) << 16, 32)  # noqa: E731
    # two per register: A [g + 8 (i % 2), 2 t + 8 (i // 2) + h], B [2 t + 8 i + h, g], h the half
    ar = [
        [pack(*(a[g + 8 * (i % 2), 2 * t + 8 * (i // 2) + h] for h in (0, 1))) for g, t in lanes] for i in range(k // 4)
    ]
    br = [[pack(*(b[2 * t + 8 * i + h, g] for h in (0, 1))) for g, t in lanes] for i in range(k // 8)]
    cr = [[T.const(f32(c[g + 8 * (i // 2), 2 * t + i % 2]), 32) for g, t in lanes] for i in range(4)]
    T.reset()
    mods = ("sync", "aligned", f"m16n8k{k}", "row", "col", "f32", ty, ty, "f32")
    d = mma.warp_product(mma.shape_of(mods), ar, br, cr)
    want = a @ b + c
    for lane in range(32):
        g, t = divmod(lane, 4)
        for i in range(4):
            got = np.uint32(evaluate(d[i][lane], {})).view(np.float32)
            assert got == want[g + 8 * (i // 2), 2 * t + i % 2], (lane, i)
    with pytest.raises(Exception, match="mma"):
        mma.shape_of(("sync", "aligned", "m16n8k16", "row", "col", "f32", "s8", "s8", "s32"))
    with pytest.raises(Exception, match="mma"):
        mma.shape_of(("sync", "aligned", "m16n8k8", "row", "col", "f32", "tf32", "tf32", "f32"))


_LANE_BELOW = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(
	.param .u64 k_param_0,
	.param .u32 k_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<9>;
	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u32 	%r1, [k_param_1];
	mov.u32 	%r2, %tid.x;
	setp.lt.u32 	%p1, %r1, 7;
	cvt.u64.u32 	%rd2, %r1;
	shl.b64 	%rd3, %rd2, 2;
	cvt.u64.u32 	%rd4, %r2;
	shl.b64 	%rd5, %rd4, 2;
	add.s64 	%rd6, %rd3, %rd5;
	add.s64 	%rd7, %rd6, OFFSET;
	add.s64 	%rd8, %rd1, %rd7;
	@%p1 st.global.b32 	[%rd8], %r2;
	ret;
}
"""


@pytest.mark.parametrize("offset, status", [(0, "proved"), (-4, "violated")])
def test_a_lane_below_the_others_is_the_lowest(offset, status):
    """Two threads store to out[n + tid + offset / 4] for any n < 7 (out has 8 ints). At offset -4, thread 0
    stores at out[-1] when n = 0. The lanes' addresses are U + c with c = -4 and 0: c is signed, so the lane
    at U - 4 is the lowest and its start is checked against 0. Read unsigned, it was the highest, and the
    store was proved in bounds."""
    from kernalin_ci import ptx as engine
    from kernalin_ci.ptx.facts import Expr, LaunchFacts, ParamFacts, TensorFacts

    facts = LaunchFacts(
        "k",
        [ParamFacts("pointer", tensor="out"), ParamFacts("unknown")],
        (Expr.of(1), Expr.of(1), Expr.of(1)),
        {"out": TensorFacts("out", "int32", 4, (Expr.of(8),), (Expr.of(1),), role="output")},
        {},
        block_threads=2,
    )
    out = engine.analyse(_LANE_BELOW.replace("OFFSET", str(offset)), facts, engine.Contract("custom"))
    assert [(r.name, r.status) for r in out.results] == [("store to out in bounds", status)]
