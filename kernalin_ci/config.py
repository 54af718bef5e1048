""".kernalin.yml -> typed Config. Every error names the file, the line and the key.

The schema is in docs/config.md; `kernalin-ci init` writes a commented starter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kernalin_ci.errors import UsageError
from kernalin_ci.ops import NAMES as OP_NAMES
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import DTYPES, resolve_params
from kernalin_ci.throughput.spec import ModelSpec

FAIL_ON = ("finding", "slower", "inconclusive", "not-analysed")
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


class _Where:
    """file:line: key -- for error messages."""

    def __init__(self, path: str):
        self.path = path

    def err(self, node, key: str, msg: str) -> UsageError:
        line = node.start_mark.line + 1 if node is not None else 1
        return UsageError(f"{self.path}:{line}: {key}: {msg}")


def _py(node):
    return yaml.safe_load(yaml.serialize(node)) if node is not None else None


def _mapping(w: _Where, node, key: str) -> dict:
    if not isinstance(node, yaml.MappingNode):
        raise w.err(node, key, "expected a mapping")
    out = {}
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode):
            raise w.err(k, key, "keys must be plain strings")
        if k.value in out:
            raise w.err(k, f"{key}.{k.value}" if key else k.value, "duplicate key")
        out[k.value] = (k, v)
    return out


def _known(w: _Where, m: dict, key: str, allowed: tuple[str, ...]) -> None:
    for name, (knode, _) in m.items():
        if name not in allowed:
            raise w.err(knode, f"{key}.{name}" if key else name, f"unknown key (allowed: {', '.join(allowed)})")


def _scalar(w: _Where, m: dict, key: str, name: str, kind, default=None, required=False):
    if name not in m:
        if required:
            anchor = next(iter(m.values()))[0] if m else None
            raise w.err(anchor, f"{key}.{name}", "required")
        return default
    knode, v = m[name]
    val = _py(v)
    if kind is float and isinstance(val, int) and not isinstance(val, bool):
        val = float(val)
    if not isinstance(val, kind) or (kind is not bool and isinstance(val, bool)):
        raise w.err(v, f"{key}.{name}", f"expected {getattr(kind, '__name__', kind)}, got {val!r}")
    return val


def load(path: str | Path) -> Config:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: configuration file not found (run `kernalin-ci init` to write one)")
    return parse(p.read_text(), str(p))


def parse(text: str, path: str = DEFAULT_FILE) -> Config:
    w = _Where(path)
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise UsageError(f"{path}:{line}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    if root is None:
        raise UsageError(f"{path}:1: empty configuration (expected a 'kernels' list)")
    top = _mapping(w, root, "")
    # `daemon:` belongs to `kernalin-ci serve` (kernalin_ci/daemon/workspace.py reads it); the gate ignores it
    _known(w, top, "", ("version", "kernels", "gate", "pipelines", "model", "daemon"))
    if "version" in top and _py(top["version"][1]) != 1:
        raise w.err(top["version"][1], "version", "only version 1 is known")
    if "kernels" not in top:
        raise w.err(root, "kernels", "required (a list of kernels)")
    knode = top["kernels"][1]
    if not isinstance(knode, yaml.SequenceNode) or not knode.value:
        raise w.err(knode, "kernels", "expected a non-empty list")
    kernels: list[Kernel] = []
    for i, item in enumerate(knode.value):
        kernels.append(_kernel(w, item, f"kernels[{i}]", {k.name for k in kernels}))
    cfg = Config(path, kernels)
    if "gate" in top:
        cfg.gate = _gate(w, top["gate"][1])
    if "pipelines" in top:
        pnode = top["pipelines"][1]
        if not isinstance(pnode, yaml.SequenceNode):
            raise w.err(pnode, "pipelines", "expected a list")
        for i, item in enumerate(pnode.value):
            cfg.pipelines.append(_pipeline(w, item, f"pipelines[{i}]", cfg))
    if "model" in top:
        cfg.model = _model(w, top["model"][1], cfg)
    return cfg


def _model(w: _Where, node, cfg: Config) -> ModelSpec:
    """`model:` (docs/tokens.md), its `kernels` resolved to the configuration's kernels (place_kernels)."""
    from kernalin_ci.throughput.spec import parse_node

    spec = parse_node(node, w.path)
    return place_kernels(spec, cfg, lambda key, msg: w.err(node, key, msg))


def place_kernels(spec: ModelSpec, cfg: Config, err=None) -> ModelSpec:
    """Resolve `spec.kernels` (place -> kernel name) against the configuration's kernels, one per place: the one
    named, else the only kernel of the place's op (attention: decode_paged before decode), else none (torch).
    `err(key, message)` makes the UsageError (default: one naming --model, whose spec names no kernel)."""
    from kernalin_ci.throughput.spec import ROLE_OPS

    if err is None:

        def err(key: str, msg: str) -> UsageError:
            return UsageError(f"--model: {key}: {msg} (name it in .kernalin.yml's model.kernels)")

    named = dict(spec.kernels)
    resolved: dict[str, str] = {}
    for role, ops in ROLE_OPS.items():
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


def _kernel(w: _Where, node, key: str, taken: set) -> Kernel:
    m = _mapping(w, node, key)
    _known(w, m, key, ("name", "op", "entry", "params", "domain", "sources", "dtype", "bench", "timeout", "tune"))
    name = _scalar(w, m, key, "name", str, required=True)
    if name in taken:
        raise w.err(m["name"][1], f"{key}.name", f"duplicate kernel name {name!r}")
    op = _scalar(w, m, key, "op", str, required=True)
    if op not in OP_NAMES:
        raise w.err(m["op"][1], f"{key}.op", f"unknown op {op!r} (ops: {', '.join(OP_NAMES)})")
    entry = _scalar(w, m, key, "entry", str, required=True)
    if ":" not in entry or not entry.rpartition(":")[2].isidentifier():
        raise w.err(m["entry"][1], f"{key}.entry", "expected 'path/to/file.py:function' or 'module:function'")
    params = _scalar(w, m, key, "params", dict, default={}) or {}
    try:
        resolve_params(op, get_op(op).params, params)
    except UsageError as e:
        raise w.err(m["params"][1] if "params" in m else node, f"{key}.params", str(e)) from None
    domain = _domain(w, m, key, op, params)
    sources = _scalar(w, m, key, "sources", list, default=[]) or []
    if not all(isinstance(s, str) for s in sources):
        raise w.err(m["sources"][1], f"{key}.sources", "expected a list of glob strings")
    dtype = _scalar(w, m, key, "dtype", str)
    if dtype is not None and dtype not in DTYPES:
        raise w.err(m["dtype"][1], f"{key}.dtype", f"must be one of {', '.join(DTYPES)}")
    if dtype is not None and domain.get("dtype") and dtype not in _as_list(domain["dtype"]):
        raise w.err(m["dtype"][1], f"{key}.dtype", f"{dtype} is outside the declared domain.dtype")
    bench = _scalar(w, m, key, "bench", dict, default={}) or {}
    if "regime" in bench:
        from kernalin_ci.bench.regime import REGIMES

        if bench["regime"] not in REGIMES:
            raise w.err(
                m["bench"][1], f"{key}.bench.regime", f"must be one of {', '.join(REGIMES)}, got {bench['regime']!r}"
            )
    timeout = _scalar(w, m, key, "timeout", float)
    if timeout is not None and timeout <= 0:
        raise w.err(m["timeout"][1], f"{key}.timeout", "must be positive")
    where = f"{key}.entry ({w.path}:{m['entry'][1].start_mark.line + 1})"
    return Kernel(name, op, entry, params, domain, sources, dtype, bench, timeout, _tune(w, m, key), where)


def _tune(w: _Where, m: dict, key: str) -> dict:
    """kernels[i].tune: {params: {NAME: [values]}, autotune: KERNEL | false} (docs/tune.md)."""
    if "tune" not in m:
        return {}
    items = _mapping(w, m["tune"][1], f"{key}.tune")
    _known(w, items, f"{key}.tune", ("params", "autotune"))
    out: dict = {}
    if "params" in items:
        pm = _mapping(w, items["params"][1], f"{key}.tune.params")
        out["params"] = {}
        for name, (knode, vnode) in pm.items():
            vals = _py(vnode)
            if not name.isidentifier():
                raise w.err(knode, f"{key}.tune.params.{name}", "expected an entry keyword name")
            if not isinstance(vals, list) or not vals:
                raise w.err(vnode, f"{key}.tune.params.{name}", "expected a non-empty list of candidate values")
            out["params"][name] = vals
    if "autotune" in items:
        v = _py(items["autotune"][1])
        if not (isinstance(v, str) or v is False):
            raise w.err(items["autotune"][1], f"{key}.tune.autotune", "expected a kernel name or false")
        out["autotune"] = v
    return out


def _as_list(v) -> list:
    return v if isinstance(v, list) else [v]


def _domain(w: _Where, m: dict, key: str, op: str, params: dict) -> dict:
    """kernels[i].domain: validated here, each error at the line of the offending key."""
    from kernalin_ci import domain as domain_mod

    if "domain" not in m:
        return {}
    node = m["domain"][1]
    items = _mapping(w, node, f"{key}.domain")
    raw = {k: _py(v) for k, (_, v) in items.items()}
    try:
        domain_mod.resolve(get_op(op), params, raw, where="")
    except UsageError as e:
        bad = next((k for k in items if str(e).startswith(f" {k}:")), None)
        at = items[bad][1] if bad else node
        raise w.err(
            at, f"{key}.domain" + (f".{bad}" if bad else ""), str(e).split(":", 1)[1].strip() if bad else str(e).strip()
        ) from None
    return raw


def deprecated(notice: UsageError) -> None:
    """An old key that still works: one line on stderr ('FILE:LINE: KEY: deprecated: ...')."""
    import sys

    print(f"kernalin-ci: warning: {notice}", file=sys.stderr)


def _gate(w: _Where, node) -> Gate:
    m = _mapping(w, node, "gate")
    _known(w, m, "gate", ("fail_on", "margin", "budget_s", "bench", "trust_head_config", "rope"))
    if "rope" in m:  # the old name of gate.margin
        if "margin" in m:
            raise w.err(m["rope"][0], "gate.rope", "the old name of gate.margin: keep one of the two")
        deprecated(w.err(m["rope"][0], "gate.rope", "deprecated: rename it gate.margin (the equivalence margin)"))
        m["margin"] = m.pop("rope")
    g = Gate()
    if "fail_on" in m:
        v = _py(m["fail_on"][1])
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or any(x not in FAIL_ON for x in v):
            raise w.err(m["fail_on"][1], "gate.fail_on", f"expected a list of {', '.join(FAIL_ON)}")
        g.fail_on = tuple(v)
    g.rope = _scalar(w, m, "gate", "margin", float, default=g.rope)
    if not 0 <= g.rope < 0.5:
        raise w.err(m["margin"][1], "gate.margin", "a fraction in [0, 0.5), e.g. 0.005 for +-0.5%")
    g.budget_s = _scalar(w, m, "gate", "budget_s", float, default=g.budget_s)
    if g.budget_s <= 0:
        raise w.err(m["budget_s"][1], "gate.budget_s", "must be positive")
    g.bench = _scalar(w, m, "gate", "bench", bool, default=g.bench)
    if "trust_head_config" in m:
        v = _py(m["trust_head_config"][1])
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise w.err(m["trust_head_config"][1], "gate.trust_head_config", "expected a list of branch names or globs")
        g.trust_head_config = tuple(v)
    return g


def _pipeline(w: _Where, node, key: str, cfg: Config) -> Pipeline:
    m = _mapping(w, node, key)
    _known(w, m, key, ("name", "kv_append", "attention", "rope", "steps"))
    name = _scalar(w, m, key, "name", str, required=True)
    roles = {"kv_append": "kv_append", "attention": "attention.decode_paged", "rope": "rope"}
    refs = {}
    for role, op in roles.items():
        ref = _scalar(w, m, key, role, str, required=role != "rope")
        if ref is None:
            continue
        k = cfg.kernel(ref)
        if k is None:
            raise w.err(m[role][1], f"{key}.{role}", f"no kernel named {ref!r}")
        if k.op != op:
            raise w.err(m[role][1], f"{key}.{role}", f"kernel {ref!r} is {k.op}, expected {op}")
        refs[role] = ref
    steps = _scalar(w, m, key, "steps", int, default=64)
    if steps < 1:
        raise w.err(m["steps"][1], f"{key}.steps", "must be >= 1")
    return Pipeline(name, refs["kv_append"], refs["attention"], refs.get("rope"), steps)


STARTER = """\
# kernalin-ci configuration (docs/config.md). Every kernel listed here is verified
# and benchmarked when a pull request changes its entry file, its `sources`, or a
# repository module its entry imports. The kernel below is an example: edit its name, op
# and entry to name your own (`kernalin-ci run` says so while its entry file does not exist).
version: 1

kernels:
  - name: decode_attention            # unique name
    op: attention.decode              # the op: attention.decode | attention.decode_paged | rope |
                                      #   kv_append | decode_step | custom (docs/ops.md)
    entry: kernels/attention.py:entry # EDIT: file.py:function (relative to the repository root) or module:function
    params: {}                        # op params (see docs/ops.md), e.g. {block_size: 16} or {style: gptj}
    # domain: {head_dim: [64, 128], dtype: [float16, bfloat16]}  # the shapes your model uses (default: found)
    sources: ["kernels/common/*.py"]  # more files that count as this kernel (globs); optional
    # dtype: bfloat16                 # verify every case in one dtype (default: float32 + fp16/bf16 sweep)
    # bench: {batch: 64, kv_len: 8192}  # benchmark shape params (default: the op's decode shapes);
    #                                   # regime: warm | cold (docs/benchmarking.md)

gate:
  fail_on: [finding, slower]          # also: inconclusive, not-analysed
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
#   preset: llama-3.1-8b              # llama-3.1-8b | llama-3.1-70b | qwen2.5-7b | mistral-7b, or the shape keys
#   serving: [{batch: 1, context: 4096}, {batch: 64, context: 4096}]
#   gpu_price_per_hour: 3.50          # USD per GPU-hour (default: an on-demand H200)
"""
