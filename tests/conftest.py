import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHECKS = REPO / "checks"
KERNELS = Path(__file__).resolve().parent / "kernels"


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tmp_path(tmp_path):
    """pytest's own, reachable by other users when the tests run as root: its folders are 0700, and a kernel
    worker of an unprivileged uid of its own (KERNALIN_SANDBOX=uid, root without bubblewrap, as on the GPU
    machine) refuses an entry or checkout it cannot read (sandbox/uid.py)."""
    if os.geteuid() == 0:
        top = Path(tempfile.gettempdir()).resolve()
        for folder in [tmp_path, *tmp_path.parents]:
            if folder == top or top not in folder.parents:
                break
            folder.chmod(folder.stat().st_mode | 0o011)
        tmp_path.chmod(tmp_path.stat().st_mode | 0o055)
    return tmp_path


def cli(*args, cwd=None, timeout=900, env=None):
    """Run the real `kernalin-ci` command in a subprocess; returns CompletedProcess."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "kernalin_ci", *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
    )


try:  # the GitHub stand-in needs the test extras (PyJWT, ...); a GPU machine running `-m gpu` may have only torch
    from kernalin_ci.testing.pytest_fixtures import github_standin, make_github_standin  # noqa: E402,F401
except ImportError as e:  # tests that use the stand-in then error with this reason (fixture not found)
    if not os.environ.get("KERNALIN_TESTS_WITHOUT_EXTRAS"):
        raise
    print(f"conftest: no GitHub stand-in ({e})", file=sys.stderr)
