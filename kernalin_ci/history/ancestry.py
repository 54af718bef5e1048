"""The order of recorded runs: by the commit graph of the default branch, not by when they were recorded.

A run can be recorded late (a re-run, a delivery retried, an older commit gated after a newer one), so
the time recorded is not the order of the code. Each repository's runs are put in the order of the
ancestry of the default branch's head (`git rev-list --topo-order`): a run whose commit is not an
ancestor of the head any more (the branch was force-pushed, or the commit was never on it) is left out
of the series and its change points and listed apart as off the branch. Without a repository to read
the graph from (or one that has none of the recorded commits) the runs stay in the order recorded, and
`Order.note` says so.

    ancestry = Ancestry.from_git("/path/to/clone", "origin/main")
    order = arrange(runs, ancestry)      # order.runs: oldest first; order.off_branch; order.by
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kernalin_ci.history.model import Run

GIT_TIMEOUT_S = 120


@dataclass
class Ancestry:
    ref: str  # what was asked for (a branch, a remote-tracking ref, a sha)
    head: str | None  # the commit it resolved to; None: no graph (note says why)
    position: dict[str, int] = field(default_factory=dict)  # ancestors of head (head included), oldest = 0
    note: str = ""

    @classmethod
    def from_git(cls, repo_dir: str | Path, ref: str) -> Ancestry:
        """The ancestry of REF in the git repository REPO_DIR (a work tree or a bare repository)."""

        def git(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["git", "-C", str(repo_dir), *args],
                capture_output=True,
                text=True,
                timeout=GIT_TIMEOUT_S,
                env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
                stdin=subprocess.DEVNULL,
            )

        try:
            head = git("rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
            if head.returncode != 0:
                return cls(ref, None, note=f"{ref} is not a commit in {repo_dir}")
            if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
                return cls(ref, None, note=f"{repo_dir} is a shallow clone (fetch its whole history: fetch-depth: 0)")
            listed = git("rev-list", "--topo-order", "--reverse", head.stdout.strip())
        except (OSError, subprocess.TimeoutExpired) as e:
            return cls(ref, None, note=f"git in {repo_dir} failed ({type(e).__name__})")
        if listed.returncode != 0:
            return cls(ref, None, note=f"git rev-list {ref} failed: {' '.join(listed.stderr.split())[:200]}")
        shas = listed.stdout.split()
        return cls(ref, head.stdout.strip(), {s: i for i, s in enumerate(shas)})

    @classmethod
    def for_branch(cls, repo_dir: str | Path, branch: str, ref: str | None = None) -> Ancestry:
        """REF, else the first of origin/BRANCH and BRANCH that REPO_DIR has."""
        if ref:
            return cls.from_git(repo_dir, ref)
        for candidate in (f"refs/remotes/origin/{branch}", f"refs/heads/{branch}"):
            found = cls.from_git(repo_dir, candidate)
            if found.head is not None or "shallow" in found.note:
                return found
        return cls(branch, None, note=f"{repo_dir} has no branch {branch} (nor origin/{branch})")


@dataclass
class Order:
    runs: list[Run]  # the series' order, oldest first
    off_branch: list[Run]  # recorded, but not ancestors of the head (left out of the series)
    by: str  # "git" | "recorded"
    ref: str | None = None
    head: str | None = None
    note: str = ""  # with by == "recorded": why

    def summary(self) -> dict:
        return {"by": self.by, "ref": self.ref, "head": self.head, "note": self.note}


def arrange(runs: list[Run], ancestry: Ancestry | None) -> Order:
    """RUNS (in the order recorded) in the order of ANCESTRY; the order recorded when there is none."""
    if ancestry is None:
        return Order(list(runs), [], "recorded", note="no git repository given to order the commits by")
    if ancestry.head is None:
        return Order(list(runs), [], "recorded", ancestry.ref, note=ancestry.note)
    on = [r for r in runs if r.commit in ancestry.position]
    if runs and not on:  # most likely another repository (or one not fetched): no order to speak of
        return Order(
            list(runs),
            [],
            "recorded",
            ancestry.ref,
            ancestry.head,
            note=f"none of the {len(runs)} recorded commits is an ancestor of {ancestry.ref} ({ancestry.head[:12]})",
        )
    on.sort(key=lambda r: ancestry.position[r.commit])
    off = [r for r in runs if r.commit not in ancestry.position]
    return Order(on, off, "git", ancestry.ref, ancestry.head)
