"""Publish a finished report to a pull request: check run (or commit status), annotations, sticky comment.

Plain data in (`Publication`), plain data out (`PublishResult`); nothing here knows how the
report was made.

Ordering contract for callers: write the local report (report.json, report.md, the step
summary) *before* calling `begin()`/`publish()`. Neither ever stops the run for a
permission problem (a fork's read-only token): those become `warnings`. `begin()` never
raises for GitHub failures at all. `publish()` raises GitHubAuthError at once when the
credentials are refused; for any other failure it still does the remaining steps, then
raises GitHubUnavailable (retries spent) or GitHubError (a request GitHub refused), with
`.result` holding what was posted. When `result.comment` is None, the PR did not get the
report: print it to the job log / step summary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kernalin_ci.github.client import DEFAULT_NAME, Annotation, GitHubClient, Posted, sticky_marker
from kernalin_ci.github.errors import GitHubAuthError, GitHubError, GitHubPermissionError, GitHubUnavailable

log = logging.getLogger("kernalin_ci.github")

MAX_ANNOTATIONS = 1000  # 20 requests; the rest are counted in the summary

# A commit status has no "neutral": a neutral check does not block a merge, so it maps to success.
STATUS_FOR_CONCLUSION = {
    "success": "success",
    "neutral": "success",
    "skipped": "success",
    "failure": "failure",
    "action_required": "failure",
    "timed_out": "error",
    "cancelled": "error",
    "stale": "error",
}


@dataclass
class Publication:
    repo: str  # owner/name, where the PR is (the base repository)
    head_sha: str  # the PR's head commit (not the merge commit GITHUB_SHA names in a pull_request run)
    conclusion: str  # success | failure | neutral (or another check run conclusion)
    title: str  # one line; also the commit status description (cut to 140 characters)
    summary: str  # markdown, cut to 65535 characters with a note
    pr_number: int | None = None
    name: str = DEFAULT_NAME  # the check's name, the status context, the sticky comment's marker
    text: str | None = None  # more markdown for the check run's details
    annotations: list[Annotation] = field(default_factory=list)
    comment_markdown: str | None = None  # the sticky PR comment; None: no comment
    details_url: str | None = None  # where the full report is (the Actions run, the daemon's page)
    external_id: str | None = None  # a daemon's job id: reuse that job's check run


@dataclass
class Started:
    check_run_id: int | None  # None: no check run (see warnings); publish() will try again
    commit_status: str | None = None  # "pending" when the status fallback was used
    warnings: list[str] = field(default_factory=list)


@dataclass
class PublishResult:
    check_run: Posted | None = None
    commit_status: str | None = None  # the state posted when check runs were not allowed
    comment: Posted | None = None
    annotations_posted: int = 0
    annotations_omitted: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def on_pull_request(self) -> bool:
        """Whether the PR shows a verdict (check run or commit status)."""
        return self.check_run is not None or self.commit_status is not None


def begin(
    client: GitHubClient,
    repo: str,
    head_sha: str,
    *,
    name: str = DEFAULT_NAME,
    external_id: str | None = None,
    details_url: str | None = None,
) -> Started:
    """Show the PR that the check is running: a check run in progress, else a pending commit status."""
    try:
        return Started(client.start_check(repo, head_sha, name=name, external_id=external_id, details_url=details_url))
    except GitHubPermissionError as e:
        started = Started(None, warnings=[f"cannot create a check run ({e}); using a commit status"])
    except GitHubError as e:
        return Started(None, warnings=[f"cannot create a check run now ({e})"])
    try:
        client.set_commit_status(
            repo,
            head_sha,
            "pending",
            "kernalin-ci is checking the changed kernels",
            context=name,
            target_url=details_url,
        )
        started.commit_status = "pending"
    except GitHubError as e:
        started.warnings.append(f"cannot set a commit status either ({e})")
    return started


def publish(client: GitHubClient, pub: Publication, *, check_run_id: int | None = None) -> PublishResult:
    """Post PUB: complete the check run CHECK_RUN_ID (from begin(); created if None) with its annotations,
    or post a commit status where check runs are not allowed; then the sticky comment."""
    result = PublishResult()
    failures: list[GitHubError] = []
    annotations = list(pub.annotations[:MAX_ANNOTATIONS])
    result.annotations_omitted = len(pub.annotations) - len(annotations)
    summary = pub.summary
    if result.annotations_omitted:
        summary += (
            f"\n\n*{result.annotations_omitted} more findings with a source location are not annotated "
            f"(at most {MAX_ANNOTATIONS}); see the full report.*"
        )

    use_status = False
    try:
        if check_run_id is None:
            check_run_id = client.start_check(
                pub.repo, pub.head_sha, name=pub.name, external_id=pub.external_id, details_url=pub.details_url
            )
        result.check_run = client.complete_check(
            pub.repo,
            check_run_id,
            conclusion=pub.conclusion,
            title=pub.title,
            summary=summary,
            text=pub.text,
            annotations=annotations,
            details_url=pub.details_url,
        )
        result.annotations_posted = len(annotations)
    except GitHubPermissionError as e:
        result.warnings.append(f"cannot create or complete the check run ({e}); posting a commit status instead")
        use_status = True
    except GitHubAuthError:
        raise
    except GitHubError as e:
        failures.append(e)
        use_status = True  # a verdict on the PR is better than none

    if use_status:
        state = STATUS_FOR_CONCLUSION.get(pub.conclusion, "error")
        try:
            client.set_commit_status(
                pub.repo, pub.head_sha, state, pub.title, context=pub.name, target_url=pub.details_url
            )
            result.commit_status = state
        except GitHubPermissionError as e:
            result.warnings.append(f"cannot post a commit status either ({e})")
        except GitHubAuthError:
            raise
        except GitHubError as e:
            failures.append(e)

    if pub.pr_number is not None and pub.comment_markdown is not None:
        try:
            result.comment = client.upsert_sticky_comment(
                pub.repo, pub.pr_number, pub.comment_markdown, marker=sticky_marker(pub.name)
            )
        except GitHubPermissionError as e:
            result.warnings.append(
                f"cannot comment on pull request #{pub.pr_number} ({e}); "
                "the report is only in the job log and step summary"
            )
        except GitHubAuthError:
            raise
        except GitHubError as e:
            failures.append(e)

    for w in result.warnings:
        log.warning("%s", w)
    if failures:
        message = "; ".join(str(f) for f in failures)
        if all(isinstance(f, GitHubUnavailable) for f in failures):
            raise GitHubUnavailable(
                message,
                status=failures[0].status,
                operation="publish",
                attempts=max(f.attempts for f in failures),
                result=result,
            )
        raise GitHubError(message, status=failures[0].status, operation="publish", result=result)
    return result
