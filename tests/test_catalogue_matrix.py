"""The whole catch matrix of the bug catalogue (checks/), on the CPU under the Triton interpreter:
every correct kernel passes every kind of check; every bug kernel is caught by the dynamic checks and
by the structural checks; the pos-0 probe misses exactly the kernels labelled "missed"."""

import os

import pytest

from kernalin_ci import catalogue as cat

KERNELS = [k for k in cat.discover(cat.default_dir()) if k.cuda is None]  # CUDA C++: tests/test_cuda_catalogue.py
IDS = [k.name for k in KERNELS]


@pytest.fixture(scope="module")
def matrix():
    kinds = ("probe", "dynamic", "structural")
    rows = cat.matrix(KERNELS, kinds, "cpu", jobs=os.cpu_count() or 2)
    return {r.kernel.name: r for r in rows}


def test_catalogue_is_complete():
    """At least 2 correct kernels and 8 bug kernels per op, every bug file names its public source."""
    for op in ("attention.decode", "attention.decode_paged", "rope", "kv_append"):
        ks = [k for k in KERNELS if k.op == op]
        assert sum(not k.is_bug for k in ks) >= 2, op
        assert sum(k.is_bug for k in ks) >= 8, op
    for k in KERNELS:
        if k.is_bug:
            assert (k.modelled_on or "").startswith("https://"), k.name


@pytest.mark.slow
@pytest.mark.parametrize("name", IDS)
def test_row_matches_its_label(matrix, name):
    row = matrix[name]
    assert not row.mismatches(), row.mismatches()
    structural = row.cells["structural"]
    if row.kernel.structural == "not-analysed":  # a feature the analysis does not model: said, never a pass
        assert structural.says_not_analysed and not structural.caught
    else:
        assert not structural.not_checked, structural.not_checked
    if row.kernel.is_bug:
        assert row.cells["dynamic"].caught and (structural.caught or row.kernel.structural == "not-analysed")
        if row.kernel.op == "decode_step":  # step-level bugs are named, by both kinds
            for kind in ("dynamic", "structural"):
                assert row.kernel.bug_class in row.cells[kind].classes, (kind, row.cells[kind].classes)
    else:
        assert not any(c.caught for c in row.cells.values())


def test_jobs_below_one_is_a_usage_error():
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "kernalin_ci", "catalogue", "--jobs", "0", "--device", "cpu"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["kernalin-ci catalogue: error: --jobs must be at least 1, not 0"], r.stderr
