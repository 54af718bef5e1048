"""The real-world corpus (tests/realworld/, docs/realworld.md): public production Triton kernels behind
our own adapters, fetched from the package registry at test time.

Every original must verify with no finding and with its structural analysis run, or show exactly its
documented true finding; every single-bug mutant must be caught with its bug class. Findings on an
original that come from a known, filed cause (manifest `known_false`) make its test a strict xfail:
the day the cause is fixed the test goes red and the entry must go. Any other finding fails.

By default the test runs the manifest's `ci` subset of the Triton kernels (every op, the current releases;
about six minutes on CI's 2 cores) and the CUDA C++ kernels (GPU only); KERNALIN_REALWORLD_ALL=1 runs every
kernel, as `python tests/realworld/matrix.py` does.
The verifies run two at a time (KERNALIN_REALWORLD_JOBS) and the matrix of the run is printed at the end
(pytest -s) and written to .cache/realworld/matrix.md.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "realworld"))
import corpus  # noqa: E402
import matrix  # noqa: E402

MANIFEST = corpus.load_manifest()
ALL = os.environ.get("KERNALIN_REALWORLD_ALL") == "1"
KERNELS = [k for k in MANIFEST if ALL or k.id in corpus.ci_subset() or k.device == "cuda"]  # CUDA: GPU-marked
JOBS = int(os.environ.get("KERNALIN_REALWORLD_JOBS", "2"))


class KnownFalse(Exception):
    """Only findings of known causes remain (or the kernel cannot run on this Triton)."""


@pytest.fixture(scope="module")
def outcomes(request):
    """Start every selected verify at once (JOBS at a time); tests wait for their own."""
    corpus.fetch(KERNELS)
    wanted = [
        (item.callspec.params["k"], item.callspec.params["variant"])
        for item in request.session.items
        if item.module.__name__ == __name__ and hasattr(item, "callspec") and "variant" in item.callspec.params
    ]
    pool = ThreadPoolExecutor(JOBS)
    futures = {(k.id, v): pool.submit(corpus.verify, k, v, k.device or "cpu") for k, v in wanted}
    yield futures
    pool.shutdown(cancel_futures=True)
    done = {key: f.result() for key, f in futures.items() if f.done() and not f.exception()}
    lines = [
        matrix.row(k, done[k.id, "original"], done[k.id, "mutant"])
        for k in KERNELS
        if (k.id, "original") in done and (k.id, "mutant") in done
    ]
    if lines:
        text = (
            "\n".join(
                [
                    "| kernel | op | original | structural | mutant | mutant found | seconds |",
                    "|---|---|---|---|---|---|---|",
                    *lines,
                ]
            )
            + "\n"
        )
        (corpus.CACHE / "matrix.md").write_text(text)
        print("\n" + text)


def _params(variant: str):
    for k in KERNELS:
        expected = bool(k.needs_triton_below) or (variant == "original" and bool(k.known_false))
        marks = (
            [pytest.mark.xfail(strict=True, raises=KnownFalse, reason="known cause, see the manifest")]
            if expected
            else []
        )
        if k.device == "cuda":  # a CUDA C++ kernel runs on a GPU only (docs/cuda.md)
            marks.append(pytest.mark.gpu)
        yield pytest.param(k, variant, id=k.id, marks=marks)


def _check(k: corpus.Kernel, o: corpus.Outcome) -> None:
    j = corpus.judge(k, o)
    if j.not_checked:  # a CUDA kernel this toolchain cannot build: said, never a pass nor a failure
        pytest.skip(j.not_checked)
    assert not j.problems, "\n".join(j.problems)
    if j.known:
        raise KnownFalse("; ".join(j.known))


@pytest.mark.slow
@pytest.mark.parametrize("k,variant", list(_params("original")))
def test_original_verifies_clean(k, variant, outcomes):
    _check(k, outcomes[k.id, variant].result())


@pytest.mark.slow
@pytest.mark.parametrize("k,variant", list(_params("mutant")))
def test_mutant_is_caught(k, variant, outcomes):
    _check(k, outcomes[k.id, variant].result())


def test_manifest_is_complete():
    """All seven ops (two whole decode steps run as decode_step among them), twenty kernels or more from
    seven projects or more; each names its distribution's sha256 and license, an adapter that exists, a
    one-place mutant in one of its files, and bug classes from the vocabulary. The CI subset names kernels
    of the manifest and covers every op."""
    ops = {"attention.decode", "attention.decode_paged", "attention.decode_multi", "attention.decode_mla", "rope"}
    ops |= {"kv_append", "decode_step"}
    assert {k.op for k in MANIFEST} == ops
    assert len(MANIFEST) >= 20 and len({k.dist.package for k in MANIFEST}) >= 7
    assert len([k for k in MANIFEST if k.op == "decode_step"]) >= 2
    subset = corpus.ci_subset()
    assert set(subset) <= {k.id for k in MANIFEST} and {k.op for k in MANIFEST if k.id in subset} == ops
    for k in MANIFEST:
        assert len(k.dist.sha256) == 64 and k.dist.license, k.id
        assert (corpus.REPO / k.adapter.split(":")[0]).is_file(), k.adapter
        assert k.mutant.file in k.files and k.mutant.find and k.mutant.find != k.mutant.replace, k.id
        assert k.mutant.bug_class in corpus.bug_classes(), k.id
        for rule in [*k.known_false, *k.true_findings]:
            assert set(rule) - {"cause", "why", "device"} <= set(corpus.MATCH_KEYS), rule
            assert rule.get("cause") or rule.get("why"), rule


def test_judgement_flags_unexplained_findings():
    """A finding no manifest rule explains is a problem; one a known cause explains is not; a known cause
    that no longer shows is a problem (its rule must go); a missing structural analysis is a problem."""
    plain = next(k for k in MANIFEST if not k.true_findings)  # the manifest has no known cause left: make one
    k = dataclasses.replace(plain, known_false=({"cause": "a known cause (test)", "bug_class": "wrong-output"},))
    rule = k.known_false[0]
    known = {
        "bug_class": rule.get("bug_class", "wrong-output"),
        "kind": rule.get("kind", "dynamic"),
        "message": "",
        "case": {"name": rule.get("case", "x"), "dtype": rule.get("dtype", "float32")},
    }
    other = {"bug_class": "gqa-mapping", "kind": "dynamic", "message": "", "case": {"name": "x", "dtype": "float32"}}
    j = corpus.judge(k, corpus.Outcome(k.id, "original", 1, [known["bug_class"]], [known], "ran"))
    assert not j.problems and j.known == [rule["cause"]]
    j = corpus.judge(k, corpus.Outcome(k.id, "original", 1, ["gqa-mapping"], [known, other], "ran"))
    assert j.problems and j.word == "FALSE FINDING"
    j = corpus.judge(k, corpus.Outcome(k.id, "original", 0, [], [], "ran"))
    assert j.problems and j.word == "MANIFEST OUT OF DATE"
    j = corpus.judge(
        k, corpus.Outcome(k.id, "original", 1, [known["bug_class"]], [known], "not analysed: capture failed")
    )
    assert j.problems and j.word == "STRUCTURAL NOT RUN"


CUDA_KERNELS = [k for k in MANIFEST if k.cuda]


@pytest.mark.slow
@pytest.mark.parametrize("k", CUDA_KERNELS, ids=[k.id for k in CUDA_KERNELS])
def test_cuda_kernel_builds_for_an_h100_with_the_flags_verify_gets(k, tmp_path):
    """The PTX of our launcher over FlashInfer's headers, for sm_90, with exactly the --cuda-flag list
    `corpus.verify` passes (the vendored CCCL first, then FlashInfer's headers): what the GPU run's build does,
    without a GPU. A toolchain that cannot build it is said (skip with the compiler's first error), as the GPU
    test says "not checked" then."""
    from kernalin_ci.cuda import toolchain
    from kernalin_ci.cuda.build import build_ptx
    from kernalin_ci.cuda.sources import CudaSpec

    if toolchain.nvcc() is None:
        pytest.skip("not checked (no CUDA compiler: pip install '.[cuda]')")
    corpus.fetch([k])
    args = corpus.cuda_args(k, corpus.CACHE / "src", corpus.REPO / Path(k.adapter).parent)
    sources = tuple(args[i + 1] for i, a in enumerate(args) if a == "--cuda-source")
    flags = tuple(a.split("=", 1)[1] for a in args if a.startswith("--cuda-flag="))
    vendored = [f for f in flags if "/cccl/" in f]
    assert vendored and flags.index(vendored[0]) < flags.index(next(f for f in flags if f.endswith("/data/include")))
    assert "fast_mod_div" in (corpus.REPO / vendored[0][2:] / "cuda" / "__cmath" / "fast_modulo_division.h").read_text()
    res = build_ptx(CudaSpec(sources, (*flags, "-arch=sm_90")), corpus.REPO, str(tmp_path))
    if res.status == "failed":
        first = next((ln for ln in res.log.splitlines() if "error" in ln), res.log[:200])
        version = toolchain.nvcc_version(res.compiler)
        pytest.skip(f"not checked (the CUDA toolchain here, {version}, does not build it: {first})")
    assert res.status == "built" and res.arch == "compute_90", res.log
    ptx = Path(res.ptx[0]).read_text()
    assert ".target sm_90" in ptx and ".visible .entry" in ptx


def test_a_cuda_kernel_this_toolchain_cannot_build_is_not_checked_never_failed_nor_passed():
    k = CUDA_KERNELS[0]
    error = {"bug_class": "build-error", "kind": "build", "message": 'fastdiv.cuh(39): error: expected a ";"'}
    for variant in ("original", "mutant"):
        j = corpus.judge(k, corpus.Outcome(k.id, variant, 1, ["build-error"], [error], "not analysed", device="cuda"))
        assert j.not_checked.startswith("not checked (the CUDA toolchain here does not build it: fastdiv.cuh(39)")
        assert not j.problems and j.word == "not built"
    other = "stride" if k.mutant.bug_class != "stride" else "scale"
    j = corpus.judge(k, corpus.Outcome(k.id, "mutant", 1, [other], [], "not analysed", device="cuda"))
    assert not j.not_checked and j.word == "MISSED"  # what builds is judged as before


PTX_HOST_FILLED = ("lightllm-destindex-copy-kv", "colossalai-kvcache-copy", "xformers-rope-padded")


@pytest.mark.slow
@pytest.mark.parametrize("kid", PTX_HOST_FILLED)
def test_the_ptx_engine_finds_nothing_on_an_original_that_prepares_its_inputs_on_the_host(kid):
    """The PTX engine alone (`--only structural --engine ptx`) on originals whose entries give the kernel tensors
    made on the host (`key[slot_mapping >= 0]`, a padded copy of q): no finding, and the properties whose
    counterexamples went through such a tensor are *not proved* with that cause (they were false findings: a
    store out of bounds, a cache holding scratch1 instead of key; and the analysis failed on a 4-dim copy)."""
    pytest.importorskip("z3")
    k = next(k for k in MANIFEST if k.id == kid)
    corpus.fetch([k])
    o = corpus.verify(k, "original", "cpu", matrix.PTX_ONLY)
    assert o.exit_code == 0 and o.structural == "ran" and o.findings == [], (o.error, o.structural, o.findings)
    causes = [n["message"] for n in o.notices if n.get("check") == "structural:ptx-proof"]
    assert any("a tensor the entry filled on the host" in c for c in causes), causes


PTX_COS_SIN = ("liger-rope", "unsloth-rope", "lmdeploy-rotary")


@pytest.mark.slow
@pytest.mark.parametrize("kid", PTX_COS_SIN)
def test_the_ptx_engine_reads_the_rotation_through_separate_cos_and_sin_tables(kid):
    """Liger's, Unsloth's and LMDeploy's kernels take HF-style cos and sin tensors the entry fills: the engine alone
    proves the original's signs and catches the mutant's flipped sign (before: *not proved (separate tables?)*,
    missed). LMDeploy's reads row `pos % seq_len` (a runtime divisor) and its K heads at `(head - BLOCK_QH) * stride`
    (a multiple of the row only on the K branch's path): before, its loads and signs were not proved."""
    pytest.importorskip("z3")
    k = next(k for k in MANIFEST if k.id == kid)
    corpus.fetch([k])
    o = corpus.verify(k, "original", "cpu", matrix.PTX_ONLY)
    assert o.exit_code == 0 and o.structural == "ran" and o.findings == [], (o.error, o.structural, o.findings)
    assert any("(the neox signs)" in p for p in o.proved), o.proved
    m = corpus.verify(k, "mutant", "cpu", matrix.PTX_ONLY)
    assert k.mutant.bug_class == "rope-sign" and "rope-sign" in m.classes, (m.classes, m.error)


@pytest.mark.slow
def test_the_ptx_engine_reads_the_rescale_of_a_combine_the_compiler_unrolled():
    """SGLang's stage 2 combines a constant number of splits in a loop the compiler unrolls, so no loop is left
    in its PTX: the engine alone proves the original's rescale (before: no rescale property for that kernel)
    and catches the mutant's `old_scale = 1.0` as `online-rescale` (before: missed)."""
    pytest.importorskip("z3")
    k = next(k for k in MANIFEST if k.id == "sglang-decode-attention")
    corpus.fetch([k])
    o = corpus.verify(k, "original", "cpu", matrix.PTX_ONLY)
    assert o.exit_code == 0 and o.structural == "ran" and o.findings == [], (o.error, o.structural, o.findings)
    assert any(p.startswith("_fwd_kernel_stage2") and "rescaled" in p for p in o.proved), o.proved
    m = corpus.verify(k, "mutant", "cpu", matrix.PTX_ONLY)
    assert k.mutant.bug_class == "online-rescale" and "online-rescale" in m.classes, (m.classes, m.error)
