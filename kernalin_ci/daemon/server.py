"""The daemon's HTTP server (standard library, a thread per connection, bounded).

    POST /webhook                     GitHub App deliveries (path: settings.webhook_path)
    GET  /healthz                     200 {"status": "ok", ...} while the store answers
    GET  /metrics                     Prometheus text format
    GET  /badge/OWNER/REPO.svg|.json  the newest gate result into the default branch (?branch=)
    GET  /jobs/ID                     one job's state and timings (JSON)
    GET  /dashboard[/OWNER/REPO]      the history dashboard (read-only; kernalin_ci/dashboard)

A delivery is answered in the order: 413 (too big: not even read), 411 (no length), 401 (no
or a wrong X-Hub-Signature-256, checked on the raw bytes before anything is parsed), 400
(missing headers, malformed JSON, not the event's shape), then 200 for a replayed delivery
id, 202 for everything recorded. Nothing but the store is touched before the answer.

What a client without the webhook secret can hold is bounded (settings.http): at most
`max_connections` connections are handled at once (more wait in the kernel's listen backlog,
not in threads); each request must arrive whole within `request_deadline_s` (a watchdog shuts
the socket down after it, however slowly the bytes trickle in); request bodies in memory never
add up to more than `max_buffered_bytes` (a body that does not fit is answered 503). Anything
malformed is a 4xx, never a 500: a 500 means the store failed.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from kernalin_ci.daemon import webhook
from kernalin_ci.daemon.metrics import CONTENT_TYPE as METRICS_TYPE

log = logging.getLogger("kernalin_ci.daemon")
_BADGE = re.compile(r"/badge/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)\.(svg|json)")
_JOB = re.compile(r"/jobs/(kci-[0-9a-f]{1,40})")
_DASHBOARD = re.compile(r"/dashboard(?:/([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+))?/?")
_ASSET = re.compile(r"/dashboard/assets/([a-z.]+)")
DRAIN_BYTES = 4 * 1024 * 1024  # read (and drop) at most this much of a body that is too big
_DELIVERY = re.compile(r"[A-Za-z0-9._-]{1,100}")
_LENGTH = re.compile(r"[0-9]{1,15}")
CUT_AFTER_S = 2.0  # when every slot is taken, a connection still reading its request after this may be cut


class Deadlines:
    """A watchdog thread: a connection past its deadline has its socket shut down, which ends any
    read or write blocked on it (a per-read timeout alone lets a client send one byte at a time).
    It also knows which connections are still reading their request, and since when: when every
    slot is taken, the one that has been reading longest is cut to make room (a real sender's
    request arrives in milliseconds; a slow one never finishes)."""

    def __init__(self):
        self._due: dict[socket.socket, float] = {}
        self._reading: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="kernalin-http-deadlines", daemon=True).start()

    def arm(self, sock: socket.socket, seconds: float) -> None:
        """SOCK starts reading a request, which must be done (and answered) within SECONDS."""
        with self._lock:
            self._due[sock] = time.monotonic() + seconds
            self._reading[sock] = time.monotonic()

    def read(self, sock: socket.socket) -> None:
        """SOCK's request has arrived whole: it is being handled, no longer a candidate to cut."""
        with self._lock:
            self._reading.pop(sock, None)

    def disarm(self, sock: socket.socket) -> None:
        with self._lock:
            self._due.pop(sock, None)
            self._reading.pop(sock, None)

    def cut_slowest(self, min_age_s: float) -> bool:
        """Shut down the connection that has been reading its request longest, if that is more than
        MIN_AGE_S (a burst of real deliveries waiting for the CPU is not cut); whether one was."""
        with self._lock:
            if not self._reading:
                return False
            sock = min(self._reading, key=self._reading.get)
            if time.monotonic() - self._reading[sock] < min_age_s:
                return False
            del self._reading[sock]
            self._due.pop(sock, None)
        _shut(sock)
        return True

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            with self._lock:
                late = [sk for sk, t in self._due.items() if t <= now]
                for sk in late:
                    del self._due[sk]
                    self._reading.pop(sk, None)
            for sk in late:
                _shut(sk)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _fix_mmap_threshold(nbytes: int = 1 << 20) -> None:
    """Allocations from NBYTES up get their own mapping, returned to the system when freed (glibc
    otherwise raises the threshold after the first large free, and request bodies then stay in the
    heap of whichever thread read them)."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


class ByteBudget:
    """Bytes of request bodies held at once, over all connections."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # a burst of deliveries waits in the kernel's backlog, not in SYN retries

    def __init__(self, address, daemon):
        class _H(Handler):
            app = daemon

        limits = daemon.settings.http
        self.deadline_s = limits.request_deadline_s
        self.deadlines = Deadlines()
        self.budget = ByteBudget(limits.max_buffered_bytes)
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._closing = False
        _fix_mmap_threshold()
        super().__init__(address, _H)

    def process_request(self, request, client_address):
        # Wait for a free slot before taking the connection on: the accept loop pauses and further
        # clients queue in the kernel's backlog, so threads (and their memory) stay bounded.
        while not self._slots.acquire(timeout=0.01):
            self.deadlines.cut_slowest(CUT_AFTER_S)
            if self._closing:
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.deadlines.disarm(request)
            self._slots.release()

    def shutdown(self) -> None:
        self._closing = True
        super().shutdown()
        self.deadlines.stop()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kernalin-ci"
    timeout = 10  # per read; the whole request has the server's deadline (Deadlines)
    disable_nagle_algorithm = True
    app = None  # the Daemon

    def handle_one_request(self):
        self.server.deadlines.arm(self.connection, self.server.deadline_s)  # idle keep-alive time counts too
        super().handle_one_request()

    def log_message(self, format, *args):  # requests are counted in /metrics, not logged one by one
        pass

    # -- answers ----------------------------------------------------------------------------------
    def _send(
        self,
        status: int,
        body: bytes | str | dict,
        ctype: str = "application/json",
        headers: dict | None = None,
        close: bool = False,
    ) -> None:
        if isinstance(body, dict):
            body = json.dumps(body) + "\n"
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    # -- POST -------------------------------------------------------------------------------------
    def do_POST(self):
        t0 = time.perf_counter()
        if urlsplit(self.path).path != self.app.settings.webhook_path:
            return self._send(404, {"error": "not found"}, close=True)
        try:
            status, answer, event = self._delivery()
        except Exception as e:  # the store failed: GitHub shows the delivery as failed and can redeliver it
            log.exception("delivery failed")
            status, answer, event = 500, {"error": f"internal error: {type(e).__name__}"}, None
        m = self.app.metrics  # counted before the answer goes out: a client that reads /metrics next sees it
        m.observe("webhook_ack_seconds", time.perf_counter() - t0)
        m.inc("webhook_deliveries_total", {"event": event or "-", "status": str(status)})
        self._send(status, answer, close=status >= 400)

    def _delivery(self) -> tuple[int, dict, str | None]:
        settings = self.app.settings
        length = self.headers.get("Content-Length")
        if length is None:
            return 411, {"error": "a Content-Length header is required"}, None
        if not _LENGTH.fullmatch(length.strip()):
            return 400, {"error": "a malformed Content-Length header"}, None
        n = int(length)
        if n > settings.max_body_bytes:
            self._discard(min(n, DRAIN_BYTES))  # so the client reads the answer rather than a reset
            return 413, {"error": f"the body is larger than {settings.max_body_bytes} bytes"}, None
        budget = self.server.budget
        if not budget.take(n):
            self._discard(min(n, DRAIN_BYTES))
            return 503, {"error": "too many request bodies in flight; try again"}, None
        try:
            return self._signed(self._read_body(n))
        finally:
            budget.give(n)

    def _read_body(self, n: int) -> bytes | bytearray:
        body = bytearray(n)  # one allocation of the announced size, filled in place
        view, got = memoryview(body), 0
        try:
            while got < n:
                k = self.rfile.readinto(view[got : got + 65536])
                if not k:
                    break
                got += k
        except OSError:
            pass
        view.release()
        self.server.deadlines.read(self.connection)
        return body if got == n else body[:got]

    def _signed(self, body: bytes) -> tuple[int, dict, str | None]:
        settings = self.app.settings
        if len(body) != int(self.headers["Content-Length"]):
            return 400, {"error": "the body ended early"}, None
        if not webhook.signature_ok(settings.secrets.webhook, body, self.headers.get(webhook.SIGNATURE_HEADER)):
            return 401, {"error": f"missing or wrong {webhook.SIGNATURE_HEADER}"}, None
        event = self.headers.get("X-GitHub-Event", "")
        delivery = self.headers.get("X-GitHub-Delivery", "")
        if not event or not _DELIVERY.fullmatch(event) or not _DELIVERY.fullmatch(delivery):
            return 400, {"error": "missing or malformed X-GitHub-Event / X-GitHub-Delivery"}, event or None
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return 400, {"error": "the body is not JSON (set the webhook's content type to application/json)"}, event
        try:
            intents = webhook.interpret(event, payload)
        except webhook.BadPayload as e:
            return 400, {"error": f"not a {event} event: {e}"}, event
        except (ValueError, TypeError, RecursionError) as e:  # a shape interpret() did not foresee: still the sender's
            log.warning("delivery %s: unexpected %s payload: %s", delivery, event, type(e).__name__)
            return 400, {"error": f"not a {event} event: {type(e).__name__}"}, event
        action = payload.get("action") if isinstance(payload.get("action"), str) else None
        accepted = self.app.store.accept(delivery, event, action, intents)
        if accepted.duplicate:
            return 200, {"status": "duplicate", "delivery": delivery}, event
        self.app.delivered(accepted)
        if accepted.jobs or accepted.cancelled or intents.installation:
            return (
                202,
                {
                    "status": "accepted",
                    "delivery": delivery,
                    "jobs": accepted.jobs,
                    "cancelled": accepted.cancelled,
                    "note": accepted.note,
                },
                event,
            )
        note = accepted.note or intents.note
        return 202, {"status": "ignored", "delivery": delivery, "jobs": [], "note": note}, event

    def _discard(self, n: int) -> None:
        try:
            while n > 0:
                chunk = self.rfile.read(min(n, 65536))
                if not chunk:
                    return
                n -= len(chunk)
        except OSError:
            pass

    # -- GET --------------------------------------------------------------------------------------
    def do_GET(self):
        self.server.deadlines.read(self.connection)
        url = urlsplit(self.path)
        path = url.path
        if path == "/healthz":
            try:
                depth = self.app.store.queue_depth()
            except Exception as e:  # the store is what health means here
                return self._send(503, {"status": "unhealthy", "error": type(e).__name__})
            posting = self.app.poster.health()
            if posting:  # results are not reaching GitHub
                return self._send(503, {"status": "unhealthy", "error": posting, "queue_depth": depth})
            return self._send(200, {"status": "ok", "queue_depth": depth, "slots": self.app.slot_names()})
        if path == "/metrics":
            return self._send(200, self.app.render_metrics(), METRICS_TYPE)
        m = _BADGE.fullmatch(path)
        if m:
            return self._badge(f"{m.group(1)}/{m.group(2)}", m.group(3), parse_qs(url.query).get("branch", [None])[0])
        if path.startswith("/dashboard"):
            return self._dashboard(path)
        m = _JOB.fullmatch(path)
        if m:
            job = self.app.store.job(m.group(1))
            if job is None or not self.app.visible(job.spec.repo):
                return self._send(404, {"error": "no such job"})
            return self._send(200, job.public())
        return self._send(404, {"error": "not found"})

    do_HEAD = do_GET

    def _dashboard(self, path: str):
        from kernalin_ci.dashboard import assets, site
        from kernalin_ci.errors import UsageError

        history = self.app.history
        if history is None:
            return self._send(404, {"error": "the history is off (history.enabled: false)"})
        m = _ASSET.fullmatch(path)
        if m:
            try:
                data = assets.asset(m.group(1))
            except UsageError as e:  # Chart.js was not fetched at install time
                return self._send(503, {"error": str(e)})
            if data is None:
                return self._send(404, {"error": "not found"})
            kind = {"js": "text/javascript", "css": "text/css"}[m.group(1).rpartition(".")[2]]
            return self._send(200, data, f"{kind}; charset=utf-8", {"Cache-Control": "max-age=3600"})
        m = _DASHBOARD.fullmatch(path)
        if m is None:
            return self._send(404, {"error": "not found"})
        html = "text/html; charset=utf-8"
        if m.group(1) is None:
            names = [r for r in history.repos() if self.app.visible(r)]
            listing = [(r, f"/dashboard/{r}", len(history.runs(r))) for r in names]
            return self._send(200, site.index_page(listing, assets="/dashboard/assets/"), html)
        repo = m.group(1)
        if not self.app.visible(repo):
            return self._send(404, {"error": "unknown repository"})
        branch = (self.app.store.repo(repo) or {}).get("default_branch") or "main"
        page = site.repo_page(
            repo,
            history.runs(repo),
            assets="/dashboard/assets/",
            badge_src=f"/badge/{repo}.svg",
            index_href="/dashboard",
            ancestry=self.app.recorder.ancestry(repo, branch),
        )
        return self._send(200, page, html)

    def _badge(self, repo: str, kind: str, branch: str | None):
        from kernalin_ci.report.badge import badge_endpoint, badge_svg
        from kernalin_ci.report.model import Report

        info = self.app.store.repo(repo)
        if info is None or not self.app.visible(repo):
            return self._send(404, {"error": "unknown repository"})
        job = self.app.store.latest_result(repo, branch or info["default_branch"])
        if job is None or job.outcome is None or job.outcome.report is None:
            return self._send(404, {"error": f"no gate result for {branch or info['default_branch']} yet"})
        report = Report.from_json(job.outcome.report)
        cache = {"Cache-Control": "no-cache, max-age=60"}
        if kind == "svg":
            return self._send(200, badge_svg(report), "image/svg+xml; charset=utf-8", cache)
        return self._send(200, badge_endpoint(report), "application/json", cache)
