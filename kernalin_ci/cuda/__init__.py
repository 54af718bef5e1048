"""CUDA C++ kernels: what kernalin-ci needs to gate them, apart from the rest.

- `sources.py`: a kernel's CUDA sources and build flags (`cuda:` in .kernalin.yml, `verify --cuda-source`);
- `includes.py`: the repository headers a source includes (`#include "..."`, followed transitively), for the diff;
- `toolchain.py`: where the CUDA compiler and Compute Sanitizer are (the `nvidia-cuda-nvcc` package, CUDA_HOME, PATH);
- `build.py`: PTX of the sources, built once per source hash into a cache the run's workers share;
- `task.py`: the worker task that builds them (sandboxed, like every step that reads a pull request's code);
- `caches.py`: the build caches of torch extensions, CuPy and NVRTC, set per worker view as Triton's is;
- `nvrtc.py`: compile and launch a `.cu` at run time through NVRTC (cuda-python), cached by source hash;
- `sanitizer.py`: NVIDIA Compute Sanitizer over a few cases of any kernel (CUDA or Triton), its reports mapped
  to bug classes.

The rest of the package reaches this one through a few hooks: the configuration's `cuda:` key, the diff's
kernel files, `verify(cuda=...)` and the worker sandbox's cache environment (docs/cuda.md).
"""

from kernalin_ci.cuda.sources import CudaSpec

__all__ = ["CudaSpec"]
