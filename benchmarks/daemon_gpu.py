"""The daemon on GPUs: `kernalin-ci serve` (local runner, one job per GPU) handling queued pull requests
of the example repository, with the GitHub stand-in as GitHub. Run on a GPU host, no network needed:

    python3 benchmarks/daemon_gpu.py                      # 1 GPU, PRs fused-exp2 and wider-tiles
    python3 benchmarks/daemon_gpu.py --gpus 2             # the same two PRs, one per GPU, at once
    python3 benchmarks/daemon_gpu.py --gpus 2 --noise     # issue 7: a PR's noise floor alone vs beside a job
    python3 benchmarks/daemon_gpu.py --check              # only check the prerequisites

What it does: commits examples/decode-kernels into a temporary git repository (main) and each PR's
patch (examples/decode-kernels/prs/NAME.patch) on a branch; starts the stand-in and `kernalin-ci serve`
in the background (its log: STATE/serve.log); delivers one signed pull_request webhook per PR, all at
once; waits until every job is done and posted; prints a timing table (queue wait, job duration,
total from delivery to posted) and what was posted (check run conclusion, annotations, comment), and
each benchmarked kernel's verdict and A/A noise floor.

--noise (needs 2 GPUs): phase 1 runs PR A (wider-tiles) alone, the other GPU idle; phase 2 runs PR A
again beside PR B (exp2-softmax-step) on the other GPU; A's noise floor (the benchmark's A/A floor)
and verdict are printed for both phases.

Needs: torch with CUDA, kernalin-ci (pip install --no-deps -e .), and for the stand-in PyGithub,
PyJWT[crypto], PyYAML, jsonschema, openapi-schema-validator, plus GitHub's OpenAPI description
(shared/github-openapi/api.github.com.json.gz beside or inside the repository, or
KERNALIN_GITHUB_OPENAPI=PATH).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
EXAMPLE = HERE / "examples" / "decode-kernels"
REPO = "acme/decode-kernels"
NEEDED = ("torch", "yaml", "github", "jwt", "cryptography", "jsonschema", "openapi_schema_validator")


def check(gpus: int) -> list[str]:
    problems = []
    for mod in NEEDED:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            problems.append(f"python module {mod!r} is missing ({e})")
    if not problems:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < gpus:
            problems.append(f"{gpus} GPUs asked for, {n} visible to torch")
        try:
            from kernalin_ci.testing.openapi import spec_path

            spec_path()
        except FileNotFoundError as e:
            problems.append(str(e))
        except ImportError as e:
            problems.append(f"kernalin-ci is not importable: {e}")
    if not shutil.which("git"):
        problems.append("git is not on PATH")
    if gpus and not shutil.which("nvidia-smi"):
        problems.append("nvidia-smi is not on PATH (the daemon finds GPUs with it)")
    return problems


def make_repo(world, prs: list[str]):
    from kernalin_ci.testing.daemon_world import git

    repo = world.add_repo(REPO, source=EXAMPLE)
    git(repo.work, "rm", "-rq", "prs")
    git(repo.work, "commit", "-qm", "base: four decode kernels")
    git(repo.work, "push", "-q", "origin", "main:main")
    repo.main = git(repo.work, "rev-parse", "HEAD")
    heads = {}
    for name in dict.fromkeys(prs):
        git(repo.work, "checkout", "-q", "-b", f"pr/{name}", "main")
        git(repo.work, "apply", str(EXAMPLE / "prs" / f"{name}.patch"))
        git(repo.work, "commit", "-qam", name)
        git(repo.work, "push", "-q", "origin", f"pr/{name}:pr/{name}")
        heads[name] = git(repo.work, "rev-parse", "HEAD")
    return repo, heads


def run_phase(serve, world, repo, heads, prs: list[tuple[int, str]], timeout: float) -> list[dict]:
    from kernalin_ci.testing.daemon_world import wait_job

    sent = []
    for number, name in prs:
        t0 = time.time()
        status, answer = serve.deliver("pull_request", world.pull_request(REPO, number, heads[name], repo.main))
        ack = time.time() - t0
        if status != 202:
            raise SystemExit(f"delivery for {name} answered {status}: {answer}")
        sent.append((number, name, answer["jobs"][0], t0, ack))
    rows = []
    for number, name, job_id, _t0, ack in sent:
        job = wait_job(serve.get, job_id, timeout=timeout)
        runs = [r for r in world.standin.check_runs(REPO) if r["external_id"] == job_id]
        comments = world.standin.comments(REPO, number)
        report_path = Path(serve.cfg["state_dir"]) / "jobs" / job_id / "out" / "report.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        rows.append(
            {
                "pr": number,
                "name": name,
                "job": job_id,
                "slot": job["slot"],
                "ack_ms": 1000 * ack,
                "queue_wait_s": job["queue_wait_s"],
                "duration_s": job["duration_s"],
                "total_s": (job["posted_at"] or job["finished_at"]) - job["created_at"],
                "state": job["state"],
                "conclusion": job["conclusion"],
                "posted": runs[0]["conclusion"] if len(runs) == 1 else f"{len(runs)} check runs",
                "annotations": len(runs[0]["annotations"]) if runs else 0,
                "comments": len(comments),
                "error": job["error"],
                "report": report,
            }
        )
    return rows


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n== {title}")
    print(
        f"{'PR':<22} {'slot':<7} {'ack ms':>7} {'queue s':>8} {'job s':>7} {'total s':>8}  {'job':<9} "
        f"{'check run':<10} {'annot':>5} {'comments':>8}"
    )
    for r in rows:
        print(
            f"#{r['pr']} {r['name']:<19} {r['slot'] or '-':<7} {r['ack_ms']:>7.1f} {r['queue_wait_s'] or 0:>8.1f} "
            f"{r['duration_s'] or 0:>7.1f} {r['total_s']:>8.1f}  {r['conclusion'] or r['state']:<9} "
            f"{r['posted']:<10} {r['annotations']:>5} {r['comments']:>8}"
        )
        if r["error"]:
            print(f"    error: {r['error']}")
        for k in r["report"].get("kernels", []):
            if k.get("status") == "unchanged":
                continue
            b = k.get("benchmark") or {}
            floor = b.get("floor")
            print(
                f"    {k['name']:<18} verify {((k.get('verification') or {}).get('verdict') or '-'):<5} "
                f"bench {b.get('verdict') or k.get('benchmark_note') or '-'}"
                + (
                    f" ratio {b['ratio']:.4f} rope ±{(b['rope'][1] - 1) * 100:.2f}% A/A floor "
                    f"{floor * 100:.3f}% rounds {b.get('rounds')}"
                    if b.get("ratio") and floor is not None
                    else ""
                )
            )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=1, help="GPUs the daemon schedules on (default 1)")
    ap.add_argument(
        "--prs",
        help="patches of examples/decode-kernels/prs (default fused-exp2,wider-tiles; "
        "with --noise: wider-tiles,exp2-softmax-step, the first is the one measured)",
    )
    ap.add_argument("--noise", action="store_true", help="issue 7: noise floor alone vs beside a job (2 GPUs)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for each job")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument(
        "--bwrap",
        default="bwrap",
        help="the bubblewrap binary the local runner's sandbox uses (default: bwrap on PATH)",
    )
    ap.add_argument("--check", action="store_true", help="only check the prerequisites")
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="try the script without a GPU: CPU slots, the interpreter (slow; benchmarks never gate)",
    )
    args = ap.parse_args(argv)
    default = "wider-tiles,exp2-softmax-step" if args.noise else "fused-exp2,wider-tiles"
    prs = [p.strip() for p in (args.prs or default).split(",") if p.strip()]
    if args.noise and args.gpus < 2:
        raise SystemExit("--noise needs --gpus 2")
    for p in prs:
        if not (EXAMPLE / "prs" / f"{p}.patch").is_file():
            raise SystemExit(f"no patch examples/decode-kernels/prs/{p}.patch")
    problems = check(0 if args.cpu else args.gpus)
    if problems:
        print("daemon_gpu: cannot run:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    if args.check:
        print("daemon_gpu: prerequisites OK")
        return 0

    import torch

    from kernalin_ci.testing.daemon_world import ServeProcess, World

    tmp = Path(tempfile.mkdtemp(prefix="kernalin-daemon-gpu-"))
    world = World(tmp / "world").start()
    repo, heads = make_repo(world, prs)
    cfg = world.daemon_config(
        tmp / "state",
        gpus="cpu" if args.cpu else args.gpus,
        cpu_slots=args.gpus,
        runner={"timeout_s": args.timeout, "sandbox": {"bwrap": args.bwrap}},
    )
    t_start = time.time()
    serve = ServeProcess(world, cfg, python=sys.executable).start(timeout=120)
    device = "CPU (interpreter)" if args.cpu else torch.cuda.get_device_name(0)
    print(
        f"daemon_gpu: torch {torch.__version__}, {device} x{args.gpus}; "
        f"kernalin-ci serve on {serve.url} (log {serve.log}); started in {time.time() - t_start:.1f} s"
    )
    _, health = serve.get("/healthz")
    print(f"daemon_gpu: slots {health['slots']}")
    try:
        if args.noise:
            a, b = prs[0], (prs[1] if len(prs) > 1 else prs[0])
            alone = run_phase(serve, world, repo, heads, [(101, a)], args.timeout)
            print_rows(f"phase 1: {a} alone (other GPU idle)", alone)
            both = run_phase(serve, world, repo, heads, [(102, a), (103, b)], args.timeout)
            print_rows(f"phase 2: {a} beside {b} (both GPUs busy)", both)
            rows = alone + both
        else:
            rows = run_phase(serve, world, repo, heads, list(enumerate(prs, start=1)), args.timeout)
            print_rows(f"{len(prs)} pull requests delivered at once, {args.gpus} GPU(s)", rows)
        wall = time.time() - t_start
        _, metrics = serve.get("/metrics")
        print(f"\nwall time {wall:.1f} s; stand-in problems: {len(world.standin.problems)}")
        for line in metrics.splitlines():
            if line.startswith(
                (
                    "kernalin_ci_jobs{",
                    "kernalin_ci_job_duration_seconds_sum",
                    "kernalin_ci_process_resident_memory_bytes",
                )
            ):
                print(f"  {line}")
        ok = all(r["state"] == "done" and r["posted"] == r["conclusion"] and r["comments"] == 1 for r in rows)
        ok = ok and not world.standin.problems
        print("OK" if ok else "FAILED: see the table and the serve log")
        return 0 if ok else 1
    finally:
        serve.stop()
        world.stop()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(tmp)])
        else:
            print(f"kept {tmp}")


if __name__ == "__main__":
    sys.exit(main())
