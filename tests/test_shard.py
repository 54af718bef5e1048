"""Splitting an entry's cases over parallel dynamic workers (kernalin_ci.verify.shard): one dtype per
worker, a repeated case with its original, every case exactly once, in order."""
from kernalin_ci.ops import NAMES, get_op
from kernalin_ci.ops.base import Case, resolve_params
from kernalin_ci.verify import shard


def default_cases(op_name, device="cuda", dtype=None):
    op = get_op(op_name)
    return op.cases(resolve_params(op_name, op.params, {}), device, dtype)


def test_attention_cases_split_by_dtype():
    cases = default_cases("attention.decode")
    groups = shard(cases, 3)
    assert [sorted({cases[i].dtype for i in g}) for g in groups] == [["float32"], ["float16"], ["bfloat16"]]
    names = [cases[i].name for i in groups[0]]
    assert "fresh-inputs" in names and "gqa-1" in names


def test_every_case_once_in_order_for_every_op():
    for op_name in NAMES:
        if op_name == "custom":
            continue
        cases = default_cases(op_name)
        for workers in (1, 2, 3, 8):
            groups = shard(cases, workers)
            assert 1 <= len(groups) <= workers
            assert sorted(i for g in groups for i in g) == list(range(len(cases)))
            assert all(g == sorted(g) for g in groups)


def test_too_many_dtypes_merge_the_smallest_neighbours():
    cases = default_cases("attention.decode")
    assert shard(cases, 1) == [list(range(len(cases)))]
    two = shard(cases, 2)
    assert [sorted({cases[i].dtype for i in g}) for g in two] == [["float32"], ["bfloat16", "float16"]]


def test_a_repeat_follows_its_original_into_another_dtype_group():
    cases = [Case("a", {}, "float32"), Case("b", {}, "float16"), Case("a-again", {}, "float16", tags=("repeat-of:a",))]
    assert shard(cases, 3) == [[0, 2], [1]]


def test_one_dtype_is_one_worker():
    assert len(shard(default_cases("rope", dtype="float16"), 3)) == 1
