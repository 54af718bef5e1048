"""The model a decode step is built for: its shapes, the serving points, the GPU price (docs/tokens.md).

Read from `.kernalin.yml` (`model:`) or from `--model PRESET|path.yml` (the same keys; `kernels` only in
`.kernalin.yml`). Every error is one line naming the file, the line and the key (exit 2).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kernalin_ci.errors import UsageError

# Shapes of public model families, from each model's published config.json on the Hugging Face Hub
# (the repository named in `source`): num_hidden_layers, hidden_size, num_attention_heads,
# num_key_value_heads, head_dim (hidden_size / num_attention_heads where the config has none),
# intermediate_size, vocab_size, torch_dtype. docs/tokens.md lists them.
PRESETS: dict[str, dict] = {
    "llama-3.1-8b": {
        "layers": 32,
        "hidden_size": 4096,
        "num_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "dtype": "bfloat16",
        "source": "meta-llama/Llama-3.1-8B config.json",
    },
    "llama-3.1-70b": {
        "layers": 80,
        "hidden_size": 8192,
        "num_heads": 64,
        "num_kv_heads": 8,
        "head_dim": 128,
        "intermediate_size": 28672,
        "vocab_size": 128256,
        "dtype": "bfloat16",
        "source": "meta-llama/Llama-3.1-70B config.json",
    },
    "qwen2.5-7b": {
        "layers": 28,
        "hidden_size": 3584,
        "num_heads": 28,
        "num_kv_heads": 4,
        "head_dim": 128,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "dtype": "bfloat16",
        "source": "Qwen/Qwen2.5-7B config.json",
    },
    "mistral-7b": {
        "layers": 32,
        "hidden_size": 4096,
        "num_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "vocab_size": 32768,
        "dtype": "bfloat16",
        "source": "mistralai/Mistral-7B-v0.3 config.json",
    },
}
SHAPE_KEYS = ("layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size")
MODEL_DTYPES = ("bfloat16", "float16", "float32")
# The gated kernels' places in the step. `decode_step` is the fused place: one entry that rotates, appends
# and attends, in place of the rope, kv_append and attention places (docs/tokens.md).
SEPARATE = ("attention", "rope", "kv_append")
FUSED = "decode_step"
ROLES = (*SEPARATE, FUSED)
ROLE_OPS = {
    "attention": ("attention.decode_paged", "attention.decode"),
    "rope": ("rope",),
    "kv_append": ("kv_append",),
    FUSED: ("decode_step",),
}
KEYS = ("preset", *SHAPE_KEYS, "dtype", "serving", "gpu_price_per_hour", "kernels", "budget_s")

# The default price: an on-demand H200 (one GPU, per hour, USD) as published by a GPU cloud;
# override with model.gpu_price_per_hour. docs/tokens.md gives the source and the spread.
DEFAULT_PRICE_PER_HOUR = 3.50
DEFAULT_PRICE_SOURCE = "default: GPUaaS.com on-demand H200 list price, one GPU, 2026-05-26 (docs/tokens.md)"
DEFAULT_SERVING = ((1, 4096), (64, 4096))


@dataclass(frozen=True)
class ServingPoint:
    batch: int  # sequences decoded together: tokens per step
    context: int  # tokens already in every sequence's KV cache

    @property
    def label(self) -> str:
        return f"batch {self.batch}, context {self.context}"


@dataclass
class ModelSpec:
    name: str  # the preset, or "custom"
    layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    serving: list[ServingPoint] = field(default_factory=lambda: [ServingPoint(b, c) for b, c in DEFAULT_SERVING])
    price_per_hour: float = DEFAULT_PRICE_PER_HOUR
    price_source: str = DEFAULT_PRICE_SOURCE
    kernels: dict[str, str] = field(default_factory=dict)  # role -> kernel name (.kernalin.yml only)
    budget_s: float | None = None  # timing budget; default gate.budget_s / --budget-s
    source: str = ""  # where the shapes come from

    def shape(self) -> dict:
        return {k: getattr(self, k) for k in SHAPE_KEYS} | {"dtype": self.dtype}

    def to_json(self) -> dict:
        d = asdict(self)
        d["serving"] = [asdict(p) for p in self.serving]
        return d

    @classmethod
    def from_json(cls, d: dict) -> ModelSpec:
        d = dict(d)
        d["serving"] = [ServingPoint(**p) for p in d.get("serving", [])]
        return cls(**d)


def presets_text() -> str:
    return ", ".join(PRESETS)


class _Errors:
    """Where an error is: 'file:line: key: message' (a YAML node gives the line) or 'where: key: message'."""

    def __init__(self, path: str):
        self.path = path

    def err(self, node, key: str, msg: str) -> UsageError:
        line = node.start_mark.line + 1 if node is not None and hasattr(node, "start_mark") else 1
        return UsageError(f"{self.path}:{line}: {key}: {msg}")


def _int(e: _Errors, node, key: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise e.err(node, key, f"expected a positive integer, got {value!r}")
    return value


def _positive(e: _Errors, node, key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise e.err(node, key, f"expected a positive number, got {value!r}")
    return float(value)


def parse_node(node, path: str, key: str = "model", allow_kernels: bool = True) -> ModelSpec:
    """A YAML mapping node (the `model:` section, or a --model file) -> ModelSpec."""
    import yaml

    e = _Errors(path)
    if not isinstance(node, yaml.MappingNode):
        raise e.err(node, key, "expected a mapping (docs/tokens.md)")
    items: dict = {}
    for k, v in node.value:
        name = k.value if isinstance(k, yaml.ScalarNode) else None
        if name not in KEYS:
            raise e.err(k, f"{key}.{name}", f"unknown key (allowed: {', '.join(KEYS)})")
        if name in items:
            raise e.err(k, f"{key}.{name}", "duplicate key")
        items[name] = (v, yaml.safe_load(yaml.serialize(v)))
    if "kernels" in items and not allow_kernels:
        raise e.err(items["kernels"][0], f"{key}.kernels", "only in .kernalin.yml (the kernels are named there)")
    base: dict = {}
    name = "custom"
    if "preset" in items:
        pnode, preset = items["preset"]
        if not isinstance(preset, str) or preset.lower() not in PRESETS:
            raise e.err(pnode, f"{key}.preset", f"unknown preset {preset!r} (presets: {presets_text()})")
        name = preset.lower()
        base = dict(PRESETS[name])
    for k in (*SHAPE_KEYS, "dtype"):
        if k in items:
            base[k] = items[k][1]
    missing = [k for k in SHAPE_KEYS if k not in base]
    if missing:
        raise e.err(node, key, f"missing {', '.join(missing)} (or name a preset: {presets_text()})")
    where = {k: items[k][0] if k in items else node for k in (*SHAPE_KEYS, "dtype")}
    vals = {k: _int(e, where[k], f"{key}.{k}", base[k]) for k in SHAPE_KEYS}
    dtype = base.get("dtype", "bfloat16")
    if dtype not in MODEL_DTYPES:
        raise e.err(where["dtype"], f"{key}.dtype", f"must be one of {', '.join(MODEL_DTYPES)}, got {dtype!r}")
    if vals["num_heads"] % vals["num_kv_heads"]:
        raise e.err(
            where["num_kv_heads"],
            f"{key}.num_kv_heads",
            f"num_heads {vals['num_heads']} is not a multiple of num_kv_heads {vals['num_kv_heads']}",
        )
    if vals["head_dim"] % 2:
        raise e.err(where["head_dim"], f"{key}.head_dim", f"must be even (rotary pairs), got {vals['head_dim']}")
    spec = ModelSpec(name=name, dtype=dtype, source=base.get("source", "") if name != "custom" else path, **vals)
    if name != "custom" and any(k in items for k in SHAPE_KEYS):
        spec.name = f"{name} (modified)"
        spec.source = f"{PRESETS[name]['source']}, with {path}"
    if "serving" in items:
        spec.serving = _serving(e, items["serving"][0], items["serving"][1], f"{key}.serving")
    if "gpu_price_per_hour" in items:
        pnode, price = items["gpu_price_per_hour"]
        spec.price_per_hour = _positive(e, pnode, f"{key}.gpu_price_per_hour", price)
        spec.price_source = f"{path}: {key}.gpu_price_per_hour"
    if "budget_s" in items:
        spec.budget_s = _positive(e, items["budget_s"][0], f"{key}.budget_s", items["budget_s"][1])
    if "kernels" in items:
        knode, kernels = items["kernels"]
        if not isinstance(kernels, dict) or not all(isinstance(v, str) for v in kernels.values()):
            raise e.err(
                knode, f"{key}.kernels", f"expected a mapping of role to kernel name (roles: {', '.join(ROLES)})"
            )
        bad = [r for r in kernels if r not in ROLES]
        if bad:
            raise e.err(knode, f"{key}.kernels.{bad[0]}", f"unknown role (roles: {', '.join(ROLES)})")
        spec.kernels = dict(kernels)
    return spec


def _serving(e: _Errors, node, value, key: str) -> list[ServingPoint]:
    import yaml

    if not isinstance(value, list) or not value:
        raise e.err(node, key, "expected a non-empty list of {batch, context}")
    out = []
    for i, (item_node, item) in enumerate(zip(node.value if isinstance(node, yaml.SequenceNode) else [], value)):
        k = f"{key}[{i}]"
        if not isinstance(item, dict) or set(item) != {"batch", "context"}:
            raise e.err(item_node, k, f"expected {{batch: N, context: N}}, got {item!r}")
        p = ServingPoint(
            _int(e, item_node, f"{k}.batch", item["batch"]), _int(e, item_node, f"{k}.context", item["context"])
        )
        if p in out:
            raise e.err(item_node, k, f"duplicate serving point ({p.label})")
        out.append(p)
    return out


def from_cli(value: str) -> ModelSpec:
    """--model PRESET|path.yml -> ModelSpec (UsageError: one line)."""
    import yaml

    if value.lower() in PRESETS:
        return parse_node(yaml.compose(f"preset: {value.lower()}"), f"--model {value}")
    p = Path(value)
    if not p.is_file():
        raise UsageError(f"--model {value!r}: neither a preset ({presets_text()}) nor a file")
    try:
        node = yaml.compose(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise UsageError(
            f"{p}:{mark.line + 1 if mark else 1}: not valid YAML: {getattr(err, 'problem', None) or err}"
        ) from None
    if node is None:
        raise UsageError(f"{p}:1: empty model file (expected the keys of docs/tokens.md)")
    return parse_node(node, str(p), key="model", allow_kernels=False)


def tiny(spec: ModelSpec) -> ModelSpec:
    """A small model with the spec's head dim and head ratio, for running the step once on the CPU."""
    group = spec.num_heads // spec.num_kv_heads
    hkv = min(spec.num_kv_heads, 2)
    hq = hkv * min(group, 2)
    return ModelSpec(
        name=f"{spec.name} (tiny CPU shape)",
        layers=1,
        hidden_size=hq * spec.head_dim,
        num_heads=hq,
        num_kv_heads=hkv,
        head_dim=spec.head_dim,
        intermediate_size=2 * hq * spec.head_dim,
        vocab_size=256,
        dtype="float32",
        serving=[ServingPoint(2, 20)],
        price_per_hour=spec.price_per_hour,
        price_source=spec.price_source,
        source=spec.source,
    )
