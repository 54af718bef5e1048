"""Shared by the history tests: report.json documents of a gate run, and a throwaway PostgreSQL server."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def bench(ratio: float, head_ms: float, shape: str = "decode") -> dict:
    """A benchmark verdict of the gate (bench/pair.py's to_json, the fields history reads)."""
    base_ms = head_ms / ratio
    v = {
        "verdict": "slower" if ratio > 1.01 else "equivalent",
        "ratio": ratio,
        "hdi": [ratio - 0.002, ratio + 0.002],
        "p_faster": 0.0,
        "p_slower": 0.9 if ratio > 1.01 else 0.01,
        "p_equivalent": 0.1,
        "rope": [0.99, 1.01],
    }
    return {**v, "clock": "cuda-events", "shapes": [{"shape": shape, **v, "base_ms": base_ms, "head_ms": head_ms}]}


def report(kernels: list[dict], conclusion: str = "success", base: str = "0" * 40) -> dict:
    return {
        "schema": 1,
        "conclusion": conclusion,
        "reason": f"test: {conclusion}",
        "base": {"sha": base},
        "head": {"sha": "f" * 40},
        "device": "cuda",
        "policy": {},
        "kernels": kernels,
        "environment": {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0"},
    }


def kernel(name: str, benchmark: dict | None = None, findings: list[dict] | None = None) -> dict:
    return {
        "name": name,
        "op": "rope",
        "entry": "k.py:f",
        "status": "changed",
        "verification": {"verdict": "fail" if findings else "pass", "findings": findings or []},
        "benchmark": benchmark,
        "failed_by": ["finding"] if findings else [],
    }


PG_BIN = (
    next((p for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True) if (p / "initdb").is_file()), None)
    if Path("/usr/lib/postgresql").is_dir()
    else None
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """initdb + pg_ctl on a temporary directory, as a non-root user (PostgreSQL refuses root)."""

    def __init__(self):
        self.root, self.port = Path(tempfile.mkdtemp(prefix="kernalin-pg-")), free_port()  # /tmp: any user reaches it
        self.data = self.root / "data"
        self.user = None
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    pwd.getpwnam(name)
                    self.user = name
                    break
                except KeyError:
                    continue

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {p.stderr or p.stdout}")

    def start(self) -> Postgres:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.user:
            shutil.chown(self.root, self.user)
        self._run(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "kernalin", "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        self._run(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-w",
            "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )
        return self

    @property
    def url(self) -> str:
        return f"postgresql://kernalin@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        try:
            self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except RuntimeError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
