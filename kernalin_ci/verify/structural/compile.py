"""Compile a captured launch to TTIR on the CPU, for sm_90, across Triton versions.

The fast path runs only the first two stages of `triton.compile` (the AST to
Triton IR, then the `make_ttir` pass pipeline: inlining, canonicalisation, CSE,
loop-invariant code motion), about a tenth of a second per kernel. If a Triton
version moves those internals, the slow path runs the whole `triton.compile`
(through PTX and ptxas, about a second) and reads `asm["ttir"]`. Results are
cached per process by the kernel's file, the source's own hash (the JIT's cache
key: source, dependencies, signature, constexprs, attributes) and options.
"""

from __future__ import annotations

import os

from kernalin_ci.verify.structural.capture import TARGET

_CACHE: dict[str, str] = {}


class CompileError(Exception):
    pass


def _source(launch):
    from triton.compiler.compiler import ASTSource

    return ASTSource(launch.jit, launch.signature, launch.constexprs, launch.attrs)


def _target():
    from triton.backends.compiler import GPUTarget

    return GPUTarget(*TARGET)


def _ttir_fast(src, target, options) -> str:
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    opts = backend.parse_options(dict(options.__dict__ if hasattr(options, "__dict__") else options or {}))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen_fns = backend.get_codegen_implementation(opts)
    module_map = backend.get_module_map()
    module = src.make_ir(target, opts, codegen_fns, module_map, context)
    stages: dict = {}
    backend.add_stages(stages, opts, src.language)
    metadata: dict = {}
    ttir = stages["ttir"](module, metadata)
    return str(ttir)


def _ttir_full(src, target, options) -> str:
    import triton

    opts = dict(options.__dict__) if hasattr(options, "__dict__") else dict(options or {})
    kernel = triton.compile(src, target=target, options=opts)
    return kernel.asm["ttir"]


def ttir(launch) -> str:
    """The TTIR text of one captured launch (cached). Raises CompileError with a one-line cause."""
    src = _source(launch)
    target = _target()
    # the file is part of the key: the same kernel source in two files compiles to two sets of locations
    opts = launch.options.__dict__ if launch.options is not None else {}
    key = launch.path + src.hash() + repr(sorted(opts.items()))
    if key in _CACHE:
        return _CACHE[key]
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        try:
            text = _ttir_fast(src, target, launch.options)
        except (AttributeError, TypeError, KeyError, ImportError):
            text = _ttir_full(src, target, launch.options)
    except Exception as e:  # a kernel that does not compile for sm_90
        msg = " ".join(str(e).split())
        raise CompileError(f"{type(e).__name__}: {msg[-400:]}") from None
    _CACHE[key] = text
    return text


_PTX_CACHE: dict[str, str] = {}


def ptx(launch) -> str:
    """The PTX text of one captured launch for sm_90 (the whole `triton.compile`, cached), for the PTX
    engine. Raises CompileError with a one-line cause."""
    src = _source(launch)
    opts = launch.options.__dict__ if launch.options is not None else {}
    key = launch.path + src.hash() + repr(sorted(opts.items()))
    if key in _PTX_CACHE:
        return _PTX_CACHE[key]
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        import triton

        kernel = triton.compile(src, target=_target(), options=dict(opts))
        text = kernel.asm["ptx"]
    except Exception as e:  # a kernel that does not compile for sm_90
        msg = " ".join(str(e).split())
        raise CompileError(f"{type(e).__name__}: {msg[-400:]}") from None
    _PTX_CACHE[key] = text
    return text
