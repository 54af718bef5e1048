"""Webhook / Actions event payloads shaped like GitHub's, for tests.

`pull_request_event()` builds a `pull_request` event as GitHub sends it to a webhook
and writes it to GITHUB_EVENT_PATH in Actions: every field the official schema
(`webhook-pull-request-<action>` in the OpenAPI description's components) requires
is present with a value of the right type. The values are invented (acme/kernels,
octo-dev's fork, ...). tests/test_github_actions.py validates the output against the
schema for every variant, so this stays real-shaped.
"""

from __future__ import annotations

API = "https://api.github.com"
WEB = "https://github.com"


def user(login: str, uid: int, kind: str = "User") -> dict:
    a = f"{API}/users/{login}"
    return {
        "login": login,
        "id": uid,
        "node_id": f"MDQ6VXNlcn{uid}",
        "avatar_url": f"https://avatars.example/u/{uid}?v=4",
        "gravatar_id": "",
        "url": a,
        "html_url": f"{WEB}/{login}",
        "followers_url": f"{a}/followers",
        "following_url": f"{a}/following{{/other_user}}",
        "gists_url": f"{a}/gists{{/gist_id}}",
        "starred_url": f"{a}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{a}/subscriptions",
        "organizations_url": f"{a}/orgs",
        "repos_url": f"{a}/repos",
        "events_url": f"{a}/events{{/privacy}}",
        "received_events_url": f"{a}/received_events",
        "type": kind,
        "user_view_type": "public",
        "site_admin": False,
    }


def repository(full_name: str, rid: int, owner: dict, *, fork: bool = False, private: bool = False) -> dict:
    name = full_name.split("/")[1]
    a = f"{API}/repos/{full_name}"
    return {
        "id": rid,
        "node_id": f"R_kgDO{rid}",
        "name": name,
        "full_name": full_name,
        "private": private,
        "owner": owner,
        "html_url": f"{WEB}/{full_name}",
        "description": "Decode-path GPU kernels",
        "fork": fork,
        "url": a,
        "forks_url": f"{a}/forks",
        "keys_url": f"{a}/keys{{/key_id}}",
        "collaborators_url": f"{a}/collaborators{{/collaborator}}",
        "teams_url": f"{a}/teams",
        "hooks_url": f"{a}/hooks",
        "issue_events_url": f"{a}/issues/events{{/number}}",
        "events_url": f"{a}/events",
        "assignees_url": f"{a}/assignees{{/user}}",
        "branches_url": f"{a}/branches{{/branch}}",
        "tags_url": f"{a}/tags",
        "blobs_url": f"{a}/git/blobs{{/sha}}",
        "git_tags_url": f"{a}/git/tags{{/sha}}",
        "git_refs_url": f"{a}/git/refs{{/sha}}",
        "trees_url": f"{a}/git/trees{{/sha}}",
        "statuses_url": f"{a}/statuses/{{sha}}",
        "languages_url": f"{a}/languages",
        "stargazers_url": f"{a}/stargazers",
        "contributors_url": f"{a}/contributors",
        "subscribers_url": f"{a}/subscribers",
        "subscription_url": f"{a}/subscription",
        "commits_url": f"{a}/commits{{/sha}}",
        "git_commits_url": f"{a}/git/commits{{/sha}}",
        "comments_url": f"{a}/comments{{/number}}",
        "issue_comment_url": f"{a}/issues/comments{{/number}}",
        "contents_url": f"{a}/contents/{{+path}}",
        "compare_url": f"{a}/compare/{{base}}...{{head}}",
        "merges_url": f"{a}/merges",
        "archive_url": f"{a}/{{archive_format}}{{/ref}}",
        "downloads_url": f"{a}/downloads",
        "issues_url": f"{a}/issues{{/number}}",
        "pulls_url": f"{a}/pulls{{/number}}",
        "milestones_url": f"{a}/milestones{{/number}}",
        "notifications_url": f"{a}/notifications{{?since,all,participating}}",
        "labels_url": f"{a}/labels{{/name}}",
        "releases_url": f"{a}/releases{{/id}}",
        "deployments_url": f"{a}/deployments",
        "created_at": "2025-11-03T09:12:44Z",
        "updated_at": "2026-05-18T16:40:02Z",
        "pushed_at": "2026-05-20T08:01:17Z",
        "git_url": f"git://github.com/{full_name}.git",
        "ssh_url": f"git@github.com:{full_name}.git",
        "clone_url": f"{WEB}/{full_name}.git",
        "svn_url": f"{WEB}/{full_name}",
        "homepage": None,
        "size": 1873,
        "stargazers_count": 41,
        "watchers_count": 41,
        "language": "Python",
        "has_issues": True,
        "has_projects": False,
        "has_downloads": True,
        "has_wiki": False,
        "has_pages": False,
        "has_discussions": False,
        "forks_count": 3,
        "mirror_url": None,
        "archived": False,
        "disabled": False,
        "open_issues_count": 5,
        "license": {
            "key": "apache-2.0",
            "name": "Apache License 2.0",
            "spdx_id": "Apache-2.0",
            "url": f"{API}/licenses/apache-2.0",
            "node_id": "MDc6TGljZW5zZTI=",
        },
        "allow_forking": True,
        "is_template": False,
        "web_commit_signoff_required": False,
        "topics": ["gpu", "triton"],
        "visibility": "private" if private else "public",
        "forks": 3,
        "open_issues": 5,
        "watchers": 41,
        "default_branch": "main",
    }


def pull_request_event(
    *,
    action: str = "synchronize",
    repo: str = "acme/kernels",
    number: int = 42,
    head_sha: str = "8d3f0c1e2b4a5968778695a4b3c2d1e0f9a8b7c6",
    base_sha: str = "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d",
    head_ref: str = "faster-decode-attention",
    base_ref: str = "main",
    head_repo: str | None = None,
    before: str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c",
    installation_id: int | None = None,
    draft: bool = False,
) -> dict:
    """A pull_request event. head_repo: the fork the PR comes from (None: a branch of REPO)."""
    org = user(repo.split("/")[0], 91000001, "Organization")
    author = user("octo-dev", 7300021)
    base = repository(repo, 812000001, org)
    head = (
        base
        if head_repo is None
        else repository(head_repo, 812000977, user(head_repo.split("/")[0], 7300021), fork=True)
    )
    a = f"{API}/repos/{repo}"
    pr_url = f"{a}/pulls/{number}"
    pr = {
        "url": pr_url,
        "id": 2314000000 + number,
        "node_id": f"PR_kwDOM{number:06d}",
        "html_url": f"{WEB}/{repo}/pull/{number}",
        "diff_url": f"{WEB}/{repo}/pull/{number}.diff",
        "patch_url": f"{WEB}/{repo}/pull/{number}.patch",
        "issue_url": f"{a}/issues/{number}",
        "number": number,
        "state": "open",
        "locked": False,
        "title": "Split-KV decode attention: fewer shared-memory round trips",
        "user": author,
        "body": "Rewrites the decode attention kernel with a split-KV loop.\n\nBench: see CI.",
        "created_at": "2026-05-19T14:03:11Z",
        "updated_at": "2026-05-20T08:01:19Z",
        "closed_at": None,
        "merged_at": None,
        "merge_commit_sha": "5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d",
        "assignee": None,
        "assignees": [],
        "requested_reviewers": [],
        "requested_teams": [],
        "labels": [],
        "milestone": None,
        "draft": draft,
        "commits_url": f"{pr_url}/commits",
        "review_comments_url": f"{pr_url}/comments",
        "review_comment_url": f"{a}/pulls/comments{{/number}}",
        "comments_url": f"{a}/issues/{number}/comments",
        "statuses_url": f"{a}/statuses/{head_sha}",
        "head": {
            "label": f"{head['owner']['login']}:{head_ref}",
            "ref": head_ref,
            "sha": head_sha,
            "user": head["owner"],
            "repo": head,
        },
        "base": {"label": f"{org['login']}:{base_ref}", "ref": base_ref, "sha": base_sha, "user": org, "repo": base},
        "_links": {
            k: {"href": v}
            for k, v in {
                "self": pr_url,
                "html": f"{WEB}/{repo}/pull/{number}",
                "issue": f"{a}/issues/{number}",
                "comments": f"{a}/issues/{number}/comments",
                "review_comments": f"{pr_url}/comments",
                "review_comment": f"{a}/pulls/comments{{/number}}",
                "commits": f"{pr_url}/commits",
                "statuses": f"{a}/statuses/{head_sha}",
            }.items()
        },
        "author_association": "CONTRIBUTOR",
        "auto_merge": None,
        "active_lock_reason": None,
        "merged": False,
        "mergeable": None,
        "rebaseable": None,
        "mergeable_state": "unknown",
        "merged_by": None,
        "comments": 0,
        "review_comments": 0,
        "maintainer_can_modify": head_repo is not None,
        "commits": 3,
        "additions": 118,
        "deletions": 47,
        "changed_files": 2,
    }
    event = {
        "action": action,
        "number": number,
        "pull_request": pr,
        "repository": base,
        "organization": {
            "login": org["login"],
            "id": org["id"],
            "node_id": org["node_id"],
            "url": f"{API}/orgs/{org['login']}",
            "repos_url": f"{API}/orgs/{org['login']}/repos",
            "events_url": f"{API}/orgs/{org['login']}/events",
            "hooks_url": f"{API}/orgs/{org['login']}/hooks",
            "issues_url": f"{API}/orgs/{org['login']}/issues",
            "members_url": f"{API}/orgs/{org['login']}/members{{/member}}",
            "public_members_url": f"{API}/orgs/{org['login']}/public_members{{/member}}",
            "avatar_url": org["avatar_url"],
            "description": "Inference kernels",
        },
        "sender": author,
    }
    if action == "synchronize":
        event["before"], event["after"] = before, head_sha
    if installation_id is not None:
        event["installation"] = {"id": installation_id, "node_id": f"MDIzOkludGVncmF0aW9u{installation_id}"}
    return event
