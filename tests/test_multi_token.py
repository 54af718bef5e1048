"""attention.decode_multi, several new tokens per sequence (docs/ops.md): the float64 reference on hand-computed
and independently formulated cases, the cases where the drafts matter, the shape rules, the benchmark shapes,
the structural status that says it is not analysed, and the catalogue's kernels (real Triton kernels under the
interpreter): the correct one passes, each bug is named with its class at its case and missed by the probe."""

import json

import pytest
import torch
from conftest import CHECKS, REPO, cli

from kernalin_ci.ops import attention_decode_multi as adm
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Case, resolve_params
from kernalin_ci.ops.bench_shapes import BenchRequest
from kernalin_ci.verify import verify

OP = "attention.decode_multi"
PARAMS = {"block_size": 16, "max_query_len": 4}
FOLDER = CHECKS / "attention_decode_multi"


def _op_params(raw=None):
    op = get_op(OP)
    return op, resolve_params(OP, op.params, raw if raw is not None else PARAMS)


def _kw(q_lens, kv_lens, D=4, Hq=2, Hkv=1, seed=0, q=None):
    """A call by hand: block size 2, sequence b's blocks in order, random keys and values."""
    g = torch.Generator().manual_seed(seed)
    bs, B, T = 2, len(kv_lens), sum(q_lens)
    need = [-(-L // bs) for L in kv_lens]
    tables = torch.zeros(B, max(need), dtype=torch.int32)
    k = torch.randn(sum(need), bs, Hkv, D, generator=g, dtype=torch.float64)
    v = torch.randn(sum(need), bs, Hkv, D, generator=g, dtype=torch.float64)
    first = 0
    for b, n in enumerate(need):
        tables[b, :n] = torch.arange(first, first + n)
        first += n
    return {
        "q": torch.randn(T, Hq, D, generator=g, dtype=torch.float64) if q is None else q,
        "k_cache": k,
        "v_cache": v,
        "block_tables": tables,
        "query_start_loc": torch.tensor(adm.query_start_loc(q_lens), dtype=torch.int32),
        "kv_lens": torch.tensor(kv_lens, dtype=torch.int32),
        "scale": 0.5,
    }


def _history(kw, b, L):
    """Sequence b's first L keys and values [L, Hkv, D], read through its table."""
    bs = kw["k_cache"].shape[1]
    j = torch.arange(L)
    blk = kw["block_tables"][b, j // bs].long()
    return kw["k_cache"][blk, j % bs], kw["v_cache"][blk, j % bs]


def test_positions_and_offsets():
    assert adm.query_start_loc([4, 1, 2]) == [0, 4, 5, 7]
    # token i of a sequence of q_len n and kv_len L sits at L - n + i
    assert adm.positions([3, 1], [5, 1]) == [(0, 0, 2), (0, 1, 3), (0, 2, 4), (1, 0, 0)]


def test_reference_by_hand_q_zero_is_the_mean_of_the_values_up_to_each_position():
    """q = 0: every score is 0, so new token i's output is the mean of the values 0..p, p = kv_len - q_len + i."""
    q_lens, kv_lens = [3, 1], [5, 2]
    op, params = _op_params({"block_size": 2})
    kw = _kw(q_lens, kv_lens, q=torch.zeros(4, 2, 4, dtype=torch.float64))
    out = op.reference(kw, params).tensors["out"]
    for t, (b, _, p) in enumerate(adm.positions(q_lens, kv_lens)):
        _, v = _history(kw, b, p + 1)
        assert torch.allclose(out[t], v[:, 0].mean(0).expand(2, -1), atol=1e-12), t
    # the first draft of sequence 0 is at position 2: three values, not five
    _, v0 = _history(kw, 0, 5)
    assert not torch.allclose(out[0, 0], v0[:, 0].mean(0))


def test_reference_is_bottom_right_causal_attention():
    """Against an independent formulation: per sequence, torch's attention with the causal mask aligned at the
    bottom right (query i of n sees keys j <= L - n + i), GQA by repeating the KV heads."""
    q_lens, kv_lens = [4, 1, 2], [6, 3, 2]
    op, params = _op_params({"block_size": 2})
    kw = _kw(q_lens, kv_lens, Hq=4, Hkv=2, seed=3)
    out = op.reference(kw, params).tensors["out"]
    starts = adm.query_start_loc(q_lens)
    for b, (n, L) in enumerate(zip(q_lens, kv_lens)):
        k, v = _history(kw, b, L)
        q = kw["q"][starts[b] : starts[b + 1]].transpose(0, 1)  # [Hq, n, D]
        k, v = (x.transpose(0, 1).repeat_interleave(2, 0) for x in (k, v))  # [Hq, L, D]
        mask = torch.arange(L)[None, :] <= (L - n + torch.arange(n))[:, None]
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5)
        assert torch.allclose(out[starts[b] : starts[b + 1]], want.transpose(0, 1), atol=1e-12), b


def test_the_cases_reach_the_drafts_edges():
    op, params = _op_params()
    cases = {c.name: c for c in op.cases(params, "cpu", None)}
    mixed = cases["mixed-q-lens"].dims
    assert {1, 4} <= set(mixed["q_lens"])  # q_len 1 beside q_len max_query_len in one batch
    assert any(n == L for n, L in zip(mixed["q_lens"], mixed["kv_lens"]))  # a first draft at position 0
    crossing = cases["block-crossing"].dims
    for n, L in zip(crossing["q_lens"], crossing["kv_lens"]):  # first and last draft in different blocks
        assert (L - n) // 16 != (L - 1) // 16
    for c in [*cases.values(), op.probe(params, None), op.shape_case(params, "float32")]:
        assert op.validate_case(c) is None, c.name
        assert max(c.dims["q_lens"]) <= 4
    probe = op.probe(params, None).dims
    assert probe["kv_lens"] == [1] and probe["q_lens"] == [1]
    _, two = _op_params({"max_query_len": 2})
    assert all(max(c.dims["q_lens"]) <= 2 for c in op.cases(two, "cpu", "float32"))


def test_inputs_follow_the_case():
    op, params = _op_params()
    case = next(c for c in op.cases(params, "cpu", "float32") if c.name == "mixed-q-lens")
    kw = op.inputs(case, params, "cpu")
    assert list(kw) == ["q", "k_cache", "v_cache", "block_tables", "query_start_loc", "kv_lens", "scale"]
    assert kw["q"].shape[0] == sum(case.dims["q_lens"]) == kw["query_start_loc"][-1]
    assert kw["query_start_loc"].dtype == torch.int32 and kw["query_start_loc"].shape == (
        len(case.dims["kv_lens"]) + 1,
    )


@pytest.mark.parametrize(
    "dims, message",
    [
        ({"q_lens": [1, 5]}, "q_lens[b] must be an integer from 1 to kv_lens[b]"),
        ({"q_lens": [1]}, "q_lens must be a list with one length per sequence (as kv_lens)"),
        ({"q_lens": [0, 1]}, "q_lens[b] must be an integer from 1 to kv_lens[b]"),
    ],
)
def test_a_case_outside_the_shape_rules(dims, message):
    op, _ = _op_params()
    case = Case("by-hand", {"Hq": 4, "Hkv": 2, "D": 8, "kv_lens": [3, 4], "scale": 0.3, **dims})
    assert op.validate_case(case) == message


def test_a_bad_case_on_the_command_line_is_one_line_and_exit_2():
    case = json.dumps(
        {"name": "by-hand", "dims": {"Hq": 4, "Hkv": 2, "D": 8, "kv_lens": [3], "q_lens": [4], "scale": 0.3}}
    )
    r = cli(
        "verify",
        "--op",
        OP,
        "--entry",
        f"{FOLDER / 'correct_causal_drafts.py'}:entry",
        "--device",
        "cpu",
        "--case",
        case,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "kernalin-ci verify: error: --case: q_lens[b] must be an integer from 1 to kv_lens[b]"
    ]


def test_bench_shapes_give_every_sequence_max_query_len_tokens():
    op, params = _op_params({"max_query_len": 3})
    cases = op.bench_cases(params, "cuda", BenchRequest("cuda", {}))
    assert [len(c.dims["kv_lens"]) for c in cases] == [1, 16, 128]
    assert all(c.dims["q_lens"] == [3] * len(c.dims["kv_lens"]) for c in cases)
    assert "q_len=3" in cases[0].name
    small = Case("s", {"Hq": 2, "Hkv": 1, "D": 4, "kv_lens": [5, 2], "q_lens": [2, 1], "scale": 1.0}, "float16")
    traffic = op.traffic(small, params)
    assert traffic.flops == 4 * 2 * 4 * (4 + 5 + 2)  # keys attended: 4 and 5 (sequence 0), 2 (sequence 1)
    assert traffic.bytes_written == 3 * 2 * 4 * 2


def test_the_structural_status_says_not_analysed():
    entry = f"{FOLDER / 'correct_causal_drafts.py'}:entry"
    r = verify(OP, entry, PARAMS, "cpu", only="structural", progress=False)
    assert r.structural.status == "not-analysed" and not r.findings
    assert r.structural.cause == (
        "not analysed for several query tokens per sequence (the analysis models one query token): "
        "the structural analysis does not model it"
    )


def test_row_labels_name_the_sequence_and_the_draft():
    op, params = _op_params()
    case = Case("c", {"Hq": 2, "Hkv": 1, "D": 4, "kv_lens": [5, 2], "q_lens": [2, 1], "scale": 1.0})
    assert op.row_label(case, {}, "out", 3) == "t=1 h=1 (sequence 0, new token 2 of 2 at position 4, kv_len=5)"
    assert op.row_label(case, {}, "out", 4) == "t=2 h=0 (sequence 1, new token 1 of 1 at position 1, kv_len=2)"


def _case(name):
    op, params = _op_params()
    return next(c for c in op.cases(params, "cpu", "float32") if c.name == name)


# (kernel, the case where its bug shows, the class it must be named with; None: correct)
KERNELS = [
    ("correct_causal_drafts", "mixed-q-lens", None),
    ("correct_causal_drafts", "block-crossing", None),
    ("bug_drafts_see_each_other", "mixed-q-lens", "causal-mask"),
    ("bug_causal_top_left", "mixed-q-lens", "causal-mask"),
    ("bug_draft_sees_next", "block-crossing", "causal-mask"),
    ("bug_query_start_strict", "mixed-q-lens", "query-start"),
    ("bug_position_from_longest_query", "mixed-q-lens", "causal-mask"),
    ("bug_key_loop_first_draft_block", "block-crossing", "causal-mask"),
]


@pytest.mark.parametrize("name, case, cls", KERNELS, ids=[f"{k[0]}-{k[1]}" for k in KERNELS])
def test_catalogue_kernel_at_its_case(name, case, cls):
    entry = f"{FOLDER / name}.py:entry"
    r = verify(OP, entry, PARAMS, "cpu", case_json=json.dumps(_case(case).to_json()), progress=False)
    assert r.cases_run == 1
    if cls is None:
        assert not r.findings, [f.message for f in r.findings]
    else:
        assert cls in {f.bug_class for f in r.findings}, [(f.bug_class, f.message) for f in r.findings]


@pytest.mark.parametrize("name", sorted({k[0] for k in KERNELS if k[2]}))
def test_the_probe_misses_each_bug(name):
    """One sequence, one token, kv_len 1: what the catalogue files say (`pos0: missed`)."""
    r = verify(OP, f"{FOLDER / name}.py:entry", PARAMS, "cpu", probe=True, progress=False)
    assert r.cases_run == 1 and not r.findings, [f.message for f in r.findings]


QTILES = REPO / "tests" / "kernels" / "decode_multi_qtiles.py"
UNIFIED = {**PARAMS, "prefill_chunk": 200}
UNIFIED_SMALL = {**PARAMS, "prefill_chunk": 100, "num_q_heads": 2, "num_kv_heads": 1}  # a few seconds of CPU


def _unified_case(name, params=UNIFIED):
    op = get_op(OP)
    return next(c for c in op.cases(resolve_params(OP, op.params, params), "cpu", "float32") if c.name == name)


def test_a_unified_kernel_gets_a_mixed_prefill_and_decode_batch():
    """With prefill_chunk, a mixed ragged batch: a decode at kv_len 1, the chunk of 200 new tokens over a
    37-token cached prefix (its first at position 37, its last at kv_len - 1), a decode right after it in
    query_start_loc; without it, no such case (a speculative kernel is held to max_query_len)."""
    op = get_op(OP)
    assert "prefill-chunk" not in {c.name for c in op.cases(resolve_params(OP, op.params, PARAMS), "cpu", None)}
    c = _unified_case("prefill-chunk")
    assert op.validate_case(c) is None
    assert c.dims["q_lens"] == [1, 200, 1, 1] and c.dims["kv_lens"] == [1, 237, 2, 130]
    rows = adm.positions(c.dims["q_lens"], c.dims["kv_lens"])
    assert rows[0] == (0, 0, 0) and rows[1] == (1, 0, 37) and rows[200] == (1, 199, 236) and rows[201] == (2, 0, 1)


def test_the_mixed_batch_catches_a_kernel_sized_for_drafts(tmp_path):
    """tests/kernels/decode_multi_qtiles.py walks a sequence's new tokens 16 at a time: it passes the mixed
    batch (a 100-token chunk, 2 query heads: a few seconds). Cut to one query tile per sequence (a launcher
    sized for drafts) it still passes the drafts' mixed-q-lens case, and the mixed batch shows the chunk's
    tokens past the first tile never computed."""
    src = QTILES.read_text()
    assert src.count("for q0 in range(0, q_len, BLOCK_Q):") == 1
    bug = tmp_path / "decode_multi_one_qtile.py"
    bug.write_text(src.replace("for q0 in range(0, q_len, BLOCK_Q):", "for q0 in range(0, BLOCK_Q, BLOCK_Q):"))

    def run(path, case):
        c = json.dumps(_unified_case(case, UNIFIED_SMALL).to_json())
        return verify(OP, f"{path}:entry", UNIFIED_SMALL, "cpu", case_json=c, progress=False)

    r = run(QTILES, "prefill-chunk")
    assert r.cases_run == 1 and not r.findings, [f.message for f in r.findings]
    r = run(bug, "mixed-q-lens")
    assert r.cases_run == 1 and not r.findings, [f.message for f in r.findings]
    r = run(bug, "prefill-chunk")
    assert [f.bug_class for f in r.findings] == ["unwritten-output"], [(f.bug_class, f.message) for f in r.findings]
    assert "sequence 1, new token 17 of 100 at position 53" in r.findings[0].message, r.findings[0].message
