"""A job's workspace: a fresh checkout of the pull request, fetched by the daemon, and the gate
configuration taken from the BASE commit (a pull request cannot change the gate that judges it).

    JOB_DIR/repo/                the checkout at the PR head (base and head commits fetched, depth 1)
    JOB_DIR/repo/.kernalin.yml   overwritten with the base commit's file (its `daemon:` section blanked)
    JOB_DIR/kernalin.yml         the same file, for runners that mount it
    JOB_DIR/out/                 where the gate writes report.json and the rest
    JOB_DIR/home, tmp            the job's HOME and TMPDIR

git runs with a scrubbed environment; a fetch token (private repositories) goes to git through
GIT_CONFIG_* variables of that one process, so it is neither on a command line nor in .git/config.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kernalin_ci.config import DEFAULT_FILE
from kernalin_ci.daemon import safefile
from kernalin_ci.daemon.model import JobSpec

FETCH_TIMEOUT_S = 600
# per-repository keys in the base branch's .kernalin.yml `daemon:` section
REPO_KEYS = ("fork_label", "timeout_s")


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
CONFIG_MAX_BYTES = 1024 * 1024


def redact(text: str) -> str:
    """TEXT with the credentials of every URL in it (scheme://USER:PASSWORD@host) taken out."""
    return _USERINFO.sub(r"\1", text)


class FetchError(Exception):
    """The code could not be fetched (network, permissions, a commit that vanished): infrastructure.
    Its message never holds a URL's credentials (it is posted on the check run)."""

    def __init__(self, message: str):
        super().__init__(redact(message))


@dataclass
class Workspace:
    job_dir: Path
    repo: Path
    out: Path
    config: Path | None  # the base commit's configuration, None when the base has none
    repo_settings: dict = field(default_factory=dict)  # the base config's `daemon:` section

    def clean(self) -> None:
        """Remove the checkout (keep out/ and job.log for the record)."""
        shutil.rmtree(self.repo, ignore_errors=True)
        for d in ("home", "tmp"):
            shutil.rmtree(self.job_dir / d, ignore_errors=True)


def _git_env(token: str | None) -> dict:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "LANG": "C",
    }
    if token:
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        env.update(
            {
                "GIT_CONFIG_COUNT": "1",
                "GIT_CONFIG_KEY_0": "http.extraHeader",
                "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
            }
        )
    return env


def _git(
    repo: Path, *args: str, token: str | None = None, timeout: float = FETCH_TIMEOUT_S, check: bool = True
) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(
            ["git", *args],
            cwd=repo,
            env=_git_env(token),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise FetchError(f"git {args[0]} timed out after {timeout:.0f} s") from None
    if check and r.returncode != 0:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        raise FetchError(f"git {args[0]} failed: {lines[-1] if lines else 'exit ' + str(r.returncode)}")
    return r


def clone_url(template: str, repo: str) -> str:
    owner, name = repo.split("/", 1)
    return template.format(repo=repo, owner=owner, name=name)


def create(job_dir: Path) -> Workspace:
    """A fresh, empty workspace (whatever an earlier attempt left is removed first: links are removed,
    never followed)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    for d in ("repo", "out", "home", "tmp", "kernalin.yml"):
        safefile.remove(job_dir / d)
    for d in ("repo", "out", "home", "tmp"):
        (job_dir / d).mkdir()
    ws = Workspace(job_dir, job_dir / "repo", job_dir / "out", None)
    _git(ws.repo, "init", "-q")
    return ws


def fetch(ws: Workspace, url: str, *shas: str, token: str | None = None) -> None:
    """Fetch commits SHAS (depth 1) from URL; each gets a ref so a clone of the checkout has it too."""
    _git(ws.repo, "fetch", "-q", "--no-tags", "--depth=1", url, *shas, token=token)
    for sha in shas:
        if _git(ws.repo, "cat-file", "-e", f"{sha}^{{commit}}", check=False).returncode != 0:
            raise FetchError(f"commit {sha[:12]} is not in {url}")
        _git(ws.repo, "update-ref", f"refs/heads/kernalin/{sha}", sha)


def read_base_config(ws: Workspace, spec: JobSpec) -> None:
    """The base commit's .kernalin.yml into JOB_DIR/kernalin.yml, its `daemon:` section split off."""
    r = _git(ws.repo, "show", f"{spec.base_sha}:{DEFAULT_FILE}", check=False)
    if r.returncode != 0:
        ws.config = None
        return
    text, ws.repo_settings = split_daemon_section(r.stdout)
    ws.config = ws.job_dir / "kernalin.yml"
    safefile.replace(ws.config, text.encode(), within=ws.job_dir)


def checkout_head(ws: Workspace, spec: JobSpec) -> None:
    """The working tree at the PR head, with the base configuration in place of the head's."""
    _git(ws.repo, "checkout", "-q", "--detach", spec.head_sha)
    if ws.config is not None:  # the head's file may be a link: it is replaced, never written through
        data = safefile.read_bytes(ws.config, ws.job_dir, CONFIG_MAX_BYTES)
        safefile.replace(ws.repo / DEFAULT_FILE, data, within=ws.job_dir)


def split_daemon_section(text: str) -> tuple[str, dict]:
    """(TEXT with the top-level `daemon:` mapping blanked line for line, that mapping).

    Lines are blanked rather than removed so the gate's error messages keep their line numbers.
    Unknown keys in the section are ignored (a newer daemon may know them); bad YAML is left for
    the gate to report.
    """
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return text, {}
    if not isinstance(root, yaml.MappingNode):
        return text, {}
    for k, v in root.value:
        if isinstance(k, yaml.ScalarNode) and k.value == "daemon":
            data = yaml.safe_load(yaml.serialize(v)) if v is not None else None
            lines = text.splitlines(keepends=True)
            end = v.end_mark.line + (1 if v.end_mark.column > 0 else 0)
            for i in range(k.start_mark.line, min(end, len(lines))):
                lines[i] = "\n"
            settings = {key: data[key] for key in REPO_KEYS if isinstance(data, dict) and key in data}
            return "".join(lines), settings
    return text, {}
