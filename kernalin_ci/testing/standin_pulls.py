"""The GitHub stand-in's endpoints for repositories, pull requests (files, hunks, reviews) and GitHub App
installations and their tokens."""

from __future__ import annotations

import re
import secrets
import subprocess
import time
from urllib.parse import urlsplit

from kernalin_ci.testing.standin_state import (
    _LEVELS,
    ApiError,
    Ctx,
    Installation,
    Repo,
    Token,
    iso,
    node_id,
)


class PullsAndApps:
    """A part of GitHubStandIn (github_standin.py): its handlers read and change the stand-in's state."""

    def _git(self, repo: Repo, *args: str) -> str | None:
        """git's answer in REPO's git_dir, None when it fails (a missing ref)."""
        if repo.git_dir is None:
            return None
        r = subprocess.run(["git", "--git-dir", repo.git_dir, *args], capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None

    def _branch_sha(self, repo: Repo, branch: str) -> str | None:
        out = self._git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}")
        return out.strip() if out else None

    def _repo_json(self, repo: Repo) -> dict:
        api, web = f"{self.base_url}/repos/{repo.full_name}", f"{self.web_url}/{repo.full_name}"
        owner, name = repo.full_name.split("/", 1)
        host = urlsplit(self.web_url).netloc
        d = {
            "id": repo.id,
            "node_id": node_id("Repository", repo.id),
            "name": name,
            "full_name": repo.full_name,
            "license": None,
            "owner": self._user(owner),
            "private": False,
            "html_url": web,
            "description": None,
            "fork": False,
            "url": api,
            "git_url": f"git://{host}/{repo.full_name}.git",
            "ssh_url": f"git@{host}:{repo.full_name}.git",
            "clone_url": f"{web}.git",
            "svn_url": web,
            "mirror_url": None,
            "homepage": None,
            "language": "Python",
            "forks": 0,
            "forks_count": 0,
            "stargazers_count": 0,
            "watchers_count": 0,
            "watchers": 0,
            "size": 1,
            "default_branch": repo.default_branch,
            "open_issues": 0,
            "open_issues_count": 0,
            "has_issues": True,
            "has_projects": True,
            "has_wiki": False,
            "has_pages": False,
            "has_downloads": True,
            "archived": False,
            "disabled": False,
            "pushed_at": iso(0),
            "created_at": iso(0),
            "updated_at": iso(0),
        }
        for k, tail in {
            "archive_url": "/{archive_format}{/ref}",
            "assignees_url": "/assignees{/user}",
            "blobs_url": "/git/blobs{/sha}",
            "branches_url": "/branches{/branch}",
            "collaborators_url": "/collaborators{/collaborator}",
            "comments_url": "/comments{/number}",
            "commits_url": "/commits{/sha}",
            "compare_url": "/compare/{base}...{head}",
            "contents_url": "/contents/{+path}",
            "contributors_url": "/contributors",
            "deployments_url": "/deployments",
            "downloads_url": "/downloads",
            "events_url": "/events",
            "forks_url": "/forks",
            "git_commits_url": "/git/commits{/sha}",
            "git_refs_url": "/git/refs{/sha}",
            "git_tags_url": "/git/tags{/sha}",
            "hooks_url": "/hooks",
            "issue_comment_url": "/issues/comments{/number}",
            "issue_events_url": "/issues/events{/number}",
            "issues_url": "/issues{/number}",
            "keys_url": "/keys{/key_id}",
            "labels_url": "/labels{/name}",
            "languages_url": "/languages",
            "merges_url": "/merges",
            "milestones_url": "/milestones{/number}",
            "notifications_url": "/notifications{?since,all,participating}",
            "pulls_url": "/pulls{/number}",
            "releases_url": "/releases{/id}",
            "stargazers_url": "/stargazers",
            "statuses_url": "/statuses/{sha}",
            "subscribers_url": "/subscribers",
            "subscription_url": "/subscription",
            "tags_url": "/tags",
            "teams_url": "/teams",
            "trees_url": "/git/trees{/sha}",
        }.items():
            d[k] = api + tail
        return d

    def _pull_json(self, repo: Repo, pr: dict, *, full: bool = True) -> dict:
        api = f"{self.base_url}/repos/{repo.full_name}"
        url = f"{api}/pulls/{pr['number']}"
        html = f"{self.web_url}/{repo.full_name}/pull/{pr['number']}"
        head_repo = self._repos.get(pr["head_repo"])

        def side(ref: str, sha: str, r: Repo | None) -> dict:
            owner = (r.full_name if r else pr["head_repo"]).split("/")[0]
            return {
                "label": f"{owner}:{ref}",
                "ref": ref,
                "sha": sha,
                "user": self._user(owner),
                "repo": self._repo_json(r) if r else None,
            }

        d = {
            "url": url,
            "id": pr["id"],
            "node_id": node_id("PullRequest", pr["id"]),
            "html_url": html,
            "diff_url": f"{html}.diff",
            "patch_url": f"{html}.patch",
            "issue_url": f"{api}/issues/{pr['number']}",
            "commits_url": f"{url}/commits",
            "review_comments_url": f"{url}/comments",
            "review_comment_url": f"{api}/pulls/comments{{/number}}",
            "comments_url": f"{api}/issues/{pr['number']}/comments",
            "statuses_url": f"{api}/statuses/{pr['head_sha']}",
            "number": pr["number"],
            "state": pr["state"],
            "locked": False,
            "title": pr["title"],
            "user": self._user(pr["login"]),
            "body": pr["body"],
            "labels": [],
            "milestone": None,
            "active_lock_reason": None,
            "created_at": pr["created_at"],
            "updated_at": pr["updated_at"],
            "closed_at": None,
            "merged_at": None,
            "merge_commit_sha": None,
            "assignee": None,
            "assignees": [],
            "requested_reviewers": [],
            "requested_teams": [],
            "head": side(pr["head_ref"], pr["head_sha"], head_repo),
            "base": side(pr["base_ref"], pr["base_sha"], repo),
            "_links": {
                k: {"href": v}
                for k, v in {
                    "self": url,
                    "html": html,
                    "issue": f"{api}/issues/{pr['number']}",
                    "comments": f"{api}/issues/{pr['number']}/comments",
                    "review_comments": f"{url}/comments",
                    "review_comment": f"{api}/pulls/comments{{/number}}",
                    "commits": f"{url}/commits",
                    "statuses": f"{api}/statuses/{pr['head_sha']}",
                }.items()
            },
            "author_association": "NONE",
            "auto_merge": None,
            "draft": False,
        }
        d["base"]["user"] = self._user(repo.full_name.split("/")[0])
        d["base"]["label"] = f"{repo.full_name.split('/')[0]}:{pr['base_ref']}"
        if full:
            files = self._pull_files(repo, pr)
            d.update(
                {
                    "merged": False,
                    "mergeable": None,
                    "rebaseable": None,
                    "mergeable_state": "unknown",
                    "merged_by": None,
                    "comments": sum(c["issue_number"] == pr["number"] for c in repo.comments.values()),
                    "review_comments": sum(len(r["comments"]) for r in pr["reviews"]),
                    "maintainer_can_modify": False,
                    "commits": 1,
                    "additions": sum(f["additions"] for f in files),
                    "deletions": sum(f["deletions"] for f in files),
                    "changed_files": len(files),
                }
            )
        return d

    def _pull(self, repo: Repo, ctx: Ctx) -> dict:
        pr = repo.pulls.get(int(ctx.path_params["pull_number"]))
        if pr is None:
            raise ApiError(404, "Not Found")
        return pr

    def _pull_files(self, repo: Repo, pr: dict, head_sha: str | None = None) -> list[dict]:
        """The files of PR as GitHub lists them: `git diff base...head`, a `patch` (its hunks) per file."""
        head = head_sha or pr["head_sha"]
        out = self._git(repo, "diff", "--no-renames", "--unified=3", f"{pr['base_sha']}...{head}")
        if not out:
            return []
        files = []
        for block in re.split(r"^diff --git ", out, flags=re.M)[1:]:
            lines = block.split("\n")
            status, name = "modified", None
            for line in lines:
                if line.startswith("new file mode"):
                    status = "added"
                elif line.startswith("deleted file mode"):
                    status = "removed"
                elif line.startswith("+++ b/"):
                    name = line[6:]
                elif line.startswith("--- a/") and name is None:
                    name = line[6:]
                elif line.startswith("@@"):
                    break
            if name is None:
                continue
            start = next((i for i, x in enumerate(lines) if x.startswith("@@")), len(lines))
            hunk_lines = [x for x in lines[start:] if x or False]
            adds = sum(x.startswith("+") for x in hunk_lines)
            dels = sum(x.startswith("-") for x in hunk_lines)
            blob = self._git(repo, "rev-parse", f"{head if status != 'removed' else pr['base_sha']}:{name}")
            ref = head if status != "removed" else pr["base_sha"]
            files.append(
                {
                    "sha": blob.strip() if blob else None,
                    "filename": name,
                    "status": status,
                    "additions": adds,
                    "deletions": dels,
                    "changes": adds + dels,
                    "blob_url": f"{self.web_url}/{repo.full_name}/blob/{ref}/{name}",
                    "raw_url": f"{self.web_url}/{repo.full_name}/raw/{ref}/{name}",
                    "contents_url": f"{self.base_url}/repos/{repo.full_name}/contents/{name}?ref={ref}",
                    "patch": "\n".join(hunk_lines),
                }
            )
        return files

    @staticmethod
    def _hunks(patch: str) -> list[dict[str, tuple[int, int]]]:
        """Per hunk of a file's patch: the line ranges it shows, {"LEFT": (first, last), "RIGHT": ...}."""
        out = []
        for m in re.finditer(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", patch, flags=re.M):
            a, b, c, d = int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1)
            out.append({"LEFT": (a, a + b - 1), "RIGHT": (c, c + d - 1)})
        return out

    def _list_pulls(self, ctx: Ctx):
        repo = ctx.repo("pull_requests")
        state = ctx.q("state", "open")
        items = [pr for pr in repo.pulls.values() if state == "all" or pr["state"] == state]
        if ctx.q("head"):
            owner, _, ref = ctx.q("head").rpartition(":")
            items = [
                pr for pr in items if pr["head_ref"] == ref and (not owner or pr["head_repo"].split("/")[0] == owner)
            ]
        if ctx.q("base"):
            items = [pr for pr in items if pr["base_ref"] == ctx.q("base")]
        items = sorted(items, key=lambda pr: -pr["number"])
        page = self._paginate(ctx, f"/repos/{repo.full_name}/pulls", items)
        return 200, [self._pull_json(repo, pr, full=False) for pr in page]

    def _create_pull(self, ctx: Ctx):
        repo = ctx.repo("pull_requests", level="write")
        b = ctx.body
        if not b.get("title"):
            raise ApiError(
                422,
                "Validation Failed",
                errors=[{"resource": "PullRequest", "field": "title", "code": "missing_field"}],
            )
        owner, _, head_ref = b["head"].rpartition(":")
        if owner and owner != repo.full_name.split("/")[0]:
            raise ApiError(
                422, "Validation Failed", errors=[{"resource": "PullRequest", "field": "head", "code": "invalid"}]
            )
        head_sha = self._branch_sha(repo, head_ref)
        base_sha = self._branch_sha(repo, b["base"])
        for name, sha in (("head", head_sha), ("base", base_sha)):
            if sha is None:
                raise ApiError(
                    422, "Validation Failed", errors=[{"resource": "PullRequest", "field": name, "code": "invalid"}]
                )
        for pr in repo.pulls.values():
            if pr["state"] == "open" and pr["head_ref"] == head_ref and pr["base_ref"] == b["base"]:
                message = f"A pull request already exists for {repo.full_name.split('/')[0]}:{head_ref}."
                raise ApiError(
                    422, "Validation Failed", errors=[{"resource": "PullRequest", "code": "custom", "message": message}]
                )
        if not self._git(repo, "rev-list", f"{base_sha}..{head_sha}").strip():
            message = f"No commits between {b['base']} and {head_ref}"
            raise ApiError(
                422, "Validation Failed", errors=[{"resource": "PullRequest", "code": "custom", "message": message}]
            )
        repo.commits.update({head_sha, base_sha})
        number = max([*repo.pulls, 0]) + 1
        pr = self._new_pull(
            repo,
            number,
            head_sha,
            base_sha,
            head_ref,
            b["base"],
            repo.full_name,
            b["title"],
            b.get("body"),
            ctx.auth.login,
        )
        return 201, self._pull_json(repo, pr)

    def _get_pull(self, ctx: Ctx):
        repo = ctx.repo("pull_requests")
        return 200, self._pull_json(repo, self._pull(repo, ctx))

    def _list_pull_files(self, ctx: Ctx):
        repo = ctx.repo("pull_requests")
        pr = self._pull(repo, ctx)
        page = self._paginate(ctx, f"/repos/{repo.full_name}/pulls/{pr['number']}/files", self._pull_files(repo, pr))
        return 200, page

    def _review_json(self, repo: Repo, pr: dict, r: dict) -> dict:
        url = f"{self.base_url}/repos/{repo.full_name}/pulls/{pr['number']}"
        html = f"{self.web_url}/{repo.full_name}/pull/{pr['number']}#pullrequestreview-{r['id']}"
        return {
            "id": r["id"],
            "node_id": node_id("PullRequestReview", r["id"]),
            "user": self._user(r["login"]),
            "body": r["body"],
            "state": r["state"],
            "html_url": html,
            "pull_request_url": url,
            "_links": {"html": {"href": html}, "pull_request": {"href": url}},
            "submitted_at": r["submitted_at"],
            "commit_id": r["commit_id"],
            "author_association": "NONE",
        }

    def _list_reviews(self, ctx: Ctx):
        repo = ctx.repo("pull_requests")
        pr = self._pull(repo, ctx)
        page = self._paginate(ctx, f"/repos/{repo.full_name}/pulls/{pr['number']}/reviews", pr["reviews"])
        return 200, [self._review_json(repo, pr, r) for r in page]

    def _create_review(self, ctx: Ctx):
        repo = ctx.repo("pull_requests", level="write")
        pr = self._pull(repo, ctx)
        b = ctx.body or {}
        event = b.get("event")
        commit = b.get("commit_id") or pr["head_sha"]
        if commit not in repo.commits and self._git(repo, "cat-file", "-e", f"{commit}^{{commit}}") is None:
            raise ApiError(422, "Unprocessable Entity", errors=["Commit not found"])
        if event in ("COMMENT", "REQUEST_CHANGES") and not b.get("body"):
            raise ApiError(422, "Unprocessable Entity", errors=[f"Body is required for event {event}"])
        if event in ("APPROVE", "REQUEST_CHANGES") and ctx.auth.login == pr["login"]:
            raise ApiError(422, "Unprocessable Entity", errors=["Can not approve your own pull request"])
        files = {f["filename"]: f for f in self._pull_files(repo, pr, commit)}
        comments = []
        for c in b.get("comments", []):
            if "line" not in c:
                raise ApiError(422, "Unprocessable Entity", errors=["the stand-in takes line-based comments only"])
            side = c.get("side", "RIGHT")
            first = c.get("start_line", c["line"])
            if c.get("start_side", side) != side or first > c["line"]:
                raise ApiError(422, "Unprocessable Entity", errors=["start_line must precede line, on the same side"])
            f = files.get(c["path"])
            if f is None:
                raise ApiError(422, "Unprocessable Entity", errors=["Path could not be resolved"])
            hunks = self._hunks(f.get("patch", ""))
            if not any(h[side][0] <= c["line"] <= h[side][1] for h in hunks):
                raise ApiError(
                    422, "Unprocessable Entity", errors=["pull_request_review_thread.line must be part of the diff"]
                )
            if not any(h[side][0] <= first and c["line"] <= h[side][1] for h in hunks):
                raise ApiError(
                    422,
                    "Unprocessable Entity",
                    errors=["pull_request_review_thread.start_line must be part of the same hunk as the line."],
                )
            comments.append({**c, "side": side, "start_line": first})
        state = {"APPROVE": "APPROVED", "REQUEST_CHANGES": "CHANGES_REQUESTED", "COMMENT": "COMMENTED"}.get(
            event, "PENDING"
        )
        r = {
            "id": next(self._ids),
            "body": b.get("body", ""),
            "state": state,
            "commit_id": commit,
            "login": ctx.auth.login,
            "submitted_at": iso(),
            "comments": comments,
        }
        pr["reviews"].append(r)
        return 200, self._review_json(repo, pr, r)

    def _installation_json(self, inst: Installation) -> dict:
        app = self._apps[inst.app_id]
        return {
            "id": inst.id,
            "app_id": app.id,
            "app_slug": app.slug,
            "target_id": 1,
            "target_type": "Organization",
            "single_file_name": None,
            "repository_selection": "selected",
            "access_tokens_url": f"{self.base_url}/app/installations/{inst.id}/access_tokens",
            "html_url": f"{self.web_url}/organizations/{inst.account}/settings/installations/{inst.id}",
            "repositories_url": f"{self.base_url}/installation/repositories",
            "events": ["pull_request"],
            "account": self._user(inst.account),
            "permissions": dict(inst.permissions),
            "created_at": iso(0),
            "updated_at": iso(0),
            "suspended_by": None,
            "suspended_at": None,
        }

    def _get_repo_installation(self, ctx: Ctx):
        app = ctx.app()
        full = f"{ctx.path_params['owner']}/{ctx.path_params['repo']}"
        for inst in self._installations.values():
            if inst.app_id == app.id and full in inst.repos:
                return 200, self._installation_json(inst)
        raise ApiError(404, "Not Found")

    def _create_installation_token(self, ctx: Ctx):
        app = ctx.app()
        inst = self._installations.get(int(ctx.path_params["installation_id"]))
        if inst is None or inst.app_id != app.id:
            raise ApiError(404, "Not Found")
        b = ctx.body or {}
        perms = dict(inst.permissions)
        if b.get("permissions"):
            for k, v in b["permissions"].items():
                if _LEVELS.get(inst.permissions.get(k, ""), 0) < _LEVELS.get(v, 9):
                    raise ApiError(422, "The permissions requested are not granted to this installation.")
            perms = dict(b["permissions"])
        repos = set(inst.repos)
        if b.get("repositories"):
            wanted = {f"{inst.account}/{name}" for name in b["repositories"]}
            if not wanted <= inst.repos:
                raise ApiError(
                    422,
                    "There is at least one repository that does not exist or is not accessible "
                    "to the parent installation.",
                )
            repos = wanted
        token = "ghs_inst_" + secrets.token_hex(16)
        expires = time.time() + 3600
        self._tokens[token] = Token(token, perms, repos, f"{app.slug}[bot]", app.id, expires)
        return 201, {
            "token": token,
            "expires_at": iso(expires),
            "permissions": perms,
            "repository_selection": "selected",
        }
