"""Stand-ins for the package imports of LMDeploy's PyTorch-engine kernel modules (lmdeploy 0.18.0): its
QuantPolicy enum, its logger, its TurboQuant helpers and two device utilities, our own lines (no
quantization; the device's own properties on a GPU, an H100's on the CPU, where LMDeploy's paged
attention derives its split count from them). For `_source.load(..., stubs=STUBS, package=PACKAGE)`.
"""

import enum
import logging

import torch


class QuantPolicy(enum.IntEnum):
    NONE = 0
    INT4 = 4
    INT8 = 8
    FP8 = 16
    FP8_E5M2 = 17
    TURBO_QUANT = 42


def _unused(*args, **kwargs):
    raise NotImplementedError("TurboQuant is not part of this adapter")


def device_props(device=None):
    if not torch.cuda.is_available():
        return {"multi_processor_count": 132, "compute_capability": (9, 0), "warps_per_sm": 64, "blocks_per_sm": 32}
    p = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    return {
        "multi_processor_count": p.multi_processor_count,
        "compute_capability": (p.major, p.minor),
        "warps_per_sm": 64 if (p.major, p.minor) in ((8, 0), (9, 0), (10, 0)) else 48,
        "blocks_per_sm": 32,
    }


STUBS = {
    "lmdeploy.messages": {"QuantPolicy": QuantPolicy},
    "lmdeploy.utils": {"get_logger": logging.getLogger},
    "lmdeploy.pytorch.kernels.cuda.turbo_quant": {"hadamard_rotate": _unused, "get_lloyd_max_codebook": _unused},
    "lmdeploy.pytorch.kernels.cuda.utils": {"get_device_props": device_props, "is_cuda": torch.cuda.is_available},
}
PACKAGE = "lmdeploy.pytorch.kernels.cuda"
