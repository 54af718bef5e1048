"""Paged caches: free, poisoned low blocks and slots (a padded lane sent to block 0 or slot 0),
the `layout` param (nhd, hnd) and the token-level pool (block_size 1), with real Triton kernels
through the real CLI and worker processes."""

import json

import pytest
import torch
from conftest import CHECKS, KERNELS, cli

from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params
from kernalin_ci.ops.paged import nhd

TOKEN = str(KERNELS / "token_attention.py")
KV = str(KERNELS / "triton_kv_append.py")
PAGED = "attention.decode_paged"


def case_json(op_name, name, **params):
    op = get_op(op_name)
    p = resolve_params(op_name, op.params, params)
    return json.dumps(next(c for c in op.cases(p, "cpu", "float32") if c.name == name).to_json())


def verify(op, entry, *extra):
    r = cli(
        "verify", "--op", op, "--entry", entry, "--device", "cpu", "--quiet", "--only", "dynamic", "--json", "-", *extra
    )
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def found(res):
    return {(f["bug_class"], f["case"]["name"]) for f in res["findings"]}


# --------------------------------------------------------------------------- free low blocks and slots


def test_free_low_blocks_case_frees_block_0_and_pads_tables_with_0():
    op = get_op(PAGED)
    p = resolve_params(PAGED, op.params, {})
    case = next(c for c in op.cases(p, "cpu", None) if c.name == "free-low-blocks")
    kw = op.inputs(case, p, "cpu")
    bs = p["block_size"]
    need = [-(-L // bs) for L in case.dims["kv_lens"]]
    owned = {int(x) for b, n in enumerate(need) for x in kw["block_tables"][b, :n]}
    assert owned.isdisjoint({0, 1, 2}) and max(owned) == kw["k_cache"].shape[0] - 1
    assert all(int(x) == 0 for b, n in enumerate(need) for x in kw["block_tables"][b, n:])
    assert torch.isnan(kw["k_cache"][:3]).all() and torch.isnan(kw["v_cache"][:3]).all()


def test_padded_lanes_sent_to_block_0_are_caught_where_block_0_is_free():
    """A random table hands block 0 to a sequence (finite slot 0): the same kernel passes there."""
    entry = f"{CHECKS}/attention_decode_paged/bug_padded_lanes_block0.py:entry"
    rc, res = verify(PAGED, entry, "--case", case_json(PAGED, "free-low-blocks"))
    assert rc == 1 and {name for _, name in found(res)} == {"free-low-blocks"}, res["findings"]
    rc, res = verify(PAGED, entry, "--case", case_json(PAGED, "gqa-8"))
    assert rc == 0, res["findings"]


def test_correct_paged_kernels_stay_clean_with_block_0_free():
    for name in ("correct_online_paged", "correct_split_paged"):
        rc, res = verify(
            PAGED, f"{CHECKS}/attention_decode_paged/{name}.py:entry", "--case", case_json(PAGED, "free-low-blocks")
        )
        assert rc == 0 and res["cases_run"] == 1, res["findings"]


def test_padding_token_written_to_slot_0_is_named_where_slot_0_is_free():
    op = get_op("kv_append")
    p = resolve_params("kv_append", op.params, {})
    case = next(c for c in op.cases(p, "cpu", None) if c.name == "free-low-slots")
    slots = op.inputs(case, p, "cpu")["slot_mapping"].tolist()
    assert -1 in slots and min(s for s in slots if s >= 0) >= 2 * p["block_size"]
    case = case_json("kv_append", "free-low-slots")
    rc, res = verify("kv_append", f"{KV}:padding_to_slot0", "--case", case)
    assert rc == 1 and ("kv-padding", "free-low-slots") in found(res), res["findings"]
    rc, res = verify("kv_append", f"{KV}:entry", "--case", case)
    assert rc == 0, res["findings"]


# --------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("op_name", [PAGED, "kv_append"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_every_case_builds_in_both_layouts_as_one_cache(op_name, block_size):
    """hnd inputs hold exactly the nhd inputs, permuted; block_size 1 (a token pool) works in every case."""
    op = get_op(op_name)
    pn = resolve_params(op_name, op.params, {"block_size": block_size})
    ph = resolve_params(op_name, op.params, {"block_size": block_size, "layout": "hnd"})
    for case in op.cases(pn, "cpu", None):
        if "huge" in case.tags:
            continue
        a, b = op.inputs(case, pn, "cpu"), op.inputs(case, ph, "cpu")
        nb, bs, hkv, d = a["k_cache"].shape
        assert bs == block_size and b["k_cache"].shape == (nb, hkv, bs, d) and b["k_cache"].is_contiguous()
        for name in ("k_cache", "v_cache"):
            assert torch.equal(a[name].view(torch.int8), nhd(b[name], "hnd").contiguous().view(torch.int8))
        if op_name == PAGED:
            assert torch.equal(op.reference(a, pn).tensors["out"], op.reference(b, ph).tensors["out"])
        else:
            slots = [s for s in a["slot_mapping"].tolist() if s >= 0]
            assert len(slots) == len(set(slots)) and len(a["slot_mapping"]) == case.dims["T"]


def test_unknown_layout_is_a_usage_error():
    r = cli("verify", "--op", PAGED, "--entry", f"{TOKEN}:hnd_attention", "--device", "cpu", "--param", "layout=dhn")
    assert r.returncode == 2 and "layout" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_hnd_attention_with_a_real_kernel():
    for name in ("gqa-8", "free-low-blocks"):
        rc, res = verify(
            PAGED, f"{TOKEN}:hnd_attention", "--param", "layout=hnd", "--case", case_json(PAGED, name, layout="hnd")
        )
        assert rc == 0 and res["cases_run"] == 1, res["findings"]


def test_hnd_kv_append_with_a_real_kernel_and_one_that_assumes_nhd():
    case = case_json("kv_append", "heads", layout="hnd")
    rc, res = verify("kv_append", f"{TOKEN}:hnd_kv_append", "--param", "layout=hnd", "--case", case)
    assert rc == 0, res["findings"]
    rc, res = verify("kv_append", f"{TOKEN}:nhd_kv_append_given_hnd", "--param", "layout=hnd", "--case", case)
    assert rc == 1


def test_token_pool_adapter_views_the_cache_with_block_size_1():
    for name in ("gqa-6", "free-low-blocks"):
        rc, res = verify(
            PAGED, f"{TOKEN}:token_pool", "--param", "block_size=1", "--case", case_json(PAGED, name, block_size=1)
        )
        assert rc == 0 and res["cases_run"] == 1, res["findings"]


def test_structural_analyses_read_an_hnd_cache_in_its_own_order():
    for op, entry, want in (
        (PAGED, "hnd_attention", 0),
        ("kv_append", "hnd_kv_append", 0),
        ("kv_append", "nhd_kv_append_given_hnd", 1),
    ):
        r = cli(
            "verify",
            "--op",
            op,
            "--entry",
            f"{TOKEN}:{entry}",
            "--param",
            "layout=hnd",
            "--device",
            "cpu",
            "--only",
            "structural",
            "--quiet",
            "--json",
            "-",
        )
        assert r.returncode == want, r.stdout + r.stderr
        res = json.loads(r.stdout)
        assert not [n for n in res["notices"] if "not analysed" in n["message"] or "could not" in n["message"]]


def test_pipeline_runs_on_an_hnd_cache():
    r = cli(
        "pipeline",
        "--kv-append",
        f"{TOKEN}:hnd_kv_append",
        "--attention",
        f"{TOKEN}:hnd_attention",
        "--param",
        "layout=hnd",
        "--steps",
        "3",
        "--device",
        "cpu",
        "--quiet",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli(
        "pipeline",
        "--kv-append",
        f"{TOKEN}:nhd_kv_append_given_hnd",
        "--attention",
        f"{TOKEN}:hnd_attention",
        "--param",
        "layout=hnd",
        "--steps",
        "3",
        "--device",
        "cpu",
        "--quiet",
    )
    assert r.returncode == 1, r.stdout + r.stderr


def test_pipeline_names_an_attention_entry_that_writes_the_cache():
    """The caches after kv_append and after attention are handed back as two tensors (on the CPU too,
    where the worker's cache is the tensor it saves), so the parent names the attention entry."""
    r = cli(
        "pipeline",
        "--kv-append",
        f"{KV}:entry",
        "--attention",
        f"{TOKEN}:attention_writes_cache",
        "--steps",
        "2",
        "--device",
        "cpu",
        "--quiet",
        "--json",
        "-",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    found = json.loads(r.stdout)["findings"]
    assert [(f["check"], f["bug_class"]) for f in found] == [("pipeline-attention", "input-modified")], found


POW2 = str(KERNELS / "pipeline_pow2.py")


def test_pipeline_runs_where_power_of_two_kernels_take_the_shape():
    """The decode pipeline has a shape domain (issue 30, item 2): unpinned, it runs its loop at D 64 and a
    short loop at each other usual head dim; the head dims the members refuse are unsupported, not checked.
    Pinned, the head dim is declared: an entry's error there is a finding."""
    args = ("pipeline", "--kv-append", f"{POW2}:kv_append", "--attention", f"{POW2}:attention", "--device", "cpu")
    r = cli(*args, "--steps", "2", "--quiet", "--json", "-")
    res = json.loads(r.stdout)
    assert r.returncode == 0, res["findings"]
    refused = {n["shape"].split()[0]: n for n in res["not_checked"]}
    assert set(refused) == {"D=80", "D=96"}, refused
    assert refused["D=80"]["reason"] == "unsupported" and "power of two" in refused["D=80"]["error"]
    assert res["coverage"]["head_dims"] == [64, 128, 256]
    r = cli(*args, "--steps", "2", "--param", "head_dim=80", "--quiet", "--json", "-")
    res = json.loads(r.stdout)
    assert r.returncode == 1 and [f["bug_class"] for f in res["findings"]] == ["entry-error"], res["findings"]
    assert "declared head dim 80" in res["findings"][0]["message"]
