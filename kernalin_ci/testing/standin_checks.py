"""The GitHub stand-in's endpoints for what the gate posts: check runs and their annotations, commit
statuses, issue comments."""

from __future__ import annotations

from kernalin_ci.testing.standin_state import (
    COMMENT_MAX_CHARS,
    NOT_ACCESSIBLE,
    STATUS_DESCRIPTION_MAX_CHARS,
    ApiError,
    Ctx,
    Repo,
    iso,
    node_id,
)


class ChecksAndComments:
    """A part of GitHubStandIn (github_standin.py): its handlers read and change the stand-in's state."""

    def _check_run_json(self, repo: Repo, run: dict) -> dict:
        url = f"{self.base_url}/repos/{repo.full_name}/check-runs/{run['id']}"
        prs = []
        for pr in repo.pulls.values():
            if pr["head_sha"] == run["head_sha"] and pr["head_repo"] == repo.full_name:
                side = {
                    "id": repo.id,
                    "url": f"{self.base_url}/repos/{repo.full_name}",
                    "name": repo.full_name.split("/")[1],
                }
                prs.append(
                    {
                        "id": pr["id"],
                        "number": pr["number"],
                        "url": f"{self.base_url}/repos/{repo.full_name}/pulls/{pr['number']}",
                        "head": {"ref": pr["head_ref"], "sha": pr["head_sha"], "repo": side},
                        "base": {"ref": pr["base_ref"], "sha": pr["base_sha"], "repo": side},
                    }
                )
        app = self._app_json(run["app_id"])
        return {
            "id": run["id"],
            "node_id": node_id("CheckRun", run["id"]),
            "head_sha": run["head_sha"],
            "external_id": run["external_id"],
            "url": url,
            "html_url": f"{self.web_url}/{repo.full_name}/runs/{run['id']}",
            "details_url": run["details_url"] or (app or {}).get("external_url"),
            "status": run["status"],
            "conclusion": run["conclusion"],
            "started_at": run["started_at"],
            "completed_at": run["completed_at"],
            "output": {
                **{k: run["output"].get(k) for k in ("title", "summary", "text")},
                "annotations_count": len(run["annotations"]),
                "annotations_url": f"{url}/annotations",
            },
            "name": run["name"],
            "check_suite": {"id": run["check_suite_id"]},
            "app": app,
            "pull_requests": prs,
        }

    def _apply_output(self, run: dict, output: dict | None) -> None:
        if not output:
            return
        for k in ("title", "summary", "text"):
            if k in output:
                run["output"][k] = output[k]
        for a in output.get("annotations", []):
            if ("start_column" in a or "end_column" in a) and a["start_line"] != a["end_line"]:
                raise ApiError(
                    422,
                    "Invalid request.\n\nstart_column and end_column may only be used when start_line equals end_line",
                )
            if a["start_line"] < 1 or a["end_line"] < a["start_line"]:
                raise ApiError(422, "Invalid request.\n\nannotation lines out of range")
        run["annotations"] += [dict(a) for a in output.get("annotations", [])]
        run["annotation_batches"].append(len(output.get("annotations", [])))

    def _apply_status(self, run: dict, body: dict) -> None:
        if "conclusion" in body:
            run["status"], run["conclusion"] = "completed", body["conclusion"]
            run["completed_at"] = body.get("completed_at") or iso()
        elif body.get("status") == "completed":
            raise ApiError(422, "Invalid request.\n\nconclusion is required when status is completed")
        elif "status" in body:
            run["status"] = body["status"]

    def _find_run(self, repo: Repo, ctx: Ctx) -> dict:
        run = repo.check_runs.get(int(ctx.path_params["check_run_id"]))
        if run is None:
            raise ApiError(404, "Not Found")
        return run

    def _create_check_run(self, ctx: Ctx):
        repo = ctx.repo("checks", level="write")
        if ctx.auth.app_id is None:
            raise ApiError(403, "Resource not accessible by personal access token")
        b = ctx.body
        self._need_commit(repo, b["head_sha"])
        suite = repo.check_suites.setdefault((ctx.auth.app_id, b["head_sha"]), next(self._ids))
        run = {
            "id": next(self._ids),
            "name": b["name"],
            "head_sha": b["head_sha"],
            "external_id": b.get("external_id", ""),
            "details_url": b.get("details_url"),
            "status": "queued",
            "conclusion": None,
            "started_at": b.get("started_at") or iso(),
            "completed_at": None,
            "output": {"title": None, "summary": None, "text": None},
            "annotations": [],
            "annotation_batches": [],
            "updates": 0,
            "app_id": ctx.auth.app_id,
            "check_suite_id": suite,
        }
        self._apply_status(run, b)
        self._apply_output(run, b.get("output"))
        repo.check_runs[run["id"]] = run
        return 201, self._check_run_json(repo, run)

    def _get_check_run(self, ctx: Ctx):
        repo = ctx.repo("checks")
        return 200, self._check_run_json(repo, self._find_run(repo, ctx))

    def _update_check_run(self, ctx: Ctx):
        repo = ctx.repo("checks", level="write")
        run = self._find_run(repo, ctx)
        if run["app_id"] != ctx.auth.app_id:
            raise ApiError(
                403,
                f"Invalid app_id `{ctx.auth.app_id}` - check run can only be modified by the GitHub "
                "App that created it.",
            )
        b = ctx.body
        if run["status"] == "completed" and b.get("status") in ("queued", "in_progress") and "conclusion" not in b:
            # a completed run cannot be reopened (reported by integrators; GitHub's reference is silent)
            raise ApiError(422, f"Invalid request.\n\nA completed check run cannot be moved back to {b['status']}")
        for k in ("name", "details_url", "external_id", "started_at"):
            if k in b:
                run[k] = b[k]
        self._apply_status(run, b)
        self._apply_output(run, b.get("output"))
        run["updates"] += 1
        return 200, self._check_run_json(repo, run)

    def _list_annotations(self, ctx: Ctx):
        repo = ctx.repo("checks")
        run = self._find_run(repo, ctx)
        items = [
            {
                "path": a["path"],
                "blob_href": f"{self.web_url}/{repo.full_name}/blob/{run['head_sha']}/{a['path']}",
                "start_line": a["start_line"],
                "end_line": a["end_line"],
                "start_column": a.get("start_column"),
                "end_column": a.get("end_column"),
                "annotation_level": a["annotation_level"],
                "title": a.get("title", ""),
                "message": a["message"],
                "raw_details": a.get("raw_details", ""),
            }
            for a in run["annotations"]
        ]
        return 200, self._paginate(ctx, f"/repos/{repo.full_name}/check-runs/{run['id']}/annotations", items)

    def _list_check_runs(self, ctx: Ctx):
        repo = ctx.repo("checks")
        ref = ctx.path_params["ref"]
        self._need_commit(repo, ref)
        runs = [r for r in repo.check_runs.values() if r["head_sha"] == ref]
        if ctx.q("check_name") is not None:
            runs = [r for r in runs if r["name"] == ctx.q("check_name")]
        if ctx.q("status") is not None:
            runs = [r for r in runs if r["status"] == ctx.q("status")]
        if ctx.q("app_id") is not None:
            runs = [r for r in runs if r["app_id"] == int(ctx.q("app_id"))]
        if ctx.q("filter", "latest") == "latest":  # the most recent run of each name
            newest: dict[str, dict] = {}
            for r in runs:
                newest[r["name"]] = r
            runs = list(newest.values())
        runs = sorted(runs, key=lambda r: -r["id"])
        page = self._paginate(ctx, f"/repos/{repo.full_name}/commits/{ref}/check-runs", runs)
        return 200, {"total_count": len(runs), "check_runs": [self._check_run_json(repo, r) for r in page]}

    def _status_json(self, repo: Repo, s: dict) -> dict:
        return {
            "url": f"{self.base_url}/repos/{repo.full_name}/statuses/{s['sha']}",
            "avatar_url": None,
            "id": s["id"],
            "node_id": node_id("StatusContext", s["id"]),
            "state": s["state"],
            "description": s["description"],
            "target_url": s["target_url"],
            "context": s["context"],
            "created_at": s["created_at"],
            "updated_at": s["created_at"],
            "creator": self._user(s["login"]),
        }

    def _create_status(self, ctx: Ctx):
        repo = ctx.repo("statuses", level="write")
        sha = ctx.path_params["sha"]
        self._need_commit(repo, sha)
        b = ctx.body
        if len(b.get("description") or "") > STATUS_DESCRIPTION_MAX_CHARS:
            raise ApiError(
                422,
                "Validation Failed",
                errors=[
                    {
                        "resource": "Status",
                        "code": "custom",
                        "field": "description",
                        "message": f"description is too long (maximum is {STATUS_DESCRIPTION_MAX_CHARS} characters)",
                    }
                ],
            )
        s = {
            "id": next(self._ids),
            "sha": sha,
            "state": b["state"],
            "description": b.get("description"),
            "target_url": b.get("target_url"),
            "context": b.get("context", "default"),
            "login": ctx.auth.login,
            "created_at": iso(),
        }
        repo.statuses.append(s)
        return 201, self._status_json(repo, s)

    def _list_statuses(self, ctx: Ctx):
        repo = ctx.repo("statuses")
        ref = ctx.path_params["ref"]
        items = [s for s in reversed(repo.statuses) if s["sha"] == ref]
        page = self._paginate(ctx, f"/repos/{repo.full_name}/commits/{ref}/statuses", items)
        return 200, [self._status_json(repo, s) for s in page]

    def _comment_json(self, repo: Repo, c: dict) -> dict:
        api = f"{self.base_url}/repos/{repo.full_name}"
        return {
            "id": c["id"],
            "node_id": node_id("IssueComment", c["id"]),
            "url": f"{api}/issues/comments/{c['id']}",
            "html_url": f"{self.web_url}/{repo.full_name}/pull/{c['issue_number']}#issuecomment-{c['id']}",
            "body": c["body"],
            "user": self._user(c["login"]),
            "created_at": c["created_at"],
            "updated_at": c["updated_at"],
            "issue_url": f"{api}/issues/{c['issue_number']}",
            "author_association": "NONE",
            "performed_via_github_app": self._app_json(c["app_id"]),
        }

    def _issue(self, repo: Repo, ctx: Ctx) -> int:
        number = int(ctx.path_params["issue_number"])
        if number not in repo.pulls:
            raise ApiError(404, "Not Found")
        return number

    def _new_comment(self, repo: Repo, issue_number: int, body: str, login: str, app_id: int | None) -> dict:
        now = iso()
        c = {
            "id": next(self._ids),
            "issue_number": issue_number,
            "body": body,
            "login": login,
            "app_id": app_id,
            "created_at": now,
            "updated_at": now,
            "edits": 0,
        }
        repo.comments[c["id"]] = c
        return c

    def _comment(self, repo: Repo, ctx: Ctx) -> dict:
        c = repo.comments.get(int(ctx.path_params["comment_id"]))
        if c is None:
            raise ApiError(404, "Not Found")
        return c

    @staticmethod
    def _check_body(body: str) -> None:
        if len(body) > COMMENT_MAX_CHARS:
            raise ApiError(
                422,
                "Validation Failed",
                errors=[
                    {
                        "resource": "IssueComment",
                        "code": "custom",
                        "field": "body",
                        "message": f"body is too long (maximum is {COMMENT_MAX_CHARS} characters)",
                    }
                ],
            )

    def _list_comments(self, ctx: Ctx):
        repo = ctx.repo("issues", "pull_requests")
        number = self._issue(repo, ctx)
        items = [c for c in repo.comments.values() if c["issue_number"] == number]
        if ctx.q("since"):
            items = [c for c in items if c["updated_at"] >= ctx.q("since")]
        page = self._paginate(ctx, f"/repos/{repo.full_name}/issues/{number}/comments", items)
        return 200, [self._comment_json(repo, c) for c in page]

    def _create_comment(self, ctx: Ctx):
        repo = ctx.repo("issues", "pull_requests", level="write")
        number = self._issue(repo, ctx)
        self._check_body(ctx.body["body"])
        c = self._new_comment(repo, number, ctx.body["body"], ctx.auth.login, ctx.auth.app_id)
        return 201, self._comment_json(repo, c)

    def _get_comment(self, ctx: Ctx):
        repo = ctx.repo("issues", "pull_requests")
        return 200, self._comment_json(repo, self._comment(repo, ctx))

    def _update_comment(self, ctx: Ctx):
        repo = ctx.repo("issues", "pull_requests", level="write")
        c = self._comment(repo, ctx)
        if c["login"] != ctx.auth.login:
            raise ApiError(403, NOT_ACCESSIBLE)
        self._check_body(ctx.body["body"])
        c["body"], c["updated_at"] = ctx.body["body"], iso()
        c["edits"] += 1
        return 200, self._comment_json(repo, c)

    def _delete_comment(self, ctx: Ctx):
        repo = ctx.repo("issues", "pull_requests", level="write")
        c = self._comment(repo, ctx)
        if c["login"] != ctx.auth.login:
            raise ApiError(403, NOT_ACCESSIBLE)
        del repo.comments[c["id"]]
        return 204, None
