"""The bytecode a sandboxed kernel worker imports torch, Triton and kernalin-ci from.

A worker in the sandbox sees the Python installation read-only and runs as a user that owns none of it,
so it cannot write the `.pyc` files Python caches compiled modules in. Where the installation has none
(an image built with `pip --no-compile` or `PYTHONDONTWRITEBYTECODE`), every worker compiles torch's
modules from source again: on the H200 3.1-3.5 s of each worker's start, on every verify's critical path
(docs/verification.md).

So the parent keeps a bytecode cache of its own: once per installation (this Python and the installed
torch, Triton and kernalin-ci) a trusted child (no pull-request code: isolated mode, its working
directory a fresh temporary folder) imports what a worker imports with `-X pycache_prefix=DIR`, which
writes their bytecode under DIR. Sandboxed workers start with the same prefix and see DIR read-only: they
read the bytecode and can change none of it. Where the installation holds its own bytecode (pip compiles
it on install) none of this is done. `KERNALIN_BYTECODE_CACHE` names DIR and uses it in any case
(default, only where the installation has none: `$XDG_CACHE_HOME/kernalin-ci/bytecode`, `~/.cache`
without XDG_CACHE_HOME), or is `off`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import threading

from kernalin_ci.launch import PACKAGE_ROOT

ENV = "KERNALIN_BYTECODE_CACHE"
WARM_TIMEOUT_S = 300

# What a worker imports. The parent's own side (the CLI, the daemon, the GitHub and dashboard code)
# is left out: no worker imports it.
WARM_SOURCE = r"""
import importlib, pkgutil, sys
for name in ("torch", "torch.profiler", "numpy", "triton", "triton.compiler.compiler", "triton.runtime.jit",
             "triton.runtime.interpreter", "triton.backends.nvidia.compiler", "triton.backends.nvidia.driver"):
    try:
        importlib.import_module(name)
    except Exception:
        pass
import kernalin_ci
PARENT_ONLY = ("__main__", "cli", "commands", "daemon", "dashboard", "github", "gate", "history")
for info in pkgutil.walk_packages(kernalin_ci.__path__, "kernalin_ci.",
                                  onerror=lambda name: None):
    if info.name.split(".")[1] in PARENT_ONLY:
        continue
    try:
        importlib.import_module(info.name)
    except Exception:
        pass
"""

_lock = threading.Lock()
_ready: dict[str, str | None] = {}
_warned: list[str] = []


def cache_dir() -> str | None:
    """DIR, or None when KERNALIN_BYTECODE_CACHE is `off`."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() == "off":
        return None
    if value:
        return os.path.abspath(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kernalin-ci", "bytecode")


def installation_key() -> str:
    """What the cached bytecode was compiled from: this Python, and where the packages a worker imports
    lie and when each was installed (their `__init__.py`; an upgrade rewrites it)."""
    import importlib.util

    parts = [sys.version, os.path.realpath(sys.executable)]
    for name in ("torch", "triton", "kernalin_ci"):
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec and spec.origin else ""
        try:
            st = os.stat(origin)
            parts.append(f"{origin} {st.st_mtime_ns} {st.st_size}")
        except OSError:
            parts.append(f"{name} -")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def installed_bytecode() -> bool:
    """Whether the installation holds the bytecode of what a worker imports first (a sample of torch's and
    Triton's modules: pip compiles them when it installs), so workers read it there."""
    import importlib.util

    tag = sys.implementation.cache_tag
    if tag is None:
        return True
    for name, inside in SAMPLE:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            continue
        source = os.path.join(os.path.dirname(spec.origin), *inside)
        folder, base = os.path.split(source)
        if os.path.exists(source) and not os.path.exists(os.path.join(folder, "__pycache__", f"{base[:-3]}.{tag}.pyc")):
            return False
    return True


SAMPLE = (
    ("torch", ("__init__.py",)),
    ("torch", ("_tensor.py",)),
    ("torch", ("nn", "modules", "module.py")),
    ("triton", ("__init__.py",)),
    ("triton", ("compiler", "compiler.py")),
)


def worker_prefix() -> str | None:
    """The folder sandboxed workers read bytecode from (`-X pycache_prefix`), compiled now if it is not
    yet; None where they read the installation's own (KERNALIN_BYTECODE_CACHE unset and the installation
    holds it), where it is off, or where it could not be made (the reason once on stderr: workers then
    compile in memory, as before)."""
    path = cache_dir()
    if path is None:
        return None
    with _lock:
        if path not in _ready:
            try:
                explicit = bool(os.environ.get(ENV, "").strip())
                _ready[path] = _warm(path) if explicit or not installed_bytecode() else None
            except (OSError, subprocess.SubprocessError) as e:
                _ready[path] = None
                _warn(f"{type(e).__name__}: {e}")
        return _ready[path]


def _warm(path: str) -> str | None:
    marker = os.path.join(path, f".ready-{installation_key()}")
    if os.path.exists(marker):  # compiled before (the folder may be read-only here: a shared, made one)
        return path
    os.makedirs(path, mode=0o755, exist_ok=True)
    os.chmod(path, 0o755)  # the sandbox's user reads it (kernalin-ci as root hands workers another uid)
    with open(os.path.join(path, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another kernalin-ci may be compiling it right now: wait for it
        if os.path.exists(marker):
            return path

        print("kernalin-ci: compiling the kernel workers' bytecode (once per installation)", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="kernalin-bytecode-") as cwd:
            argv = [sys.executable, "-I", "-X", f"pycache_prefix={path}", "-c"]
            # it runs unsandboxed: the installation's own paths only (isolated mode) and kernalin-ci's,
            # never an entry of this process's sys.path that a checkout could have put there
            boot = f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r})\n"
            proc = subprocess.run(
                [*argv, boot + WARM_SOURCE],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=WARM_TIMEOUT_S,
                env={k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")},
            )
        if proc.returncode != 0:
            _warn(f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
            return None
        _readable(path)
        with open(marker, "w") as f:
            f.write(f"{sys.version}\n{sys.executable}\n")
    return path


def _readable(path: str) -> None:
    """Every folder o+rx, every file o+r: the sandbox's user reads what this user wrote."""
    for root, dirs, files in os.walk(path):
        for d in dirs:
            p = os.path.join(root, d)
            os.chmod(p, os.stat(p).st_mode | 0o555)
        for name in files:
            p = os.path.join(root, name)
            os.chmod(p, os.stat(p).st_mode | 0o444)


def _warn(why: str) -> None:
    if why not in _warned:
        _warned.append(why)
        print(f"kernalin-ci: no bytecode cache for kernel workers ({why}); they compile in memory", file=sys.stderr)
