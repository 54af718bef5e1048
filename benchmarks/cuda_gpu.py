"""Every GPU part of CUDA C++ support (docs/cuda.md) in one unattended run; results as JSON under $OUT.

    OUT=/some/dir python3 benchmarks/cuda_gpu.py [--deadline-s S] [PART ...]   # from the repository root, on the GPU

Parts (default: all, in this order; each prints its wall time). --deadline-s (default 530) bounds the whole run:
each part gets what is left, a part still running then is stopped (its process group killed) and says so, and
the parts after it say "not run (deadline)": the run fits a 10-minute command with its results written.

- `env`: what the machine has (python, torch, Triton, cupy, cuda-bindings/NVRTC, nvcc, ninja, compute-sanitizer,
  bubblewrap, pytest) and what is missing -> env.json;
- `tests`: `pytest tests/test_cuda_gpu.py` in three groups, shortest first (five ways of launching CUDA code; a
  dropped barrier and a correct change gated end to end, the sanitizer on a Triton kernel; the CUDA catalogue's
  matrix with Compute Sanitizer)
  -> tests.json (written by the tests: every result, and every failing command's exit code and output),
  tests-output.txt (pytest's whole output) and the matrix as catalogue.md;
- `timing`: `kernalin-ci verify` wall time of CUDA C++ kernels against Triton kernels of the same op (twice each,
  sanitizer off), the build's share, and Compute Sanitizer's cost per tool -> timing.json;
- `realworld`: the real-world corpus's CUDA kernels (FlashInfer) on the GPU, originals and mutants ->
  realworld.json. Needs `.cache/realworld/src` and `.cache/realworld/mutants` (3.7 MB; made by
  `python tests/realworld/fetch.py --mutants` on a machine with the network) carried with the working tree.

A log of every command (its last lines) goes to log.txt. Exit code 0 when every part ran and its checks passed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("OUT") or ROOT / "cuda-gpu-out")
PARTS = ("env", "tests", "realworld", "timing")
LOG: list[str] = []
DEADLINE = [float("inf")]  # time.monotonic() by which every command must have ended (--deadline-s)


def log(text: str) -> None:
    print(text, flush=True)
    LOG.append(text)


def left() -> float:
    return DEADLINE[0] - time.monotonic()


def run(cmd: list[str], cwd: Path = ROOT, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """CMD to its end, or until TIMEOUT or the run's deadline (then its whole process group is killed: exit 124)."""
    t0 = time.perf_counter()
    limit = max(1.0, min(timeout, left()))
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=limit)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code, err = 124, err + f"\n(stopped after {limit:.0f} s: the run's deadline)"
    r = subprocess.CompletedProcess(cmd, code, out, err)
    tail = "\n".join((r.stdout + "\n" + r.stderr).strip().splitlines()[-15:])
    log(f"$ {' '.join(cmd)}  (exit {r.returncode}, {time.perf_counter() - t0:.1f} s)\n{tail}")
    return r


def write(name: str, data) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_text(json.dumps(data, indent=1, default=str))


# ------------------------------------------------------------------ env


def version_of(module: str) -> str | None:
    try:
        m = importlib.import_module(module)
    except Exception as e:  # not installed, or broken: say which
        return None if isinstance(e, ImportError) else f"broken: {type(e).__name__}: {e}"
    return str(getattr(m, "__version__", "present"))


def part_env() -> bool:
    from kernalin_ci.cuda import toolchain

    info: dict = {"python": platform.python_version(), "machine": platform.machine()}
    for name in ("torch", "triton", "cupy", "numpy", "yaml", "pytest", "ninja"):
        info[name] = version_of(name)
    info["cuda.bindings"] = version_of("cuda.bindings")
    try:
        from kernalin_ci.cuda.nvrtc import nvrtc_version

        info["nvrtc"] = nvrtc_version()
    except Exception as e:
        info["nvrtc"] = None
        info["nvrtc_error"] = f"{type(e).__name__}: {e}"
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        info["capability"] = list(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None
        info["torch_cuda"] = torch.version.cuda
    except Exception as e:
        info["gpu"] = f"torch: {e}"
    nvcc = toolchain.nvcc()
    info["nvcc"] = nvcc and {"path": nvcc, "version": toolchain.nvcc_version(nvcc)}
    sanitizer = toolchain.compute_sanitizer()
    info["compute-sanitizer"] = sanitizer and {"path": sanitizer, "version": _first_line([sanitizer, "--version"])}
    info["ninja_binary"] = shutil.which("ninja")
    try:
        from torch.utils.cpp_extension import CUDA_HOME

        info["torch_cuda_home"] = CUDA_HOME
    except Exception as e:
        info["torch_cuda_home"] = f"{type(e).__name__}: {e}"
    info["bwrap"] = shutil.which("bwrap")
    needed = ("torch", "triton", "cupy", "pytest", "cuda.bindings", "nvrtc", "nvcc", "compute-sanitizer")
    info["missing"] = [k for k in needed if info.get(k) is None]
    if not info["ninja"] and not info["ninja_binary"]:
        info["missing"].append("ninja (torch.utils.cpp_extension builds need it)")
    write("env.json", info)
    log(json.dumps(info, indent=1, default=str))
    return True


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run: {e}"
    return out[-1] if out else ""


# ------------------------------------------------------------------ tests


TEST_GROUPS = (  # short groups first: a run cut by its deadline still has their results (and their failures')
    ("ways", "way"),
    ("gates", "end_to_end or triton_kernel"),
    ("matrix", "catalogue_row"),
)


def part_tests() -> bool:
    ok, outputs = True, []
    for name, select in TEST_GROUPS:
        r = run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "--tb=short", "-k", select,
             "tests/test_cuda_gpu.py"],
            timeout=3000,
            env={"KERNALIN_CUDA_OUT": str(OUT)},
        )  # fmt: skip
        outputs.append(f"===== {name} (exit {r.returncode})\n{r.stdout[-1_000_000:]}\n{r.stderr[-500_000:]}")
        (OUT / "tests-output.txt").write_text("\n".join(outputs))
        ok = ok and r.returncode == 0
    path = OUT / "tests.json"
    if path.is_file():
        rows = json.loads(path.read_text()).get("cuda catalogue") or []
        if rows:
            (OUT / "catalogue.md").write_text(render_matrix(rows) + "\n")
    return ok


def render_matrix(rows: list[dict]) -> str:
    # the structural column (the PTX engine, on the CPU) is docs/catalogue.md's: `catalogue --kinds ptx`
    lines = ["| kernel | bug class | pos-0 probe | dynamic | Compute Sanitizer | as labelled |"]
    lines.append("|---|---|---|---|---|---|")
    for row in rows:
        cells = []
        for kind in ("probe", "dynamic", "sanitizer"):
            c = row["results"].get(kind) or {}
            if c.get("error"):
                cells.append("error")
            elif c.get("not_checked"):
                cells.append(c["not_checked"])
            elif c.get("caught"):
                word = "caught" if row["bug_class"] else "FLAGGED"
                cells.append(word if kind == "probe" else f"{word} ({', '.join(c['classes'])})")
            else:
                cells.append("missed" if row["bug_class"] else "pass")
        ok = "yes" if not row["mismatches"] else "NO: " + "; ".join(row["mismatches"])
        label = row["bug_class"] or "(correct)"
        lines.append(f"| `{row['kernel']}` | {label} | {' | '.join(cells)} | {ok} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ timing

CUDA = ROOT / "checks" / "cuda"
VERIFIES = {
    # name: (op, entry, cwd, extra args); the CUDA ones name their sources (built once per verify)
    "kv_append triton": ("kv_append", "checks/kv_append/correct_per_token.py:entry", ROOT, []),
    "kv_append cuda nvrtc": (
        "kv_append",
        f"{CUDA}/kv_append/correct_per_token.py:entry",
        CUDA,
        ["--cuda-source", "kv_append/kv_append.cu", "--cuda-flag=-Icommon"],
    ),
    "kv_append cuda load_inline": (
        "kv_append",
        "tests/cuda_entries/kv_append_load_inline.py:entry",
        ROOT,
        ["--cuda-source", "checks/cuda/kv_append/kv_append.cu", "--cuda-flag=-Ichecks/cuda/common"],
    ),
    "paged attention triton": (
        "attention.decode_paged",
        "checks/attention_decode_paged/correct_online_paged.py:entry",
        ROOT,
        ["--param", "block_size=16"],
    ),
    "paged attention cuda nvrtc": (
        "attention.decode_paged",
        f"{CUDA}/attention_decode_paged/correct_online_smem.py:entry",
        CUDA,
        ["--param", "block_size=16", "--cuda-source", "attention_decode_paged/paged_decode.cu", "--cuda-flag=-Icommon"],
    ),
}


def verify_once(name: str, *extra: str) -> dict:
    op, entry, cwd, args = VERIFIES[name]
    cmd = [sys.executable, "-m", "kernalin_ci", "verify", "--op", op, "--entry", entry, "--device", "cuda"]
    cmd += ["--quiet", "--json", "-", *args, *extra]
    t0 = time.perf_counter()
    r = run(cmd, cwd=cwd)
    wall = time.perf_counter() - t0
    try:
        res = json.loads(r.stdout)
    except json.JSONDecodeError:
        return {"name": name, "wall_s": wall, "error": r.stderr.strip()[-500:]}
    build = res.get("build") or {}
    return {
        "name": name,
        "wall_s": round(wall, 2),
        "verify_s": res.get("seconds"),
        "build_s": build.get("seconds"),
        "after_build_s": round(res["seconds"] - (build.get("seconds") or 0.0), 2),
        "cases": res.get("cases_run"),
        "verdict": res.get("verdict"),
        "findings": [f["bug_class"] for f in res.get("findings", [])],
        "sanitizer": res.get("sanitizer"),
    }


def part_timing() -> bool:
    rows = []
    for name in VERIFIES:  # once each: the build's share is in build_s, the rest is the verify once built
        if left() < 30:
            log(f"timing: {name} not run (deadline)")
            continue
        row = verify_once(name, "--sanitizer", "off")
        row["run"] = 1
        rows.append(row)
    for name in ("paged attention triton", "paged attention cuda nvrtc"):
        if left() < 30:
            continue
        row = verify_once(name, "--only", "sanitizer")
        row["run"] = "sanitizer only"
        rows.append(row)
    summary = {}
    for name in VERIFIES:
        runs = [r for r in rows if r["name"] == name and isinstance(r.get("run"), int) and "error" not in r]
        if runs:
            best = {key: min(r[key] for r in runs) for key in ("after_build_s", "wall_s")}
            summary[name] = best
    pairs = [
        ("kv_append cuda nvrtc", "kv_append triton"),
        ("kv_append cuda load_inline", "kv_append triton"),
        ("paged attention cuda nvrtc", "paged attention triton"),
    ]
    for cuda, triton in pairs:
        if cuda in summary and triton in summary:
            summary[cuda]["ratio_to_triton_after_build"] = round(
                summary[cuda]["after_build_s"] / summary[triton]["after_build_s"], 2
            )
    write("timing.json", {"rows": rows, "summary": summary})
    log(json.dumps(summary, indent=1))
    return len(rows) == len(VERIFIES) + 2 and all("error" not in r for r in rows)


# ------------------------------------------------------------------ realworld


def part_realworld() -> bool:
    sys.path.insert(0, str(ROOT / "tests" / "realworld"))
    import corpus

    ids = [k.id for k in corpus.load_manifest() if k.device == "cuda"]
    r = run(
        [sys.executable, "tests/realworld/matrix.py", "--device", "cuda", "--jobs", "3", "--only", ",".join(ids),
         "--json", str(OUT / "realworld.json")],
        timeout=3000,
    )  # fmt: skip
    (OUT / "realworld.md").write_text(r.stdout + "\n" + r.stderr[-20_000:])
    return r.returncode == 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deadline-s", type=float, default=530.0, help="the whole run's time (default 530)")
    ap.add_argument("parts", nargs="*")
    args = ap.parse_args(argv)
    DEADLINE[0] = time.monotonic() + args.deadline_s
    parts = args.parts or list(PARTS)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"cuda_gpu: unknown part {unknown[0]!r} (parts: {', '.join(PARTS)})", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    from kernalin_ci.cuda import toolchain

    nvcc = toolchain.nvcc()
    if nvcc and not os.environ.get("CUDA_HOME"):  # torch.utils.cpp_extension looks for the toolkit there
        os.environ["CUDA_HOME"] = str(Path(os.path.realpath(nvcc)).parent.parent)
        log(f"CUDA_HOME={os.environ['CUDA_HOME']} (from {nvcc})")
    ok = True
    for part in parts:
        if left() < 20:
            log(f"== part {part}: not run (deadline)")
            ok = False
            continue
        t0 = time.perf_counter()
        try:
            passed = globals()[f"part_{part}"]()
        except Exception as e:  # one part's failure must not cost the others their results
            log(f"part {part}: {type(e).__name__}: {e}")
            passed = False
        log(f"== part {part}: {'ok' if passed else 'FAILED'} in {time.perf_counter() - t0:.0f} s")
        ok = ok and passed
        (OUT / "log.txt").write_text("\n".join(LOG)[-4_000_000:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
