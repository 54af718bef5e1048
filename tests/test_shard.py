"""Splitting an entry's cases over parallel dynamic workers (kernalin_ci.verify.supervisor.shard): one dtype per
worker, a repeated case with its original, every case exactly once, in order."""

from kernalin_ci.ops import NAMES, get_op
from kernalin_ci.ops.base import Case, resolve_params
from kernalin_ci.verify.supervisor import shard


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


def test_progress_of_a_shard_numbers_cases_as_in_the_whole_list(capsys):
    from kernalin_ci.verify.supervisor import Progress

    Progress(True, 12, "attention.decode").subset([8, 9, 10, 11]).case_done(1, "large-scores-float16", 0.25, 0)
    assert capsys.readouterr().err.strip() == "attention.decode [10/12] large-scores-float16: ok (0.2 s)"


def test_sharded_run_reports_every_case_and_finding_in_case_order(monkeypatch):
    """Three workers at once (as on a GPU) give the same result as one."""
    import dataclasses

    from conftest import KERNELS

    import kernalin_ci.verify as v
    from kernalin_ci.device import CPU, DEVICES

    entry = f"{KERNELS / 'torch_attention.py'}:gqa_modulo"
    one = v.verify("attention.decode", entry, {}, "cpu", only="dynamic", progress=False)
    monkeypatch.setitem(DEVICES, "cpu", dataclasses.replace(CPU, dynamic_workers=3))
    three = v.verify("attention.decode", entry, {}, "cpu", only="dynamic", progress=False)
    assert three.cases_run == one.cases_run == 15
    assert [f.to_json() for f in three.findings] == [f.to_json() for f in one.findings]
    assert {f.bug_class for f in three.findings} == {"gqa-mapping"}
    first = three.findings[0]
    assert first.case["name"] == "tiles"  # the first case of the whole list, from the float32 worker
    assert "gqa-8-bfloat16, gqa-8-float16" in first.message  # ... and the other workers' cases with it
