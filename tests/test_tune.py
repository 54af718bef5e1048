"""kernalin-ci tune on the CPU: search space, verification before timing, the race's decision code and
the patch writer. Timing here is wall clock under the Triton interpreter: no assertion reads a time."""

import ast
import json
import shutil
import subprocess

import numpy as np
import pytest
from conftest import REPO, cli

from kernalin_ci.errors import UsageError
from kernalin_ci.progress import TerminalSink
from kernalin_ci.testing.pytest_fixtures import github_standin  # noqa: F401
from kernalin_ci.tune import patch, race
from kernalin_ci.tune.space import TuneSpec, build_space

FIXTURES = REPO / "tests" / "tune_kernels"
BENCH_KERNELS = REPO / "benchmarks" / "kernels" / "tune"
CONFIG = """\
version: 1
kernels:
  - name: paged
    op: attention.decode_paged
    entry: kernels/{file}:entry
    params: {{block_size: 16}}
    dtype: float32
    domain: {{head_dim: 32, num_q_heads: 2, num_kv_heads: 1}}
{tune}"""


def repo(tmp_path, file, tune="", text=None):
    (tmp_path / "kernels").mkdir(parents=True)
    if text is None:
        shutil.copy(FIXTURES / file, tmp_path / "kernels" / file)
    else:
        (tmp_path / "kernels" / file).write_text(text)
    (tmp_path / ".kernalin.yml").write_text(CONFIG.format(file=file, tune=tune))
    return tmp_path


# ---------------------------------------------------------------- search space


def test_space_from_tune_params_reads_the_entry_defaults(tmp_path):
    root = repo(tmp_path, "paged_tiles.py")
    spec = TuneSpec({"BLOCK_N": [16, 32], "num_warps": [4, 8]}, use_autotune=False)
    space = build_space(spec, "kernels/paged_tiles.py:entry", str(root), "cpu")
    assert space.current.params == {"BLOCK_N": 16, "num_warps": 4}
    assert [c.params for c in space.candidates] == [
        {"BLOCK_N": 16, "num_warps": 8},
        {"BLOCK_N": 32, "num_warps": 4},
        {"BLOCK_N": 32, "num_warps": 8},
    ]
    assert space.entry_file == "kernels/paged_tiles.py"
    with pytest.raises(UsageError, match="no keyword parameter 'BLOCK_M'"):
        build_space(TuneSpec({"BLOCK_M": [16]}, use_autotune=False), "kernels/paged_tiles.py:entry", str(root), "cpu")


def test_config_tune_section_is_validated(tmp_path):
    root = repo(tmp_path, "paged_tiles.py", "    tune: {params: {BLOCK_N: 16}}\n")
    r = cli("tune", "paged", "--device", "cpu", cwd=root)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "tune.params.BLOCK_N: expected a non-empty list" in r.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    root = repo(tmp_path, "paged_tiles.py", "    tune: {params: {BLOCK_N: [16, 32]}}\n")
    for args in (
        ["nope"],
        [],
        ["paged", "--space", "BLOCK_N"],
        ["paged", "--space", "TILE=8,16", "--no-autotune"],
        ["paged", "--budget-s", "0"],
    ):
        r = cli("tune", *args, "--device", "cpu", cwd=root)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


# ---------------------------------------------------------------- verification before timing (real kernels)


def test_a_tile_larger_than_the_page_is_dropped_with_its_finding_and_never_timed(tmp_path):
    root = repo(tmp_path, "paged_tiles.py", "    tune: {params: {BLOCK_N: [16, 32], num_warps: [2]}}\n")
    r = cli("tune", "paged", "--device", "cpu", "--budget-s", "1", "--out", "out", cwd=root)
    assert r.returncode == 0, r.stderr
    out = json.loads((root / "out" / "tune.json").read_text())
    # progress on stderr: the space, each verification, the drops, each timing round of the race
    progress = r.stderr.splitlines()
    assert "tune paged: 2 candidates (BLOCK_N in [16, 32]; num_warps in [2]) on cpu" in progress
    assert sum(line.startswith("  verify ") for line in progress) == 3
    assert any(line.startswith("verified: 1 of 2 candidates pass, 1 dropped (") for line in progress)
    assert any(line.startswith("  final race of 1 configs and current: ") for line in progress)
    assert out["stopped"] in ("settled", "budget", "rounds") and out["final_rounds"] >= 1
    checked = {c["label"]: c for c in out["verification"]}
    assert checked["BLOCK_N=32 num_warps=2"]["passed"] is False
    assert checked["BLOCK_N=32 num_warps=2"]["findings"], "dropped without a finding"
    assert checked["BLOCK_N=16 num_warps=2"]["passed"] is True
    assert next(c for c in out["verification"] if c["name"] == "current")["passed"] is True
    bad = next(c["name"] for c in out["verification"] if c["label"] == "BLOCK_N=32 num_warps=2")
    good = next(c["name"] for c in out["verification"] if c["label"] == "BLOCK_N=16 num_warps=2")
    assert bad not in out["timed"] and {"current", good} <= set(out["timed"])
    assert [d["label"] for d in out["dropped"]] == ["BLOCK_N=32 num_warps=2"]
    assert out["reference"] == "current" and out["chosen"] in ("current", good)
    assert len(out["per_shape"]) == len(out["shapes"]) >= 1
    assert "dropped  BLOCK_N=32 num_warps=2:" in r.stdout
    assert "BLOCK_N=32 num_warps=2" in (root / "out" / "tune.md").read_text()


BENCH_CONFIGS = 'CONFIGS = [triton.Config({"BLOCK_N": n}, num_warps=w) for n in (16, 32, 64) for w in (2, 4)]'


def paged_autotuned() -> str:
    """The benchmark's autotuned paged kernel (benchmarks/kernels/tune/), its space narrowed to BLOCK_N 16
    (right) and 32 (larger than the page: wrong) at num_warps 4, two verifications instead of six."""
    text = (BENCH_KERNELS / "paged_autotuned.py").read_text()
    assert text.count(BENCH_CONFIGS) == 1, "the benchmark kernel's CONFIGS line changed: update this test"
    return text.replace(BENCH_CONFIGS, BENCH_CONFIGS.replace("(16, 32, 64)", "(16, 32)").replace("(2, 4)", "(4,)"))


def git(cwd, *args) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def test_autotune_space_drops_the_wrong_config_writes_the_verified_list_and_opens_a_pr(tmp_path, github_standin):
    """--write edits the working tree; --github pushes HEAD + the patch to a branch of origin (a real bare
    repository) and opens a pull request into the current branch on the GitHub stand-in."""
    root = repo(tmp_path / "work", "paged_autotuned.py", text=paged_autotuned())
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(root, "init", "-q", "-b", "main")
    git(root, "-c", "user.name=dev", "-c", "user.email=dev@example.invalid", "commit", "-q", "--allow-empty", "-m", "0")
    git(root, "add", "-A")
    git(root, "-c", "user.name=dev", "-c", "user.email=dev@example.invalid", "commit", "-q", "-m", "kernels")
    git(root, "remote", "add", "origin", str(origin))
    git(root, "push", "-q", "origin", "main")
    head = git(root, "rev-parse", "HEAD").strip()
    github_standin.add_repo("acme/kernels", git_dir=str(origin))
    github_standin.add_token("ghs_tuneTokenForTests0123456789abcdef0000")
    env = {
        "GITHUB_API_URL": github_standin.base_url,
        "GITHUB_TOKEN": "ghs_tuneTokenForTests0123456789abcdef0000",
        "GITHUB_REPOSITORY": "acme/kernels",
        "GITHUB_ACTIONS": "",
    }
    args = ("tune", "paged", "--device", "cpu", "--budget-s", "1", "--out", "out", "--write", "--github")
    r = cli(*args, cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads((root / "out" / "tune.json").read_text())
    k = out["space"]["autotune"]  # discovered in a worker: the gate process never imports the kernel
    assert (k["kernel"], k["file"], k["key"]) == ("_paged_tiles", "kernels/paged_autotuned.py", ["D"])
    assert [c["kwargs"] for c in k["configs"]] == [{"BLOCK_N": 16}, {"BLOCK_N": 32}]
    assert [c["label"] for c in out["verification"]] == [
        "(entry as it is)",
        "BLOCK_N=16 num_warps=4 num_stages=3 num_ctas=1",
        "BLOCK_N=32 num_warps=4 num_stages=3 num_ctas=1",
    ]
    assert out["verification"][0]["passed"] is None  # the full autotuner cannot run under the interpreter
    assert "verified: 1 of 2 candidates pass, 1 dropped (" in r.stderr
    assert [d["label"] for d in out["dropped"]] == ["BLOCK_N=32 num_warps=4 num_stages=3 num_ctas=1"]
    assert out["dropped"][0]["findings"]
    assert out["timed"] == [] and out["stopped"] == "single"
    src = (root / "kernels" / "paged_autotuned.py").read_text()
    tree = ast.parse(src)
    deco = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_paged_tiles")
    assert "configs=CONFIGS" in ast.unparse(deco.decorator_list[0])
    configs = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "CONFIGS").value
    assert [ast.unparse(e) for e in configs.elts] == [
        "triton.Config({'BLOCK_N': 16}, num_warps=4, num_stages=3, num_ctas=1)"
    ]
    assert (root / "out" / "tune.patch").read_text().startswith("--- a/kernels/paged_autotuned.py")
    # --github: HEAD + the patch on a branch of origin, a pull request of it into main; HEAD stays
    (pr,) = github_standin.pulls("acme/kernels")
    branch = pr["head_ref"]
    assert branch.startswith("kernalin-ci/tune/paged-") and pr["base_ref"] == "main" and pr["base_sha"] == head
    assert pr["title"] == "kernalin-ci tune: paged: BLOCK_N=16 num_warps=4 num_stages=3 num_ctas=1"
    assert "BLOCK_N=32 num_warps=4" in pr["body"] and "```diff" in pr["body"]  # tune.md: the dropped config
    pushed = git(origin, "rev-parse", f"refs/heads/{branch}").strip()
    assert pr["head_sha"] == pushed and git(origin, "rev-parse", f"{pushed}^").strip() == head
    assert git(origin, "show", f"{pushed}:kernels/paged_autotuned.py") == src  # what --write wrote
    assert git(root, "rev-parse", "HEAD").strip() == head and git(root, "symbolic-ref", "--short", "HEAD") == "main\n"
    assert f"opened pull request #{pr['number']}" in r.stdout


# ---------------------------------------------------------------- the race: set up once


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_race_sets_every_shape_up_once_for_screening_and_the_final_rounds(tmp_path, device):
    """A real race (the benchmark's split-KV kernel, NUM_SPLITS as a keyword): one benchmark worker makes
    each shape's inputs once, prepares each instance once (a CUDA graph to check and one to time, on a
    GPU) and runs the screening rung and the final rounds on them. A worker per rung or chunk, inputs
    made per round or graphs captured per round fail it. The configs are not verified here (the race
    alone: the other tests verify before racing); nothing reads a time."""
    from kernalin_ci.bench import stats
    from kernalin_ci.tune.run import Checked, Target, TuneResult, _race
    from kernalin_ci.tune.space import candidate_source

    root, entry = str(REPO / "benchmarks"), "kernels/tune/split_kv.py:entry"
    space = build_space(TuneSpec({"NUM_SPLITS": [2, 4, 8]}, use_autotune=False), entry, root, device)
    assert space.current.params["NUM_SPLITS"] == 4 and len(space.candidates) == 2
    entries = {"current": entry}
    for c in space.candidates:
        (tmp_path / f"{c.name}.py").write_text(candidate_source(entry, root, c))
        entries[c.name] = f"{tmp_path / c.name}.py:entry"
    result = TuneResult(Target("attention.decode", entry, root), device, space, budget_s=2.0)
    result.checked = [Checked(c, True, note="not verified: the race alone") for c in [space.current, *space.candidates]]
    field = ["current", *(c.name for c in space.candidates)]
    said = []
    _race(result, result.target, entries, root, field, device, 2.0, None, 0.005, 1, 1, 0, None, said.append)

    assert result.stopped in ("settled", "budget", "rounds"), (result.stopped, result.notes)
    setup = result.race_setup
    shapes = len(result.shapes)
    assert shapes >= 1 and setup["workers"] == 1 and setup["setups"] == [1] * shapes
    assert setup["inputs_made"] == [1] * shapes  # attention.decode redraws its inputs in place each round
    instances = len(field) + 1  # and the A/A copy of the current config
    assert setup["graph_captures"] == [2 * instances if device == "cuda" else 0] * shapes
    (rung,) = result.rungs  # two candidates, one finalist: one screening rung, then the final race
    assert rung["field"] == field[1:] and len(rung["kept"]) == 1 and rung["rounds"] >= 1
    assert result.final_rounds >= stats.MIN_ROUNDS
    assert setup["rounds"] == rung["rounds"] + result.final_rounds  # all of them in that one worker
    assert set(result.timed) == set(field) and len(result.judgements) == shapes
    lines = [TerminalSink().line(ev).text for ev in said]
    assert sum(line.startswith("  benchmark set up for the race: 4 instances") for line in lines) == 1


# ---------------------------------------------------------------- the race's decision code


def synthetic(ms_per_shape: dict, rounds=12, reps=3, noise=0.002, seed=0):
    """{name: [ms of shape 0, ms of shape 1, ...]} -> {name: [rounds, shapes, reps]} with lognormal noise."""
    rng = np.random.default_rng(seed)
    return {
        n: np.asarray(ms)[None, :, None] * np.exp(rng.normal(0, noise, (rounds, len(ms), reps)))
        for n, ms in ms_per_shape.items()
    }


def test_screening_keeps_each_shapes_winner_first():
    t = synthetic({"a": [1.0, 2.0], "b": [1.5, 1.0], "c": [1.1, 2.1], "d": [2.0, 3.0]})
    assert race.screen(t, ["a", "b", "c", "d"], 2) == ["a", "b"]
    assert race.screen(t, ["a", "b", "c", "d"], 3) == ["a", "b", "c"]
    assert race.halve(7, 3) == 4 and race.halve(4, 3) == 3


def test_judge_gives_best_posterior_and_equivalents_per_shape():
    t = synthetic(
        {"current": [1.0, 1.0], "base2": [1.0, 1.0], "fast": [0.80, 1.0], "fast2": [0.801, 1.3], "slow": [1.2, 1.0005]}
    )
    js = race.judge(t, "current", "base2", ["current", "fast", "fast2", "slow"], rope_min=0.01)
    assert js[0].best in ("fast", "fast2") and set([js[0].best, *js[0].equivalent]) == {"fast", "fast2"}
    assert js[0].vs_reference["fast"].verdict == "faster" and js[0].vs_reference["slow"].verdict == "slower"
    assert js[1].best in ("current", "fast", "slow") and "fast2" not in js[1].equivalent
    assert race.settled(js)
    assert race.overall(js, "current") == "fast"


def test_an_open_race_is_not_settled():
    t = synthetic({"current": [1.0], "base2": [1.0], "x": [0.99]}, rounds=3, noise=0.05)
    js = race.judge(t, "current", "base2", ["current", "x"], rope_min=0.001)
    assert not race.settled(js)


# ---------------------------------------------------------------- the patch writer


def test_patch_writer_sets_entry_defaults_and_autotune_lists():
    src = (FIXTURES / "paged_tiles.py").read_text()
    new = patch.write_params(src, "entry", {"BLOCK_N": 8, "num_warps": 2})
    assert "def entry(q, k_cache, v_cache, block_tables, kv_lens, scale, BLOCK_N=8, num_warps=2):" in new
    assert new.replace("BLOCK_N=8, num_warps=2):", "BLOCK_N=16, num_warps=4):") == src
    with pytest.raises(patch.NotWritable):
        patch.write_params(src, "entry", {"scale": 1})
    inline = (
        "import triton\n\n@triton.autotune(configs=[triton.Config({'B': 1}), triton.Config({'B': 2})], key=[])\n"
        "@triton.jit\ndef k(B: tl.constexpr):\n    pass\n"
    )
    out = patch.write_autotune(inline, "k", [{"kwargs": {"B": 2}, "num_warps": 8}])
    assert "triton.Config({'B': 2}, num_warps=8)," in out and "{'B': 1}" not in out
    ast.parse(out)
    p = patch.Patch("k.py", inline, out)
    assert p.diff.startswith("--- a/k.py\n+++ b/k.py\n")


def test_recommend_keeps_the_current_config_unless_shown_faster():
    t = synthetic({"current": [1.0, 1.0], "base2": [1.0, 1.0], "x": [0.8, 1.0], "y": [0.8, 1.3]})
    js = race.judge(t, "current", "base2", ["current", "x", "y"], rope_min=0.01)
    assert race.recommend(js, "current") == ("x", None)
    t = synthetic({"current": [1.0, 1.0], "base2": [1.0, 1.0], "y": [0.8, 1.3]})
    js = race.judge(t, "current", "base2", ["current", "y"], rope_min=0.01)
    assert race.recommend(js, "current") in (("current", "y"), ("current", None))


def test_make_patch_writes_the_chosen_defaults(tmp_path):
    from kernalin_ci.tune.run import Target, TuneResult

    root = repo(tmp_path, "paged_tiles.py")
    spec = TuneSpec({"BLOCK_N": [8, 16]}, use_autotune=False)
    space = build_space(spec, "kernels/paged_tiles.py:entry", str(root), "cpu")
    result = TuneResult(Target("attention.decode_paged", "kernels/paged_tiles.py:entry", str(root)), "cpu", space)
    result.reference = "current"
    result.judgements = race.judge(
        synthetic({"current": [1.0], "base2": [1.0], "c0": [0.7]}), "current", "base2", ["current", "c0"]
    )
    result.chosen, held = race.recommend(result.judgements, "current")
    assert (result.chosen, held) == ("c0", None)
    p, why = patch.make_patch(result)
    assert why == "" and p.path == "kernels/paged_tiles.py"
    assert "-def entry(q, k_cache, v_cache, block_tables, kv_lens, scale, BLOCK_N=16, num_warps=4):" in p.diff
    assert "+def entry(q, k_cache, v_cache, block_tables, kv_lens, scale, BLOCK_N=8, num_warps=4):" in p.diff
    patch.apply(p, str(root))
    assert "BLOCK_N=8, num_warps=4):" in (root / "kernels" / "paged_tiles.py").read_text()
    result.chosen = "current"
    assert patch.make_patch(result)[0] is None


# ---------------------------------------------------------------- never race a config less verified than the current


def test_a_config_passes_only_when_checked_at_least_as_well_as_the_current_one():
    from kernalin_ci.findings import Finding, NotChecked, StructuralStatus, VerifyResult
    from kernalin_ci.tune.run import judge_verification
    from kernalin_ci.tune.space import Candidate

    c = Candidate("c0", {"BLOCK_N": 64})

    def result(cases=4, findings=(), refused=(), structural="analysed"):
        return VerifyResult(
            "attention.decode_paged",
            "kernels/paged.py:entry",
            cases_run=cases,
            findings=list(findings),
            not_checked=[NotChecked(s, "unsupported", "BLOCK_N > head_dim") for s in refused],
            structural=StructuralStatus(structural, None if structural == "analysed" else "no launch captured"),
        )

    current = result(refused=["D=256 float32"])
    assert judge_verification(c, result(), 1.0, current).passed is True
    assert judge_verification(c, result(refused=["D=256 float32"]), 1.0, current).passed is True
    bad = judge_verification(c, result(findings=[Finding("dynamic", "kv-mask", "masked")]), 1.0, current)
    assert bad.passed is False and bad.findings
    nothing = judge_verification(c, result(cases=0), 1.0, current)  # nothing ran: never a pass
    assert nothing.passed is None and "no verification case ran" in nothing.note
    narrower = judge_verification(c, result(refused=["D=256 float32", "D=64 float32"]), 1.0, current)
    assert narrower.passed is False and "refuses 1 shape the current config serves: at D=64 float32" in narrower.note
    unanalysed = judge_verification(c, result(structural="not-analysed"), 1.0, current)
    assert unanalysed.passed is None and "structural not analysed" in unanalysed.note
    assert judge_verification(c, result(structural="not-analysed"), 1.0, result(structural="not-analysed")).passed
    assert judge_verification(Candidate("current", {}), result(cases=0)).passed is None
    assert judge_verification(Candidate("current", {}), None).passed is None  # the autotuner on the CPU


def test_a_config_dropped_in_the_race_is_never_judged_or_chosen():
    from kernalin_ci.tune.run import Target, TuneResult, decide
    from kernalin_ci.tune.space import Candidate, Space

    result = TuneResult(
        Target("attention.decode_paged", "k.py:entry", "."), "cpu", Space(Candidate("current", {}), [], {})
    )
    # c1 was fastest, then its outputs disagreed in a benchmark round and it left the race
    acc = synthetic({"current": [1.0, 1.0], "base2": [1.0, 1.0], "c1": [0.5, 0.5], "c2": [0.8, 0.8]})
    assert decide(result, acc, "current", ["c1", "c2"], None, 0.01) is None and result.chosen == "c1"
    decide(result, acc, "current", ["c2"], None, 0.01)
    assert result.chosen == "c2" and all("c1" not in j.ms and j.best == "c2" for j in result.judgements)
    decide(result, acc, "current", [], None, 0.01)
    assert result.chosen == "current" and all(set(j.ms) == {"current"} for j in result.judgements)
