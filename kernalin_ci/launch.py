"""How kernalin-ci starts its own Python children (the gate under the daemon's local runner, the
kernel workers of verify and bench), and how a process that runs untrusted children hides itself.

A child starts in isolated mode (`-I`: no PYTHON* variables, no user site-packages, neither the
working directory nor a script's directory on sys.path). Its sys.path gets, in front, the
directory this kernalin_ci was imported from and then this process's own absolute sys.path entries
(where torch and the rest were found, PYTHONPATH included), minus anything inside the child's
working directory. A checkout that carries its own `kernalin_ci/` package (the gate and the
workers run inside checkouts) therefore cannot stand in for the tool, and this works the same from
an installed wheel, an editable install or a plain source tree.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

import kernalin_ci

# the directory that holds the kernalin_ci package this process runs (site-packages or a source tree)
PACKAGE_ROOT = str(Path(kernalin_ci.__file__).resolve().parent.parent)
# argv: -c BOOT PATHS MODULE ARGS...: PATHS (JSON) go first on sys.path, MODULE runs as __main__ with ARGS
_BOOT = (
    "import json, runpy, sys; sys.path[:0] = json.loads(sys.argv.pop(1)); m = sys.argv.pop(1); "
    "runpy.run_module(m, run_name='__main__', alter_sys=True)"
)


def child_path(cwd: str | os.PathLike | None = None) -> list[str]:
    """The sys.path entries a child gets in front: ours, never one inside its working directory CWD."""
    inside = os.path.realpath(cwd if cwd is not None else os.getcwd())
    out = [PACKAGE_ROOT]
    for p in sys.path:
        if not p or not os.path.isabs(p) or p in out:
            continue
        real = os.path.realpath(p)
        if real == inside or real.startswith(inside.rstrip(os.sep) + os.sep):
            continue
        out.append(p)
    return out


def module_argv(
    module: str, *, cwd: str | os.PathLike | None = None, python: str = sys.executable, pycache: str | None = None
) -> list[str]:
    """argv that runs `python -m MODULE` from this installation only, in working directory CWD (default:
    ours); append the module's arguments. PYCACHE: the folder it reads bytecode from (`-X pycache_prefix`)."""
    prefix = ["-X", f"pycache_prefix={pycache}"] if pycache else []
    return [python, "-I", *prefix, "-u", "-c", _BOOT, json.dumps(child_path(cwd)), module]


# For an image where kernalin-ci is installed (the docker runner): no -I, so the interpreter keeps every
# site it has (a user site too); the working directory ('' with -c) leaves sys.path before anything is
# imported, so a module in the checkout cannot stand in for runpy or kernalin_ci.
_IMAGE_BOOT = (
    "import sys; sys.path[:] = [p for p in sys.path if p]; import runpy; m = sys.argv.pop(1); "
    "runpy.run_module(m, run_name='__main__', alter_sys=True)"
)


def image_module_argv(module: str, python: str = "python3") -> list[str]:
    """argv that runs `python -m MODULE` from the installation of an image, never from the working directory."""
    return [python, "-u", "-c", _IMAGE_BOOT, module]


_PR_SET_DUMPABLE = 4


def make_undumpable() -> bool:
    """Make this process non-dumpable (prctl PR_SET_DUMPABLE 0) for as long as it lives.

    Its /proc/PID files (environ, mem, cmdline's neighbours) then belong to root and ptrace is
    refused, so an untrusted child running as the same uid cannot read the parent's environment
    or memory. Children get the flag back on exec, so the daemon can still find and kill them.
    No core dumps either. False where prctl is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
