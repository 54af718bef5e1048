"""float32 -> FP8 -> float32 in a 10-line Triton kernel: `python interp_fp8_cast.py patched|unpatched` under
TRITON_INTERPRET=1 prints, per format, the bytes the kernel stored and the values it read back, for values
where FP8 conversion goes wrong (the top of a binade, ties, past the largest normal, subnormals), and the
float32 read back from every one of the 256 bytes, as JSON."""

import json
import sys

import torch
import triton
import triton.language as tl

if sys.argv[1] == "patched":
    from kernalin_ci.runtime.interp_patches import fp8_conversions

    assert fp8_conversions()


@triton.jit
def round_trip(X, Q, Y, N, FMT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    m = i < N
    q = tl.load(X + i, mask=m).to(FMT)
    tl.store(Q + i, q, mask=m)
    tl.store(Y + i, q.to(tl.float32), mask=m)


@triton.jit
def widen(Q, Y, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(Q + i).to(tl.float32))


out = {}
for name, dtype, fmt in (("e4m3", torch.float8_e4m3fn, tl.float8e4nv), ("e5m2", torch.float8_e5m2, tl.float8e5)):
    fi = torch.finfo(dtype)
    tiny = fi.smallest_normal * fi.eps  # the smallest subnormal
    x = torch.tensor(
        [
            124.9,
            -31.4,
            1.0625,
            1.1875,
            fi.max,
            fi.max * 1.05,
            fi.max * 4,
            -fi.max * 4,
            1e30,
            fi.smallest_normal,
            fi.smallest_normal * 0.75,
            tiny,
            tiny * 0.5,
            tiny * 0.51,
            tiny * 1.5,
            0.3,
            -2.7,
        ],
        dtype=torch.float32,
    )
    q = torch.empty(x.numel(), dtype=dtype)
    y = torch.empty(x.numel())
    round_trip[(1,)](x, q, y, x.numel(), FMT=fmt, BLOCK=32)
    every = torch.arange(256, dtype=torch.uint8).view(dtype)
    back = torch.empty(256)
    widen[(1,)](every, back, BLOCK=256)
    out[name] = {
        "x": x.tolist(),
        "stored": q.view(torch.uint8).tolist(),
        "read": [str(v) for v in y.tolist()],
        "every_byte": [str(v) for v in back.tolist()],
    }
print(json.dumps(out))
