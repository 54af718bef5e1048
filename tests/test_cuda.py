"""CUDA C++ kernels on a host without a GPU (docs/cuda.md): the `cuda:` configuration, the diff following
`#include "..."`, PTX built once per source hash with the registry's nvcc, the verdict "not checked (needs a GPU)"
(never a pass) and the gate's neutral conclusion, gated by `fail_on: [not-checked]`; every kernel of the CUDA
catalogue compiles to PTX with nvcc and with NVRTC. The GPU half is tests/test_cuda_gpu.py."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import CHECKS, cli

from kernalin_ci import catalogue as cat
from kernalin_ci import config
from kernalin_ci.cuda import toolchain
from kernalin_ci.cuda.build import build_ptx
from kernalin_ci.cuda.includes import included_files, kernel_files
from kernalin_ci.cuda.sources import CudaSpec
from kernalin_ci.errors import UsageError

CUDA = CHECKS / "cuda"
CUDA_KERNELS = [k for k in cat.discover(CHECKS) if k.cuda]
needs_nvcc = pytest.mark.skipif(toolchain.nvcc() is None, reason="no CUDA compiler (pip install '.[cuda]')")


def git(repo, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


# the barrier between tiles in the shared attention header (the line a pull request drops)
BARRIER = "        __syncthreads();  // all threads are done with the values before the next keys overwrite them\n"

CONFIG = """\
kernels:
  - name: paged_decode
    op: attention.decode_paged
    entry: attention_decode_paged/correct_online_smem.py:entry
    params: {block_size: 16}
    cuda: {sources: [attention_decode_paged/paged_decode.cu], flags: [-Icommon]}
gate: {budget_s: 10}
"""
# a correct pull request to the same header (the values' loop unrolled: the same sums in the same order)
VALUES_LOOP = "            for (int j = 0; j < nv; ++j) a += p[j] * sm.kv[j][d];\n"
UNROLLED = "#pragma unroll 4\n" + VALUES_LOOP


@pytest.fixture
def cuda_repo(tmp_path):
    """An example repository holding the CUDA catalogue's paged decode kernel (its .cu, the shared headers, the
    entry) gated with benchmarks on; a pull request changes the header (pr_to_cuda_repo)."""
    r = tmp_path / "repo"
    (r / "attention_decode_paged").mkdir(parents=True)
    shutil.copytree(CUDA / "common", r / "common")
    for name in ("paged_decode.cu", "correct_online_smem.py"):
        shutil.copy(CUDA / "attention_decode_paged" / name, r / "attention_decode_paged" / name)
    (r / ".kernalin.yml").write_text(CONFIG)
    git(r, "init", "-q", "-b", "main")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "base")
    return r


def pr_to_cuda_repo(repo, old: str, new: str, message: str) -> None:
    """Branch `pr` of REPO: decode_attention.cuh with OLD replaced by NEW, committed."""
    header = repo / "common" / "decode_attention.cuh"
    text = header.read_text()
    assert old in text
    git(repo, "checkout", "-qb", "pr")
    header.write_text(text.replace(old, new))
    git(repo, "commit", "-qam", message)


# ------------------------------------------------------------------ configuration and diff


def test_cuda_key_is_read_and_its_errors_name_line_and_key():
    k = config.parse(CONFIG).kernels[0]
    assert k.cuda == CudaSpec(("attention_decode_paged/paged_decode.cu",), ("-Icommon",))
    assert k.cuda.include_dirs() == ["common"]
    bad = CONFIG.replace("cuda: {sources: [attention_decode_paged/paged_decode.cu],", "cuda: {sources: [],")
    with pytest.raises(UsageError, match=r"^\.kernalin\.yml:6: kernels\[0\]\.cuda\.sources: expected a non-empty"):
        config.parse(bad)
    with pytest.raises(UsageError, match=r"kernels\[0\]\.cuda\.flag: unknown key"):
        config.parse(CONFIG.replace("flags:", "flag:"))
    with pytest.raises(UsageError, match="not a path inside the repository"):
        config.parse(CONFIG.replace("[attention_decode_paged/paged_decode.cu]", "[../x.cu]"))


def test_headers_are_followed_transitively_inside_the_repository(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "k.cu").write_text('#include "a.cuh"\n#include <cuda_fp16.h>\n// #include "commented.cuh"\n')
    (tmp_path / "a.cuh").write_text('#pragma once\n#include "b.cuh"\n')
    (tmp_path / "inc" / "b.cuh").write_text('#include "../k.cu"\n#include "/etc/hostname"\n')  # a cycle; outside
    (tmp_path / "commented.cuh").write_text("")
    found = included_files(tmp_path, tmp_path / "k.cu", ["inc"])
    assert found == {(tmp_path / "a.cuh").resolve(), (tmp_path / "inc" / "b.cuh").resolve()}
    spec = CudaSpec(("*.cu",), ("-I", "inc"))
    assert kernel_files(tmp_path, spec) == {"k.cu", "a.cuh", "inc/b.cuh"}


def test_a_changed_header_changes_the_cuda_kernel(cuda_repo):
    from kernalin_ci.gate.diff import affected_kernels, changed_files, worktrees

    header = cuda_repo / "common" / "decode_attention.cuh"
    header.write_text(header.read_text().replace("#define TILE 32", "#define TILE 64"))
    git(cuda_repo, "commit", "-qam", "bigger tiles")
    cfg = config.parse(CONFIG)
    with worktrees(cuda_repo, "main~1", "main") as (base, head):
        changed = changed_files(cuda_repo, "main~1", "main")
        [a] = affected_kernels(cfg, changed, head, base)
    assert a.status == "changed" and a.reasons == ["common/decode_attention.cuh changed"]


# ------------------------------------------------------------------ the build


@needs_nvcc
def test_ptx_is_built_once_per_source_hash(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(CUDA / "common", src / "common")
    shutil.copy(CUDA / "rope" / "rope.cu", src / "rope.cu")
    spec = CudaSpec(("rope.cu",), ("-Icommon", "-O3"))
    cache = str(tmp_path / "cache")
    first = build_ptx(spec, src, cache)
    assert first.status == "built" and first.sources == ["rope.cu"], first.log
    assert ".entry rope(" in Path(first.ptx[0]).read_text()
    again = build_ptx(spec, src, cache)
    assert again.status == "cached" and again.key == first.key and again.seconds < first.seconds
    (src / "common" / "kernalin_cuda.cuh").write_text((src / "common" / "kernalin_cuda.cuh").read_text() + "\n// x\n")
    changed = build_ptx(spec, src, cache)
    assert changed.status == "built" and changed.key != first.key  # an included header is part of the key
    (src / "rope.cu").write_text((src / "rope.cu").read_text().replace("const int half", "const int half = oops;"))
    broken = build_ptx(spec, src, cache)
    assert broken.status == "failed" and broken.error_location()[0] == "rope.cu", broken.log


@needs_nvcc
@pytest.mark.parametrize("kernel", CUDA_KERNELS, ids=[k.name for k in CUDA_KERNELS])
def test_every_cuda_catalogue_kernel_compiles_to_ptx(kernel, tmp_path):
    spec = CudaSpec.from_json(kernel.cuda)
    res = build_ptx(spec, Path(kernel.root), str(tmp_path))
    assert res.status == "built", res.log


def test_every_cuda_catalogue_kernel_compiles_with_nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc", reason="no cuda-python (pip install '.[cuda]')")
    from kernalin_ci.cuda import nvrtc

    sources = {src for k in CUDA_KERNELS for src in CudaSpec.from_json(k.cuda).files(Path(k.root))}
    assert len(sources) == 4  # the bug variants are -D flags of these (compiled by nvcc above)
    for src in sorted(sources):
        ptx = nvrtc.compile_source(src, "compute_80", (), [CUDA / "common"])
        assert b".visible .entry" in ptx, src


def test_the_catalogue_has_every_op_and_its_cuda_only_bugs():
    ops = {k.op for k in CUDA_KERNELS}
    assert ops == {"rope", "kv_append", "attention.decode", "attention.decode_paged", "decode_step"}
    for op in ops:
        assert any(not k.is_bug for k in CUDA_KERNELS if k.op == op), op
    classes = {k.bug_class for k in CUDA_KERNELS}
    assert {"shared-race", "warp-reduction", "step-order", "unmasked-load", "softmax-no-max"} <= classes
    for k in CUDA_KERNELS:
        assert not k.is_bug or (k.modelled_on or "").startswith("https://"), k.name  # the public fix it models


# ------------------------------------------------------------------ verify and the gate without a GPU


@needs_nvcc
def test_verify_on_the_cpu_says_not_checked_and_never_passes(tmp_path):
    kernel = next(k for k in CUDA_KERNELS if k.name == "cuda/rope/correct_neox")
    args = ["verify", "--op", "rope", "--entry", f"{kernel.path}:entry", "--device", "cpu", "--quiet", "--json", "-"]
    args += ["--cuda-source", "rope/rope.cu", "--cuda-flag=-Icommon"]
    r = cli(*args, cwd=kernel.root)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "not-checked" and out["cases_run"] == 0 and out["findings"] == []
    assert out["build"]["status"] == "built" and out["build"]["sources"] == ["rope/rope.cu"]
    assert {n["reason"] for n in out["not_checked"]} == {"needs-gpu"}
    assert sum(len(n["cases"]) for n in out["not_checked"]) >= 8
    assert out["sanitizer"]["status"] == "not-checked" and out["sanitizer"]["cause"] == "needs a GPU"
    assert out["structural"]["status"] == "not-analysed"
    assert "not checked (needs a GPU)" in r.stderr and "NOT CHECKED" in r.stderr


def test_the_decode_loop_of_cuda_entries_on_the_cpu_is_not_checked_and_never_an_error():
    """`pipeline` with CUDA C++ rope, kv_append and attention entries, their sources named: built once, every case
    not checked (needs a GPU), no finding (without the sources named, each case was an entry-error: 'Torch not
    compiled with CUDA enabled'); a source that does not compile is the build-error finding, as in verify."""
    entries = {"--rope": "rope/correct_neox.py", "--kv-append": "kv_append/correct_per_token.py",
               "--attention": "attention_decode_paged/correct_online_smem.py"}  # fmt: skip
    args = ["pipeline", "--device", "cpu", "--steps", "8", "--quiet", "--json", "-", "--cuda-flag=-Icommon"]
    for flag, path in entries.items():
        args += [flag, f"{path}:entry"]
    for src in ("rope/rope.cu", "kv_append/kv_append.cu", "attention_decode_paged/paged_decode.cu"):
        args += ["--cuda-source", src]
    r = cli(*args, cwd=CUDA)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "not-checked" and out["cases_run"] == 0 and out["findings"] == [], out["findings"]
    assert out["build"]["status"] == "built" and len(out["build"]["sources"]) == 3
    assert {n["reason"] for n in out["not_checked"]} == {"needs-gpu"} and len(out["not_checked"]) >= 4
    broken = [a if a != "--cuda-flag=-Icommon" else "--cuda-flag=-Inowhere" for a in args]
    r = cli(*broken, cwd=CUDA)
    assert r.returncode == 1, r.stderr
    assert [f["bug_class"] for f in json.loads(r.stdout)["findings"]] == ["build-error"]


@needs_nvcc
def test_a_source_that_does_not_compile_is_a_build_error_finding(tmp_path):
    shutil.copytree(CUDA / "common", tmp_path / "common")
    text = (CUDA / "rope" / "rope.cu").read_text().replace("sincosf(pos * theta", "sincosf(pos * thetta")
    (tmp_path / "rope.cu").write_text(text)
    (tmp_path / "entry.py").write_text("def entry(q, k, positions):\n    return q, k\n")
    r = cli("verify", "--op", "rope", "--entry", "entry.py:entry", "--device", "cpu", "--quiet", "--json", "-",
            "--cuda-source", "rope.cu", "--cuda-flag=-Icommon", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 1, r.stderr
    [f] = json.loads(r.stdout)["findings"]
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "thetta" in s)
    assert (f["bug_class"], f["kind"], f["location"]["line"]) == ("build-error", "build", line)
    assert f["location"]["path"].endswith("rope.cu") and 'identifier "thetta" is undefined' in f["message"]


@needs_nvcc
def test_the_gate_on_the_cpu_is_neutral_and_fails_with_fail_on_not_checked(cuda_repo):
    """The pull request tests/test_cuda_gpu.py gates end to end on a GPU (a barrier dropped), on the CPU: the diff
    and the build run, and the report says exactly what was not checked (every case, Compute Sanitizer, the
    benchmark), never a pass."""
    pr_to_cuda_repo(cuda_repo, BARRIER, "", "drop a barrier")
    out = cuda_repo / "out"
    r = cli("run", "--device", "cpu", "--quiet", "--base", "main", "--out", str(out), cwd=cuda_repo)
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["conclusion"] == "neutral", report["reason"]
    assert report["reason"].startswith("not checked (needs a GPU): paged_decode")
    [k] = report["kernels"]
    assert k["status"] == "changed" and k["reasons"] == ["common/decode_attention.cuh changed"]
    v = k["verification"]
    assert v["verdict"] == "not-checked" and v["cases_run"] == 0 and k["failed_by"] == []
    assert v["build"]["status"] == "built" and v["sanitizer"]["status"] == "not-checked"
    assert v["sanitizer"]["cause"] == "needs a GPU" and k["benchmark"] is None
    assert k["benchmark_note"] == "not benchmarked: a CUDA C++ kernel needs a GPU"
    md = (out / "report.md").read_text()
    for said in (
        "**not checked** (needs a GPU)",
        "- **CUDA build:** built",
        "- **Compute Sanitizer:** **not checked (needs a GPU)**",
        "not benchmarked: a CUDA C++ kernel needs a GPU",
    ):
        assert said in md, said
    assert "passed" not in md and "pass ·" not in md
    r = cli("run", "--device", "cpu", "--quiet", "--base", "main", "--out", str(out), "--fail-on",
            "finding,not-checked", cwd=cuda_repo)  # fmt: skip
    assert r.returncode == 1, r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["conclusion"] == "failure" and report["kernels"][0]["failed_by"] == ["not-checked"]


# ------------------------------------------------------------------ Compute Sanitizer's reports (it runs on a GPU)

REPORT = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at paged_decode+0x1d0 in /src/decode_attention.cuh:83
=========     and Read access at paged_decode+0x2a0 in /src/decode_attention.cuh:88 [1024 hazards]
=========     and Read access at paged_decode+0x2f0 in /src/decode_attention.cuh:88 [960 hazards]
=========
========= Warning: Race reported between Write access at paged_decode+0x100 in /src/decode_attention.cuh:70
=========     and Write access at paged_decode+0x100 in /src/decode_attention.cuh:70 [32 hazards]
=========
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""
MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 2 bytes
=========     at append16+0x210 in /src/kv_append.cu:31
=========     by thread (5,0,0) in block (3,0,0)
=========     Address 0x7f00001ffffe is out of bounds
=========
========= Invalid __global__ read of size 4 bytes
=========     at rope+0x90 in /src/rope.cu:12
=========     by thread (0,0,0) in block (0,0,0)
=========
========= ERROR SUMMARY: 2 errors
"""


@needs_nvcc
def test_a_gated_decode_loop_of_cuda_members_on_the_cpu_is_not_checked(cuda_repo):
    """A `.kernalin.yml` pipeline whose members are CUDA C++ kernels: the gate builds their sources for the loop
    and, on the CPU, the loop is not checked (needs a GPU), no finding (each case was an entry-error)."""
    (cuda_repo / "kv_append").mkdir()
    for name in ("kv_append.cu", "correct_per_token.py"):
        shutil.copy(CUDA / "kv_append" / name, cuda_repo / "kv_append" / name)
    config = CONFIG.replace(
        "gate:",
        """  - name: append
    op: kv_append
    entry: kv_append/correct_per_token.py:entry
    params: {block_size: 16}
    cuda: {sources: [kv_append/kv_append.cu], flags: [-Icommon]}
pipelines:
  - {name: loop, kv_append: append, attention: paged_decode, steps: 8}
gate:""",
    )
    (cuda_repo / ".kernalin.yml").write_text(config)
    git(cuda_repo, "add", "-A")
    git(cuda_repo, "commit", "-qm", "a kv_append and a decode loop")
    pr_to_cuda_repo(cuda_repo, VALUES_LOOP, UNROLLED, "unroll the values loop")
    out = cuda_repo / "out"
    r = cli("run", "--device", "cpu", "--quiet", "--base", "main", "--out", str(out), cwd=cuda_repo)
    assert r.returncode == 0, r.stderr
    [loop] = json.loads((out / "report.json").read_text())["pipelines"]
    v = loop["verification"]
    assert v["verdict"] == "not-checked" and v["findings"] == [] and loop["failed_by"] == [], v
    assert v["build"]["status"] == "built" and {n["reason"] for n in v["not_checked"]} == {"needs-gpu"}


def test_sanitizer_reports_map_to_bug_classes():
    from kernalin_ci.cuda.sanitizer import findings, parse

    errors, warnings = parse("racecheck", REPORT)
    [race] = findings(errors, ["tiles"])
    assert (race.bug_class, race.kind, race.check) == ("shared-race", "sanitizer", "sanitizer:racecheck")
    assert (race.location.path, race.location.line) == ("/src/decode_attention.cuh", 83)
    assert "(1984 reports)" in race.message and "in paged_decode" in race.message
    assert len(warnings) == 1  # a benign hazard: a notice, never a finding
    errors, _ = parse("memcheck", MEMCHECK)
    by_class = {f.bug_class: f for f in findings(errors, ["slots"])}
    assert set(by_class) == {"stray-write", "unmasked-load"}
    assert by_class["stray-write"].location.line == 31 and "block (3,0,0)" in by_class["stray-write"].message
    assert parse("initcheck", "========= Uninitialized __global__ memory read of size 4 bytes\n")[0][0].bug_class == (
        "uninitialized-read"
    )
    sync = "========= Barrier error detected. Divergent thread(s) in block\n=========     at k+0x10 in /s/k.cu:9\n"
    assert parse("synccheck", sync)[0][0].bug_class == "barrier-divergence"
    assert parse("memcheck", "========= Program hit cudaErrorInvalidValue on CUDA API call to cudaFree.\n")[0] == []


def test_memcheck_pads_every_allocation_and_the_other_tools_run_plain():
    """A padding token's write just before the cache lands inside the tensor allocated before it unless memcheck
    pads each allocation (the first GPU run missed bug_padding_not_skipped so): --padding on memcheck only."""
    from kernalin_ci.cuda.sanitizer import PADDING, argv

    cmd = argv("/cs", "memcheck", "/log")
    assert cmd[:3] == ["/cs", "--tool", "memcheck"] and cmd[cmd.index("--padding") + 1] == str(PADDING)
    assert PADDING >= 8 * 128 * 4  # a whole row of the widest kv_append case (Hkv=8, D=128, float32)
    for tool in ("racecheck", "initcheck", "synccheck"):
        assert "--padding" not in argv("/cs", tool, "/log")
