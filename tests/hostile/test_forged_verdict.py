"""Attack 3 of issue 13: kernel code under test forges the verdict from inside the dynamic worker.

Every entry here is wrong (the GQA head mapping) and, on its first call, writes forged events and result
files for every case and exits. The parent decides the verdict from the tensors it compares, so each run
must FAIL: the forged 'no findings' events are not findings the parent reads."""

import json
from pathlib import Path

import pytest
from conftest import cli

FORGE = str(Path(__file__).with_name("forge_kernels.py"))


def verify(fn):
    r = cli(
        "verify",
        "--op",
        "attention.decode",
        "--entry",
        f"{FORGE}:{fn}",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--only",
        "dynamic",
        "--quiet",
        "--json",
        "-",
        timeout=600,
    )
    assert r.returncode == 1, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    res = json.loads(r.stdout)
    assert res["verdict"] == "fail"
    return res


def classes(res):
    return {f["bug_class"] for f in res["findings"]}


def messages(res):
    return " ".join(f["message"] for f in res["findings"])


def test_forged_pass_events_without_results_fail():
    res = verify("forge_pass_events")
    assert classes(res) == {"bad-result"}
    assert "no readable result file" in messages(res)


def test_wellformed_forged_results_are_compared_by_the_parent():
    """Files in exactly the format the parent reads, events that say 'no findings': the parent builds the
    inputs again, compares the handed-back output with its own float64 reference, and finds the bug."""
    res = verify("forge_wellformed_results")
    assert "gqa-mapping" in classes(res), res["findings"]


def test_junk_symlinked_and_extra_result_files_are_bad_results():
    res = verify("forge_odd_files")
    text = messages(res)
    assert classes(res) == {"bad-result"}
    assert "inputs handed back" in text  # an output alone: no inputs, no guards
    assert "no readable result file" in text  # the symlink is not followed
    assert "a case not asked for" in text
    assert "files no result named" in text  # the extra files


@pytest.mark.parametrize(
    "fn, says",
    [
        ("forge_early_done", "handed back no result"),
        ("forge_malformed", "malformed event"),
    ],
)
def test_early_done_and_malformed_events_fail(fn, says):
    res = verify(fn)
    assert classes(res) == {"bad-result"} and says in messages(res), res["findings"]


def test_a_forged_end_of_the_decode_pipeline_fails():
    r = cli(
        "pipeline",
        "--kv-append",
        f"{FORGE}:forge_pipeline_steps",
        "--attention",
        f"{FORGE}:forge_pipeline_steps",
        "--device",
        "cpu",
        "--steps",
        "4",
        "--quiet",
        "--json",
        "-",
        timeout=600,
    )
    assert r.returncode == 1, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    res = json.loads(r.stdout)
    assert classes(res) == {"bad-result"} and "after 0 of 4 steps" in messages(res), res["findings"]


def test_claims_the_parent_cannot_accept_are_bad_results(tmp_path):
    """The worker's words about a case that did not run (checked in the parent, no worker needed): 'unsupported'
    at a declared shape, 'interpreter' on a GPU, a case moved to a shape that is none of its alternatives."""
    from kernalin_ci import domain as dm
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.verify.exchange import BadResult
    from kernalin_ci.verify.judge import CaseReader

    op = get_op("attention.decode")
    params = resolve_params(op.name, op.params, {})
    case = next(c for c in op.cases(params, "cpu", "float32") if c.dims["D"] == 64)
    shape = dm.shape_text(dm.shape_of(op, case, params))
    declared = dm.parse(
        {"head_dim": 64, "num_q_heads": case.dims["Hq"], "num_kv_heads": case.dims["Hkv"], "dtype": "float32"}, op
    )

    def read(domain, device, ev):
        reader = CaseReader(op, params, domain, "float32", device, poison=True, root=None)
        return reader(0, case, {"event": "case-done", "index": 0, **ev}, str(tmp_path))

    unsupported = {"status": "not-run", "not_checked": {"shape": shape, "reason": "unsupported", "error": "x"}}
    assert read(dm.Domain(), "cpu", unsupported).ran is None  # undeclared: accepted, as not checked
    with pytest.raises(BadResult, match="a declared shape"):
        read(declared, "cpu", unsupported)
    interpreter = {"status": "not-run", "not_checked": {"reason": "interpreter", "error": "x"}}
    assert read(dm.Domain(), "cpu", interpreter).ran is None
    with pytest.raises(BadResult, match="claimed on cuda"):
        read(dm.Domain(), "cuda", interpreter)
    moved = dict(case.to_json(), dims={**case.dims, "D": 72})
    with pytest.raises(BadResult, match="not one of its alternatives"):
        read(
            dm.Domain(),
            "cpu",
            {
                "status": "ok",
                "file": "case-0.pt",
                "ran": moved,
                "not_checked": {"shape": shape, "reason": "unsupported", "error": "x", "instead": "D=72"},
            },
        )


def test_a_forged_decode_step_loop_fails():
    """decode_step's loop is judged in the parent too: a step forged in the exact part format is compared
    (its caches were not written), and a loop case that ends with no step handed back is a bad result."""
    r = cli(
        "verify",
        "--op",
        "decode_step",
        "--entry",
        f"{FORGE}:forge_decode_step_loop",
        "--device",
        "cpu",
        "--only",
        "dynamic",
        "--param",
        "steps=4",
        "--quiet",
        "--json",
        "-",
        timeout=600,
    )
    assert r.returncode == 1, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    res = json.loads(r.stdout)
    assert "kv-coverage" in classes(res), res["findings"]
