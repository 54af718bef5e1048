"""The dynamic engine's mechanics, end to end through the real CLI and worker processes:
isolation (hang, segfault), poison (unwritten output, out-of-bounds writes), input
immutability, fresh inputs (result caching), fingerprints, exit codes and JSON."""

import json

import pytest
from conftest import KERNELS, cli

ATT = str(KERNELS / "torch_attention.py")
KV = str(KERNELS / "triton_kv_append.py")


def verify(op, entry, *extra):
    r = cli("verify", "--op", op, "--entry", entry, "--device", "cpu", "--quiet", "--json", "-", *extra)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def classes(result):
    return {f["bug_class"] for f in result["findings"]}


def test_correct_entry_passes_every_case():
    rc, res = verify("attention.decode", f"{ATT}:entry")
    assert rc == 0 and res["verdict"] == "pass" and res["findings"] == []
    # 8 float32 cases + a float16/bfloat16 sweep of 4 + one small case at each usual head dim the plan
    # does not reach (80, 96, 256)
    assert res["cases_run"] == 15
    assert res["coverage"]["head_dims"] == [64, 80, 96, 128, 256] and res["not_checked"] == []
    assert set(res) >= {"op", "entry", "verdict", "cases_run", "seconds", "findings"}


def test_parent_never_imports_torch():
    """The CLI resolves params and builds every op's cases without torch (a 3 s import on a CUDA
    machine, paid again by each worker); only the workers import it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from kernalin_ci import cli, catalogue, verify\n"
        "from kernalin_ci.ops import NAMES, get_op\n"
        "from kernalin_ci.ops.base import resolve_params\n"
        "for name in NAMES:\n"
        "    if name != 'custom':\n"
        "        op = get_op(name)\n"
        "        p = resolve_params(name, op.params, {})\n"
        "        for device in ('cpu', 'cuda'):\n"
        "            [c.to_json() for c in op.cases(p, device, None) + [op.probe(p, None)]]\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "fn, expected",
    [
        ("gqa_modulo", "gqa-mapping"),
        ("zeroes_input", "input-modified"),
        ("half_written", "unwritten-output"),
        ("caches_by_shape", "stale-result"),
        ("raises", "entry-error"),
    ],
)
def test_defects_are_named(fn, expected):
    rc, res = verify("attention.decode", f"{ATT}:{fn}")
    assert rc == 1 and expected in classes(res), res["findings"]
    f = next(f for f in res["findings"] if f["bug_class"] == expected)
    assert f["case"]["name"] and "--case" in f["reproduce"]


def test_reproduce_command_reruns_exactly_that_case():
    _, res = verify("attention.decode", f"{ATT}:gqa_modulo")
    f = res["findings"][0]
    case = json.dumps(f["case"])
    rc, again = verify("attention.decode", f"{ATT}:gqa_modulo", "--case", case)
    assert rc == 1 and again["cases_run"] == 1 and classes(again) == {"gqa-mapping"}


def test_a_hang_is_a_timeout_finding_and_the_other_cases_still_run():
    rc, res = verify("attention.decode", f"{ATT}:hangs_on_gqa1", "--timeout", "20")
    assert rc == 1 and classes(res) == {"timeout"}
    assert res["findings"][0]["case"]["name"] == "gqa-1"
    assert res["cases_run"] == 15


def test_a_segfault_is_a_crash_finding_and_the_other_cases_still_run():
    rc, res = verify("attention.decode", f"{ATT}:segfaults_on_gqa1")
    assert rc == 1 and classes(res) == {"crashed"}
    f = res["findings"][0]
    assert f["case"]["name"] == "gqa-1" and "SIGSEGV" in f["message"]
    assert res["cases_run"] == 15


def test_kernel_stdout_is_not_mistaken_for_engine_events():
    rc, res = verify("attention.decode", f"{ATT}:prints_a_lot")
    assert rc == 0 and res["cases_run"] == 15


def test_pos0_probe_misses_what_the_cases_catch():
    rc, res = verify("attention.decode", f"{ATT}:gqa_modulo", "--probe", "pos0")
    # the probe has Hq=8, Hkv=2: the modulo mapping reads the wrong head even at kv_len 1
    assert rc == 1 and res["cases_run"] == 1
    rc, res = verify("attention.decode", f"{ATT}:half_written", "--probe", "pos0")
    assert rc == 1  # unwritten heads hold garbage without poison, not the reference


def test_triton_kv_append_correct_and_padding_written():
    rc, res = verify("kv_append", f"{KV}:entry", "--dtype", "float32")
    assert rc == 0, res["findings"]
    rc, res = verify("kv_append", f"{KV}:no_padding_skip", "--dtype", "float32")
    assert rc == 1 and "kv-padding" in classes(res), res["findings"]
    rc, res = verify("kv_append", f"{KV}:no_padding_skip", "--probe", "pos0")
    assert rc == 0  # the probe has no padding token


def test_kernel_code_does_not_see_the_gates_credentials():
    secrets = {
        "GITHUB_TOKEN": "ghs_x",
        "GH_TOKEN": "gho_x",
        "KERNALIN_GITHUB_APP_PRIVATE_KEY": "k",
        "ACTIONS_RUNTIME_TOKEN": "t",
    }
    r = cli(
        "verify",
        "--op",
        "attention.decode",
        "--entry",
        f"{ATT}:reads_credentials",
        "--device",
        "cpu",
        "--quiet",
        "--json",
        "-",
        env=secrets,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_broken_structural_package_is_an_error_never_a_silent_skip():
    """If the structural checks cannot be imported, verify cannot run without them: `kernalin_ci.verify`
    imports them at its top, so its own import fails (a fresh interpreter, the package made unimportable)."""
    import subprocess
    import sys

    code = "import sys\nsys.modules['kernalin_ci.verify.structural'] = None\nimport kernalin_ci.verify\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=KERNELS.parent.parent)
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError") and "kernalin_ci.verify.structural" in last, r.stderr
