"""Precision the checks hold kernels to: float32 tl.dot on TF32 (recognised from the compiled IR),
and float32 rope held to float32 accuracy with a per-frequency angle allowance."""

import functools
import importlib.util
import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import CHECKS, KERNELS, REPO, cli

from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params
from kernalin_ci.ops.rope import FLOAT32_TOLERANCE, angle_error, row_slack
from kernalin_ci.verify.precision import tf32_dots

TF32_KERNEL = KERNELS / "tf32_attention.py"
PAGED_KERNEL = KERNELS / "tf32_paged.py"


def _lines(path: Path, needle: str) -> list[int]:
    return [i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln]


def _load(path: Path):
    """The kernel file as a fresh module (this process never runs the interpreter: its kernels compile)."""
    spec = importlib.util.spec_from_file_location(f"{path.stem}_jit", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cuda_ttir(path: Path, kernel: str, ptrs: dict, consts: dict) -> str:
    """The TTIR of `kernel` as Triton compiles it for an H100/H200 (sm_90): what a GPU worker hands back."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    fn = getattr(_load(path), kernel)
    sig = {}
    for n in fn.arg_names:
        if n in ptrs:
            sig[n] = ptrs[n]
        elif n == "scale":
            sig[n] = "fp32"
        elif n.startswith("s_"):
            sig[n] = "i32"
        else:
            sig[n] = "constexpr"
    # a fresh cache: a TTIR cached by another checkout of this file would name that checkout's path
    old = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="kernalin-test-triton-") as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            return triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ttir"]
        finally:
            if old is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = old


def _ttir(ieee: bool, ptr: str = "*fp32") -> str:
    consts = {"GROUP": 4, "D": 64, "BLOCK_H": 16, "BLOCK_N": 32, "BLOCK_D": 64, "IEEE": ieee}
    ptrs = {"Q": ptr, "K": ptr, "V": ptr, "Out": ptr, "Lens": "*i32"}
    return _cuda_ttir(TF32_KERNEL, "_decode_dot", ptrs, consts)


def test_tf32_dots_are_read_from_the_compiled_ir_with_their_lines():
    found = tf32_dots(_ttir(ieee=False))
    assert {Path(loc.path).name for loc in found} == {TF32_KERNEL.name}
    want = [i for i, ln in enumerate(TF32_KERNEL.read_text().splitlines(), 1) if "tl.dot(" in ln and "ieee" not in ln]
    assert len(want) == 2 and sorted(loc.line for loc in found) == want


def test_ieee_dots_are_not_tf32_and_upcast_half_inputs_are():
    assert tf32_dots(_ttir(ieee=True)) == ()
    assert len(tf32_dots(_ttir(ieee=False, ptr="*fp16"))) == 2  # the kernel upcasts: float32 operands


# --------------------------------------------------------------------------- the decode loop, judged in the parent


def _paged_ttir(D: int, ieee: bool = False, gqa_bug: bool = False) -> str:
    consts = {"GROUP": 2, "HKV": 2, "D": D, "PAGE": 16, "BLOCK_H": 16, "BLOCK_N": 32, "BLOCK_D": 64}
    ptrs = {"Q": "*fp32", "KC": "*fp32", "VC": "*fp32", "Out": "*fp32", "Tables": "*i32", "Lens": "*i32"}
    return _cuda_ttir(PAGED_KERNEL, "_paged_dot", ptrs, {**consts, "IEEE": ieee, "GQA_BUG": gqa_bug})


@functools.cache
def _worker_steps(task: str, entries: tuple, params_json: str, case_json: str) -> tuple:
    """A 3-step decode loop run by the real worker (its own process, the Triton interpreter): each step's raw
    result as it handed it back."""
    from kernalin_ci.isolate import run_task
    from kernalin_ci.jobs import CasesJob, DynamicJob, PipelineJob
    from kernalin_ci.ops.base import Case
    from kernalin_ci.sandbox import CappedFolder
    from kernalin_ci.verify import exchange

    folder = CappedFolder("kernalin-test-results-")  # the worker writes folder.path, we read folder.view
    params, cases = json.loads(params_json), (Case.from_json(case_json),)
    job: CasesJob
    if task == "verify-dynamic":
        job = DynamicJob(
            op="decode_step",
            entry=entries[0][1],
            root=str(REPO),
            params=params,
            main_dtype="float32",
            cases=cases,
            results=folder.path,
        )
    else:
        job = PipelineJob(
            entries=dict(entries),
            root=str(REPO),
            params=params,
            dtype="float32",
            seed=0,
            cases=cases,
            results=folder.path,
        )
    events: list = []
    with folder:
        outcome = run_task(job, "cpu", 300, lambda ev: events.append(ev) or True, writable=(folder,))
        assert outcome.status == "ok", outcome.ended()
        parts = [ev for ev in events if ev.get("event") == "case-part"]
        assert [ev["part"] for ev in parts] == [0, 1, 2], events
        raws = tuple(exchange.load(folder.view, exchange.part_name(0, ev["part"]), ev["file"]) for ev in parts)
        assert os.listdir(folder.view) == []  # each file is removed as it is read
    assert all(raw["ttir"] == [] for raw in raws)  # nothing is recorded on the CPU
    return raws


def _decode_step_parts(fn_name: str) -> tuple:
    op = get_op("decode_step")
    params = resolve_params(op.name, op.params, {"steps": 3})
    case = op.cases(params, "cpu", "float32")[0]
    entry = f"{PAGED_KERNEL.relative_to(REPO)}:{fn_name}"
    raws = _worker_steps("verify-dynamic", (("decode_step", entry),), json.dumps(params), json.dumps(case.to_json()))
    return op, params, case, list(raws)


def _judge_loop(read, case, raws: list, ttir: list, results: Path):
    """The parent reading the steps as a GPU worker would hand them back (the same tensors, with the TTIR of
    the kernel it launched): part files and case-part events, then the case-done event."""
    from kernalin_ci.verify.exchange import hand_back_parts

    events: list = []
    hand_back = hand_back_parts(events.append, str(results), 0)
    for step, raw in enumerate(raws):
        hand_back(step, {**raw, "ttir": ttir}, 0.0)
    for ev in events:
        read.part(0, case, ev, str(results))
    return read(0, case, {"event": "case-done", "index": 0, "status": "ok"}, str(results))


def _case_reader(op, params, case, device: str):
    from kernalin_ci.domain import Domain
    from kernalin_ci.verify.judge import CaseReader

    return CaseReader(op, params, Domain(), "float32", device, poison=True, root=str(REPO))


def _scaled(raws: list, name: str, factor: float) -> list:
    """The steps with step 0's `name` (the output, or the new keys' rows of the cache) scaled: relative error
    factor - 1, as a worker could hand it back."""
    first = dict(raws[0])
    t = first[name].clone()
    if name == "k_cache":
        t.view(-1, *t.shape[2:])[first["slot_mapping"]] *= factor
    else:
        t *= factor
    first[name] = t
    return [first, *raws[1:]]


def test_decode_step_loop_judges_a_tf32_attention_output_at_the_tf32_tolerance(tmp_path):
    """The loop's steps are judged by the single-kernel rule: on a GPU a float32 attention output whose kernel
    holds a TF32 dot (read in the parent from the TTIR handed back) is judged at 1.5e-2 with the notice naming
    the dot's line. An output 8e-3 off (what TF32 rounding can leave, beyond the loop's float32 4e-3) passes
    then, and is a finding with an ieee TTIR, with none, or on the CPU."""
    op, params, case, raws = _decode_step_parts("decode_step")
    line = _lines(PAGED_KERNEL, "tl.dot(q, tl.trans(k)) * scale")[0]
    off = _scaled(raws, "out", 1.008)
    for steps in (raws, off):
        r = _judge_loop(_case_reader(op, params, case, "cuda"), case, steps, [_paged_ttir(40)], tmp_path)
        assert r.findings == [], r.findings
        assert [(n.check, n.message) for n in r.notices] == [
            (
                "tf32",
                "float32 attention output judged at TF32 tolerance (0.015): tl.dot input precision tf32 at "
                f"tests/kernels/tf32_paged.py:{line}",
            )
        ]
    for device, ttir in (("cuda", [_paged_ttir(40, ieee=True)]), ("cuda", []), ("cpu", [_paged_ttir(40)])):
        assert _judge_loop(_case_reader(op, params, case, device), case, raws, ttir, tmp_path).notices == []
        r = _judge_loop(_case_reader(op, params, case, device), case, off, ttir, tmp_path)
        assert [(f.check, f.bug_class) for f in r.findings] == [("decode-step-attention", "wrong-output")], device
        assert "tolerance 0.004" in r.findings[0].message and r.notices == []


def test_a_tf32_ttir_never_loosens_the_caches_of_a_decode_step(tmp_path):
    """Only the output a dot computes is judged at the TF32 tolerance: rotated new keys 8e-3 off in the cache
    are a kv-slot finding with a TF32 TTIR too."""
    op, params, case, raws = _decode_step_parts("decode_step")
    r = _judge_loop(
        _case_reader(op, params, case, "cuda"), case, _scaled(raws, "k_cache", 1.008), [_paged_ttir(40)], tmp_path
    )
    assert [(f.check, f.bug_class) for f in r.findings] == [("decode-step-cache", "kv-slot")], r.findings


def test_decode_pipeline_judges_a_tf32_attention_entry_at_the_tf32_tolerance(tmp_path):
    """The pipeline's reader: the attention entry's TTIR handed back with each step gives the TF32 notice."""
    from kernalin_ci.ops.base import Case
    from kernalin_ci.verify import pipeline_params
    from kernalin_ci.verify.loop_judge import PipelineReader

    entries = {
        "kv_append": f"{(KERNELS / 'triton_kv_append.py').relative_to(REPO)}:entry",
        "attention.decode_paged": f"{PAGED_KERNEL.relative_to(REPO)}:attention",
    }
    params = pipeline_params(entries, {})
    case = Case("decode-loop", {"steps": 3, "D": 64, "instead": []}, "float32", 0)
    raws = _worker_steps("verify-pipeline", tuple(entries.items()), json.dumps(params), json.dumps(case.to_json()))
    for device, ttir, notes in (("cuda", [_paged_ttir(64)], 1), ("cpu", [_paged_ttir(64)], 0)):
        read = PipelineReader(params, "float32", 0, device, False, root=str(REPO))
        r = _judge_loop(read, case, list(raws), ttir, tmp_path)
        assert r.findings == [] and len(r.notices) == notes, (device, r.findings, r.notices)
        assert all("at tests/kernels/tf32_paged.py:" in n.message for n in r.notices)


def test_the_tf32_tolerance_never_tightens_a_case_s_own():
    """A reference that allows more than TF32 (a custom op's own tolerance) keeps it."""
    from kernalin_ci.ops.base import Case, Expected
    from kernalin_ci.verify.precision import TF32_TOLERANCE
    from kernalin_ci.verify.reference import check_reference

    op = get_op("attention.decode")
    params = resolve_params(op.name, op.params, {})
    case = Case("small", {"Hq": 4, "Hkv": 2, "D": 16, "kv_lens": [3, 9], "scale": 0.25}, "float32", 0)
    before = op.inputs(case, params, "cpu", poison=False)
    want = op.reference(before, params).tensors
    outs = {k: (v * 1.03).to(torch.float32) for k, v in want.items()}  # 3% off
    loose = Expected(want, tolerance=0.05)
    assert check_reference(op, case, before, outs, params, {}, TF32_TOLERANCE, loose) == []
    assert check_reference(op, case, before, outs, params, {}, TF32_TOLERANCE, Expected(want)) != []


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """A float32 operand as a tensor core reads it in TF32 (mantissa truncated to 10 bits)."""
    return (t.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def test_a_sink_dominated_row_allows_the_tf32_error_of_its_scores_and_a_sink_bug_is_still_caught():
    """On an H100, SGLang's paged decode with sinks (float32, TF32 dots) was 0.0169 off in one row of the
    large-scores case (kv_len 2: the sink takes nearly all the mass, so normalisation does not cancel the scores'
    TF32 error), above the flat TF32 tolerance: a false finding. The row's allowance now adds what TF32 operands
    of q.k move it; the kernel's output is emulated here by the reference over TF32-truncated q and keys."""
    from kernalin_ci.ops.base import Case, Expected
    from kernalin_ci.verify.precision import TF32_TOLERANCE
    from kernalin_ci.verify.reference import check_reference

    op = get_op("attention.decode_paged")
    params = resolve_params(op.name, op.params, {"block_size": 16, "sinks": True})
    dims = {"Hq": 8, "Hkv": 2, "D": 64, "kv_lens": [2, 16, 100, 257], "scale": 0.125, "qk_std": 6.5}
    case = Case("large-scores", dims, "float32", 5, ("large-scores",))
    before = op.inputs(case, params, "cpu", poison=False)
    expected = op.reference(before, params)
    tf32_in = {**before, "q": _tf32(before["q"]), "k_cache": _tf32(before["k_cache"])}
    outs = {"out": op.reference(tf32_in, params).tensors["out"].to(torch.float32)}
    assert check_reference(op, case, before, outs, params, {}, TF32_TOLERANCE, expected) == []
    flat = Expected(expected.tensors, row_slack=expected.row_slack)  # the TF32 tolerance alone: the old false finding
    assert [f.bug_class for f in check_reference(op, case, before, outs, params, {}, TF32_TOLERANCE, flat)] == [
        "wrong-output"
    ]
    assert check_reference(op, case, before, outs, params, {}, None, expected) != []  # not on TF32: no allowance
    no_sinks = resolve_params(op.name, op.params, {"block_size": 16})
    dropped = {"out": op.reference(tf32_in, no_sinks).tensors["out"].to(torch.float32)}  # a kernel that drops them
    assert check_reference(op, case, before, dropped, params, {}, TF32_TOLERANCE, expected) != []


# --------------------------------------------------------------------------- rope


def test_angle_allowance_is_per_frequency_and_grows_with_the_position():
    pos = torch.tensor([0, 1, 1000, 65535])
    err = angle_error(pos, 10000.0, 64)
    assert bool((err[0] == 0).all()) and bool((err[1:, 0] > err[1:, -1] * 1000).all())
    assert float(err[3, 0]) < 0.05 and float(err[1, 0]) < 1e-6  # a few float32 roundings of the angle
    # fixed inputs: the allowance scales with the row's magnitude (unseeded, 8% of draws passed 2e-5 below)
    x = torch.randn(4, 2, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    slack = row_slack(x, pos, "neox", 10000.0, 64)
    assert slack.shape == (8,) and float(slack[:2].max()) == 0.0
    # a cos/sin table in float16 is off by ~1.4e-4 per row: well above what is allowed up to position 100
    small = row_slack(x[:1].expand(3, 2, 64), torch.tensor([7, 31, 100]), "neox", 10000.0, 64)
    assert float(small.max()) + FLOAT32_TOLERANCE < 3e-5


def _case(name):
    op = get_op("rope")
    p = resolve_params("rope", op.params, {"style": "gptj"})
    return json.dumps(next(c for c in op.cases(p, "cpu", "float32") if c.name == name).to_json())


def _verify(entry, *extra):
    r = cli(
        "verify",
        "--op",
        "rope",
        "--entry",
        entry,
        "--device",
        "cpu",
        "--quiet",
        "--only",
        "dynamic",
        "--json",
        "-",
        *extra,
    )
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def test_float16_cos_sin_table_on_float32_activations_is_a_precision_finding():
    rc, res = _verify(
        f"{CHECKS}/rope/bug_precision_fp16_table.py:entry", "--param", "style=gptj", "--case", _case("positions")
    )
    assert rc == 1 and {f["bug_class"] for f in res["findings"]} == {"precision"}, res["findings"]


@pytest.mark.parametrize("name,style", [("correct_gptj_table", "gptj"), ("correct_neox", "neox")])
def test_correct_float32_rope_stays_clean_at_float32_accuracy(name, style):
    rc, res = _verify(f"{CHECKS}/rope/{name}.py:entry", "--param", f"style={style}", "--case", _case("positions"))
    assert rc == 0, res["findings"]


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_tf32_entry_is_judged_at_tf32_tolerance_with_a_notice_on_the_gpu():
    """kernalin-ci verify on cuda: the default-precision kernel passes with the TF32 notice naming its dot's line;
    the ieee kernel passes without one."""
    line = _lines(TF32_KERNEL, "tl.dot(q, tl.trans(k)) * scale")[0]
    r = cli(
        "verify",
        "--op",
        "attention.decode",
        "--entry",
        f"{TF32_KERNEL}:entry",
        "--device",
        "cuda",
        "--only",
        "dynamic",
        "--dtype",
        "float32",
        "--quiet",
        "--json",
        "-",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout)
    notes = [n["message"] for n in res["notices"] if n["check"] == "tf32"]
    assert notes and "float32 judged at TF32 tolerance" in notes[0] and f"tf32_attention.py:{line}" in notes[0]
    r = cli(
        "verify",
        "--op",
        "attention.decode",
        "--entry",
        f"{TF32_KERNEL}:entry_ieee",
        "--device",
        "cuda",
        "--only",
        "dynamic",
        "--dtype",
        "float32",
        "--quiet",
        "--json",
        "-",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [n for n in json.loads(r.stdout)["notices"] if n["check"] == "tf32"]


@pytest.mark.gpu
def test_tf32_decode_loops_pass_with_the_notice_and_a_mutant_is_still_caught_on_the_gpu():
    """decode_step and the decode pipeline on cuda in float32, attention by a default-precision (TF32) tl.dot:
    both pass with the TF32 notice naming the dot's line; the GQA mutant of the same kernel is still caught."""
    line = _lines(PAGED_KERNEL, "tl.dot(q, tl.trans(k)) * scale")[0]

    def run(*args):
        r = cli(*args, "--device", "cuda", "--dtype", "float32", "--quiet", "--json", "-")
        assert r.returncode in (0, 1), r.stdout + r.stderr
        res = json.loads(r.stdout)
        return r.returncode, res, [n["message"] for n in res["notices"] if n["check"] == "tf32"]

    step = ("verify", "--op", "decode_step", "--only", "dynamic", "--param", "steps=16", "--entry")
    rc, res, notes = run(*step, f"{PAGED_KERNEL}:decode_step")
    assert rc == 0, res["findings"]
    assert notes == [
        f"float32 attention output judged at TF32 tolerance (0.015): tl.dot input precision tf32 at "
        f"tests/kernels/tf32_paged.py:{line}"
    ], notes
    rc, res, notes = run(*step, f"{PAGED_KERNEL}:decode_step_gqa_bug")
    assert rc == 1 and {f["check"] for f in res["findings"]} == {"decode-step-attention"}, res["findings"]
    rc, res, notes = run(
        "pipeline",
        "--kv-append",
        f"{KERNELS}/triton_kv_append.py:entry",
        "--attention",
        f"{PAGED_KERNEL}:attention",
        "--steps",
        "16",
    )
    assert rc == 0 and len(notes) == 1 and f"tf32_paged.py:{line}" in notes[0], (res["findings"], notes)


def test_a_notice_every_case_gives_is_said_once():
    """The TF32 notice of the decode pipeline's five cases is one notice (on an H100 it was five), a different
    one is kept beside it."""
    from kernalin_ci.findings import Notice
    from kernalin_ci.verify.supervisor import CasesRun

    run = CasesRun()
    tf32 = Notice("tf32", "float32 attention output judged at TF32 tolerance (0.015): tl.dot at k.py:44")
    for _ in range(5):
        run.note([Notice(tf32.check, tf32.message)])
    run.note([Notice("tf32", "another dot at k.py:50")])
    assert [n.message for n in run.notices] == [tf32.message, "another dot at k.py:50"]
