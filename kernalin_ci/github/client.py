"""GitHubClient: the few GitHub REST operations kernalin-ci needs, through PyGithub, with retries.

Every method takes plain values (repository full name, sha, numbers, strings) and
returns plain values. Each is one retry unit (kernalin_ci.github.retry): where a
retried create could otherwise make a second object (a check run, the sticky
comment), the unit first looks for the object a lost answer may have created.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from kernalin_ci import __version__
from kernalin_ci.github.pygithub import Github, github
from kernalin_ci.github.retry import RetryPolicy, call_with_retry

log = logging.getLogger("kernalin_ci.github")

DEFAULT_API_URL = "https://api.github.com"
DEFAULT_NAME = "kernalin-ci"
ANNOTATIONS_PER_REQUEST = 50  # the Checks API takes at most 50 per request; each update appends
OUTPUT_MAX_CHARS = 65535  # check run output.summary and output.text
COMMENT_MAX_CHARS = 65536  # an issue comment body
STATUS_DESCRIPTION_MAX_CHARS = 140
ANNOTATION_TITLE_MAX_CHARS = 255
CHECK_TITLE_MAX_CHARS = 255  # GitHub documents no limit for a check run's title; one line is kept short
ANNOTATION_TEXT_MAX_BYTES = 64 * 1024  # message and raw_details
CONCLUSIONS = ("success", "failure", "neutral", "cancelled", "skipped", "timed_out", "action_required")
STATUS_STATES = ("success", "failure", "pending", "error")
LEVELS = ("notice", "warning", "failure")


@dataclass
class Annotation:
    """A finding on a line range of a file (path relative to the repository root)."""

    path: str
    start_line: int
    end_line: int
    message: str
    annotation_level: str = "failure"  # notice | warning | failure
    title: str | None = None
    raw_details: str | None = None

    def to_api(self) -> dict:
        if self.annotation_level not in LEVELS:
            raise ValueError(f"annotation_level must be one of {LEVELS}, not {self.annotation_level!r}")
        start = max(int(self.start_line), 1)
        d = {
            "path": self.path.replace("\\", "/").lstrip("/").removeprefix("./"),
            "start_line": start,
            "end_line": max(int(self.end_line), start),
            "annotation_level": self.annotation_level,
            "message": _cut_bytes(self.message or "(no message)", ANNOTATION_TEXT_MAX_BYTES),
        }
        if self.title:
            d["title"] = (
                self.title
                if len(self.title) <= ANNOTATION_TITLE_MAX_CHARS
                else self.title[: ANNOTATION_TITLE_MAX_CHARS - 1] + "…"
            )
        if self.raw_details:
            d["raw_details"] = _cut_bytes(self.raw_details, ANNOTATION_TEXT_MAX_BYTES)
        return d


@dataclass
class Posted:
    """Something GitHub now shows: its id and the page a person opens."""

    id: int
    html_url: str


@dataclass
class PullRequestInfo:
    number: int
    head_sha: str
    head_ref: str
    head_repo: str | None  # owner/name; None when a fork was deleted
    base_ref: str
    html_url: str


@dataclass
class PullFile:
    """A file a pull request changes: its blob sha at the head (None when removed) and its diff hunks."""

    path: str
    sha: str | None
    patch: str  # GitHub's per-file patch: the hunks ("@@ -a,b +c,d @@" ...); empty for a binary or huge file


def sticky_marker(name: str = DEFAULT_NAME) -> str:
    """The hidden first line that identifies the sticky comment of check NAME."""
    return f"<!-- kernalin-ci sticky comment: {name.replace('--', '- -')} -->"


def truncate_markdown(text: str, limit: int, what: str = "text") -> str:
    """TEXT cut to at most LIMIT characters at a line break, code fences and <details> closed, with a note."""
    if len(text) <= limit:
        return text
    note = (
        f"\n\n---\n*This {what} was cut to fit GitHub's limit of {limit} characters: "
        f"{{n}} characters omitted. The full report is in the job's output (report.md).*\n"
    )
    keep = limit - len(note.format(n=len(text))) - 32  # room for the note and closing fences/tags
    cut = text[:keep]
    nl = cut.rfind("\n")
    if nl > keep * 0.8:
        cut = cut[:nl]
    if cut.count("```") % 2:
        cut += "\n```"
    cut += "\n</details>" * max(cut.count("<details") - cut.count("</details>"), 0)
    out = cut + note.format(n=len(text) - len(cut))
    return out[:limit]


def _cut_bytes(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 8].decode("utf-8", errors="ignore") + " …"


def _now() -> datetime:
    return datetime.now(timezone.utc)


class GitHubClient:
    """One authenticated connection to a GitHub (github.com or an Enterprise server's /api/v3).

    auth: a github.Auth (see kernalin_ci.github.auth). min_write_interval_s is the pause PyGithub keeps
    between writes (GitHub asks integrators for one second to stay clear of secondary rate limits;
    tests use 0).
    """

    def __init__(
        self,
        auth: github.Auth.Auth,
        *,
        base_url: str = DEFAULT_API_URL,
        retry: RetryPolicy = RetryPolicy(),
        timeout_s: int = 15,
        min_write_interval_s: float = 1.0,
        min_request_interval_s: float = 0.25,
        secrets: Iterable[str] = (),
    ):
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self.secrets = tuple(s for s in secrets if s)
        self.gh = Github(
            auth=auth,
            base_url=self.base_url,
            timeout=int(timeout_s),
            retry=None,
            lazy=True,
            per_page=100,
            user_agent=f"kernalin-ci/{__version__}",
            seconds_between_requests=min_request_interval_s or None,
            seconds_between_writes=min_write_interval_s or None,
        )

    def _call(self, operation: str, fn):
        return call_with_retry(fn, operation=operation, policy=self.retry, secrets=self.secrets)

    def _repo(self, repo: str):
        return self.gh.get_repo(repo)  # lazy: no request

    # -- check runs -------------------------------------------------------------------------------
    def find_check_run(self, repo: str, head_sha: str, *, name: str = DEFAULT_NAME, external_id: str) -> int | None:
        """The newest check run NAME on HEAD_SHA whose external_id is EXTERNAL_ID, if one exists."""
        run = self._call(
            f"find check run {name!r} on {head_sha[:12]}", lambda: self._find_run(repo, head_sha, name, external_id)
        )
        return None if run is None else run.id

    def _find_run(self, repo: str, head_sha: str, name: str, external_id: str):
        runs = self._repo(repo).get_commit(head_sha).get_check_runs(check_name=name, filter="all")
        for run in runs:  # newest first
            if run.external_id == external_id:
                return run
        return None

    def start_check(
        self,
        repo: str,
        head_sha: str,
        *,
        name: str = DEFAULT_NAME,
        external_id: str | None = None,
        details_url: str | None = None,
        title: str = "Checking kernels",
        summary: str = "kernalin-ci is verifying and benchmarking the kernels this change touches.",
    ) -> int:
        """Create check run NAME on HEAD_SHA, status in_progress; its id.

        With EXTERNAL_ID (a daemon's job id), an existing run with that id is reused instead
        (set in_progress if it was queued; a completed one stays as it is until complete_check).
        Without one, a fresh id is used, so that a create retried after a lost answer finds the
        run it made rather than making a second.
        """
        reuse = external_id is not None
        ext = external_id or uuid.uuid4().hex
        tries = 0

        def once() -> int:
            nonlocal tries
            tries += 1
            if reuse or tries > 1:
                run = self._find_run(repo, head_sha, name, ext)
                if run is not None:
                    if run.status == "queued":
                        run.edit(status="in_progress", output={"title": title, "summary": summary})
                    log.info("reusing check run %s (%s) for external_id %s", run.id, run.status, ext)
                    return run.id
            kwargs = {"details_url": details_url} if details_url else {}
            run = self._repo(repo).create_check_run(
                name=name,
                head_sha=head_sha,
                status="in_progress",
                external_id=ext,
                started_at=_now(),
                output={"title": title, "summary": summary},
                **kwargs,
            )
            return run.id

        return self._call(f"create check run {name!r} on {head_sha[:12]}", once)

    def complete_check(
        self,
        repo: str,
        check_run_id: int,
        *,
        conclusion: str,
        title: str,
        summary: str,
        text: str | None = None,
        annotations: Sequence[Annotation] = (),
        details_url: str | None = None,
    ) -> Posted:
        """Add ANNOTATIONS in batches of 50 and complete the run with CONCLUSION.

        Batches but the last are sent while the run is in progress (GitHub appends each);
        the last goes with the conclusion, so 120 annotations make 3 requests.
        """
        if conclusion not in CONCLUSIONS:
            raise ValueError(f"conclusion must be one of {CONCLUSIONS}, not {conclusion!r}")
        title = title[:CHECK_TITLE_MAX_CHARS] or "kernalin-ci"
        summary = truncate_markdown(summary, OUTPUT_MAX_CHARS, "summary")
        items = [a.to_api() for a in annotations]
        batches = [items[i : i + ANNOTATIONS_PER_REQUEST] for i in range(0, len(items), ANNOTATIONS_PER_REQUEST)]
        run = self._repo(repo).get_check_run(check_run_id)  # lazy: no request
        for i, batch in enumerate(batches[:-1]):
            output = {"title": title, "summary": summary, "annotations": batch}
            self._call(
                f"add annotations {i * 50 + 1}-{i * 50 + len(batch)} to check run {check_run_id}",
                lambda: run.edit(output=output),
            )
        output = {"title": title, "summary": summary}
        if text:
            output["text"] = truncate_markdown(text, OUTPUT_MAX_CHARS, "text")
        if batches:
            output["annotations"] = batches[-1]
        extra = {"details_url": details_url} if details_url else {}
        self._call(
            f"complete check run {check_run_id}",
            lambda: run.edit(status="completed", conclusion=conclusion, completed_at=_now(), output=output, **extra),
        )
        return Posted(run.id, run.html_url)

    # -- commit status ----------------------------------------------------------------------------
    def set_commit_status(
        self,
        repo: str,
        sha: str,
        state: str,
        description: str,
        *,
        context: str = DEFAULT_NAME,
        target_url: str | None = None,
    ) -> Posted:
        """A commit status (the fallback where check runs may not be created)."""
        if state not in STATUS_STATES:
            raise ValueError(f"state must be one of {STATUS_STATES}, not {state!r}")
        if len(description) > STATUS_DESCRIPTION_MAX_CHARS:
            description = description[: STATUS_DESCRIPTION_MAX_CHARS - 1] + "…"
        kwargs = {"target_url": target_url} if target_url else {}

        def once():
            st = (
                self._repo(repo)
                .get_commit(sha)
                .create_status(state, description=description, context=context, **kwargs)
            )
            return Posted(st.id, target_url or "")

        return self._call(f"set commit status {context!r} on {sha[:12]}", once)

    # -- the sticky comment -----------------------------------------------------------------------
    def upsert_sticky_comment(self, repo: str, pr_number: int, body: str, *, marker: str = sticky_marker()) -> Posted:
        """Edit the PR's comment that starts with MARKER to BODY, or create it if there is none.

        All pages of comments are searched. Should earlier races have left several, the oldest
        is kept and edited and the others are deleted. One retry unit: a create whose answer
        was lost is found on the next try and edited, never made twice.
        """
        full = truncate_markdown(f"{marker}\n{body}", COMMENT_MAX_CHARS, "comment")

        def once() -> Posted:
            issue = self._repo(repo).get_issue(pr_number)  # lazy: no request
            mine = [c for c in issue.get_comments() if (c.body or "").startswith(marker)]
            if not mine:
                c = issue.create_comment(full)
                return Posted(c.id, c.html_url)
            keep, extra = mine[0], mine[1:]
            if keep.body != full:
                keep.edit(full)
            for c in extra:
                try:
                    c.delete()
                except github.GithubException as e:
                    if e.status not in (403, 404):
                        raise
                    log.warning("could not delete duplicate sticky comment %s (%s)", c.id, e.status)
            return Posted(keep.id, keep.html_url)

        return self._call(f"update the comment on pull request #{pr_number}", once)

    # -- pull requests and reviews (kernalin-ci tune --github) -------------------------------------
    def pull_request(self, repo: str, number: int) -> PullRequestInfo:
        """The head and base of pull request NUMBER."""

        def once() -> PullRequestInfo:
            pr = self._repo(repo).get_pull(number)
            head_repo = pr.head.repo.full_name if pr.head.repo else None
            return PullRequestInfo(number, pr.head.sha, pr.head.ref, head_repo, pr.base.ref, pr.html_url)

        return self._call(f"read pull request #{number}", once)

    def pull_files(self, repo: str, number: int) -> list[PullFile]:
        """The files pull request NUMBER changes: path, blob sha at its head, and the patch (its diff hunks)."""
        return self._call(
            f"list the files of pull request #{number}",
            lambda: [PullFile(f.filename, f.sha, f.patch or "") for f in self._repo(repo).get_pull(number).get_files()],
        )

    def post_review(
        self, repo: str, number: int, *, commit_id: str, body: str, comments: Sequence[dict], marker: str
    ) -> tuple[Posted, bool]:
        """A review (event COMMENT) with line COMMENTS on pull request NUMBER at COMMIT_ID; BODY starts with MARKER.
        -> (the review, whether it was posted now). A review whose body starts with MARKER is never posted
        twice: one retry unit that looks for it first (an earlier run, or a create whose answer was lost)."""
        full = truncate_markdown(f"{marker}\n{body}", COMMENT_MAX_CHARS, "review")

        def once() -> tuple[Posted, bool]:
            pr = self._repo(repo).get_pull(number)  # lazy: no request
            for r in pr.get_reviews():
                if (r.body or "").startswith(marker):
                    return Posted(r.id, r.html_url), False
            r = pr.create_review(
                commit=self._repo(repo).get_commit(commit_id), body=full, event="COMMENT", comments=list(comments)
            )
            return Posted(r.id, r.html_url), True

        return self._call(f"review pull request #{number}", once)

    def open_pull_request(self, repo: str, *, head: str, base: str, title: str, body: str) -> tuple[Posted, bool]:
        """Open a pull request of branch HEAD (in REPO) into BASE -> (it, whether it was opened now). An open
        one of HEAD into BASE is reused (a branch pushed again), also when a create's answer was lost."""
        owner = repo.split("/")[0]
        full = truncate_markdown(body, COMMENT_MAX_CHARS, "description")

        def once() -> tuple[Posted, bool]:
            r = self._repo(repo)
            for pr in r.get_pulls(state="open", head=f"{owner}:{head}", base=base):
                return Posted(pr.number, pr.html_url), False
            pr = r.create_pull(base=base, head=head, title=title[:256], body=full)
            return Posted(pr.number, pr.html_url), True

        return self._call(f"open a pull request of {head} into {base}", once)
