"""The whole catch matrix of the bug catalogue (checks/), on the CPU under the Triton interpreter:
every correct kernel passes every kind of check; every bug kernel is caught by the dynamic checks and
by the structural checks; the pos-0 probe misses exactly the kernels labelled "missed".

The probe column of every file is the catalogue's `pos0` labels, which each directory's own test runs in one
child process (tests/catalogue_probe.py: test_catalogue_attention, _rope_kv, _decode_step); here the probe
cell runs through `verify()` for one kernel of each label, and the whole matrix for the other two kinds."""

import os

import pytest

from kernalin_ci import catalogue as cat

KERNELS = [k for k in cat.discover(cat.default_dir()) if k.cuda is None]  # CUDA C++: tests/test_cuda_catalogue.py
IDS = [k.name for k in KERNELS]


@pytest.fixture(scope="module")
def matrix():
    rows = cat.matrix(KERNELS, ("dynamic", "structural"), "cpu", jobs=os.cpu_count() or 2)
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
        # a decode_step step-level bug is named by both kinds; a feature bug (not analysed) is caught, as in attention
        if row.kernel.op == "decode_step" and row.kernel.structural != "not-analysed":
            for kind in ("dynamic", "structural"):
                assert row.kernel.bug_class in row.cells[kind].classes, (kind, row.cells[kind].classes)
    else:
        assert not any(c.caught for c in row.cells.values())


@pytest.mark.slow
def test_the_probe_cell_is_the_pos0_probe():
    """The probe cell (`verify --probe pos0`) catches a kernel labelled caught and misses one labelled missed."""
    caught = next(k for k in KERNELS if k.pos0 == "caught" and k.op == "attention.decode")
    missed = next(k for k in KERNELS if k.pos0 == "missed" and k.op == "attention.decode")
    rows = cat.matrix([caught, missed], ("probe",), "cpu", jobs=2)
    assert [r.cells["probe"].caught for r in rows] == [True, False], [r.cells["probe"] for r in rows]
    assert not any(r.mismatches() for r in rows)


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
