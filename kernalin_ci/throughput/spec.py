"""The model a decode step is built for: its shapes, the serving points, the GPU price (docs/tokens.md).

Read from `.kernalin.yml` (`model:`) or from `--model PRESET|path.yml` (the same keys; `kernels` only in
`.kernalin.yml`). Every error is one line naming the file, the line and the key (exit 2).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kernalin_ci import yamlcheck
from kernalin_ci.errors import UsageError
from kernalin_ci.ops.roles import ROLES  # the gated kernels' places in the step (docs/tokens.md)

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
    # The decode-path features (docs/tokens.md "Attention features") from the config classes of the pinned
    # `transformers` 4.56.2 wheel: their documented defaults are these models' configs. No dtype: the `model:`
    # default (bfloat16) applies, the classes name none.
    "mistral-7b-v0.1": {
        "layers": 32,
        "hidden_size": 4096,
        "num_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "window": 4096,
        "window_layers": "all",
        "source": "transformers 4.56.2 MistralConfig defaults (its docstring: mistralai/Mistral-7B-v0.1): "
        "head_dim None -> hidden_size / num_attention_heads, sliding_window 4096 on every layer",
    },
    "gemma-2-2b": {
        "layers": 26,
        "hidden_size": 2304,
        "num_heads": 8,
        "num_kv_heads": 4,
        "head_dim": 256,
        "intermediate_size": 9216,
        "vocab_size": 256000,
        "window": 4096,
        "window_layers": "even",
        "logit_cap": 50.0,
        "source": "transformers 4.56.2 Gemma2Config defaults (= google/gemma-2-2b config.json): sliding_window "
        "4096 on layer_types' default 'sliding_attention' layers 0, 2, 4, ..., attn_logit_softcapping 50.0, "
        "query_pre_attn_scalar 256 = head_dim (so the scale is head_dim^-0.5)",
    },
}
# An FP8 KV cache as a public checkpoint's model card states it: amd/Llama-3.1-8B-Instruct-FP8-KV ("KV Cache: FP8
# symmetric per-tensor"; vLLM's `fp8` KV cache, which it reads with those per-tensor scales, is E4M3). Its shapes
# are the base model's, meta-llama/Llama-3.1-8B-Instruct (= llama-3.1-8b above).
PRESETS["llama-3.1-8b-fp8-kv"] = {
    **PRESETS["llama-3.1-8b"],
    "kv_dtype": "fp8_e4m3",
    "source": "amd/Llama-3.1-8B-Instruct-FP8-KV model card: KV cache FP8 (E4M3) symmetric per-tensor; "
    "shapes: meta-llama/Llama-3.1-8B config.json",
}
SHAPE_KEYS = ("layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size")
MODEL_DTYPES = ("bfloat16", "float16", "float32")
# The decode-path features the attention ops take as params (docs/ops.md "Attention features", "FP8 KV caches")
FEATURE_KEYS = ("window", "window_layers", "logit_cap", "sinks", "kv_dtype")
WINDOW_LAYERS = ("all", "even")  # which layers slide: every one, or 0, 2, 4, ... (the others attend everything)
KV_DTYPES = ("fp8_e4m3", "fp8_e5m2")
KEYS = ("preset", *SHAPE_KEYS, "dtype", *FEATURE_KEYS, "serving", "gpu_price_per_hour", "kernels", "budget_s")

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
    window: int | None = None  # sliding window in keys, the query's own included (docs/ops.md)
    window_layers: str = "all"  # WINDOW_LAYERS: which layers use the window
    logit_cap: float | None = None  # attention logit soft-cap
    sinks: bool = False  # a sink logit per query head
    kv_dtype: str | None = None  # KV_DTYPES: an FP8 cache (unset: the model's dtype)

    def shape(self) -> dict:
        return {k: getattr(self, k) for k in SHAPE_KEYS} | {"dtype": self.dtype} | self.features()

    def features(self) -> dict:
        """The features the model sets (no key for one it leaves off)."""
        d = {k: getattr(self, k) for k in FEATURE_KEYS}
        if self.window is None:
            d.pop("window_layers")
        return {k: v for k, v in d.items() if v not in (None, False)}

    def attention_params(self, layer: int) -> dict:
        """Layer LAYER's attention op params (docs/ops.md): window (on the layers that slide), logit_cap,
        sinks, kv_dtype (per-tensor scales)."""
        p: dict = {}
        if self.window is not None and (self.window_layers == "all" or layer % 2 == 0):
            p["window"] = self.window
        if self.logit_cap is not None:
            p["logit_cap"] = self.logit_cap
        if self.sinks:
            p["sinks"] = True
        if self.kv_dtype is not None:
            p["kv_dtype"] = self.kv_dtype
        return p

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


_POSITIVE_INT = {"type": "integer", "minimum": 1, "x-message": "expected a positive integer, got {value!r}"}
_POSITIVE = {"type": "number", "exclusiveMinimum": 0, "x-message": "expected a positive number, got {value!r}"}
# `model:` and a --model file (docs/tokens.md) as a schema; presets and the shapes' arithmetic in parse_model
MODEL_SCHEMA = {
    "type": "object",
    "x-message": "expected a mapping (docs/tokens.md)",
    "properties": {
        "preset": {"type": "string"},
        **{k: _POSITIVE_INT for k in SHAPE_KEYS},
        "dtype": {
            "enum": list(MODEL_DTYPES),
            "x-message": f"must be one of {', '.join(MODEL_DTYPES)}, got {{value!r}}",
        },
        "window": _POSITIVE_INT,
        "window_layers": {
            "enum": list(WINDOW_LAYERS),
            "x-message": f"must be one of {', '.join(WINDOW_LAYERS)}, got {{value!r}}",
        },
        "logit_cap": _POSITIVE,
        "sinks": {"type": "boolean", "x-message": "expected true or false, got {value!r}"},
        "kv_dtype": {
            "enum": list(KV_DTYPES),
            "x-message": f"must be one of {', '.join(KV_DTYPES)}, got {{value!r}}",
        },
        "serving": {
            "type": "array",
            "minItems": 1,
            "x-message": "expected a non-empty list of {{batch, context}}",
            "items": {
                "type": "object",
                "properties": {"batch": _POSITIVE_INT, "context": _POSITIVE_INT},
                "required": ["batch", "context"],
                "x-required": "a serving point is {batch: N, context: N}",
                "additionalProperties": False,
                "x-message": "expected {{batch: N, context: N}}, got {value!r}",
            },
        },
        "gpu_price_per_hour": _POSITIVE,
        "kernels": {
            "type": "object",
            "propertyNames": {
                "enum": list(ROLES),
                "x-message": f"{{value!r}}: unknown role (roles: {', '.join(ROLES)})",
            },
            "additionalProperties": {"type": "string"},
            "x-message": f"expected a mapping of role to kernel name (roles: {', '.join(ROLES)})",
        },
        "budget_s": _POSITIVE,
    },
    "additionalProperties": False,
}


def parse_model(doc, at: tuple = (), shown: tuple | None = None, allow_kernels: bool = True) -> ModelSpec:
    """The model at AT of DOC (a kernalin_ci.yamlcheck.Document: the `model:` section, or a whole --model
    file, whose keys SHOWN names `model.KEY`) -> ModelSpec."""

    yamlcheck.check(doc, MODEL_SCHEMA, at, shown)
    items = doc.data
    for part in at:
        items = items[part]
    path = doc.path

    def err(key: str | None, msg: str):
        where = (*at, key) if key else tuple(at)
        return doc.error(where, msg, shown=shown and (*shown, *where[len(at) :]))

    if "kernels" in items and not allow_kernels:
        raise err("kernels", "only in .kernalin.yml (the kernels are named there)")
    base: dict = {}
    name = "custom"
    if "preset" in items:
        preset = items["preset"]
        if preset.lower() not in PRESETS:
            raise err("preset", f"unknown preset {preset!r} (presets: {presets_text()})")
        name = preset.lower()
        base = dict(PRESETS[name])
    base.update({k: items[k] for k in (*SHAPE_KEYS, "dtype", *FEATURE_KEYS) if k in items})
    if "window_layers" in items and base.get("window") is None:
        raise err("window_layers", "needs window (the sliding window's size)")
    if "logit_cap" in items and not math.isfinite(float(items["logit_cap"])):
        raise err("logit_cap", f"expected a positive finite number, got {items['logit_cap']!r}")
    missing = [k for k in SHAPE_KEYS if k not in base]
    if missing:
        raise err(None, f"missing {', '.join(missing)} (or name a preset: {presets_text()})")
    vals = {k: base[k] for k in SHAPE_KEYS}
    if vals["num_heads"] % vals["num_kv_heads"]:
        raise err(
            "num_kv_heads" if "num_kv_heads" in items else None,
            f"num_heads {vals['num_heads']} is not a multiple of num_kv_heads {vals['num_kv_heads']}",
        )
    if vals["head_dim"] % 2:
        raise err("head_dim" if "head_dim" in items else None, f"must be even (rotary pairs), got {vals['head_dim']}")
    spec = ModelSpec(
        name=name, dtype=base.get("dtype", "bfloat16"), source=base.get("source", "") if name != "custom" else path,
        **vals,
        **{k: base[k] for k in FEATURE_KEYS if k in base},
    )  # fmt: skip
    if spec.logit_cap is not None:
        spec.logit_cap = float(spec.logit_cap)
    if name != "custom" and any(k in items for k in (*SHAPE_KEYS, *FEATURE_KEYS)):
        spec.name = f"{name} (modified)"
        spec.source = f"{PRESETS[name]['source']}, with {path}"
    if "serving" in items:
        spec.serving = []
        for i, item in enumerate(items["serving"]):
            p = ServingPoint(item["batch"], item["context"])
            if p in spec.serving:
                where = (*at, "serving", i)
                raise doc.error(where, f"duplicate serving point ({p.label})", shown=shown and (*shown, "serving", i))
            spec.serving.append(p)
    if "gpu_price_per_hour" in items:
        spec.price_per_hour = float(items["gpu_price_per_hour"])
        spec.price_source = f"{path}: {yamlcheck.dotted((*(shown or at), 'gpu_price_per_hour'))}"
    if "budget_s" in items:
        spec.budget_s = float(items["budget_s"])
    if "kernels" in items:
        spec.kernels = dict(items["kernels"])
    return spec


def from_cli(value: str) -> ModelSpec:
    """--model PRESET|path.yml -> ModelSpec (UsageError: one line)."""

    if value.lower() in PRESETS:
        doc = yamlcheck.parse(f"preset: {value.lower()}", f"--model {value}", empty="")
        return parse_model(doc, shown=("model",))
    p = Path(value)
    if not p.is_file():
        raise UsageError(f"--model {value!r}: neither a preset ({presets_text()}) nor a file")
    doc = yamlcheck.load(p, "model file", empty="empty model file (expected the keys of docs/tokens.md)")
    return parse_model(doc, shown=("model",), allow_kernels=False)


TINY_WINDOW = 8  # the tiny step's window at most: within its 21 keys, so the window masks keys


def tiny(spec: ModelSpec) -> ModelSpec:
    """A small model with the spec's head dim, head ratio and attention features, for running the step once on
    the CPU (the window shrunk to at most TINY_WINDOW keys so that it masks some at the tiny context)."""
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
        window=min(spec.window, TINY_WINDOW) if spec.window is not None else None,
        window_layers=spec.window_layers,
        logit_cap=spec.logit_cap,
        sinks=spec.sinks,
        kv_dtype=spec.kv_dtype,
    )
