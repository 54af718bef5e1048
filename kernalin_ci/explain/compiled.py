"""Worker task "explain-compile" (in the child: the PR's code is imported only here).

For each benchmark shape: run the entry once on that shape's inputs (CPU tensors) with the structural
capture's recorder (kernalin_ci.verify.structural.capture: nothing is launched), every config of an
autotuned kernel recorded; record the torch operations the entry's host code performs; compile every
recorded launch with `triton.compile` for sm_90 (TTGIR, PTX, cubin: ptxas ships with Triton, no GPU
needed); then read the resources (`ptxas -v`) and the SASS (`cuobjdump -sass`).

One event per shape: `{"event": "explain-shape", "shape": i, "launches": [...], "host_ops": [...],
"error": null}`, then `{"event": "explain-toolchain", ...}`.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
import time

from kernalin_ci.entry import load_entry
from kernalin_ci.explain.code import (
    digest,
    instruction_mix,
    normalize_ptx,
    normalize_ttgir,
    occupancy,
    ptxas_resources,
    sass_instructions,
)
from kernalin_ci.jobs import CompileJob, Emit
from kernalin_ci.ops import get_op
from kernalin_ci.verify.structural import capture
from kernalin_ci.verify.structural.capture import CaptureError, capture_at

ARCH = 90  # the capture's target (kernalin_ci.verify.structural.capture.TARGET)
_COMPILED: dict = {}


def _tool(name: str, arch: int = ARCH) -> str | None:
    """Triton's bundled ptxas / cuobjdump (the system's may be too old for Triton's PTX)."""
    if name == "ptxas":
        try:
            from triton.backends.nvidia.compiler import get_ptxas

            try:
                return get_ptxas(arch).path
            except TypeError:
                return get_ptxas().path
        except Exception:
            pass
    try:
        import triton.knobs as knobs

        path = getattr(knobs.nvidia, name).path
        if path:
            return path
    except Exception:
        pass
    return shutil.which(name)


def toolchain() -> dict:
    """What this process compiles and runs with (compared between base and head)."""
    import torch
    import triton

    facts = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "triton_path": os.path.dirname(triton.__file__),
        "cuda": torch.version.cuda,
    }
    ptxas = _tool("ptxas")
    facts["ptxas"] = None
    if ptxas:
        try:
            out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30).stdout
            facts["ptxas"] = next((ln.strip() for ln in out.splitlines() if "release" in ln), out.strip()[-80:])
        except (OSError, subprocess.SubprocessError):
            pass
    return facts


class HostOps:
    """The torch operations the entry's host code runs (aten op, shapes, dtypes, scalars): part of what
    the identity check compares, since a CUDA graph times them with the kernels."""

    def __init__(self):
        self.ops: list[str] = []

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        ops = self.ops

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                ops.append(f"{func}({_sig(args)}{', ' + _sig(kwargs) if kwargs else ''})")
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.mode.__enter__()
        # the recorder's own bookkeeping (canary checks of scratch tensors) is not the entry's work
        from torch.utils._python_dispatch import _disable_current_modes

        self.saved = capture.LaunchRecorder.record
        saved = self.saved

        def record(rec, *args, **kwargs):
            with _disable_current_modes():
                return saved(rec, *args, **kwargs)

        capture.LaunchRecorder.record = record
        return self

    def __exit__(self, *exc):

        capture.LaunchRecorder.record = self.saved
        self.mode.__exit__(*exc)


def _sig(x) -> str:
    import torch

    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
    if isinstance(x, dict):
        return ", ".join(f"{k}={_sig(v)}" for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return "(" + ", ".join(_sig(v) for v in x) + ")"
    if isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format)):
        return repr(x)[:60]
    return type(x).__name__


def compile_launch(la) -> dict:
    """Compile one captured launch for sm_90 and describe it (cached per source, specialization, options)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    opts = dict(la.options.__dict__) if la.options is not None and hasattr(la.options, "__dict__") else {}
    src = ASTSource(la.jit, la.signature, la.constexprs, la.attrs)
    key = la.path + src.hash() + repr(sorted(opts.items()))
    if key in _COMPILED:
        return _COMPILED[key]
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    t0 = time.perf_counter()
    try:
        k = triton.compile(src, target=GPUTarget("cuda", ARCH, 32), options=opts)
    except Exception as e:  # a kernel that does not compile for sm_90
        res = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[-300:]}"}
        _COMPILED[key] = res
        return res
    md = k.metadata
    get = (lambda n, d=None: getattr(md, n, d)) if not isinstance(md, dict) else (lambda n, d=None: md.get(n, d))
    ttgir, ptx, cubin = k.asm.get("ttgir", ""), k.asm.get("ptx", ""), k.asm.get("cubin", b"")
    res = {
        "name": get("name"),
        "num_warps": get("num_warps"),
        "num_stages": get("num_stages"),
        "num_ctas": get("num_ctas", 1),
        "shared_bytes": get("shared", 0),
        "ttgir": digest(normalize_ttgir(ttgir)),
        "ptx": digest(normalize_ptx(ptx)),
        "cubin": digest(cubin) if cubin else None,
        "sass": None,
        "resources": None,
        "mix": None,
        "occupancy": None,
        "notes": [],
        "compile_s": 0.0,
    }
    with tempfile.TemporaryDirectory(prefix="kernalin-explain-") as tmp:
        ptxas = _tool("ptxas")
        if ptxas and ptx:
            p = os.path.join(tmp, "k.ptx")
            with open(p, "w") as f:
                f.write(ptx)
            r = subprocess.run(
                [ptxas, "-v", f"--gpu-name=sm_{ARCH}a", p, "-o", os.path.join(tmp, "v.cubin")],
                capture_output=True,
                text=True,
                timeout=300,
            )
            res["resources"] = ptxas_resources(r.stderr) if r.returncode == 0 else None
        if res["resources"] is None:
            res["notes"].append("registers and spills: not available (Triton's ptxas not found or failed)")
        cuobjdump = _tool("cuobjdump")
        if cuobjdump and cubin:
            c = os.path.join(tmp, "k.cubin")
            with open(c, "wb") as f:
                f.write(cubin)
            r = subprocess.run([cuobjdump, "-sass", c], capture_output=True, text=True, timeout=300)
            if r.returncode == 0:
                ins = sass_instructions(r.stdout)
                res["sass"] = digest("\n".join(ins))
                res["mix"] = instruction_mix(ins)
        if res["sass"] is None:
            res["notes"].append("SASS: not available (cuobjdump not found or failed); identity from TTGIR and PTX")
    regs = (res["resources"] or {}).get("registers")
    smem = int(res["shared_bytes"] or 0) + int((res["resources"] or {}).get("static_smem_bytes") or 0)
    res["occupancy"] = occupancy(ARCH, int(res["num_warps"] or 4), regs, smem)
    res["compile_s"] = round(time.perf_counter() - t0, 3)
    _COMPILED[key] = res
    return res


def describe_launch(la) -> dict:
    """The launch itself: kernel, grid, scalars, pointers (by tensor), constexprs, autotune."""
    args = []
    for a in la.args:
        if a.kind == "pointer":
            args.append([a.name, f"{a.tensor}+{a.byte_offset}:{a.pointee}"])
        elif a.kind != "none":
            args.append([a.name, a.value])
    constexprs = {a.name: a.value for a in la.args if a.kind == "constexpr"}
    return {
        "kernel": la.kernel,
        "path": la.path,
        "line": la.line,
        "grid": list(la.grid),
        "args": args,
        "constexprs": constexprs,
        "autotuned": bool(la.autotuned),
    }


def run_job(job: CompileJob, emit: Emit) -> None:
    """Worker task 'explain-compile'."""
    os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret (set before the entry imports Triton)

    op = get_op(job.op, root=job.root)
    params = job.params
    fn = load_entry(job.entry, job.root)
    emit({"event": "explain-toolchain", **toolchain()})
    for i, case in enumerate(job.cases):
        host = HostOps()

        def entry(host=host, **kw):
            with host:
                return fn(**kw)

        try:
            kw = op.inputs(case, params, "cpu", poison=False)
            cap = capture_at(op, entry, params, case, inputs=kw, all_configs=True)
        except CaptureError as e:
            emit({"event": "explain-shape", "shape": i, "launches": [], "host_ops": [], "error": str(e)})
            continue
        launches = []
        for la in cap.launches:
            d = describe_launch(la)
            d["compiled"] = compile_launch(la)
            launches.append(d)
        emit(
            {
                "event": "explain-shape",
                "shape": i,
                "launches": launches,
                "host_ops": host.ops,
                "notes": [n for n in cap.notes],
                "error": None if launches else "the entry launched no Triton kernel",
            }
        )
