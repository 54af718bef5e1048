""".kernalin.yml -> typed Config. Every error names the file, the line and the key.

The schema is in docs/config.md; `kernalin-ci init` writes a commented starter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kernalin_ci import yamlcheck
from kernalin_ci.bench.regime import REGIMES
from kernalin_ci.cuda import sources as cuda_spec
from kernalin_ci.cuda.sources import CudaSpec
from kernalin_ci.errors import UsageError
from kernalin_ci.ops import NAMES as OP_NAMES
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import DTYPES, resolve_params
from kernalin_ci.ops.roles import PIPELINE, ROLES, pipeline_op, role_ops
from kernalin_ci.throughput.spec import MODEL_SCHEMA, ModelSpec, parse_model

FAIL_ON = ("finding", "slower", "inconclusive", "not-analysed", "not-checked")
DEFAULT_FILE = ".kernalin.yml"


@dataclass
class Kernel:
    name: str
    op: str
    entry: str
    params: dict = field(default_factory=dict)
    domain: dict = field(default_factory=dict)  # the shapes the model uses (kernalin_ci.domain; docs/config.md)
    sources: list[str] = field(default_factory=list)
    dtype: str | None = None  # verify every case in this dtype (default: float32 + a half-precision sweep)
    bench: dict = field(default_factory=dict)  # benchmark shapes/params for the harness
    timeout: float | None = None
    tune: dict = field(default_factory=dict)  # `kernalin-ci tune`'s search space (docs/tune.md)
    where: str = ""  # where the entry is set, for messages: "kernels[0].entry (.kernalin.yml:9)"
    cuda: CudaSpec | None = None  # a CUDA C++ kernel's sources and build flags (docs/cuda.md)

    @property
    def entry_file(self) -> str | None:
        target = self.entry.rpartition(":")[0]
        return target if target.endswith(".py") else None


@dataclass
class Pipeline:
    name: str
    kv_append: str  # kernel names
    attention: str
    rope: str | None = None
    steps: int = 64


@dataclass
class Gate:
    fail_on: tuple[str, ...] = ("finding", "slower")
    rope: float = 0.005  # `gate.margin`: the smallest equivalence margin (the statistics' ROPE half-width)
    budget_s: float = 30.0  # benchmark budget per kernel pair
    bench: bool = True
    # head branches (globs) whose own .kernalin.yml decides their gate, read from the BASE configuration only;
    # never a fork's branch (kernalin_ci/gate/config_source.py)
    trust_head_config: tuple[str, ...] = ()


@dataclass
class Config:
    path: str
    kernels: list[Kernel]
    gate: Gate = field(default_factory=Gate)
    pipelines: list[Pipeline] = field(default_factory=list)
    model: ModelSpec | None = None  # `model:`: decode tokens/s and $/Mtok (docs/tokens.md)

    def kernel(self, name: str) -> Kernel | None:
        return next((k for k in self.kernels if k.name == name), None)


_IDENT = "^[A-Za-z_][A-Za-z0-9_]*$"
# `.kernalin.yml` as a schema (docs/config.md); what it cannot say is checked in `parse` below
KERNEL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "op": {"enum": list(OP_NAMES), "x-message": "unknown op {value!r} (ops: " + ", ".join(OP_NAMES) + ")"},
        "entry": {
            "type": "string",
            "pattern": "^.+:[A-Za-z_][A-Za-z0-9_]*$",
            "x-message": "expected 'path/to/file.py:function' or 'module:function'",
        },
        "params": {"type": "object"},
        "domain": {"type": "object"},
        "sources": {
            "type": "array",
            "items": {"type": "string", "x-message": "expected a list of glob strings"},
            "x-message": "expected a list of glob strings",
        },
        "dtype": {"enum": list(DTYPES), "x-message": "must be one of " + ", ".join(DTYPES)},
        "bench": {"type": "object", "properties": {"regime": {"enum": list(REGIMES)}}},
        "timeout": {"type": "number", "exclusiveMinimum": 0, "x-message": "must be positive"},
        "tune": {
            "type": "object",
            "properties": {
                "params": {
                    "type": "object",
                    "propertyNames": {"pattern": _IDENT, "x-message": "{value!r}: expected an entry keyword name"},
                    "additionalProperties": {
                        "type": "array",
                        "minItems": 1,
                        "x-message": "expected a non-empty list of candidate values",
                    },
                },
                "autotune": {
                    "type": ["string", "boolean"],
                    "not": {"const": True},
                    "x-message": "expected a kernel name or false",
                },
            },
            "additionalProperties": False,
        },
        "cuda": {  # a CUDA C++ kernel (docs/cuda.md); cuda_spec.parse checks the paths
            "type": "object",
            "properties": {
                "sources": {
                    "type": ["array", "string"],
                    "minItems": 1,
                    "items": {"type": "string"},
                    "x-message": "expected a non-empty list of .cu files or globs",
                },
                "flags": {
                    "type": ["array", "string"],
                    "items": {"type": "string"},
                    "x-message": "expected a list of compiler flags",
                },
            },
            "required": ["sources"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "op", "entry"],
    "additionalProperties": False,
}
_MARGIN = {
    "type": "number",
    "minimum": 0,
    "exclusiveMaximum": 0.5,
    "x-message": "a fraction in [0, 0.5), e.g. 0.005 for +-0.5%",
}
GATE_SCHEMA = {
    "type": "object",
    "properties": {
        "fail_on": {
            "type": ["array", "string"],
            "items": {"enum": list(FAIL_ON), "x-message": "expected a list of " + ", ".join(FAIL_ON)},
            "if": {"type": "string"},
            "then": {"enum": list(FAIL_ON), "x-message": "expected a list of " + ", ".join(FAIL_ON)},
            "x-message": "expected a list of " + ", ".join(FAIL_ON),
        },
        "margin": _MARGIN,
        "budget_s": {"type": "number", "exclusiveMinimum": 0, "x-message": "must be positive"},
        "bench": {"type": "boolean"},
        "trust_head_config": {
            "type": ["array", "string"],
            "items": {"type": "string", "minLength": 1, "x-message": "expected a list of branch names or globs"},
            "minLength": 1,
            "x-message": "expected a list of branch names or globs",
        },
        "rope": _MARGIN,  # the old name of margin (a warning)
    },
    "additionalProperties": False,
}
PIPELINE_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "kv_append": {"type": "string"},
        "attention": {"type": "string"},
        "rope": {"type": "string"},
        "steps": {"type": "integer", "minimum": 1, "x-message": "must be >= 1"},
    },
    "required": ["name", "kv_append", "attention"],
    "additionalProperties": False,
}
SCHEMA = {
    "type": "object",
    "x-message": "expected a mapping with a 'kernels' list",
    "properties": {
        "version": {"const": 1, "x-message": "only version 1 is known"},
        "kernels": {"type": "array", "minItems": 1, "items": KERNEL_SCHEMA, "x-message": "expected a non-empty list"},
        "gate": GATE_SCHEMA,
        "pipelines": {"type": "array", "items": PIPELINE_SCHEMA, "x-message": "expected a list"},
        "model": MODEL_SCHEMA,
        "daemon": {},  # `kernalin-ci serve`'s (kernalin_ci/daemon/workspace.py reads it); the gate ignores it
    },
    "required": ["kernels"],
    "x-required": "a list of kernels",
    "additionalProperties": False,
}


def load(path: str | Path) -> Config:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: configuration file not found (run `kernalin-ci init` to write one)")
    return parse(p.read_text(), str(p))


def parse(text: str, path: str = DEFAULT_FILE) -> Config:
    doc = yamlcheck.parse(text, path, empty="empty configuration (expected a 'kernels' list)")
    if isinstance(doc.data, dict) and isinstance(doc.data.get("gate"), dict) and "rope" in doc.data["gate"]:
        if "margin" in doc.data["gate"]:
            raise doc.error(("gate", "rope"), "the old name of gate.margin: keep one of the two", key=True)
        deprecated(doc.error(("gate", "rope"), "deprecated: rename it gate.margin (the equivalence margin)", key=True))
    yamlcheck.check(doc, SCHEMA)
    d = doc.data
    kernels: list[Kernel] = []
    for i, item in enumerate(d["kernels"]):
        kernels.append(_kernel(doc, i, item, {k.name for k in kernels}))
    cfg = Config(path, kernels)
    if d.get("gate") is not None:
        cfg.gate = _gate(d["gate"])
    for i, item in enumerate(d.get("pipelines") or []):
        cfg.pipelines.append(_pipeline(doc, i, item, cfg))
    if "model" in d:
        spec = parse_model(doc, ("model",))
        cfg.model = place_kernels(spec, cfg, lambda key, msg: doc.error(("model", *key.split(".")[1:]), msg))
    return cfg


def deprecated(notice: UsageError) -> None:
    """An old key that still works: one line on stderr ('FILE:LINE: KEY: deprecated: ...')."""
    import sys

    print(f"kernalin-ci: warning: {notice}", file=sys.stderr)


def place_kernels(spec: ModelSpec, cfg: Config, err=None) -> ModelSpec:
    """Resolve `spec.kernels` (place -> kernel name) against the configuration's kernels, one per place: the one
    named, else the only kernel of the place's op (attention: decode_paged before decode), else none (torch).
    `err(key, message)` makes the UsageError (default: one naming --model, whose spec names no kernel)."""

    if err is None:

        def err(key: str, msg: str) -> UsageError:
            return UsageError(f"--model: {key}: {msg} (name it in .kernalin.yml's model.kernels)")

    named = dict(spec.kernels)
    resolved: dict[str, str] = {}
    for role in ROLES:
        ops = role_ops(role)
        if role in named:
            k = cfg.kernel(named[role])
            if k is None:
                raise err(f"model.kernels.{role}", f"no kernel named {named[role]!r}")
            if k.op not in ops:
                raise err(f"model.kernels.{role}", f"kernel {k.name!r} is {k.op}, expected {' or '.join(ops)}")
            resolved[role] = k.name
            continue
        for op in ops:
            found = [k.name for k in cfg.kernels if k.op == op]
            if len(found) > 1:
                raise err(f"model.kernels.{role}", f"several {op} kernels ({', '.join(found)}): name one")
            if found:
                resolved[role] = found[0]
                break
    spec.kernels = resolved
    return spec


def _kernel(doc: yamlcheck.Document, i: int, m: dict, taken: set) -> Kernel:
    at = ("kernels", i)
    if m["name"] in taken:
        raise doc.error((*at, "name"), f"duplicate kernel name {m['name']!r}")
    op = m["op"]
    params = m.get("params") or {}
    try:
        resolve_params(op, get_op(op).params, params)
    except UsageError as e:
        raise doc.error((*at, "params") if "params" in m else at, str(e)) from None
    domain = _domain(doc, at, m, op, params)
    dtype = m.get("dtype")
    if dtype is not None and domain.get("dtype") and dtype not in _as_list(domain["dtype"]):
        raise doc.error((*at, "dtype"), f"{dtype} is outside the declared domain.dtype")
    tune = dict(m.get("tune") or {})
    where = f"kernels[{i}].entry ({doc.path}:{doc.line((*at, 'entry'))})"
    timeout = float(m["timeout"]) if m.get("timeout") is not None else None
    cuda = None
    if "cuda" in m:
        try:
            cuda = cuda_spec.parse(m["cuda"], f"kernels[{i}].cuda")
        except UsageError as e:
            where_, _, msg = str(e).partition(": ")
            raise doc.error((*at, "cuda", where_.rpartition(".")[2]), msg) from None
    return Kernel(
        m["name"], op, m["entry"], params, domain, list(m.get("sources") or []), dtype,
        dict(m.get("bench") or {}), timeout, tune, where, cuda,
    )  # fmt: skip


def _as_list(v) -> list:
    return v if isinstance(v, list) else [v]


def _domain(doc: yamlcheck.Document, at: tuple, m: dict, op: str, params: dict) -> dict:
    """kernels[i].domain: validated here, each error at the line of the offending key."""
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci import domain as domain_mod

    raw = m.get("domain") or {}
    if not raw:
        return {}
    try:
        domain_mod.resolve(get_op(op), params, raw, where="")
    except UsageError as e:
        bad = next((k for k in raw if str(e).startswith(f" {k}:")), None)
        if bad:
            raise doc.error((*at, "domain", bad), str(e).split(":", 1)[1].strip()) from None
        raise doc.error((*at, "domain"), str(e).strip()) from None
    return raw


def _gate(m: dict) -> Gate:
    g = Gate()
    if "fail_on" in m:
        g.fail_on = tuple(_as_list(m["fail_on"]))
    g.rope = float(m.get("margin", m.get("rope", g.rope)))
    g.budget_s = float(m.get("budget_s", g.budget_s))
    g.bench = m.get("bench", g.bench)
    if "trust_head_config" in m:
        g.trust_head_config = tuple(_as_list(m["trust_head_config"]))
    return g


def _pipeline(doc: yamlcheck.Document, i: int, m: dict, cfg: Config) -> Pipeline:
    at = ("pipelines", i)

    for role in PIPELINE:
        op = pipeline_op(role)
        ref = m.get(role)
        if ref is None:
            continue
        k = cfg.kernel(ref)
        if k is None:
            raise doc.error((*at, role), f"no kernel named {ref!r}")
        if k.op != op:
            raise doc.error((*at, role), f"kernel {ref!r} is {k.op}, expected {op}")
    return Pipeline(m["name"], m["kv_append"], m["attention"], m.get("rope"), int(m.get("steps", 64)))


STARTER = """\
# kernalin-ci configuration (docs/config.md). Every kernel listed here is verified
# and benchmarked when a pull request changes its entry file, its `sources`, or a
# repository module its entry imports. The kernel below is an example: edit its name, op
# and entry to name your own (`kernalin-ci run` says so while its entry file does not exist).
version: 1

kernels:
  - name: decode_attention            # unique name
    op: attention.decode              # the op: attention.decode | attention.decode_paged |
                                      #   attention.decode_multi | attention.decode_mla | rope |
                                      #   kv_append | decode_step | custom (docs/ops.md)
    entry: kernels/attention.py:entry # EDIT: file.py:function (relative to the repository root) or module:function
    params: {}                        # op params (see docs/ops.md), e.g. {block_size: 16} or {style: gptj}
    # domain: {head_dim: [64, 128], dtype: [float16, bfloat16]}  # the shapes your model uses (default: found)
    sources: ["kernels/common/*.py"]  # more files that count as this kernel (globs); optional
    # cuda: {sources: [csrc/attention.cu], flags: [-O3, -Icsrc/include]}  # a CUDA C++ kernel (docs/cuda.md)
    # dtype: bfloat16                 # verify every case in one dtype (default: float32 + fp16/bf16 sweep)
    # bench: {batch: 64, kv_len: 8192}  # benchmark shape params (default: the op's decode shapes);
    #                                   # regime: warm | cold (docs/benchmarking.md)

gate:
  fail_on: [finding, slower]          # also: inconclusive, not-analysed, not-checked
  margin: 0.005                       # equivalence margin: head/base within +-0.5% counts as equivalent
  budget_s: 30                        # benchmark time per kernel pair (seconds of GPU time)
  bench: true                         # false: verify only

# pipelines:                          # run kv_append + paged attention (+ rope) as a decode loop
#   - name: decode_loop
#     kv_append: kv_append_kernel
#     attention: paged_attention_kernel
#     rope: rope_kernel
#     steps: 64

# model:                              # decode tokens/s and $/Mtok of your model, on a GPU (docs/tokens.md)
#   preset: llama-3.1-8b              # a preset (docs/tokens.md: llama-3.1-8b, gemma-2-2b, ...) or the shape keys
#   serving: [{batch: 1, context: 4096}, {batch: 64, context: 4096}]
#   gpu_price_per_hour: 3.50          # USD per GPU-hour (default: an on-demand H200)
"""
