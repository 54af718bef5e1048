"""custom: any other op. The configuration names a float64-capable `reference`
callable (same keywords as the entry) and an `inputs(seed, case) -> dict` builder
(docs/ops.md)."""

from __future__ import annotations

from typing import Any

from kernalin_ci.entry import load_entry
from kernalin_ci.errors import UsageError
from kernalin_ci.lazy import torch
from kernalin_ci.ops.base import Case, Expected, Op, Param, Params, Tensors
from kernalin_ci.ops.bench_shapes import BenchRequest


def _entry_spec(v: Any) -> str | None:
    return None if isinstance(v, str) and ":" in v else "must be 'file.py:function' or 'module:function'"


PARAMS = (
    Param("reference", None, str, "float64 reference callable, same keywords as the entry", check=_entry_spec),
    Param("inputs", None, str, "inputs(seed, case) -> dict of keyword arguments", check=_entry_spec),
    Param("cases", [{}], list, "case dicts passed to inputs(); each runs with several seeds"),
    Param("seeds", 3, int, "seeds per case", check=lambda v: None if v >= 1 else "must be >= 1"),
    Param("written", [], list, "argument names the entry may write"),
)


def as_outputs(ret: Any) -> Tensors:
    if isinstance(ret, torch.Tensor):
        return {"out": ret}
    if isinstance(ret, (tuple, list)):
        return {f"out{i}": t for i, t in enumerate(ret)}
    if isinstance(ret, dict):
        return dict(ret)
    raise TypeError(f"expected a tensor, a tuple of tensors or a dict, got {type(ret).__name__}")


class Custom(Op):
    name = "custom"
    params = PARAMS
    written = ()
    redraw_inputs = False  # the user's builder knows the structure of its inputs
    user_code = True  # inputs() and reference() are the user's: the worker runs them (verify/judge.py)

    def _fn(self, params: Params, key: str) -> Any:
        if not params.get(key):
            raise UsageError(f"op custom: param {key!r} is required (a 'file.py:function' entry)")
        return load_entry(params[key], self.root)

    def written_names(self, params: Params) -> tuple[str, ...]:
        return tuple(params.get("written") or ())

    def cases(self, params: Params, device: str, dtype: str | None) -> list[Case]:
        out = []
        for i, c in enumerate(params.get("cases") or [{}]):
            if not isinstance(c, dict):
                raise UsageError("op custom: param 'cases' must be a list of objects")
            for s in range(params["seeds"]):
                out.append(Case(f"case{i}-seed{s}", dict(c), dtype or c.get("dtype", "float32"), 1000 * i + s))
        return out

    def probe(self, params: Params, dtype: str | None) -> Case:
        c = (params.get("cases") or [{}])[0]
        return Case("probe", dict(c), dtype or "float32", 0, ("probe",))

    def inputs(self, case: Case, params: Params, device: str, poison: bool = True) -> Tensors:
        kw = self._fn(params, "inputs")(case.seed, {**case.dims, "dtype": case.dtype, "device": device})
        if not isinstance(kw, dict):
            raise UsageError("op custom: inputs() must return a dict of keyword arguments")
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}

    def outputs(self, ret: Any, kw: Tensors) -> Tensors:
        return as_outputs(ret)

    def reference(self, kw: Tensors, params: Params) -> Expected:
        kw64 = {
            k: (v.to("cpu", torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
            for k, v in kw.items()
        }
        ref = as_outputs(self._fn(params, "reference")(**kw64))
        return Expected({k: v.to(torch.float64) for k, v in ref.items()})

    def bench_cases(self, params: Params, device: str, request: BenchRequest) -> list[Case]:
        return [
            Case(
                f"custom case {i}",
                dict(c),
                request.given.get("dtype", c.get("dtype", request.dtype)),
                1000 + i,
                ("bench",),
            )
            for i, c in enumerate((params.get("cases") or [{}])[:4])
        ]


OP_CLASS = Custom
