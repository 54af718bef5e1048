"""Chart.js, the dashboard's charting library: fetched with `npm pack` (pinned version, checked against
a pinned SHA-256), kept next to this module in vendor/ (not in git: 210 kB of minified code), and
copied into every site built. `kernalin-ci dashboard --fetch-assets` (and .ci/run, and the Action's
install step) fetches it; KERNALIN_CHARTJS names a copy fetched elsewhere (a machine without npm)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from kernalin_ci.errors import UsageError

CHARTJS_VERSION = "4.6.1"
CHARTJS_FILE = "chart.umd.min.js"
CHARTJS_SHA256 = "87364cc2b2a76a6684929e7d6b80b18a897794db38400caff1fcf1791c6925d2"
VENDOR = Path(__file__).resolve().parent / "vendor"
STATIC = Path(__file__).resolve().parent / "static"


def _ok(path: Path) -> bool:
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == CHARTJS_SHA256


def chartjs() -> Path:
    """The checked Chart.js file; UsageError (what to run) when it is not here."""
    env = os.environ.get("KERNALIN_CHARTJS")
    for p in ([Path(env)] if env else []) + [VENDOR / CHARTJS_FILE]:
        if p.is_file():
            if not _ok(p):
                raise UsageError(f"{p}: not Chart.js {CHARTJS_VERSION} (SHA-256 differs)")
            return p
    raise UsageError(
        f"Chart.js {CHARTJS_VERSION} is not installed: run `kernalin-ci dashboard --fetch-assets` "
        "(needs npm), or set KERNALIN_CHARTJS to a copy of chart.umd.min.js"
    )


def fetch_chartjs() -> Path:
    """`npm pack chart.js@VERSION`, its dist/chart.umd.min.js checked and kept in vendor/."""
    target = VENDOR / CHARTJS_FILE
    if _ok(target):
        return target
    if not shutil.which("npm"):
        raise UsageError("--fetch-assets needs npm (or set KERNALIN_CHARTJS to a copy of chart.umd.min.js)")
    with tempfile.TemporaryDirectory(prefix="kernalin-chartjs-") as tmp:
        p = subprocess.run(
            ["npm", "pack", "--silent", f"chart.js@{CHARTJS_VERSION}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=300,
        )
        tgz = Path(tmp) / f"chart.js-{CHARTJS_VERSION}.tgz"
        if p.returncode != 0 or not tgz.is_file():
            raise UsageError(f"npm pack chart.js@{CHARTJS_VERSION} failed: {' '.join(p.stderr.split())[:300]}")
        with tarfile.open(tgz) as tf:
            data = tf.extractfile(f"package/dist/{CHARTJS_FILE}").read()
            license_text = tf.extractfile("package/LICENSE.md").read()
    if hashlib.sha256(data).hexdigest() != CHARTJS_SHA256:
        raise UsageError(f"chart.js@{CHARTJS_VERSION} from the registry does not match the pinned SHA-256")
    VENDOR.mkdir(parents=True, exist_ok=True)
    tmp_target = target.with_suffix(".tmp")
    tmp_target.write_bytes(data)
    os.replace(tmp_target, target)
    (VENDOR / "chart.js-LICENSE.md").write_bytes(license_text)
    return target


def asset(name: str) -> bytes | None:
    """The bytes of a dashboard asset by file name (the daemon serves them); None when unknown."""
    if name == CHARTJS_FILE:
        return chartjs().read_bytes()
    p = STATIC / name
    return p.read_bytes() if name in ("dashboard.js", "dashboard.css") and p.is_file() else None


def copy_assets(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(chartjs(), out / CHARTJS_FILE)
    lic = VENDOR / "chart.js-LICENSE.md"
    if lic.is_file():
        shutil.copyfile(lic, out / "chart.js-LICENSE.md")
    for name in ("dashboard.js", "dashboard.css"):
        shutil.copyfile(STATIC / name, out / name)
