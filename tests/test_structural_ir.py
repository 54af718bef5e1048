"""The TTIR parser and the dataflow layer, on IR compiled for sm_90 from real kernels and on hand-written text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kernalin_ci.verify.structural.ir import parse_constant, parse_type
from kernalin_ci.verify.structural.ir_parser import parse_module

FIX = Path(__file__).resolve().parent / "structural_fixtures"


@pytest.fixture
def compiled(monkeypatch):
    """Capture an entry and compile its launches to TTIR, in this process (kernels are never launched)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")

    def run(name: str, op: str, params: dict | None = None):
        import json

        from kernalin_ci.entry import load_entry
        from kernalin_ci.ops import get_op
        from kernalin_ci.ops.base import resolve_params
        from kernalin_ci.verify.structural.capture import capture
        from kernalin_ci.verify.structural.compile import ttir

        p = resolve_params(op, get_op(op).params, params or {})
        monkeypatch.setenv("KERNALIN_PARAMS", json.dumps(p))
        cap = capture(op, load_entry(f"{FIX / name}:entry"), p)
        return cap, [ttir(la) for la in cap.launches]

    return run


def test_parse_compiled_online_softmax(compiled):
    cap, texts = compiled("attn_correct_online.py", "attention.decode")
    m = parse_module(texts[0])
    k = m.kernel
    # every runtime argument of the launch is an argument of the IR function, in order
    assert [a.name for a in cap.launches[0].runtime_args] == [v.name.lstrip("%") for v in k.args]
    ops = list(m.walk())
    loops = [op for op in ops if op.name == "scf.for"]
    assert len(loops) == 1 and len(loops[0].results) == 3  # m_i, l_i, acc carried
    from kernalin_ci.verify.structural.dataflow import carried, loop_arg, loop_yield, reduce_kind

    assert {reduce_kind(op) for op in ops if op.name == "tt.reduce"} == {"addf", "maxnumf"}
    assert sum(op.name == "math.exp" for op in ops) == 2  # alpha and p
    body_args = [loop_arg(loops[0], j) for j in range(3)]
    assert all(carried(a) == (loops[0], j) for j, a in enumerate(body_args))
    assert all(loop_yield(loops[0], j) is not None for j in range(3))
    # the output division uses the loop's results (%acc#k)
    div = next(op for op in ops if op.name == "arith.divf")
    assert div.operands[0].owner is loops[0] and div.operands[0] is loops[0].results[2]
    # every load and store has a location in the fixture file, on the line that does it
    src = (FIX / "attn_correct_online.py").read_text().splitlines()
    for op in ops:
        if op.name in ("tt.load", "tt.store"):
            f = op.loc.user_frame(cap.launches[0].path)
            assert f is not None and f.path.endswith("attn_correct_online.py")
            assert ("tl.load" in src[f.line - 1]) == (op.name == "tt.load") or "tl.store" in src[f.line - 1]
    # named locations give variable names
    assert {"q", "k", "v"} <= {op.loc.name for op in ops if op.name == "tt.load"}


def test_parse_text_forms():
    text = """#loc = loc("/src/kern.py":3:0)
#loc2 = loc("/site/triton/language/standard.py":290:11)
#loc3 = loc("/src/kern.py":9:14)
#loc4 = loc("total"(#loc3))
#loc5 = loc(callsite(#loc2 at #loc4))
module {
  tt.func public @k(%X: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("X"(#loc)), %n: i32 loc("n"(#loc))) attributes {noinline = false} {
    %cst = arith.constant dense<0xFF800000> : tensor<8xf32> loc(#loc)
    %c0 = arith.constant 0 : i64 loc(#loc)
    %0 = tt.get_program_id x : i32 loc(#loc)
    %1 = arith.extsi %0 : i32 to i64 loc(#loc)
    %2 = arith.cmpi slt, %1, %c0 : i64 loc(#loc)
    cf.cond_br %2, ^bb1, ^bb2 loc(#loc)
  ^bb1:  // pred: ^bb0
    tt.return loc(#loc)
  ^bb2:  // pred: ^bb0
    %r = tt.make_range {end = 8 : i32, start = 0 : i32} : tensor<8xi32> loc(#loc)
    %p = tt.splat %X : !tt.ptr<f32> -> tensor<8x!tt.ptr<f32>> loc(#loc)
    %q = tt.addptr %p, %r : tensor<8x!tt.ptr<f32>>, tensor<8xi32> loc(#loc)
    %v = tt.load %q : tensor<8x!tt.ptr<f32>> loc(#loc)
    %s = "tt.reduce"(%v) <{axis = 0 : i32}> ({
    ^bb0(%a: f32 loc(callsite(#loc2 at #loc4)), %b: f32 loc(callsite(#loc2 at #loc4))):
      %t = arith.addf %a, %b : f32 loc(#loc5)
      tt.reduce.return %t : f32 loc(#loc5)
    }) : (tensor<8xf32>) -> f32 loc(#loc5)
    %w:2 = scf.for %i = %c0 to %c0 step %c0 iter_args(%x = %s, %y = %s) -> (f32, f32)  : i64 {
      scf.yield %y, %x : f32, f32 loc(#loc)
    } loc(#loc)
    tt.store %X, %w#1 : !tt.ptr<f32> loc(#loc)
    tt.return loc(#loc)
  } loc(#loc)
} loc(#loc)
"""
    m = parse_module(text)
    k = m.kernel
    assert [b.label for b in k.blocks] == ["", "bb1", "bb2"]
    ops = {op.name: op for op in m.walk()}
    br = ops["cf.cond_br"]
    assert br.attrs["targets"] == [("bb1", 0), ("bb2", 0)] and br.operands[0].name == "%2"
    red = ops["tt.reduce"]
    assert red.result.type.shape == () and red.result.type.elem == "f32"
    # a call site inside triton's standard library resolves to the user's line, with the variable name
    f = red.loc.user_frame()
    assert (f.path, f.line, red.loc.name) == ("/src/kern.py", 9, "total")
    assert ops["tt.load"].result.type.text == "tensor<8xf32>"
    loop = ops["scf.for"]
    assert [r.name for r in loop.results] == ["%w#0", "%w#1"]
    assert ops["tt.store"].operands[1] is loop.results[1]
    assert (
        math.isinf(parse_constant(next(o for o in m.walk() if o.name == "arith.constant")))
        and parse_constant(next(o for o in m.walk() if o.name == "arith.constant")) < 0
    )


@pytest.mark.parametrize(
    "text,shape,elem,pointee",
    [
        ("tensor<16x32xf32>", (16, 32), "f32", ""),
        ("tensor<16x!tt.ptr<f16>>", (16,), "ptr", "f16"),
        ("!tt.ptr<i64>", (), "ptr", "i64"),
        ("i1", (), "i1", ""),
        ("tensor<4x8xbf16, #blocked>", (4, 8), "bf16", ""),
    ],
)
def test_types(text, shape, elem, pointee):
    t = parse_type(text)
    assert (t.shape, t.elem, t.pointee) == (shape, elem, pointee)
