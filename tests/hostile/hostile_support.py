"""Helpers of the hostile-PR suite (fixtures are in conftest.py)."""
from __future__ import annotations

import os
import socket

REPO = "acme/kernels"
BASE_FILES = {".kernalin.yml": "version: 1\nkernels: []\n"}
PAYLOAD_COMMAND = ["{python}", "payload.py", "{out}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pr_with_payload(world, number: int, payload: str, files: dict | None = None) -> dict:
    """A pull request whose head adds payload.py (the 'kernel code' that runs in the job)."""
    repo = world.repos[REPO]
    head = repo.commit({"payload.py": payload, **(files or {})}, f"pr {number}", branch=f"pr-{number}")
    return world.pull_request(REPO, number, head, repo.main)


def check_run_text(world, job_id: str) -> str:
    runs = [r for r in world.standin.check_runs(REPO) if r["external_id"] == job_id]
    assert runs, f"no check run for {job_id}"
    out = runs[-1].get("output") or {}
    return " ".join(str(out.get(k) or "") for k in ("title", "summary", "text"))


def proc_threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))
