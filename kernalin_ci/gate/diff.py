"""git diff -> the kernels a change affects, and base/head checkouts side by side.

A kernel is affected when its entry file, one of its `sources` globs, any
repository module its entry imports (followed transitively), or one of its CUDA
sources or the repository headers they include (`cuda:`, followed transitively) changed between
base and head. A Python file whose syntax tree is the same at base and head (only comments, blank
lines or formatting changed) does not count: the same program, decided from the diff before any
worker starts. A kernel whose entry file does not exist at base is new (verify
only); a kernel the head's configuration no longer lists and whose entry is gone
at head is removed (noted).
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kernalin_ci.config import Config, Kernel
from kernalin_ci.cuda.includes import kernel_files as cuda_files
from kernalin_ci.errors import UsageError


def git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr.strip().splitlines() or ["failed"])[-1]
        raise UsageError(f"git {' '.join(args)}: {msg}")
    return r.stdout


def repo_root(path: Path) -> Path:
    return Path(git(path, "rev-parse", "--show-toplevel").strip())


@dataclass
class Refs:
    base: str  # sha
    head: str
    base_label: str
    head_label: str
    repo: str | None = None  # owner/name, from the Actions event
    pr: int | None = None
    fork: bool = False
    head_branch: str | None = None  # the head's branch name (the event's, or the one checked out)


def default_branch(repo: Path) -> str:
    for args in (("symbolic-ref", "--short", "refs/remotes/origin/HEAD"),):
        try:
            return git(repo, *args).strip()
        except UsageError:
            pass
    for name in ("origin/main", "origin/master", "main", "master"):
        try:
            git(repo, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
            return name
        except UsageError:
            continue
    raise UsageError(
        "base: cannot find the default branch (no origin/HEAD, main or master) to take the "
        "base revision from; name the base revision",
        setting="base",
    )


def event_refs(event_path: str | None) -> dict:
    """base/head shas, repo and PR number from a GitHub Actions pull_request event, if any."""
    if not event_path or not os.path.isfile(event_path):
        return {}
    try:
        with open(event_path) as f:
            ev = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"GITHUB_EVENT_PATH {event_path}: cannot read the event: {e}") from None
    pr = ev.get("pull_request")
    if not pr:
        return _push_refs(ev)
    head_repo = (pr.get("head", {}).get("repo") or {}).get("full_name")
    base_repo = (pr.get("base", {}).get("repo") or {}).get("full_name")
    return {
        "base": pr["base"]["sha"],
        "head": pr["head"]["sha"],
        "pr": pr.get("number"),
        "repo": base_repo,
        # a deleted fork has no head repository: never the base's own
        "fork": not (head_repo and base_repo and head_repo == base_repo),
        "head_branch": pr.get("head", {}).get("ref"),
    }


def _push_refs(ev: dict) -> dict:
    """A push to the default branch: the pushed range, before..after (the history records it)."""
    repo = ev.get("repository") or {}
    before, after = ev.get("before"), ev.get("after")
    if not isinstance(repo, dict) or ev.get("ref") != f"refs/heads/{repo.get('default_branch')}":
        return {}
    if not before or not after or set(before) == {"0"}:
        return {}
    return {"base": before, "head": after, "repo": repo.get("full_name")}


def resolve_refs(
    repo: Path, base: str | None, head: str | None, event_path: str | None = None, head_branch: str | None = None
) -> Refs:
    ev = event_refs(event_path)
    head_label = head or ev.get("head") or "HEAD"
    head_sha = _commit(repo, head_label)
    if head_branch is None:
        head_branch = ev["head_branch"] if "head_branch" in ev else _branch(repo, head_label)
    if base:
        base_label, base_sha = base, _commit(repo, base)
    elif ev.get("base"):
        base_label, base_sha = ev["base"], _commit(repo, ev["base"])
    else:
        branch = default_branch(repo)
        base_sha = git(repo, "merge-base", branch, head_sha).strip()
        base_label = f"merge-base({branch}, {head_label})"
    return Refs(
        base_sha, head_sha, base_label, head_label, ev.get("repo"), ev.get("pr"), ev.get("fork", False), head_branch
    )


def _branch(repo: Path, ref: str) -> str | None:
    """The local branch REF names (HEAD: the branch checked out), else None."""
    r = subprocess.run(
        ["git", "rev-parse", "--symbolic-full-name", "--verify", "--quiet", ref],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    name = r.stdout.strip()
    return name.removeprefix("refs/heads/") if r.returncode == 0 and name.startswith("refs/heads/") else None


def _commit(repo: Path, ref: str) -> str:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    except UsageError:
        raise UsageError(
            f"unknown revision {ref!r} (fetch it first, e.g. fetch-depth: 0 in actions/checkout)"
        ) from None


def changed_files(repo: Path, base: str, head: str) -> list[str]:
    out = git(repo, "diff", "--name-only", "--no-renames", base, head)
    return [line for line in out.splitlines() if line]


COSMETIC = "only comments or formatting changed (the same Python syntax tree)"


def same_code(base_root: Path, head_root: Path, path: str) -> bool:
    """Whether PATH is a Python file with the same syntax tree at base and head: only comments, blank lines
    or formatting changed (positions are not compared; docstrings are code). Read as bytes, so an encoding
    declaration is honoured; a file missing or not parsing on either side is changed code."""
    if not path.endswith(".py"):
        return False
    trees = []
    for root in (base_root, head_root):
        try:
            trees.append(ast.dump(ast.parse((root / path).read_bytes(), path)))
        except (OSError, SyntaxError, ValueError):
            return False
    return trees[0] == trees[1]


@dataclass
class Affected:
    kernel: Kernel
    status: str  # "changed" | "new" | "unchanged" | "removed"
    reasons: list[str] = field(default_factory=list)


def kernel_files(k: Kernel, root: Path) -> set[str]:
    """Repository-relative files that make up kernel k in the tree at `root`: its entry, the repository
    modules the entry imports, and a CUDA kernel's sources with every header they include."""
    files: set[str] = set()
    if k.cuda is not None:
        files |= cuda_files(root, k.cuda)
    entry = k.entry_file
    if entry:
        files.add(os.path.normpath(entry))
        files |= imported_files(root, root / entry)
    else:
        mod = k.entry.rpartition(":")[0]
        path = _module_file(root, mod)
        if path:
            files.add(str(path.relative_to(root)))
            files |= imported_files(root, path)
    return files


def _matches(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or Path(path).match(p) for p in patterns)


def _module_file(root: Path, dotted: str, base_dir: Path | None = None) -> Path | None:
    parts = dotted.split(".")
    for start in ([base_dir] if base_dir else []) + [root]:
        cand = start.joinpath(*parts)
        for p in (cand.with_suffix(".py"), cand / "__init__.py"):
            if p.is_file() and _inside(p, root):
                return p
    return None


def _inside(p: Path, root: Path) -> bool:
    try:
        p.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def imported_files(root: Path, path: Path, seen: set | None = None) -> set[str]:
    """Repository files `path` imports, transitively (absolute, sibling and relative imports)."""
    seen = set() if seen is None else seen
    if not path.is_file() or path in seen:
        return set()
    seen.add(path)
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (SyntaxError, UnicodeDecodeError):
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[tuple[str, Path | None]] = []
        if isinstance(node, ast.Import):
            names = [(a.name, path.parent) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                mod = node.module or ""
                names = [(f"{mod}.{a.name}" if mod else a.name, base) for a in node.names]
                if mod:
                    names.append((mod, base))
            else:
                mod = node.module or ""
                names = [(mod, path.parent)] + [(f"{mod}.{a.name}", path.parent) for a in node.names]
        for dotted, base in names:
            f = _module_file(root, dotted, base) if dotted else None
            if f is None:
                continue
            found.add(str(f.resolve().relative_to(root.resolve())))
            # a package import also runs the __init__ of every parent package in the repo
            found |= imported_files(root, f, seen)
    return found


def affected_kernels(
    cfg: Config, changed: list[str], head_root: Path, base_root: Path, dropped: set[str] = frozenset()
) -> list[Affected]:
    """Each kernel of CFG: new, changed, unchanged, or removed (DROPPED from the head's configuration and
    its entry gone at head too)."""
    out = []
    cosmetic = {f for f in changed if same_code(base_root, head_root, f)}
    changed = [f for f in changed if f not in cosmetic]
    changed_set = set(changed)
    for k in cfg.kernels:
        if k.name in dropped and not _entry_exists(k, head_root):
            out.append(Affected(k, "removed", ["removed from the configuration, its entry gone"]))
            continue
        entry_at_base = _entry_exists(k, base_root)
        if not entry_at_base:
            gone = missing_entry(k, head_root)
            out.append(
                Affected(
                    k,
                    "new",
                    [
                        f"{k.entry_file} exists neither at base nor at head"
                        if gone
                        else "the entry does not exist at base"
                    ],
                )
            )
            continue
        reasons = []
        files = kernel_files(k, head_root) | kernel_files(k, base_root)
        for f in sorted(changed_set & files):
            reasons.append(f"{f} changed")
        for f in changed:
            if k.sources and _matches(f, k.sources) and f"{f} changed" not in reasons:
                reasons.append(f"{f} changed (sources)")
        if reasons:
            out.append(Affected(k, "changed", reasons))
            continue
        mine = sorted(f for f in cosmetic if f in files or (k.sources and _matches(f, k.sources)))
        out.append(Affected(k, "unchanged", [f"{f}: {COSMETIC}" for f in mine]))
    return out


def missing_entry(k: Kernel, head_root: Path) -> str | None:
    """Why K cannot be checked at head when its entry file is not there (the untouched `kernalin-ci init`
    template's example, a typo, a file the pull request removed): what to edit; None when it is there (or the
    entry names a module, which may be installed rather than in the repository)."""
    if not k.entry_file or (head_root / k.entry_file).is_file():
        return None
    return (
        f"entry {k.entry}: {k.entry_file} does not exist at head; edit {k.where or 'the kernel entry'} "
        "to name your kernel's file and function (path/to/file.py:function, from the repository root)"
    )


def _entry_exists(k: Kernel, root: Path) -> bool:
    if k.entry_file:
        return (root / k.entry_file).is_file()
    return _module_file(root, k.entry.rpartition(":")[0]) is not None


@contextlib.contextmanager
def worktrees(repo: Path, base: str, head: str):
    """Base and head checked out side by side in a temp dir; removed afterwards, also on failure."""
    tmp = Path(tempfile.mkdtemp(prefix="kernalin-gate-"))
    tmp.chmod(0o755)  # the kernel workers' sandbox user (uid 65534 under root) reads the checkouts
    made = []
    try:
        for name, sha in (("base", base), ("head", head)):
            path = tmp / name
            git(repo, "worktree", "add", "--detach", "--quiet", str(path), sha)
            made.append(path)
        yield made[0], made[1]
    finally:
        for path in made:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=repo, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
