"""Send a webhook delivery the way GitHub does: JSON body, X-GitHub-Event, X-GitHub-Delivery and
X-Hub-Signature-256 (HMAC-SHA256 of the exact bytes sent). For tests, benchmarks and replaying a
delivery by hand; a plain http.client request, one connection each.

    status, answer = deliver("http://127.0.0.1:8080/webhook", "pull_request", payload, secret)
"""

from __future__ import annotations

import http.client
import json
import uuid
from urllib.parse import urlsplit

from kernalin_ci.daemon.webhook import SIGNATURE_HEADER, signature


def deliver(
    url: str,
    event: str,
    payload: dict | bytes,
    secret: bytes | str | None,
    *,
    delivery_id: str | None = None,
    signature_value: str | None = None,
    timeout: float = 30,
    extra_headers: dict | None = None,
) -> tuple[int, dict]:
    """POST one delivery; (HTTP status, the JSON answer). secret None: no signature header at all;
    signature_value: send this header value instead of the right one."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/kernalin-test",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery_id or str(uuid.uuid4()),
        "Content-Length": str(len(body)),
    }
    if signature_value is not None:
        headers[SIGNATURE_HEADER] = signature_value
    elif secret is not None:
        headers[SIGNATURE_HEADER] = signature(secret.encode() if isinstance(secret, str) else secret, body)
    headers.update(extra_headers or {})
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        conn.request("POST", u.path or "/", body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    try:
        answer = json.loads(data) if data else {}
    except ValueError:
        answer = {"raw": data.decode("utf-8", "replace")}
    return r.status, answer


def get_json(url: str, timeout: float = 30) -> tuple[int, dict | str]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        conn.request("GET", u.path + (f"?{u.query}" if u.query else ""))
        r = conn.getresponse()
        data = r.read().decode("utf-8", "replace")
        ctype = r.getheader("Content-Type", "")
    finally:
        conn.close()
    if ctype.startswith("application/json"):
        return r.status, json.loads(data)
    return r.status, data
