"""FlashInfer-Bench workloads as kernalin-ci cases (docs/cli.md, "FlashInfer-Bench workloads").

FlashInfer-Bench describes an op as a *definition* (`definitions/<op_type>/<name>.json`: named axes, constant or
variable, and its input tensors) and a user's traffic as *workloads* (`workloads/<op_type>/<name>.jsonl`: one
trace per line, `{"definition", "workload": {"axes", "inputs", "uuid"}, "solution": null, "evaluation": null}`);
an input is `random`, a `scalar` with its value, or a tensor of a `safetensors` file under the dataset's root.
The op kernalin-ci shares with it is paged decode attention (`gqa_paged` decode: q [batch_size, num_qo_heads,
head_dim], a paged cache [num_pages, page_size, num_kv_heads, head_dim], `kv_indptr`, `kv_indices`, an optional
`kv_last_page_len`, `sm_scale`): `attention.decode_paged`. Each workload becomes one case: its batch, its
sequences' kv lengths (from `kv_indptr` and `kv_last_page_len`), the definition's heads, head dim and page size,
its `sm_scale`, the definition's dtype. The page ids themselves are drawn as in every case of the op.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernalin_ci.errors import UsageError
from kernalin_ci.findings import CaseVerdict
from kernalin_ci.ops import NAMES, get_op
from kernalin_ci.ops.base import DTYPES, Case

DECODE_INPUTS = {"q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "sm_scale"}
OPTIONAL_INPUTS = {"kv_last_page_len"}
# a safetensors dtype code -> (struct format, bytes)
_INTS = {"I32": ("i", 4), "I64": ("q", 8), "U8": ("B", 1), "I16": ("h", 2), "I8": ("b", 1)}


@dataclass(frozen=True)
class Workloads:
    """The cases of one workload file, and the op params its definition fixes."""

    definition: str
    op_type: str  # the definition's; the op that shares it says so (Op.flashinfer_bench)
    params: dict[str, Any]  # block_size, num_q_heads, num_kv_heads, head_dim
    dtype: str
    cases: list[Case]
    workloads: list[dict]  # each case's workload object, as the file holds it


def _bad(path: Path, what: str) -> UsageError:
    return UsageError(f"workload {path}: {what}", setting="workload")


def load(path: str | Path) -> Workloads:
    """The workload file's cases (every line of one definition); bad input raises UsageError (exit 2)."""
    path = Path(path)
    if not path.is_file():
        raise _bad(path, "no such file")
    traces = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            t = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(path, f"line {n}: not JSON ({e.msg})") from None
        if not isinstance(t, dict) or not isinstance(t.get("workload"), dict) or not t.get("definition"):
            raise _bad(path, f"line {n}: expected a trace with 'definition' and 'workload'")
        traces.append((n, t))
    if not traces:
        raise _bad(path, "no workload in the file")
    names = sorted({str(t["definition"]) for _, t in traces})
    if len(names) > 1:
        raise _bad(path, f"workloads of several definitions ({', '.join(names)}): one file per definition")
    root = dataset_root(path)
    definition = read_definition(path, root, names[0])
    params, dtype = decode_params(path, definition)
    cases = [
        case_of(path, root, n, t["workload"], definition, params, dtype, seed=i) for i, (n, t) in enumerate(traces)
    ]
    return Workloads(names[0], str(definition["op_type"]), params, dtype, cases, [t["workload"] for _, t in traces])


def dataset_root(path: Path) -> Path:
    """The dataset folder: the nearest folder above the file that holds `definitions/`."""
    for folder in path.resolve().parents:
        if (folder / "definitions").is_dir():
            return folder
    raise _bad(path, "no definitions/ folder above it (a FlashInfer-Bench dataset holds definitions/ and workloads/)")


def read_definition(path: Path, root: Path, name: str) -> dict:
    found = sorted((root / "definitions").rglob(f"{name}.json"))
    if not found:
        raise _bad(path, f"definition {name}: no {name}.json under {root / 'definitions'}")
    try:
        d = json.loads(found[0].read_text())
    except json.JSONDecodeError as e:
        raise _bad(path, f"definition {found[0]}: not JSON ({e.msg})") from None
    if not isinstance(d, dict) or not isinstance(d.get("axes"), dict) or not isinstance(d.get("inputs"), dict):
        raise _bad(path, f"definition {found[0]}: expected an object with 'axes' and 'inputs'")
    return d


def decode_params(path: Path, d: dict) -> tuple[dict[str, Any], str]:
    """block_size, num_q_heads, num_kv_heads, head_dim and the dtype of a paged decode definition."""
    inputs = set(d["inputs"])
    shared = any(get_op(n).flashinfer_bench == d.get("op_type") for n in NAMES)
    if not shared or not DECODE_INPUTS <= inputs or inputs - DECODE_INPUTS - OPTIONAL_INPUTS:
        raise _bad(
            path,
            f"definition {d.get('name')} (op_type {d.get('op_type')}): kernalin-ci shares only paged decode "
            f"attention (op_type gqa_paged with inputs {', '.join(sorted(DECODE_INPUTS))})",
        )

    def const(axis: str) -> int:
        a = d["axes"].get(axis)
        if not isinstance(a, dict) or a.get("type") != "const" or not isinstance(a.get("value"), int) or a["value"] < 1:
            raise _bad(path, f"definition {d.get('name')}: axis {axis} must be a positive constant")
        return int(a["value"])

    params = {
        "block_size": const("page_size"),
        "num_q_heads": const("num_qo_heads"),
        "num_kv_heads": const("num_kv_heads"),
        "head_dim": const("head_dim"),
    }
    if params["num_q_heads"] % params["num_kv_heads"]:
        raise _bad(path, f"definition {d.get('name')}: num_qo_heads is not a multiple of num_kv_heads")
    dtype = (d["inputs"]["q"] or {}).get("dtype")
    if dtype not in DTYPES:
        raise _bad(path, f"definition {d.get('name')}: q dtype {dtype} (kernalin-ci checks {', '.join(DTYPES)})")
    return params, dtype


def case_of(path: Path, root: Path, n: int, w: dict, d: dict, params: dict, dtype: str, seed: int) -> Case:
    """One workload as a case of attention.decode_paged."""
    where = f"line {n}"
    inputs = w.get("inputs")
    axes = w.get("axes")
    if not isinstance(inputs, dict) or not isinstance(axes, dict):
        raise _bad(path, f"{where}: a workload needs 'axes' and 'inputs'")
    indptr = tensor(path, root, where, inputs, "kv_indptr")
    if len(indptr) < 2 or any(b < a for a, b in zip(indptr, indptr[1:])):
        raise _bad(path, f"{where}: kv_indptr must be at least 2 long and non-decreasing")
    pages = [b - a for a, b in zip(indptr, indptr[1:])]
    ps = params["block_size"]
    if "kv_last_page_len" in inputs:
        last = tensor(path, root, where, inputs, "kv_last_page_len")
        if len(last) != len(pages) or any(not 1 <= x <= ps for x in last):
            raise _bad(path, f"{where}: kv_last_page_len must hold one value in 1..{ps} per sequence")
        lens = [(p - 1) * ps + x for p, x in zip(pages, last)]
    else:
        lens = [p * ps for p in pages]
    if any(n_ < 1 for n_ in lens):
        raise _bad(path, f"{where}: a sequence with no key (kv_indptr repeats a value)")
    if "batch_size" in axes and axes["batch_size"] != len(lens):
        raise _bad(path, f"{where}: axis batch_size {axes['batch_size']}, kv_indptr holds {len(lens)} sequences")
    scale_in = inputs.get("sm_scale")
    D = params["head_dim"]
    if isinstance(scale_in, dict) and scale_in.get("type") == "scalar":
        scale = scale_in.get("value")
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
            raise _bad(path, f"{where}: sm_scale must be a positive number")
    else:  # not given: the definition's default, 1/sqrt(head_dim)
        scale = D**-0.5
    dims = {"Hq": params["num_q_heads"], "Hkv": params["num_kv_heads"], "D": D, "kv_lens": lens, "scale": float(scale)}
    uuid = str(w.get("uuid") or n)
    return Case(f"workload-{seed}-{uuid[:8]}", dims, dtype, seed, ("workload",))


def tensor(path: Path, root: Path, where: str, inputs: dict, name: str) -> list[int]:
    """An integer input of a workload, read from its safetensors file (its path is relative to the dataset)."""
    spec = inputs.get(name)
    if not isinstance(spec, dict) or spec.get("type") != "safetensors":
        raise _bad(path, f"{where}: input {name} must be a safetensors tensor (it describes the batch)")
    file = root / str(spec.get("path", ""))
    key = str(spec.get("tensor_key") or name)
    if not file.is_file():
        raise _bad(path, f"{where}: input {name}: no such file {file}")
    return read_ints(file, key, path)


def read_ints(file: Path, key: str, path: Path) -> list[int]:
    """One integer tensor of a safetensors file, flattened (the format: an 8-byte little-endian header length,
    a JSON header naming each tensor's dtype, shape and byte range, then the data)."""
    raw = file.read_bytes()
    try:
        (n,) = struct.unpack_from("<Q", raw, 0)
        header = json.loads(raw[8 : 8 + n])
        meta = header[key]
        fmt, size = _INTS[meta["dtype"]]
        begin, end = meta["data_offsets"]
        data = raw[8 + n + begin : 8 + n + end]
        count = math.prod(meta["shape"])
        if len(data) != count * size:
            raise ValueError("its byte range does not match its shape")
        return list(struct.unpack(f"<{count}{fmt}", data))
    except KeyError as e:
        raise _bad(path, f"{file}: no integer tensor {key} ({e})") from None
    except (struct.error, ValueError, TypeError) as e:
        raise _bad(path, f"{file}: not a safetensors file ({e})") from None


def for_op(wl: Workloads, op: str, params: dict[str, Any], dtype: str | None = None) -> tuple[dict, list[Case]]:
    """The op params with the definition's (a value the user gave that differs is a usage error) and the cases
    (in DTYPE when given, else the definition's dtype)."""
    if get_op(op).flashinfer_bench != wl.op_type:
        raise UsageError(
            f"workload: definition {wl.definition} (op_type {wl.op_type}) is not a definition of op {op}",
            setting="workload",
        )
    merged = dict(params)
    for key, value in wl.params.items():
        if key in merged and str(merged[key]) != str(value):
            raise UsageError(
                f"workload: param {key}={merged[key]}, but definition {wl.definition} has {value}", setting="workload"
            )
        merged[key] = value
    cases = [Case(c.name, c.dims, dtype or c.dtype, c.seed, c.tags) for c in wl.cases]
    return merged, cases


# FlashInfer-Bench's evaluation statuses that a verdict of kernalin-ci maps to (docs/cli.md)
PASSED, INCORRECT_NUMERICAL, INCORRECT_SHAPE = "PASSED", "INCORRECT_NUMERICAL", "INCORRECT_SHAPE"
RUNTIME_ERROR, TIMEOUT = "RUNTIME_ERROR", "TIMEOUT"
RUNTIME_CLASSES = ("entry-error", "crashed", "cuda-error", "bad-result")  # the call did not hand back an output
SHAPE_CHECK = "output-shape"  # the output is not a tensor of the reference's shape
NOT_CHECKED = "not checked at its own shape"
NOT_TIMED = "passed, not timed (a PASSED evaluation needs a latency: --timings)"
NO_ERRORS = "a finding without a measured error"


def status(v: CaseVerdict) -> str:
    """The evaluation status of a case that ran at its own shape: its worst finding, PASSED without one."""
    if "timeout" in v.bug_classes:
        return TIMEOUT
    if any(c in RUNTIME_CLASSES for c in v.bug_classes):
        return RUNTIME_ERROR
    if SHAPE_CHECK in v.checks:
        return INCORRECT_SHAPE
    if not v.bug_classes:
        return PASSED
    return INCORRECT_NUMERICAL


def trace(
    wl: Workloads,
    verdicts: list[CaseVerdict],
    solution: str,
    environment: dict,
    timestamp: str,
    latencies: dict[str, float],
    kernel_wide: tuple[str, ...] = (),
) -> tuple[list[dict], dict[str, list[str]]]:
    """One FlashInfer-Bench trace per workload whose case has a true evaluation, and the cases left out by
    reason. LATENCIES: milliseconds per launch by case name, where a benchmark timed it on a GPU. Correctness
    holds the judge's measured errors (PASSED and INCORRECT_NUMERICAL, as the schema requires); performance
    only the latency (PASSED); the reference's latency and the speedup against it are not measured, so absent.
    KERNEL_WIDE: the kernel's findings that belong to no workload (structural, Compute Sanitizer), for each log."""
    by_case = {v.case: v for v in verdicts}
    lines: list[dict] = []
    left: dict[str, list[str]] = {}
    for case, work in zip(wl.cases, wl.workloads):
        v = by_case.get(case.name)  # None: the case never finished (the run stopped before it)
        st = status(v) if v is not None and v.ran else None  # None: not checked at its own shape
        why = NOT_CHECKED if v is None or st is None else None
        if v is not None and st in (PASSED, INCORRECT_NUMERICAL) and v.errors is None:
            why = NO_ERRORS  # the schema holds these two statuses to their errors
        elif st == PASSED and case.name not in latencies:
            why = NOT_TIMED
        if v is None or why is not None:
            left.setdefault(why or NOT_CHECKED, []).append(case.name)
            continue
        evaluation: dict = {
            "status": st,
            "environment": environment,
            "timestamp": timestamp,
            "log": "\n".join([*(f"{c}: {m}" for c, m in zip(v.bug_classes, v.messages)), *kernel_wide]),
        }
        if st in (PASSED, INCORRECT_NUMERICAL) and v.errors is not None:  # always, as checked above
            evaluation["correctness"] = {
                "max_absolute_error": _number(v.errors.max_abs),
                "max_relative_error": _number(v.errors.max_rel),
            }
        if st == PASSED:
            evaluation["performance"] = {"latency_ms": latencies[case.name]}
        lines.append({"definition": wl.definition, "workload": work, "solution": solution, "evaluation": evaluation})
    return lines, left


def _number(x: float) -> float | str:
    """A float as FlashInfer-Bench writes it: NaN and infinities as the strings "NaN", "Infinity", "-Infinity"."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x
