"""`torch`, imported on first use.

The parent process resolves params and builds cases (plain data) and never
launches anything; importing torch there would cost about 3 s on a CUDA machine
before the first worker even starts. Modules that the parent and the workers
share write `from kernalin_ci.lazy import torch`; the real import happens on the
first attribute access: in the worker, and in the parent once it judges a result.
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING


class LazyModule(types.ModuleType):
    def __getattr__(self, attr):
        module = importlib.import_module(self.__name__)
        return getattr(module, attr)


if TYPE_CHECKING:  # the type checker sees the real module (annotations such as torch.Tensor)
    import torch as torch
else:
    torch = LazyModule("torch")
