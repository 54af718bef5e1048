"""PTX of a kernel's CUDA sources, built once per source hash.

The key covers the compiler's version, the target, the flags, and the path and bytes of every source and of
every repository header it includes (includes.py): an unchanged kernel is never built twice in a cache, and a
changed header always builds again. The cache is the folder the run's workers share (caches.py): base and head
see different checkouts and so get different folders, never one build directory for both.

Building PTX needs no GPU: on a host without one it is what can be checked of a CUDA kernel (a source that does
not compile is a `build-error` finding)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kernalin_ci.cuda import toolchain
from kernalin_ci.cuda.caches import cache_dir
from kernalin_ci.cuda.includes import included_files
from kernalin_ci.cuda.sources import CudaSpec

DEFAULT_ARCH = "compute_80"
TIMEOUT_S = 600.0
# flags that choose the target, the output or the kind of build: replaced by `-ptx -arch=ARCH -o FILE`
_DROP_WITH_VALUE = ("-o", "-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code")
_DROP = (
    "-c",
    "--compile",
    "-shared",
    "--shared",
    "-ptx",
    "--ptx",
    "-cubin",
    "--cubin",
    "-fatbin",
    "--fatbin",
    "-lineinfo",
)
ERROR_AT = re.compile(r"^(?P<path>[^\s()]+)\((?P<line>\d+)\): (?:catastrophic )?error", re.M)


@dataclass
class BuildResult:
    """status: built | cached | failed | no-compiler | no-sources."""

    status: str
    key: str = ""
    compiler: str = ""
    arch: str = DEFAULT_ARCH
    sources: list[str] = field(default_factory=list)  # repository-relative
    ptx: list[str] = field(default_factory=list)  # the PTX files (in the cache)
    log: str = ""  # a failed build's compiler output (trimmed)
    failed: str | None = None  # the source that failed
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> BuildResult:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def error_location(self) -> tuple[str, int] | None:
        """(file, line) of the compiler's first error, if it names one."""
        m = ERROR_AT.search(self.log)
        return (m["path"], int(m["line"])) if m else None


def ptx_arch(flags: tuple[str, ...], gpu: str | None = None) -> str:
    """The virtual architecture to build PTX for: the highest compute_XY (or sm_XY) the flags target, else the
    GPU's in use (GPU: "compute_90" on an H100), else compute_80 (what every GPU the gate runs on takes)."""
    found = [int(m) for m in re.findall(r"(?:compute|sm)_(\d+)", " ".join(flags))]
    return f"compute_{max(found)}" if found else gpu or DEFAULT_ARCH


def build_flags(flags: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
            continue
        if f in _DROP_WITH_VALUE:
            skip = True
            continue
        if f in _DROP or any(f.startswith(d + "=") for d in _DROP_WITH_VALUE) or f.startswith(("-arch", "-gencode")):
            continue
        out.append(f)
    return out


def source_key(spec: CudaSpec, root: Path, compiler: str, arch: str) -> tuple[str, list[Path]]:
    """The build's key and the sources it covers."""
    base = root.resolve()
    sources = spec.files(base)
    h = hashlib.sha256()
    h.update(json.dumps([toolchain.nvcc_version(compiler), arch, list(spec.flags)]).encode())
    files = set(sources)
    for src in sources:
        files |= included_files(base, src, spec.include_dirs())
    for p in sorted(files):
        h.update(str(p.relative_to(base)).encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest(), sources


def build_ptx(spec: CudaSpec, root: Path, cache: str, gpu: str | None = None) -> BuildResult:
    """PTX of every source of SPEC at ROOT into CACHE/ptx-KEY/ (built there once; a later call finds it), for
    the architecture of ptx_arch (GPU: the one of the GPU in use, where there is one)."""
    t0 = time.perf_counter()
    compiler = toolchain.nvcc()
    if compiler is None:
        return BuildResult(
            "no-compiler", log="no CUDA compiler (pip install 'kernalin-ci[cuda]', or set KERNALIN_NVCC)"
        )
    arch = ptx_arch(spec.flags, gpu)
    key, sources = source_key(spec, root, compiler, arch)
    base = root.resolve()
    rel = [str(s.relative_to(base)) for s in sources]
    if not sources:
        return BuildResult("no-sources", key, compiler, arch, log=f"no file matches {', '.join(spec.sources)}")
    out = Path(cache) / f"ptx-{key[:24]}"
    done = out / "result.json"
    if done.is_file():
        try:
            old = BuildResult.from_json(json.loads(done.read_text()))
            old.status = "cached" if old.status == "built" else old.status
            old.seconds = time.perf_counter() - t0
            return old
        except (OSError, ValueError, TypeError):
            pass
    out.mkdir(parents=True, exist_ok=True)
    result = BuildResult("built", key, compiler, arch, rel)
    for name in rel:
        target = out / (name.replace(os.sep, "__") + ".ptx")
        argv = [compiler, "-ptx", f"-arch={arch}", *build_flags(spec.flags), "-o", str(target), name]
        try:
            p = subprocess.run(argv, cwd=base, capture_output=True, text=True, timeout=TIMEOUT_S)
            ok, log = p.returncode == 0, (p.stderr + p.stdout)
        except subprocess.TimeoutExpired:
            ok, log = False, f"the compiler took more than {TIMEOUT_S:g} s"
        except OSError as e:
            result.status, result.log = "no-compiler", f"cannot run {compiler}: {e}"
            break
        if not ok:
            result.status, result.failed = "failed", name
            result.log = "\n".join(log.strip().splitlines()[:40])[:4000]
            break
        result.ptx.append(str(target))
    result.seconds = time.perf_counter() - t0
    if result.status in ("built", "failed"):  # a missing compiler is not the sources' result: not kept
        done.write_text(json.dumps(result.to_json()))
    return result


def build_shared(sources: list, flags=(), arch: str | None = None) -> str:
    """A shared library of SOURCES (a launcher of your own with `extern "C"` functions, called through ctypes:
    docs/cuda.md) built with nvcc for ARCH (default: the GPU torch sees, e.g. sm_90), once per hash of the
    sources, every header they include from FLAGS' -I folders, the flags and the compiler, into the run's
    CUDA cache (caches.py). Raises RuntimeError with the compiler's output when it does not build."""

    compiler = toolchain.nvcc()
    if compiler is None:
        raise RuntimeError("no CUDA compiler (pip install 'kernalin-ci[cuda]', or set KERNALIN_NVCC)")
    if arch is None:
        import torch

        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    paths = [Path(s).resolve() for s in sources]
    spec = CudaSpec(tuple(str(p) for p in paths), tuple(flags))
    h = hashlib.sha256(json.dumps([toolchain.nvcc_version(compiler), arch, list(flags)]).encode())
    files = set(paths)
    for p in paths:
        files |= included_files(Path("/"), p, [str(Path(d).resolve()) for d in spec.include_dirs()])
    for p in sorted(files):
        h.update(str(p).encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    folder = Path(cache_dir()) / f"lib-{h.hexdigest()[:24]}"
    target = folder / f"{paths[0].stem}.so"
    if target.is_file():
        return str(target)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{paths[0].stem}.{os.getpid()}.so"
    argv = [compiler, "-shared", "-Xcompiler", "-fPIC", f"-arch={arch}", *flags, "-o", str(tmp), *map(str, paths)]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"nvcc took more than {TIMEOUT_S:g} s building {paths[0].name}") from None
    if p.returncode != 0:
        raise RuntimeError(f"{paths[0].name} does not build: {(p.stderr + p.stdout).strip()[:3000]}")
    os.replace(tmp, target)
    return str(target)
