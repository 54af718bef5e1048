"""vLLM 0.34.0's vllm/v1/attention/ops/triton_reshape_and_cache_flash.py, loaded once for the adapters of its
kernels (vllm_reshape_and_cache.py, vllm_reshape_and_cache_per_token_head.py). The module imports vLLM's platform
object, its Triton re-export and two quantization helpers; the stand-ins are our own lines."""

import torch
import triton
import triton.language as tl
from _source import load

module = load(
    "vllm-0.34.0",
    "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py",
    stubs={
        "vllm.model_executor.layers.quantization.utils.quant_utils": {
            "FP8_DTYPE": torch.float8_e4m3fn,
            "get_fp8_min_max": lambda: (-448.0, 448.0),
        },
        "vllm.platforms": {"current_platform": None},
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.v1.kv_cache_interface": {"KVQuantMode": None, "is_quantized_kv_cache": lambda dtype: False},
    },
)
