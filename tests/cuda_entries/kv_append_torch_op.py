# kv_append as a compiled PyTorch operator, torch.ops.kernalin_demo.kv_append: the launcher registers itself
# with TORCH_LIBRARY (as an extension built by setup.py does); here torch.utils.cpp_extension.load builds and
# loads it (is_python_module=False) (docs/cuda.md, "a compiled PyTorch extension op").
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

HERE = Path(__file__).resolve().parent
CUDA = HERE.parents[1] / "checks" / "cuda"

load(
    name="kernalin_kv_append_op",
    sources=[str(HERE / "kv_append_op.cu")],
    extra_include_paths=[str(CUDA / "kv_append"), str(CUDA / "common")],
    is_python_module=False,
)


def entry(key, value, k_cache, v_cache, slot_mapping):
    torch.ops.kernalin_demo.kv_append(key, value, k_cache, v_cache, slot_mapping)
