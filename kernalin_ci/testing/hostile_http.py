"""Clients of the daemon's HTTP front that an attacker without the webhook secret would run, and the
signed deliveries that must still get through (tests/hostile/test_http_front.py,
benchmarks/daemon_hostile_load.py). Loopback only, bounded in count and time.

    with ReconnectingSlowClients(url, 400) as attack:      # each trickles a header byte every 0.5 s,
        results = signed_deliveries(url, secret, 200, 10)  # and reconnects as soon as it is cut
    summary(results, within_s=2.0)
"""

from __future__ import annotations

import asyncio
import http.client
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from kernalin_ci.daemon.deliver import deliver

GITHUB_TIMEOUT_S = 10.0  # GitHub gives up on a delivery after this, and does not redeliver by itself


class ReconnectingSlowClients:
    """N clients, each in a loop: connect, send the start of a request, then one more header byte every
    TRICKLE_S (never finishing it); when the server cuts or answers it, connect again at once. One
    asyncio loop in a thread of this process."""

    def __init__(self, url: str, n: int, trickle_s: float = 0.5):
        u = urlsplit(url)
        self.host, self.port, self.n, self.trickle_s = u.hostname, u.port, n, trickle_s
        self.connects = self.cuts = self.refused = 0
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._stopping = False  # checked by every client too: a cancellation can be lost in wait_for
        self._thread = threading.Thread(target=self._run, name="slow-clients", daemon=True)
        self._ready = threading.Event()

    def __enter__(self) -> ReconnectingSlowClients:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._halt)
            self._thread.join(30)

    def _halt(self) -> None:
        self._stopping = True
        self._stop.set()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        tasks = [asyncio.ensure_future(self._client()) for _ in range(self.n)]
        self._ready.set()
        await self._stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _client(self) -> None:
        while not self._stopping:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                self.refused += 1
                await asyncio.sleep(0.05)
                continue
            self.connects += 1
            try:
                writer.write(b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                while not self._stopping:
                    try:
                        await asyncio.wait_for(reader.read(4096), self.trickle_s)
                        break  # an answer or the end of the stream: cut
                    except asyncio.TimeoutError:
                        writer.write(b"a")
                        await writer.drain()
            except OSError:
                pass
            finally:
                writer.close()
            self.cuts += 1


@dataclass
class Delivery:
    status: int | None  # None: no answer within the timeout (or the connection failed)
    seconds: float
    error: str = ""  # why there is no answer


def signed_deliveries(url: str, secret: str, n: int, rate: float, timeout: float = GITHUB_TIMEOUT_S) -> list[Delivery]:
    """N signed `ping` deliveries to URL's /webhook, one started every 1/RATE s (each on its own
    connection, as GitHub sends them), each given TIMEOUT; in the order sent."""

    def one(_):
        t0 = time.monotonic()
        try:
            status, _answer = deliver(url + "/webhook", "ping", {"zen": "x", "hook_id": 1}, secret, timeout=timeout)
        except (OSError, http.client.HTTPException) as e:
            return Delivery(None, time.monotonic() - t0, f"{type(e).__name__}: {e}")
        return Delivery(status, time.monotonic() - t0)

    futures = []
    with ThreadPoolExecutor(max(1, min(n, int(rate * timeout) + 1))) as pool:
        start = time.monotonic()
        for i in range(n):
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
            futures.append(pool.submit(one, i))
        return [f.result() for f in futures]


def summary(results: list[Delivery], within_s: float = 2.0) -> dict:
    """The share of RESULTS answered 2xx within WITHIN_S, and the latency quantiles (a delivery
    without an answer counts at its timeout)."""
    ok = [r for r in results if r.status is not None and 200 <= r.status < 300 and r.seconds <= within_s]
    times = sorted(r.seconds for r in results)
    q = statistics.quantiles(times, n=100, method="inclusive") if len(times) > 1 else times * 99
    return {
        "n": len(results),
        "ok_within": len(ok),
        "share": len(ok) / len(results) if results else 0.0,
        "p50_s": q[49],
        "p99_s": q[98],
        "unanswered": sum(r.status is None for r in results),
        "statuses": sorted({r.status for r in results}, key=str),
    }
