"""Capture: launches recorded with their exact specialization, pointers mapped back to op arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parent / "structural_fixtures"


@pytest.fixture
def cap_of(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")

    def run(entry: str, op: str, params: dict | None = None):
        from kernalin_ci.entry import load_entry
        from kernalin_ci.ops import get_op
        from kernalin_ci.ops.base import resolve_params
        from kernalin_ci.verify.structural.capture import capture

        p = resolve_params(op, get_op(op).params, params or {})
        monkeypatch.setenv("KERNALIN_PARAMS", json.dumps(p))
        return capture(op, load_entry(entry), p)

    return run


def test_single_kernel_specialization(cap_of):
    cap = cap_of(f"{FIX / 'attn_correct_online.py'}:entry", "attention.decode")
    assert len(cap.launches) == 1
    la = cap.launches[0]
    B, Hq, D = cap.kwargs["q"].shape
    Hkv = cap.kwargs["k_cache"].shape[1]
    # the capture case: B > 1, a GQA ratio that is neither 1 nor Hkv, a head dim with a tail
    assert B > 1 and Hq % Hkv == 0 and Hq // Hkv not in (1, Hkv) and D & (D - 1) != 0
    assert la.kernel == "_attn" and la.grid == (B, Hq, 1)
    assert la.path.endswith("attn_correct_online.py") and la.line == 11
    assert {k: la.arg(k).value for k in ("GROUP", "D", "BLOCK_N", "BLOCK_D")} == {
        "GROUP": Hq // Hkv,
        "D": D,
        "BLOCK_N": 32,
        "BLOCK_D": 64,
    }
    assert la.signature["Q"] == "*fp16" and la.signature["Lens"] == "*i32" and la.signature["scale"] == "fp32"
    # pointers map back to the op's arguments; the allocated output is the returned tensor
    assert {a.name: a.tensor for a in la.args if a.kind == "pointer"} == {
        "Q": "q",
        "K": "k_cache",
        "V": "v_cache",
        "O": "out",
        "Lens": "kv_lens",
    }
    assert cap.outputs == {"out": "out"}
    assert cap.tensors["out"].role == "output" and cap.tensors["out"].init == "uninitialized"
    assert cap.tensors["k_cache"].role == "input"
    assert la.arg("scale").value == pytest.approx(float(cap.kwargs["scale"]))
    # divisibility hints, as the JIT computes them for a launch
    assert any("tt.divisibility" in str(v) for v in la.attrs.values())


def test_scratch_and_two_kernels(cap_of):
    cap = cap_of(f"{FIX / 'attn_correct_split.py'}:entry", "attention.decode")
    assert [la.kernel for la in cap.launches] == ["_partial", "_combine"]
    part, comb = cap.launches
    assert part.grid[2] == 3 and comb.grid[2] == 1
    mo = part.arg("MO").tensor
    assert mo.startswith("scratch") and comb.arg("MO").tensor == mo
    assert cap.tensors[mo].role == "scratch" and cap.tensors[mo].init == "uninitialized"
    assert comb.arg("O").tensor == "out"


def test_pointer_into_a_tensor_and_copies(cap_of, tmp_path):
    src = tmp_path / "views.py"
    src.write_text("""import torch
import triton
import triton.language as tl


@triton.jit
def _k(X, Y, Z, n):
    i = tl.arange(0, 16)
    tl.store(Y + i, tl.load(X + i, mask=i < n), mask=i < n)
    tl.store(Z + i, tl.load(Z + i, mask=i < n), mask=i < n)


def entry(q, k, positions):
    out_q = q.clone()  # a copy (rope is captured in float32: q.float() would be q itself)
    out_k = torch.zeros_like(k)
    _k[(1,)](q[1, 2:], out_q, out_k, 4)
    return out_q, out_k
""")
    cap = cap_of(f"{src}:entry", "rope")
    la = cap.launches[0]
    q = cap.kwargs["q"]
    x = la.arg("X")
    assert x.tensor == "q" and x.byte_offset == (q.stride(0) + 2 * q.stride(1)) * q.element_size()
    y, z = cap.tensors[la.arg("Y").tensor], cap.tensors[la.arg("Z").tensor]
    assert y.init == "copy:q" and y.role == "output" and z.init == "zeros"
    assert cap.outputs == {"q": y.name, "k": z.name}
    assert la.arg("n").kind == "int" and la.arg("n").value == 4


def test_entry_that_needs_a_power_of_two_head_dim(cap_of):
    cap = cap_of(f"{FIX / 'rope_correct_gptj_join.py'}:entry", "rope", {"style": "gptj"})
    assert cap.kwargs["q"].shape[-1] == 64  # the first case (D = 48) was refused, the second taken


def test_entry_that_raises(cap_of, tmp_path):
    from kernalin_ci.verify.structural.capture import CaptureError

    src = tmp_path / "bad.py"
    src.write_text("def entry(q, k, positions):\n    raise RuntimeError('no kernel here')\n")
    with pytest.raises(CaptureError, match="RuntimeError during the capture call: no kernel here"):
        cap_of(f"{src}:entry", "rope")


def test_host_moves_follow_gathers_to_the_input():
    """Elements moved on the host (mask indexing, index_select, a transposed contiguous copy, a cast, a copy
    into part of a buffer) map back to the input's element offsets; arithmetic makes them unknown."""
    import torch

    from kernalin_ci.verify.structural.host import HostMoves

    key = torch.randn(5, 2, 3)
    slots = torch.tensor([4, -1, 7, -1, 0])
    moves = HostMoves({"key": key, "slot_mapping": slots})
    with moves:
        keep = slots >= 0
        kept = key[keep]
        picked = key.index_select(0, torch.tensor([4, 0])).transpose(0, 1).contiguous().double()
        buf = torch.zeros(4, 2, 3)
        buf[1:3] = key[keep][:2]
        scaled = key[keep] * 2.0
    offsets = torch.arange(30).reshape(5, 2, 3)
    name, m = moves.origin(kept)
    assert name == "key" and m[:18].tolist() == offsets[[0, 2, 4]].reshape(-1).tolist()
    name, m = moves.origin(picked)
    assert name == "key" and m[:12].tolist() == offsets[[4, 0]].transpose(0, 1).reshape(-1).tolist()
    name, m = moves.origin(buf)
    assert m[:6].tolist() == [-1] * 6 and m[6:18].tolist() == offsets[[0, 2]].reshape(-1).tolist()
    assert m[18:].tolist() == [-1] * 6
    assert moves.origin(scaled) is None


def test_following_host_moves_does_not_import_dynamo():
    """The structural worker's capture runs under HostMoves; torch's wrapper around a dispatch mode would
    import torch._dynamo on its first call (2-3 s of the worker's time on the H200): a fresh process that
    captures an entry must not load it."""
    import subprocess
    import sys

    code = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "0"
from kernalin_ci.entry import load_entry
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params
from kernalin_ci.verify.structural.task import capture_material
p = resolve_params("attention.decode", get_op("attention.decode").params, {})
os.environ["KERNALIN_PARAMS"] = json.dumps(p)
material, _ = capture_material("attention.decode", load_entry(sys.argv[1]), p)
assert material["shape"] is not None, material["refused"]
print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
"""
    entry = str(Path(__file__).resolve().parent.parent / "checks/attention_decode/correct_online_softmax.py") + ":entry"
    out = subprocess.run([sys.executable, "-c", code, entry], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["no", "dynamo"], out.stdout
