"""Write every rendering of a Report into one directory (what `kernalin-ci run --out DIR` leaves)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from kernalin_ci.report.badge import badge_endpoint, badge_svg
from kernalin_ci.report.junit import render_junit
from kernalin_ci.report.markdown import render_markdown, render_step_summary
from kernalin_ci.report.model import Report

FILES = ("report.json", "report.md", "junit.xml", "badge.svg", "badge.json")


def _plain(x):
    """JSON-ready copy: tuples as lists, non-finite floats (NaN, Inf: not JSON) as null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def report_json(report: Report) -> str:
    """report.json's text (schema: kernalin_ci/report/schema.py, docs/report.md)."""
    return json.dumps(_plain(report.to_json()), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def step_summary(report: Report) -> str:
    """Markdown for $GITHUB_STEP_SUMMARY (github.actions.append_step_summary writes it): the comment's
    layout, with room for every finding."""
    return render_step_summary(report)


def _write(path: Path, text: str) -> None:
    """Write via a temporary file and a rename, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_all(report: Report, out_dir: str | Path) -> dict[str, Path]:
    """Write report.json, report.md (the PR comment), junit.xml, badge.svg and badge.json (shields.io
    endpoint) into OUT_DIR (created if needed); returns {file name: path}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = {
        "report.json": report_json(report),
        "report.md": render_markdown(report),
        "junit.xml": render_junit(report),
        "badge.svg": badge_svg(report),
        "badge.json": json.dumps(badge_endpoint(report), ensure_ascii=False) + "\n",
    }
    paths = {}
    for name in FILES:
        paths[name] = out / name
        _write(paths[name], texts[name])
    return paths
