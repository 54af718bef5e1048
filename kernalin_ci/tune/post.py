"""`kernalin-ci tune --github`: the chosen config goes to GitHub, where the gate checks it like any other change.

- on a pull request (a pull_request run of the Action, or `--pr N`): one review on that pull request,
  its body tune.md (the table and the whole diff), with a GitHub "suggestion" comment on each changed
  line range that lies in the pull request's diff (GitHub takes line comments there only) and when the
  file at the pull request's head is the file that was tuned (same git blob);
- elsewhere: a commit of the patch on top of HEAD (the working tree and the current branch are left
  alone) pushed to branch `kernalin-ci/tune/<kernel>-<patch hash>` of the `origin` remote, and a pull
  request of that branch into `--base` (default: the current branch).

Both are idempotent: the same patch suggested again finds its review (a marker with the patch's hash in
the body), pushed again updates the same branch and finds its open pull request.

`resolve()` runs before tuning, so that missing credentials or a repository that cannot take a branch
cost no GPU time; `post()` runs after. The GitHub calls are GitHubClient's (kernalin_ci/github/client.py)
and its retries; git runs as a subprocess with git's own credentials for the push.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kernalin_ci.errors import UsageError

REMOTE = "origin"
BRANCH_PREFIX = "kernalin-ci/tune/"


@dataclass
class Destination:
    """Where --github posts: resolved before tuning."""

    repo: str  # owner/name
    toplevel: Path  # the git repository the tuned files belong to
    client: object  # GitHubClient
    pr: int | None = None  # a pull request to review; None: open a new one
    head_sha: str | None = None  # the pull request's head (from the Actions event), else looked up
    base: str | None = None  # the new pull request's base branch


@dataclass
class TunePost:
    kind: str  # "review" | "pull-request"
    url: str
    new: bool  # False: an earlier identical post was found and kept
    suggestions: int = 0  # inline suggestions (a review)
    changes: int = 0  # changed line ranges of the patch
    branch: str | None = None  # the pushed branch (a pull request)
    number: int | None = None

    def line(self) -> str:
        if self.kind == "review":
            what = "posted a review on" if self.new else "already suggested on"
            return (
                f"{what} pull request #{self.number}: {self.url} ({self.suggestions} of {self.changes} "
                f"changed line ranges as suggestions; the whole diff is in the review)"
            )
        what = "opened" if self.new else "updated"
        return f"{what} pull request #{self.number}: {self.url} (branch {self.branch})"


def git(cwd: Path, *args: str, env: dict | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, env=env, input=input, encoding="utf-8"
    )


def _toplevel(root: Path) -> Path:
    r = git(root, "rev-parse", "--show-toplevel")
    if r.returncode != 0:
        raise UsageError(f"--github: {root} is not in a git repository")
    return Path(r.stdout.strip()).resolve()


def repo_from_url(url: str) -> str | None:
    """owner/name from a remote URL (https://host/owner/name.git, git@host:owner/name.git, a path)."""
    m = re.search(r"[/:]([^/:]+)/([^/:]+?)(?:\.git)?/?$", url.strip())
    return f"{m[1]}/{m[2]}" if m else None


def resolve(root: str, *, pr: int | None = None, base: str | None = None, env: dict | None = None) -> Destination:
    """The pull request to review, or the repository and base branch of a new one; the GitHub client
    (credentials as the rest of the tool: GITHUB_TOKEN or a GitHub App, docs/github.md)."""
    # deferred: PyGithub is optional (the github extra)
    from kernalin_ci.github import actions
    from kernalin_ci.github.auth import client_from_env

    env = os.environ if env is None else env
    toplevel = _toplevel(Path(root).resolve())
    event_pr = actions.context(env).pull_request if actions.in_actions(env) else None
    if pr is not None and pr < 1:
        raise UsageError(f"--pr {pr}: not a pull request number")
    if base is not None and (pr is not None or event_pr is not None):
        raise UsageError("--base names the base branch of a new pull request: not with --pr or in a pull_request run")
    repo = (event_pr.repo if event_pr else None) or env.get("GITHUB_REPOSITORY")
    if not repo:
        url = git(toplevel, "remote", "get-url", REMOTE)
        repo = repo_from_url(url.stdout) if url.returncode == 0 else None
    if not repo or repo.count("/") != 1:
        raise UsageError("--github: no repository (set GITHUB_REPOSITORY=owner/name, or an origin remote)")
    dest = Destination(repo, toplevel, None)
    if pr is not None:
        dest.pr = pr
        if event_pr is not None and event_pr.number == pr:
            dest.head_sha = event_pr.head_sha
    elif event_pr is not None:
        dest.pr, dest.head_sha = event_pr.number, event_pr.head_sha
    else:
        if git(toplevel, "remote", "get-url", REMOTE).returncode != 0:
            raise UsageError(f"--github: the repository has no {REMOTE!r} remote to push the branch to")
        cur = git(toplevel, "symbolic-ref", "--short", "-q", "HEAD")
        dest.base = base or (cur.stdout.strip() if cur.returncode == 0 else None)
        if not dest.base:
            raise UsageError("--github: HEAD is detached: give the new pull request's base branch with --base BRANCH")
    dest.client = client_from_env(repo, env=env)
    return dest


def check_clean(dest: Destination, path: Path) -> None:
    """A new pull request is HEAD plus the patch: the tuned file must not differ from HEAD."""
    if dest.pr is not None:
        return
    rel = _relative(dest, path)
    r = git(dest.toplevel, "status", "--porcelain", "--", rel)
    if r.returncode == 0 and r.stdout.strip():
        raise UsageError(
            f"--github: {rel} has uncommitted changes: commit them first (the pull request is HEAD + the patch)"
        )


def _relative(dest: Destination, path: Path) -> str:
    try:
        return Path(path).resolve().relative_to(dest.toplevel).as_posix()
    except ValueError:
        raise UsageError(f"--github: {path} is outside the git repository {dest.toplevel}") from None


# -- the patch as line changes ------------------------------------------------------------------------
@dataclass
class LineChange:
    """Old lines first..last (1-based, inclusive) of the file become `new` (text, each line with its newline)."""

    first: int
    last: int
    new: str


def changes(old: str, new: str) -> list[LineChange]:
    """The patch's changed line ranges, each anchored on at least one old line (a suggestion replaces lines)."""
    a, b = old.splitlines(True), new.splitlines(True)
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if i1 == i2:  # a pure insertion: suggest the line before (or after, at the top) together with it
            if i1 > 0:
                out.append(LineChange(i1, i1, a[i1 - 1] + "".join(b[j1:j2])))
            else:
                out.append(LineChange(1, 1, "".join(b[j1:j2]) + (a[0] if a else "")))
        else:
            out.append(LineChange(i1 + 1, i2, "".join(b[j1:j2])))
    return out


def hunk_ranges(file_patch: str) -> list[tuple[int, int]]:
    """The new-side line ranges (first, last) of a GitHub per-file patch's hunks: where line comments may go."""
    out = []
    for m in re.finditer(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", file_patch, flags=re.M):
        start, count = int(m[1]), int(m[2]) if m[2] is not None else 1
        if count:
            out.append((start, start + count - 1))
    return out


def blob_sha(text: str) -> str:
    """git's blob id of TEXT (utf-8), to compare with a pull request file's `sha`."""
    data = text.encode("utf-8")
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def suggestion_body(change: LineChange, label: str) -> str:
    fence = "```"
    while fence in change.new:
        fence += "`"
    return f"kernalin-ci tune: `{label}` (verified, then raced).\n\n{fence}suggestion\n{change.new}{fence}\n"


def patch_id(patch) -> str:
    return hashlib.sha256(patch.diff.encode()).hexdigest()[:12]


# -- posting ------------------------------------------------------------------------------------------
def post(dest: Destination, patch, root: str, *, kernel: str, label: str, markdown: str) -> TunePost:
    """Post PATCH (relative to ROOT) as resolved in DEST. GitHub failures raise GitHubError; git's raise UsageError."""
    path = _relative(dest, Path(root, patch.path))
    if dest.pr is not None:
        return _review(dest, patch, path, label, markdown)
    return _pull_request(dest, patch, path, kernel, label, markdown)


def _review(dest: Destination, patch, path: str, label: str, markdown: str) -> TunePost:
    client = dest.client
    head = dest.head_sha or client.pull_request(dest.repo, dest.pr).head_sha
    files = {f.path: f for f in client.pull_files(dest.repo, dest.pr)}
    found = files.get(path)
    todo = changes(patch.old, patch.new)
    comments = []
    why = ""
    if found is None:
        why = f"{path} is not changed by this pull request: GitHub takes suggestions on its diff only"
    elif found.sha != blob_sha(patch.old):
        why = f"{path} at the pull request's head is not the file that was tuned"
    else:
        ranges = hunk_ranges(found.patch)
        for c in todo:
            if any(lo <= c.first and c.last <= hi for lo, hi in ranges):
                comment = {"path": path, "line": c.last, "side": "RIGHT", "body": suggestion_body(c, label)}
                if c.first != c.last:
                    comment |= {"start_line": c.first, "start_side": "RIGHT"}
                comments.append(comment)
        if len(comments) < len(todo):
            why = f"{len(todo) - len(comments)} of {len(todo)} changed line ranges lie outside this pull request's diff"
    body = markdown + (f"\nNot suggested inline: {why} (the diff above has every change).\n" if why else "")
    marker = f"<!-- kernalin-ci tune: {patch_id(patch)} -->"
    posted, new = client.post_review(dest.repo, dest.pr, commit_id=head, body=body, comments=comments, marker=marker)
    return TunePost("review", posted.html_url, new, len(comments), len(todo), number=dest.pr)


def _pull_request(dest: Destination, patch, path: str, kernel: str, label: str, markdown: str) -> TunePost:
    top = dest.toplevel
    at_head = git(top, "show", f"HEAD:{path}")
    if at_head.returncode != 0 or at_head.stdout != patch.old:
        raise UsageError(f"--github: {path} differs from HEAD: commit it first (the pull request is HEAD + the patch)")
    branch = f"{BRANCH_PREFIX}{re.sub(r'[^A-Za-z0-9._-]+', '-', kernel).strip('-') or 'kernel'}-{patch_id(patch)}"
    title = f"kernalin-ci tune: {kernel}: {label}"
    commit = _commit(
        top, path, patch.new, f"{title}\n\nVerified first, then raced against the current config (kernalin-ci tune).\n"
    )
    push = git(top, "push", "--quiet", "--force", REMOTE, f"{commit}:refs/heads/{branch}")
    if push.returncode != 0:
        # deferred: PyGithub is optional (the github extra)
        from kernalin_ci.github.errors import redact

        text = " ".join(redact(push.stderr, dest.client.secrets).split())[:400]
        raise UsageError(f"--github: git push of {branch} to {REMOTE} failed: {text}")
    posted, new = dest.client.open_pull_request(dest.repo, head=branch, base=dest.base, title=title, body=markdown)
    return TunePost("pull-request", posted.html_url, new, branch=branch, number=posted.id)


def _commit(top: Path, path: str, text: str, message: str) -> str:
    """A commit of HEAD with PATH's content TEXT, made in a scratch index: the working tree, the index and
    the current branch are untouched."""
    with tempfile.TemporaryDirectory(prefix="kernalin-tune-git-") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp, "index"))}
        if not git(top, "config", "user.email").stdout.strip():
            env |= {
                "GIT_AUTHOR_NAME": "kernalin-ci",
                "GIT_AUTHOR_EMAIL": "kernalin-ci@users.noreply.github.com",
                "GIT_COMMITTER_NAME": "kernalin-ci",
                "GIT_COMMITTER_EMAIL": "kernalin-ci@users.noreply.github.com",
            }
        mode = git(top, "ls-tree", "HEAD", "--", path).stdout.split(" ")[0] or "100644"
        _ok(git(top, "read-tree", "HEAD", env=env), ("read-tree",))
        blob = _ok(git(top, "hash-object", "-w", "--stdin", input=text, env=env), ("hash-object",)).strip()
        _ok(git(top, "update-index", "--cacheinfo", f"{mode},{blob},{path}", env=env), ("update-index",))
        tree = _ok(git(top, "write-tree", env=env), ("write-tree",)).strip()
        return _ok(
            git(top, "commit-tree", tree, "-p", "HEAD", "-F", "-", input=message, env=env), ("commit-tree",)
        ).strip()


def _ok(r: subprocess.CompletedProcess, args) -> str:
    if r.returncode != 0:
        raise UsageError(f"--github: git {args[0]} failed: {' '.join(r.stderr.split())[:300]}")
    return r.stdout
