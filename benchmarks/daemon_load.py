"""Load test of `kernalin-ci serve`: bursts of concurrent signed deliveries on loopback.

A real daemon process (SQLite queue, local runner, CPU slots) against the GitHub stand-in, with the
stand-in gate command (kernalin_ci.testing.daemon_world.FAKE_GATE: a real report.json, no kernel work), so
what is measured is the daemon: acknowledgement time, whether every delivery became exactly one job
that ran and was posted, and the daemon's memory after each round (it must not grow per job).

    python benchmarks/daemon_load.py [--deliveries 200] [--rounds 3] [--slots 4] [--replays 20]

Each round sends DELIVERIES new pull_request deliveries at once (one thread and one connection each,
released together) plus REPLAYS re-sent delivery ids, waits until every job is done and posted, then
reads the daemon's RSS. Prints one table; docs/daemon.md has the figures of a run.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kernalin_ci.daemon.metrics import rss_bytes
from kernalin_ci.testing.daemon_world import ServeProcess, World, fake_gate_command, git

REPO = "acme/kernels"


def heads(repo, n: int) -> list[str]:
    """N new commits (one per pull request: GitHub lists check runs per commit), pushed at once."""
    git(repo.work, "checkout", "-q", "-B", "load", "main")
    out = []
    for i in range(n):
        git(repo.work, "commit", "-q", "--allow-empty", "-m", f"load {i}")
        out.append(git(repo.work, "rev-parse", "HEAD"))
    git(repo.work, "push", "-q", "-f", "origin", "load:load")
    return out


def burst(serve: ServeProcess, world: World, numbers: list[int], base: str, replays: int):
    shas = heads(world.repos[REPO], len(numbers))
    payloads = [(n, world.pull_request(REPO, n, sha, base), str(uuid.uuid4())) for n, sha in zip(numbers, shas)]
    go = threading.Barrier(len(payloads) + replays)
    results = []
    lock = threading.Lock()

    def one(item, delivery_id):
        n, payload, _ = item
        go.wait()
        t0 = time.perf_counter()
        try:
            status, answer = serve.deliver("pull_request", payload, delivery_id=delivery_id, timeout=60)
        except OSError as e:
            status, answer = 0, {"error": str(e)}
        with lock:
            results.append((n, status, answer, time.perf_counter() - t0))

    with ThreadPoolExecutor(max_workers=len(payloads) + replays) as pool:
        futures = [pool.submit(one, p, p[2]) for p in payloads]
        futures += [pool.submit(one, p, p[2]) for p in payloads[:replays]]  # the same delivery ids again
        for f in futures:
            f.result()
    return results


def wait_all_posted(db_path: Path, expected: int, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        db = sqlite3.connect(db_path)
        try:
            n = db.execute("SELECT COUNT(*) FROM jobs WHERE state='done' AND post_state='posted'").fetchone()[0]
        finally:
            db.close()
        if n >= expected:
            return time.monotonic() - t0
        time.sleep(0.25)
    raise TimeoutError(f"only {n} of {expected} jobs done and posted after {timeout} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deliveries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="kernalin-load-"))
    world = World(tmp / "world").start()
    repo = world.add_repo(REPO, {".kernalin.yml": "version: 1\nkernels: []\n", "verdict.txt": "success\n"})
    cfg = world.daemon_config(tmp / "state", cpu_slots=args.slots, runner={"command": fake_gate_command()})
    serve = ServeProcess(world, cfg).start()
    db_path = tmp / "state" / "jobs.sqlite3"
    print(f"kernalin-ci serve pid {serve.pid} on {serve.url}; {args.slots} CPU slots; state in {tmp}", flush=True)
    rows = []
    try:
        warm = list(range(1, args.deliveries + 1))  # a first burst: imports, caches, thread arenas
        burst(serve, world, warm, repo.main, 0)
        wait_all_posted(db_path, len(warm), args.timeout)
        rss0 = rss_bytes(serve.pid)
        total = len(warm)
        # service time: one delivery at a time (pull_request.edited: full size, checked, recorded, no job)
        seq = []
        for n in range(1, 51):
            payload = world.pull_request(REPO, n, repo.main, repo.main, action="edited")
            t0 = time.perf_counter()
            status, _ = serve.deliver("pull_request", payload)
            seq.append(time.perf_counter() - t0)
            assert status == 202, status
        seq.sort()
        next_pr = 1000
        for rnd in range(1, args.rounds + 1):
            numbers = list(range(next_pr, next_pr + args.deliveries))
            next_pr += args.deliveries
            t0 = time.monotonic()
            results = burst(serve, world, numbers, repo.main, args.replays)
            ack_wall = time.monotonic() - t0
            total += args.deliveries
            drain = wait_all_posted(db_path, total, args.timeout)
            acks = sorted(r[3] for r in results)
            accepted = [r for r in results if r[1] == 202]
            dup = [r for r in results if r[1] == 200 and r[2].get("status") == "duplicate"]
            failed = [r for r in results if r[1] not in (200, 202)]
            db = sqlite3.connect(db_path)
            jobs = db.execute("SELECT COUNT(*) FROM jobs WHERE pr >= ? AND pr < ?", (numbers[0], next_pr)).fetchone()[0]
            posted = db.execute(
                "SELECT COUNT(*) FROM jobs WHERE pr >= ? AND pr < ? AND state='done' AND post_state='posted'",
                (numbers[0], next_pr),
            ).fetchone()[0]
            db.close()
            runs = sum(1 for r in world.standin.check_runs(REPO) if r["status"] == "completed")
            rows.append(
                {
                    "round": rnd,
                    "sent": len(results),
                    "accepted": len(accepted),
                    "duplicates": len(dup),
                    "errors": len(failed),
                    "jobs": jobs,
                    "posted": posted,
                    "lost": args.deliveries - posted,
                    "check_runs_total": runs,
                    "p50_ms": 1000 * statistics.median(acks),
                    "p99_ms": 1000 * acks[int(0.99 * (len(acks) - 1))],
                    "max_ms": 1000 * acks[-1],
                    "burst_s": ack_wall,
                    "drain_s": drain,
                    "rss_mb": rss_bytes(serve.pid) / 2**20,
                }
            )
            print(f"round {rnd}: {rows[-1]}", flush=True)
        problems = list(world.standin.problems)
    finally:
        serve.stop()
        world.stop()

    print(
        f"\none delivery at a time: p50 {1000 * statistics.median(seq):.1f} ms, max {1000 * seq[-1]:.1f} ms "
        f"(50 deliveries); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'round':>5} {'sent':>5} {'202':>5} {'dup':>4} {'err':>4} {'jobs':>5} {'posted':>6} {'lost':>4} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'drain s':>8} {'RSS MiB':>8}"
    )
    print(
        f"{'warm':>5} {args.deliveries:>5} {'':>5} {'':>4} {'':>4} {args.deliveries:>5} {args.deliveries:>6} "
        f"{'':>4} {'':>7} {'':>7} {'':>7} {'':>8} {rss0 / 2**20:>8.1f}"
    )
    for r in rows:
        print(
            f"{r['round']:>5} {r['sent']:>5} {r['accepted']:>5} {r['duplicates']:>4} {r['errors']:>4} {r['jobs']:>5} "
            f"{r['posted']:>6} {r['lost']:>4} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['max_ms']:>7.1f} "
            f"{r['drain_s']:>8.1f} {r['rss_mb']:>8.1f}"
        )
    growth = (rows[-1]["rss_mb"] - rss0 / 2**20) * 2**10 / (args.deliveries * len(rows))
    print(
        f"\nRSS after the warm-up burst {rss0 / 2**20:.1f} MiB, after {len(rows)} more bursts "
        f"({args.deliveries * len(rows)} jobs) {rows[-1]['rss_mb']:.1f} MiB: {growth:+.2f} KiB per job"
    )
    print(f"GitHub stand-in problems: {len(problems)}")
    ok = (
        all(
            r["lost"] == 0
            and r["errors"] == 0
            and r["accepted"] == r["jobs"] == args.deliveries
            and r["duplicates"] == args.replays
            for r in rows
        )
        and not problems
    )
    print("OK: every delivery became exactly one job, run and posted" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
