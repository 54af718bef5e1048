"""Issue 13, attack 9: exhausting or confusing the HTTP front of a real `kernalin-ci serve`.

Malformed headers and signed edge cases must be answered 400 (on main: 500s), a repository name of
`../..` never reaches an API path, nothing runs for a delivery without an App installation, and
clients without the secret can hold only bounded threads and memory: slowly trickled requests are
cut at the request deadline, request bodies in memory are capped as a whole. Issue 29, item 4: while
more slow clients than the front holds at once reconnect as soon as they are cut, signed deliveries
are still answered within GitHub's 10 s (on the threaded server they waited in the listen backlog
behind the attackers)."""

import json
import socket
import threading
import time

from hostile_support import PAYLOAD_COMMAND, REPO, proc_threads, serve, world  # noqa: F401 (fixtures)

from kernalin_ci.daemon.app import wait_for
from kernalin_ci.daemon.server import HANDLER_THREADS
from kernalin_ci.daemon.webhook import signature
from kernalin_ci.testing.daemon_world import WEBHOOK_SECRET
from kernalin_ci.testing.hostile_http import GITHUB_TIMEOUT_S, ReconnectingSlowClients, signed_deliveries


def raw(url: str, data: bytes) -> int:
    """Send DATA on a fresh connection; the status code answered."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(data)
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ")[1])


def signed(event: str, body: bytes, length: bytes | None = None) -> bytes:
    return (
        b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: "
        + event.encode()
        + b"\r\nX-GitHub-Delivery: d-"
        + str(time.monotonic_ns()).encode()
        + b"\r\nX-Hub-Signature-256: "
        + signature(WEBHOOK_SECRET.encode(), body).encode()
        + b"\r\nContent-Length: "
        + (length or str(len(body)).encode())
        + b"\r\n\r\n"
        + body
    )


def test_malformed_requests_are_400_and_names_are_checked(tmp_path, world, serve):
    daemon = serve(world.daemon_config(tmp_path / "state", runner={"command": PAYLOAD_COMMAND}))
    repo = world.repos[REPO]
    good = world.pull_request(REPO, 1, repo.main, repo.main)
    assert raw(daemon.url, signed("pull_request", b"{}", length="\u00b2".encode("latin-1"))) == 400
    assert raw(daemon.url, signed("pull_request", b"[" * 200_000 + b"]" * 200_000)) == 400
    huge = json.loads(json.dumps(good))
    huge["number"] = huge["pull_request"]["number"] = 2**70
    assert daemon.deliver("pull_request", huge)[0] == 400
    dots = json.loads(json.dumps(good))
    dots["repository"]["full_name"] = "../.."
    assert daemon.deliver("pull_request", dots)[0] == 400
    uninstalled = json.loads(json.dumps(good))
    uninstalled.pop("installation")
    status, answer = daemon.deliver("pull_request", uninstalled)
    assert status == 202 and answer["jobs"] == [], answer
    status, answer = daemon.deliver("pull_request", good)  # the same delivery, well formed: one job
    assert status == 202 and len(answer["jobs"]) == 1
    assert "Traceback" not in daemon.log.read_text()


def test_slow_clients_and_large_bodies_hold_bounded_resources(tmp_path, world, serve):
    daemon = serve(
        world.daemon_config(
            tmp_path / "state",
            runner={"command": PAYLOAD_COMMAND},
            http={"max_connections": 8, "request_deadline_s": 2, "max_buffered_bytes": 1_000_000},
        )
    )
    host, port = daemon.url.split("//")[1].split(":")
    base_threads = proc_threads(daemon.pid)
    clients = [socket.create_connection((host, int(port)), timeout=5) for _ in range(40)]
    cut = [False] * len(clients)
    peak = [0]

    def trickle():  # one header byte per client every 0.2 s, for 6 s: under any per-read timeout
        for s in clients:
            s.sendall(b"POST /webhook HTTP/1.1\r\nX-Slow: ")
        end = time.monotonic() + 6
        while time.monotonic() < end:
            for i, s in enumerate(clients):
                if not cut[i]:
                    try:
                        s.sendall(b"a")
                    except OSError:
                        cut[i] = True
            peak[0] = max(peak[0], proc_threads(daemon.pid))
            time.sleep(0.2)

    t = threading.Thread(target=trickle)
    t.start()
    time.sleep(1)
    status, _ = daemon.get("/healthz")  # a real client still gets through (after the deadline frees slots)
    t.join()
    for s in clients:
        s.close()
    assert status == 200
    assert peak[0] <= base_threads + 8 + 2, (base_threads, peak[0])  # at most max_connections handler threads
    # those taken on were cut at their deadline however steadily they trickled (the others waited in the
    # kernel's listen backlog, holding no thread)
    assert cut.count(True) >= 8, cut

    # bodies in memory: a first client holds a 800 kB body open; a second one's does not fit the budget
    holder = socket.create_connection((host, int(port)), timeout=10)
    holder.sendall(b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 800000\r\n\r\n" + b"x" * 1000)
    time.sleep(0.5)
    body = b"y" * 800_000
    assert (
        raw(
            daemon.url,
            b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: ping\r\nX-GitHub-Delivery: d1\r\n"
            b"X-Hub-Signature-256: sha256=00\r\nContent-Length: 800000\r\n\r\n" + body,
        )
        == 503
    )
    holder.close()
    assert wait_for(
        lambda: (
            raw(
                daemon.url,
                b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: ping\r\n"
                b"X-GitHub-Delivery: d2\r\nX-Hub-Signature-256: sha256=00\r\n"
                b"Content-Length: 800000\r\n\r\n" + body,
            )
            == 401
        ),
        10,
    )


def test_signed_deliveries_get_through_reconnecting_slow_clients(tmp_path, world, serve):
    # 200 attackers against a front that holds 16 connections at once: each is cut and at once reconnects
    daemon = serve(
        world.daemon_config(tmp_path / "state", runner={"command": PAYLOAD_COMMAND}, http={"max_connections": 16})
    )
    base_threads = proc_threads(daemon.pid)
    peak = [base_threads]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.1):
            peak[0] = max(peak[0], proc_threads(daemon.pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ReconnectingSlowClients(daemon.url, 200) as attack:
            time.sleep(2)  # every attacker connected and trickling
            results = signed_deliveries(daemon.url, WEBHOOK_SECRET, 20, rate=5)
    finally:
        stop.set()
        sampler.join()
    assert attack.connects > 200 and attack.cuts > 0, (attack.connects, attack.cuts)  # the attack was real
    late = [
        (r.status, round(r.seconds, 1), r.error) for r in results if r.status != 202 or r.seconds > GITHUB_TIMEOUT_S
    ]
    assert not late, late  # each delivery answered 2xx within GitHub's limit
    assert peak[0] <= base_threads + HANDLER_THREADS + 2, (base_threads, peak[0])  # no thread per connection
