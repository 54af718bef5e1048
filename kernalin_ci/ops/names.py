"""The op names of docs/ops.md and the module of each: a leaf, read by the registry (`ops/__init__.py`) and by
`base.resolve_params` (an op's own check of its params)."""

MODULES = {
    "attention.decode": "attention_decode",
    "attention.decode_paged": "attention_decode_paged",
    "attention.decode_multi": "attention_decode_multi",
    "attention.decode_mla": "attention_decode_mla",
    "rope": "rope",
    "kv_append": "kv_append",
    "decode_step": "decode_step",
    "custom": "custom",
}
NAMES = tuple(MODULES)
