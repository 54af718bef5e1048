"""The daemon's HTTP front: one asyncio loop holds the connections, a few threads answer them.

    POST /webhook                     GitHub App deliveries (path: settings.webhook_path)
    GET  /healthz                     200 {"status": "ok", ...} while the store answers
    GET  /metrics                     Prometheus text format
    GET  /badge/OWNER/REPO.svg|.json  the newest gate result into the default branch (?branch=)
    GET  /jobs/ID                     one job's state and timings (JSON)
    GET  /dashboard[/OWNER/REPO]      the history dashboard (read-only; kernalin_ci/dashboard)

A connection costs a socket and a small buffer, never a thread: the loop reads each request whole
(h11 parses HTTP/1.1; the request line and headers may take at most MAX_HEAD_BYTES), then hands it
to one of HANDLER_THREADS threads (`Routes`), which answer it from the store. So clients that send
their request slowly, or never finish it, hold no thread, and a signed delivery is answered as soon
as its bytes are in (docs/security.md: "HTTP front").

A delivery is answered in the order: 413 (too big: not even read), 411 (no length), 401 (no
or a wrong X-Hub-Signature-256, checked on the raw bytes before anything is parsed), 400
(missing headers, malformed JSON, not the event's shape), then 200 for a replayed delivery
id, 202 for everything recorded. Nothing but the store is touched before the answer.

What a client without the webhook secret can hold is bounded (settings.http): at most
`max_connections` connections are open at once; when all are taken, the one that has waited longest
for its client is cut to make room, one still waiting for a request's head first (a real sender's
request arrives in milliseconds; a slow one never finishes; a sender may write the head and the body
apart), and while none is waiting (all are being answered) further clients wait in the kernel's
listen backlog. Each request must arrive, and be answered, whole within `request_deadline_s` of the
connection starting to wait for it (idle keep-alive time counts), however slowly its bytes trickle.
Request bodies held at once never add up to more than `max_buffered_bytes` (one that does not fit
is answered 503, from its Content-Length, before any of it is read). After an answer that closes the
connection, what the client still sends is read and dropped (at most DRAIN_BYTES, within the
deadline), so that it reads the answer rather than a reset. Anything malformed is a 4xx, never a
500: a 500 means the store failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import resource
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

import h11

from kernalin_ci.daemon import webhook
from kernalin_ci.daemon.metrics import CONTENT_TYPE as METRICS_TYPE
from kernalin_ci.dashboard import assets, site
from kernalin_ci.errors import UsageError
from kernalin_ci.report.badge import badge_endpoint, badge_svg
from kernalin_ci.report.model import Report

log = logging.getLogger("kernalin_ci.daemon")
_BADGE = re.compile(r"/badge/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)\.(svg|json)")
_JOB = re.compile(r"/jobs/(kci-[0-9a-f]{1,40})")
_DASHBOARD = re.compile(r"/dashboard(?:/([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+))?/?")
_ASSET = re.compile(r"/dashboard/assets/([a-z.]+)")
_DELIVERY = re.compile(r"[A-Za-z0-9._-]{1,100}")
HANDLER_THREADS = 8  # requests answered at once (each a store transaction or a page rendered)
MAX_HEAD_BYTES = 16 * 1024  # a request's line and headers
READ_BYTES = 64 * 1024  # one read from a socket
DRAIN_BYTES = 4 * 1024 * 1024  # read (and drop) at most this much of a request that is refused
OWN_FILES = 256  # open files the daemon keeps for itself beside its connections (store, jobs, pipes)
BACKLOG = 1024  # a burst of deliveries waits in the kernel's backlog, not in SYN retries


@dataclass(frozen=True)
class HttpRequest:
    method: str  # GET, HEAD, POST, ...
    target: str  # the path and the query, as sent
    headers: dict[str, str]  # names in lower case; the first of a repeated header
    body: bytes | bytearray = b""
    received: float = 0.0  # time.perf_counter() when its head had arrived

    @property
    def path(self) -> str:
        return urlsplit(self.target).path


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    ctype: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False  # close the connection after this answer


def answer(
    status: int, body: bytes | str | dict, ctype: str = "application/json", headers=None, close: bool = False
) -> Answer:
    if isinstance(body, dict):
        body = json.dumps(body) + "\n"
    return Answer(status, body.encode() if isinstance(body, str) else body, ctype, headers or {}, close)


def _fix_mmap_threshold(nbytes: int = 1 << 20) -> None:
    """Allocations from NBYTES up get their own mapping, returned to the system when freed (glibc
    otherwise raises the threshold after the first large free, and request bodies then stay in the
    heap of whichever thread read them)."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _connections_that_fit(wanted: int) -> int:
    """Raise the soft limit on open files (up to the hard one) so that WANTED connections fit beside
    the daemon's own files; how many fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + OWN_FILES
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted
    fit = max(1, soft - OWN_FILES)
    log.warning(
        "http.max_connections %d: only %d fit under the open files limit %d (raise it: LimitNOFILE=, ulimit -n)",
        wanted,
        fit,
        soft,
    )
    return fit


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


class _Conn:
    __slots__ = ("sock", "task")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.task: asyncio.Task | None = None


class Server:
    """Listens on ADDRESS (bound at once); `serve_forever` runs the loop in the calling thread until
    `shutdown` (from another thread)."""

    def __init__(self, address: tuple[str, int], daemon):
        limits = daemon.settings.http
        self.budget = ByteBudget(limits.max_buffered_bytes)
        self.routes = Routes(daemon, self.budget)
        self.deadline_s = limits.request_deadline_s
        self.max_connections = _connections_that_fit(limits.max_connections)
        self._sock = socket.create_server(address, backlog=BACKLOG)
        if hasattr(socket, "TCP_DEFER_ACCEPT"):  # Linux: a client is accepted once its first bytes are in
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, max(1, int(self.deadline_s)))
        self._sock.setblocking(False)
        self.server_address = self._sock.getsockname()
        self._pool = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="kernalin-http-answer")
        self._loop = asyncio.new_event_loop()
        self._open: set[_Conn] = set()
        # connections waiting for their client, longest first: for a request's head (or after an answer),
        # and for the rest of a request whose head has come (a sender may write the head and the body apart)
        self._waiting: dict[_Conn, None] = {}
        self._waiting_body: dict[_Conn, None] = {}
        self._room = asyncio.Event()
        self._stopping = asyncio.Event()
        self._ran = threading.Event()
        self._done = threading.Event()
        _fix_mmap_threshold()

    # -- lifecycle --------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        self._ran.set()
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._done.set()

    def shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._stopping.set)
        if self._ran.is_set():
            self._done.wait(30)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def server_close(self) -> None:
        self._sock.close()
        if not self._loop.is_running():
            self._loop.close()

    async def _serve(self) -> None:
        accepting = asyncio.ensure_future(self._accept())
        await self._stopping.wait()
        accepting.cancel()
        tasks = [accepting] + [c.task for c in self._open if c.task]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- connections ------------------------------------------------------------------------------
    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while len(self._open) >= self.max_connections and self._longest_waiting() is None:
                await self._freed()  # every connection is being answered: the next client waits in the backlog
            try:
                sock, _ = await loop.sock_accept(self._sock)
            except OSError as e:  # out of file descriptors, or the client gave up: try again shortly
                log.warning("accept: %s", e)
                await asyncio.sleep(0.1)
                continue
            while len(self._open) >= self.max_connections:
                longest = self._longest_waiting()
                if longest is not None:
                    self._cut(longest)
                else:
                    await self._freed()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock)
            self._open.add(conn)
            conn.task = loop.create_task(self._connection(conn))
            await asyncio.sleep(0)  # let the connections run between two accepts

    async def _freed(self) -> None:
        """Until a connection ends."""
        self._room.clear()
        await self._room.wait()

    def _longest_waiting(self) -> _Conn | None:
        """The connection to cut when every one is taken: the one that has waited longest for a request's
        head, else the one that has waited longest for the rest of its request (a real sender's request
        arrives in milliseconds, a slow one never finishes)."""
        for waiting in (self._waiting, self._waiting_body):
            if waiting:
                return next(iter(waiting))
        return None

    def _cut(self, conn: _Conn) -> None:
        self._busy(conn)
        self._open.discard(conn)
        if conn.task:
            conn.task.cancel()

    def _wait(self, conn: _Conn, body: bool = False) -> None:
        """CONN waits for its client from now on, for a request's head or (BODY) the rest of the request:
        the last one of its kind to cut."""
        self._busy(conn)
        (self._waiting_body if body else self._waiting)[conn] = None

    def _busy(self, conn: _Conn) -> None:
        """CONN no longer waits for its client (it is being answered, or it ended)."""
        self._waiting.pop(conn, None)
        self._waiting_body.pop(conn, None)

    async def _connection(self, conn: _Conn) -> None:
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            while True:
                self._wait(conn)
                try:
                    keep = await asyncio.wait_for(self._exchange(conn, h), self.deadline_s)
                except asyncio.TimeoutError:
                    return
                if not keep:
                    return
                h.start_next_cycle()
        except (OSError, h11.LocalProtocolError):
            pass  # the client went away, or broke the protocol after its answer
        finally:
            self._busy(conn)
            self._open.discard(conn)
            conn.sock.close()
            self._room.set()

    async def _exchange(self, conn: _Conn, h: h11.Connection) -> bool:
        """One request and its answer on CONN; whether the connection stays open for another."""
        try:
            event = await self._next(conn, h)
            if not isinstance(event, h11.Request):
                return False
            received = time.perf_counter()
            headers: dict[str, str] = {}
            for name, value in event.headers:
                headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
            head = HttpRequest(event.method.decode("latin-1"), event.target.decode("latin-1"), headers, b"", received)
            refused = self.routes.refuse(head)
            if refused is not None:
                await self._send(conn, h, head, refused)
                return False
            reserved = int(headers.get("content-length", "0")) if head.method == "POST" else 0  # refuse() took it
            unread = head.method != "POST" and (
                "transfer-encoding" in headers or headers.get("content-length", "0") != "0"
            )
            try:
                request = head if unread else await self._read_body(conn, h, head, reserved)
            except BaseException:
                self.budget.give(reserved)
                raise
            self._busy(conn)  # being answered: no longer a candidate to cut
            reply = await self._answer(request, reserved)
            del request  # the budget has its bytes back: so has the memory, before the answer goes out
        except h11.RemoteProtocolError as e:  # malformed: 400 (431 for too long a head), never a 500
            if h.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
                return False
            refusal = answer(e.error_status_hint, {"error": f"malformed request: {e}"}, close=True)
            await self._send(conn, h, HttpRequest("GET", "/", {}), refusal)
            return False
        if unread:  # a body nobody reads (a GET's): the connection ends after the answer
            reply = Answer(reply.status, reply.body, reply.ctype, reply.headers, close=True)
        await self._send(conn, h, head, reply)
        return not reply.close and h.our_state is h11.DONE and h.their_state is h11.DONE

    async def _next(self, conn: _Conn, h: h11.Connection):
        loop = asyncio.get_running_loop()
        while True:
            event = h.next_event()
            if event is not h11.NEED_DATA:
                return event
            h.receive_data(await loop.sock_recv(conn.sock, READ_BYTES))

    async def _read_body(self, conn: _Conn, h: h11.Connection, head: HttpRequest, n: int) -> HttpRequest:
        self._wait(conn, body=True)
        if n and h.they_are_waiting_for_100_continue:
            await asyncio.get_running_loop().sock_sendall(
                conn.sock, h.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
            )
        body = bytearray(n)  # one allocation of the announced size (h11 holds the client to it), filled in place
        got = 0
        while True:
            event = await self._next(conn, h)
            if isinstance(event, h11.Data):
                body[got : got + len(event.data)] = event.data
                got += len(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return HttpRequest(head.method, head.target, head.headers, body, head.received)
            else:
                raise h11.RemoteProtocolError("the body ended early")

    async def _answer(self, request: HttpRequest, reserved: int) -> Answer:
        """REQUEST's answer from a handler thread, which gives the body's RESERVED bytes back."""

        def run() -> Answer:
            try:
                return self.routes.answer(request)
            finally:
                self.budget.give(reserved)

        future = self._pool.submit(run)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancelled():  # never ran: give its bytes back here
                self.budget.give(reserved)
            raise

    async def _send(self, conn: _Conn, h: h11.Connection, head: HttpRequest, reply: Answer) -> None:
        headers = [
            ("Content-Type", reply.ctype),
            ("Content-Length", str(len(reply.body))),
            ("Server", "kernalin-ci"),
            ("Date", formatdate(usegmt=True)),
            *reply.headers.items(),
        ]
        if reply.close:
            headers.append(("Connection", "close"))
        data = h.send(h11.Response(status_code=reply.status, headers=headers, reason=HTTPStatus(reply.status).phrase))
        if head.method != "HEAD":
            data += h.send(h11.Data(data=reply.body))
        data += h.send(h11.EndOfMessage())
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(conn.sock, data)
        if reply.close or h.our_state is not h11.DONE:
            await self._drain(conn)

    async def _drain(self, conn: _Conn) -> None:
        """The answer is out and the connection ends: read what the client still sends (at most
        DRAIN_BYTES), so that closing does not reset the connection before the client has read it."""
        self._wait(conn)
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return
        loop, left = asyncio.get_running_loop(), DRAIN_BYTES
        while left > 0:
            data = await loop.sock_recv(conn.sock, min(READ_BYTES, left))
            if not data:
                return
            left -= len(data)


class Routes:
    """The answers, in a handler thread: from a whole request to its answer."""

    def __init__(self, daemon, budget: ByteBudget):
        self.app, self.budget = daemon, budget

    def refuse(self, head: HttpRequest) -> Answer | None:
        """The answer that refuses HEAD before its body is read (and, for a delivery that may come in,
        its bytes taken from the budget), or None. In the loop's thread: no store, no waiting."""
        if head.method in ("GET", "HEAD"):
            return None
        if head.method != "POST":
            return answer(501, {"error": f"unsupported method {head.method}"}, close=True)
        if head.path != self.app.settings.webhook_path:
            return answer(404, {"error": "not found"}, close=True)
        status, body = self._admit(head)
        if status is None:
            return None
        self._count(head, status, None)
        return answer(status, body, close=True)

    def _admit(self, head: HttpRequest) -> tuple[int | None, dict]:
        length = head.headers.get("content-length")
        if length is None or "transfer-encoding" in head.headers:
            return 411, {"error": "a Content-Length header is required"}
        n = int(length)  # h11 has checked that it is a number
        limit = self.app.settings.max_body_bytes
        if n > limit:
            return 413, {"error": f"the body is larger than {limit} bytes"}
        if not self.budget.take(n):
            return 503, {"error": "too many request bodies in flight; try again"}
        return None, {}

    def answer(self, req: HttpRequest) -> Answer:
        try:
            return self.post(req) if req.method == "POST" else self.get(req)
        except Exception as e:  # a bug or the store: a 500 that says which, the traceback in the log
            log.exception("%s %s failed", req.method, req.path)
            return answer(500, {"error": f"internal error: {type(e).__name__}"}, close=True)

    def _count(self, req: HttpRequest, status: int, event: str | None) -> None:
        m = self.app.metrics  # counted before the answer goes out: a client that reads /metrics next sees it
        m.observe("webhook_ack_seconds", time.perf_counter() - req.received)
        m.inc("webhook_deliveries_total", {"event": event or "-", "status": str(status)})

    # -- POST -------------------------------------------------------------------------------------
    def post(self, req: HttpRequest) -> Answer:
        try:
            status, body, event = self._signed(req)
        except Exception as e:  # the store failed: GitHub shows the delivery as failed and can redeliver it
            log.exception("delivery failed")
            status, body, event = 500, {"error": f"internal error: {type(e).__name__}"}, None
        self._count(req, status, event)
        return answer(status, body, close=status >= 400)

    def _signed(self, req: HttpRequest) -> tuple[int, dict, str | None]:
        settings = self.app.settings
        body = req.body  # bytes or the bytearray it was read into: hmac and json take both, uncopied
        if not webhook.signature_ok(settings.secrets.webhook, body, req.headers.get(webhook.SIGNATURE_HEADER.lower())):
            return 401, {"error": f"missing or wrong {webhook.SIGNATURE_HEADER}"}, None
        event = req.headers.get("x-github-event", "")
        delivery = req.headers.get("x-github-delivery", "")
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

    # -- GET --------------------------------------------------------------------------------------
    def get(self, req: HttpRequest) -> Answer:
        url = urlsplit(req.target)
        path = url.path
        if path == "/healthz":
            try:
                depth = self.app.store.queue_depth()
            except Exception as e:  # the store is what health means here
                return answer(503, {"status": "unhealthy", "error": type(e).__name__})
            posting = self.app.poster.health()
            if posting:  # results are not reaching GitHub
                return answer(503, {"status": "unhealthy", "error": posting, "queue_depth": depth})
            return answer(200, {"status": "ok", "queue_depth": depth, "slots": self.app.slot_names()})
        if path == "/metrics":
            return answer(200, self.app.render_metrics(), METRICS_TYPE)
        m = _BADGE.fullmatch(path)
        if m:
            return self._badge(f"{m.group(1)}/{m.group(2)}", m.group(3), parse_qs(url.query).get("branch", [None])[0])
        if path.startswith("/dashboard"):
            return self._dashboard(path)
        m = _JOB.fullmatch(path)
        if m:
            job = self.app.store.job(m.group(1))
            if job is None or not self.app.visible(job.spec.repo):
                return answer(404, {"error": "no such job"})
            return answer(200, job.public())
        return answer(404, {"error": "not found"})

    def _dashboard(self, path: str) -> Answer:

        history = self.app.history
        if history is None:
            return answer(404, {"error": "the history is off (history.enabled: false)"})
        m = _ASSET.fullmatch(path)
        if m:
            try:
                data = assets.asset(m.group(1))
            except UsageError as e:  # Chart.js was not fetched at install time
                return answer(503, {"error": str(e)})
            if data is None:
                return answer(404, {"error": "not found"})
            kind = {"js": "text/javascript", "css": "text/css"}[m.group(1).rpartition(".")[2]]
            return answer(200, data, f"{kind}; charset=utf-8", {"Cache-Control": "max-age=3600"})
        m = _DASHBOARD.fullmatch(path)
        if m is None:
            return answer(404, {"error": "not found"})
        html = "text/html; charset=utf-8"
        if m.group(1) is None:
            names = [r for r in history.repos() if self.app.visible(r)]
            listing = [(r, f"/dashboard/{r}", len(history.runs(r))) for r in names]
            return answer(200, site.index_page(listing, assets="/dashboard/assets/"), html)
        repo = m.group(1)
        if not self.app.visible(repo):
            return answer(404, {"error": "unknown repository"})
        branch = (self.app.store.repo(repo) or {}).get("default_branch") or "main"
        page = site.repo_page(
            repo,
            history.runs(repo),
            assets="/dashboard/assets/",
            badge_src=f"/badge/{repo}.svg",
            index_href="/dashboard",
            ancestry=self.app.recorder.ancestry(repo, branch),
        )
        return answer(200, page, html)

    def _badge(self, repo: str, kind: str, branch: str | None) -> Answer:

        info = self.app.store.repo(repo)
        if info is None or not self.app.visible(repo):
            return answer(404, {"error": "unknown repository"})
        job = self.app.store.latest_result(repo, branch or info["default_branch"])
        if job is None or job.outcome is None or job.outcome.report is None:
            return answer(404, {"error": f"no gate result for {branch or info['default_branch']} yet"})
        report = Report.from_json(job.outcome.report)
        cache = {"Cache-Control": "no-cache, max-age=60"}
        if kind == "svg":
            return answer(200, badge_svg(report), "image/svg+xml; charset=utf-8", cache)
        return answer(200, badge_endpoint(report), "application/json", cache)
