"""What clients without the webhook secret can make `kernalin-ci serve` hold (issue 13, attack 9).

A real serve process on loopback (default settings: http.max_connections 1024, request_deadline_s 10,
max_buffered_bytes 64 MiB; --max-connections N sets the first), then, each bounded in time:

    slow       N clients (default 300) each trickle one header byte every 0.5 s for --seconds
    bodies     M clients (default 40) each send a 24 MiB body at once (a wrong signature)
    reconnect  R clients (default 400) trickle like the slow ones and reconnect as soon as they are
               cut, while D signed deliveries (default 200) arrive at a steady --rate per second
               (each given GitHub's 10 s)

Prints the daemon's threads and RSS before and at their peak, how many slow clients were cut off,
how the bodies were answered, how long a /healthz took in the middle of each, and for the signed
deliveries the share answered 2xx within 2 s and their p50/p99 latency.

    python benchmarks/daemon_hostile_load.py [--slow 300] [--bodies 40] [--seconds 15]
                                              [--reconnecting 400] [--deliveries 200] [--rate 10]
                                              [--max-connections N]
    (a scenario whose count is 0 is skipped)
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kernalin_ci.testing.daemon_world import WEBHOOK_SECRET, ServeProcess, World, fake_gate_command
from kernalin_ci.testing.github_standin import GitHubStandIn
from kernalin_ci.testing.hostile_http import ReconnectingSlowClients, signed_deliveries, summary


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Peak:
    def __init__(self, pid: int):
        self.pid, self.threads, self.rss = pid, threads(pid), rss_mib(pid)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.05):
            self.threads = max(self.threads, threads(self.pid))
            self.rss = max(self.rss, rss_mib(self.pid))

    def stop(self):
        self._stop.set()
        self._t.join()
        return self


def timed_healthz(url: str) -> float:
    from kernalin_ci.daemon.deliver import get_json

    t0 = time.monotonic()
    status, _ = get_json(url + "/healthz", timeout=120)
    assert status == 200, status
    return time.monotonic() - t0


def slow_clients(daemon, n: int, seconds: float) -> dict:
    host, port = daemon.url.split("//")[1].split(":")
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    peak = Peak(daemon.pid)
    cut = [False] * n
    health = []
    end = time.monotonic() + seconds

    def check():  # a real client, once the slow ones hold every slot
        time.sleep(min(2, seconds / 2))
        health.append(timed_healthz(daemon.url))

    checker = threading.Thread(target=check)
    checker.start()
    while time.monotonic() < end:
        for i, s in enumerate(socks):
            if not cut[i]:
                try:
                    s.sendall(b"a")
                except OSError:
                    cut[i] = True
        time.sleep(0.5)
    checker.join()
    for s in socks:
        s.close()
    peak.stop()
    return {"peak_threads": peak.threads, "peak_rss": peak.rss, "cut": sum(cut), "healthz_s": health[0]}


def large_bodies(daemon, n: int, size: int) -> dict:
    host, port = daemon.url.split("//")[1].split(":")
    body = b"z" * size
    head = (
        f"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: ping\r\nX-GitHub-Delivery: d\r\n"
        f"X-Hub-Signature-256: sha256={'0' * 64}\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    peak = Peak(daemon.pid)

    def one(_):
        try:
            with socket.create_connection((host, int(port)), timeout=60) as s:
                s.sendall(head + body)
                return s.recv(64).split(b" ")[1].decode()
        except (OSError, IndexError) as e:
            return type(e).__name__

    with ThreadPoolExecutor(n) as pool:
        fut = pool.map(one, range(n))
        health = timed_healthz(daemon.url)
        answers = list(fut)
    peak.stop()
    counts = {a: answers.count(a) for a in sorted(set(answers))}
    return {"peak_threads": peak.threads, "peak_rss": peak.rss, "answers": counts, "healthz_s": health}


def reconnecting(daemon, n: int, deliveries: int, rate: float) -> dict:
    peak = Peak(daemon.pid)
    with ReconnectingSlowClients(daemon.url, n) as attack:
        time.sleep(3)  # every client connected and trickling
        results = signed_deliveries(daemon.url, WEBHOOK_SECRET, deliveries, rate)
    peak.stop()
    return {
        **summary(results, within_s=2.0),
        "connects": attack.connects,
        "cuts": attack.cuts,
        "peak_threads": peak.threads,
        "peak_rss": peak.rss,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", type=int, default=300)
    ap.add_argument("--bodies", type=int, default=40)
    ap.add_argument("--body-mib", type=int, default=24)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--reconnecting", type=int, default=400)
    ap.add_argument("--deliveries", type=int, default=200)
    ap.add_argument("--rate", type=float, default=10, help="signed deliveries per second")
    ap.add_argument("--max-connections", type=int, help="http.max_connections (default: the daemon's)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, GitHubStandIn() as standin:
        world = World(Path(tmp) / "world", standin).start()
        world.add_repo("acme/kernels", {".kernalin.yml": "version: 1\nkernels: []\n"})
        limits = {"max_connections": args.max_connections} if args.max_connections else {}
        cfg = world.daemon_config(Path(tmp) / "state", runner={"command": fake_gate_command()}, http=limits)
        daemon = ServeProcess(world, cfg).start()
        try:
            time.sleep(1)
            print(f"idle: {threads(daemon.pid)} threads, RSS {rss_mib(daemon.pid):.1f} MiB")
            if args.slow:
                s = slow_clients(daemon, args.slow, args.seconds)
                print(
                    f"{args.slow} slow clients for {args.seconds:g} s: peak {s['peak_threads']} threads, RSS "
                    f"{s['peak_rss']:.1f} MiB; {s['cut']} cut off; /healthz in {s['healthz_s']:.2f} s"
                )
                time.sleep(1)
            if args.bodies:
                b = large_bodies(daemon, args.bodies, args.body_mib * 1024 * 1024)
                print(
                    f"{args.bodies} x {args.body_mib} MiB bodies: peak {b['peak_threads']} threads, RSS "
                    f"{b['peak_rss']:.1f} MiB; answers {b['answers']}; /healthz in {b['healthz_s']:.2f} s"
                )
                time.sleep(1)
            if args.reconnecting and args.deliveries:
                r = reconnecting(daemon, args.reconnecting, args.deliveries, args.rate)
                print(
                    f"{args.reconnecting} reconnecting slow clients, {r['n']} signed deliveries at {args.rate:g}/s: "
                    f"{r['ok_within']} ({100 * r['share']:.1f} %) answered 2xx within 2 s, {r['unanswered']} not "
                    f"within 10 s; latency p50 {r['p50_s']:.3f} s, p99 {r['p99_s']:.3f} s; statuses {r['statuses']}; "
                    f"{r['connects']} attacker connections, {r['cuts']} cut; peak {r['peak_threads']} threads, "
                    f"RSS {r['peak_rss']:.1f} MiB"
                )
            print(f"after: {threads(daemon.pid)} threads, RSS {rss_mib(daemon.pid):.1f} MiB")
        finally:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
