"""rope: rotary position embedding of query and key (docs/ops.md)."""

from __future__ import annotations

from typing import Any

from kernalin_ci.findings import Finding
from kernalin_ci.lazy import torch
from kernalin_ci.ops.base import (
    DTYPE_BYTES,
    TOLERANCE,
    Case,
    Expected,
    Op,
    Param,
    Params,
    Tensors,
    Traffic,
    capture_case,
    capture_head_dims,
    capture_heads,
    generator,
    positive,
    randn,
    valid_dims,
)
from kernalin_ci.ops.bench_shapes import BenchRequest

PARAMS = (
    Param("style", "neox", str, "pairing: neox (i, i + r/2) or gptj (2i, 2i + 1)", choices=("neox", "gptj")),
    Param("base", 10000.0, float, "theta_i = base^(-2i/r)", check=lambda v: None if v > 1 else "must be > 1"),
    Param(
        "rotary_dim",
        None,
        int,
        "r, the rotated dims (default D; even, <= D)",
        check=lambda v: None if v > 0 and v % 2 == 0 else "must be positive and even",
    ),
    Param("max_position", 65536, int, "positions are < max_position", check=positive),
    Param("head_dim", None, int, "pin D for every case (default: 64 and 128)", check=positive),
    Param("num_q_heads", None, int, "pin Hq", check=positive),
    Param("num_kv_heads", None, int, "pin Hkv", check=positive),
)


def rotate(
    x: torch.Tensor,
    positions: torch.Tensor,
    style: str,
    base: float,
    r: int,
    sign: float = 1.0,
    table: torch.dtype | None = None,
) -> torch.Tensor:
    """The definition in float64. x [T, H, D], positions [T]. `table`: a dtype the cos/sin values are
    rounded to first (what a cos/sin table held in that dtype gives)."""
    x = x.to(torch.float64)
    i = torch.arange(r // 2, dtype=torch.float64)
    theta = base ** (-2.0 * i / r)
    a = positions.to("cpu", torch.float64)[:, None] * theta[None, :]  # [T, r/2]
    cos, sin = torch.cos(a)[:, None, :], sign * torch.sin(a)[:, None, :]
    if table is not None:
        cos, sin = cos.to(table).to(torch.float64), sin.to(table).to(torch.float64)
    out = x.clone()
    if style == "neox":
        x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
        out[..., : r // 2] = x1 * cos - x2 * sin
        out[..., r // 2 : r] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = x1 * cos - x2 * sin
        out[..., 1:r:2] = x2 * cos + x1 * sin
    return out


# The rounding unit of float32 (the largest relative error of one rounding).
U32 = 2.0**-24
# float32 rope is held to float32 accuracy: with exact angles a correct kernel's rows are off by a few
# roundings of the rotation (x1 cos - x2 sin: ~3 U32) and of cos/sin themselves (1-2 ulps; the GPU's
# approximate sin/cos: absolute error ~2^-20.5 = 7e-7 after range reduction). 1e-5 leaves a margin of
# 10 over the worst of these, and is 10 to 20 times below a cos/sin table stored in float16 (2^-11
# relative per entry, ~1.4e-4 per row). The angle error of a correct kernel grows with the position
# and is allowed separately, per frequency (`angle_error`).
FLOAT32_TOLERANCE = 1e-5


def angle_error(positions: torch.Tensor, base: float, r: int) -> torch.Tensor:
    """[T, r/2]: the angle error (radians) a correct float32 kernel may make at each token and frequency.

    A correct kernel forms theta_i = base^(-2i/r) in float32 (torch pow, or exp2 of -2i/r * log2(base)):
    the exponent carries up to 3 roundings of its own size, so theta_i is off by up to 3 |ln theta_i| U32
    relative (measured: 12.8 U32 at most for exp2, base 5e5, r 128, where 3 |ln theta| + 1.3 bounds it),
    plus 2 ulps (4 U32) for pow/exp2 and a reciprocal. The angle p * theta_i adds one rounding, and sin/cos
    of a large angle on a GPU (the approximate instructions reduce the argument by a float32 product with
    1/(2 pi)) up to 2 ulps more of the angle. So the error is at most p * theta_i * (8 + 3 |ln theta_i|) * U32:
    0.03 rad at position 65535 for theta = 1, against the O(1) error of a wrong position, sign, pairing or
    base, and p * theta_i * 2^-11 of an angle formed in float16."""
    i = torch.arange(r // 2, dtype=torch.float64)
    theta = base ** (-2.0 * i / r)
    per_freq = theta * (8.0 + 3.0 * theta.log().abs()) * U32
    return positions.to(torch.float64).abs()[:, None] * per_freq[None, :]


def row_slack(x: torch.Tensor, positions: torch.Tensor, style: str, base: float, r: int) -> torch.Tensor:
    """Extra relative error allowed per row of x [T, H, D] (flattened to T * H): an angle error d_i moves
    the pair of frequency i by at most d_i times its norm n_i, so the row moves by sqrt(sum_i d_i^2 n_i^2),
    relative to the row's norm (which the rotation keeps)."""
    x = x.to(torch.float64)
    if style == "neox":
        a, b = x[..., : r // 2], x[..., r // 2 : r]
    else:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
    d = angle_error(positions.to("cpu"), base, r)[:, None, :]  # [T, 1, r/2]
    moved = ((d * d) * (a * a + b * b)).sum(-1).sqrt()
    return (moved / x.norm(dim=-1).clamp_min(1e-30)).reshape(-1)


class Rope(Op):
    name = "rope"
    params = PARAMS
    written = ("q", "k")  # in-place kernels may return q and k themselves
    decode_role = "rope"
    rotates = True
    shape_symbols = {("q", 0): "T", ("k", 0): "T", ("positions", 0): "T"}  # q, k: [T, H, D], a row per token
    domain_axes = ("head_dim", "num_q_heads", "num_kv_heads", "dtype")
    structural = "rope"

    def _shape(self, params: Params, D: int, hq: int, hkv: int) -> dict[str, Any]:
        D = params.get("head_dim") or D
        r = params.get("rotary_dim") or D
        if r > D:
            D = r
        hq = params.get("num_q_heads") or hq
        hkv = params.get("num_kv_heads") or hkv
        return {"D": D, "Hq": hq, "Hkv": hkv}

    def cases(self, params: Params, device: str, dtype: str | None) -> list[Case]:
        main = dtype or "float32"
        mp = params["max_position"]
        special = [0, 1, 2, 3, 7, 31, 100, 1000, 4095, mp - 1, mp - 2, mp // 2 + 1]
        special = [p for p in special if 0 <= p < mp]
        cases = [
            Case("positions", {**self._shape(params, 64, 8, 2), "T": 37, "positions": special}, main, 1),
            Case("full-heads", {**self._shape(params, 128, 4, 4), "T": 19, "positions": special[:5]}, main, 2),
            Case("many-heads", {**self._shape(params, 64, 12, 4), "T": 53}, main, 3),
            Case("relative", {**self._shape(params, 64, 8, 2), "T": 16, "relative": 5}, main, 4, ("relative",)),
            Case(
                "fresh-inputs",
                {**self._shape(params, 64, 8, 2), "T": 37, "positions": special},
                main,
                5,
                ("repeat-of:positions",),
            ),
        ]
        if dtype is None:
            for i, dt in enumerate(("float16", "bfloat16")):
                cases.append(
                    Case(
                        f"positions-{dt}", {**self._shape(params, 64, 8, 2), "T": 37, "positions": special}, dt, 10 + i
                    )
                )
        return cases

    def probe(self, params: Params, dtype: str | None) -> Case:
        return Case(
            "pos0-probe", {**self._shape(params, 64, 8, 2), "T": 1, "positions": [0]}, dtype or "float32", 0, ("probe",)
        )

    def shape_case(self, params: Params, dtype: str) -> Case:
        mp = params["max_position"]
        pos = [p for p in (0, 1, 7, mp - 1) if p < mp]
        return Case("shape", {**self._shape(params, 64, 8, 2), "T": 5, "positions": pos}, dtype, 40, ("shape",))

    def inputs(self, case: Case, params: Params, device: str, poison: bool = True) -> Tensors:
        d = case.dims
        g = generator(case.seed)
        T, Hq, Hkv, D = d["T"], d["Hq"], d["Hkv"], d["D"]
        mp = params["max_position"]
        pos = list(d.get("positions", []))[:T]
        if d.get("relative"):
            # pairs (m, m - delta) with the same delta: <R(m)q, R(m-delta)k> must not depend on m
            ms = torch.randint(d["relative"], mp, (T // 2,), generator=g).tolist()
            pos = [p for m in ms for p in (m, m - d["relative"])]
        pos = pos + torch.randint(0, mp, (T - len(pos),), generator=g).tolist()
        q = randn((T, Hq, D), g, case.dtype, "cpu")
        k = randn((T, Hkv, D), g, case.dtype, "cpu")
        if d.get("relative"):  # one q vector and one k vector everywhere
            q[:] = q[0]
            k[:] = k[0]
        return {"q": q.to(device), "k": k.to(device), "positions": torch.tensor(pos, dtype=torch.int64, device=device)}

    def outputs(self, ret: Any, kw: Tensors) -> Tensors:
        if not isinstance(ret, (tuple, list)) or len(ret) != 2:
            raise TypeError(f"rope entry must return (q_out, k_out), got {type(ret).__name__}")
        return {"q": ret[0], "k": ret[1]}

    def _r(self, params: Params, D: int) -> int:
        return params.get("rotary_dim") or D

    def reference(self, kw: Tensors, params: Params) -> Expected:
        D = kw["q"].shape[-1]
        r, st, base = self._r(params, D), params["style"], params["base"]
        pos = kw["positions"].to("cpu")
        fp32 = kw["q"].dtype == torch.float32
        return Expected(
            {"q": rotate(kw["q"], kw["positions"], st, base, r), "k": rotate(kw["k"], kw["positions"], st, base, r)},
            row_slack={n: row_slack(kw[n].to("cpu"), pos, st, base, r) for n in ("q", "k")},
            tolerance=FLOAT32_TOLERANCE if fp32 else None,
        )

    def fingerprints(self, kw: Tensors, params: Params, case: Case) -> list[tuple[str, Tensors]]:
        D = kw["q"].shape[-1]
        r, st, base = self._r(params, D), params["style"], params["base"]
        pos = kw["positions"]
        other = "gptj" if st == "neox" else "neox"

        def both(**kws: Any) -> Tensors:
            a = dict(style=st, base=base, r=r, positions=pos)
            a.update(kws)
            p = a.pop("positions")
            return {"q": rotate(kw["q"], p, **a), "k": rotate(kw["k"], p, **a)}

        fps = [
            ("rope-pairing", both(style=other)),
            ("rope-sign", both(sign=-1.0)),
            ("rope-position", both(positions=torch.zeros_like(pos))),
            ("rope-position", both(positions=torch.arange(len(pos)))),
        ]
        if r != D:
            fps.append(("rope-frequency", both(r=D)))
        if kw["q"].dtype == torch.float32:  # a cos/sin table in half precision
            fps += [("precision", both(table=torch.float16)), ("precision", both(table=torch.bfloat16))]
        return fps

    def properties(self, case: Case, kw: Tensors, outs: Tensors, params: Params) -> list[Finding]:
        """Reference-free: rotations preserve norms; <R(m)q, R(n)k> depends on m - n only."""
        found = []
        tol = TOLERANCE[case.dtype]
        for name in ("q", "k"):
            x = kw[name].to(torch.float64)
            y = outs[name].detach().to("cpu", torch.float64)
            nx, ny = x.norm(dim=-1), y.norm(dim=-1)
            rel = (ny - nx).abs() / nx.clamp_min(1e-30)
            bad = ~(rel <= 4 * tol)
            if bool(bad.any()):
                t, h = [int(i) for i in bad.nonzero()[0]]
                found.append(
                    Finding(
                        "norm-preservation",
                        "wrong-output",
                        f"{name}: {int(bad.sum())} of {bad.numel()} rows change their norm (a rotation keeps it); "
                        f"worst relative change {float(rel.nan_to_num(float('inf')).max()):.3g} at t={t} h={h}, "
                        f"position {int(kw['positions'][t])}",
                    )
                )
        if case.dims.get("relative"):
            q = outs["q"].detach().to("cpu", torch.float64)
            k = outs["k"].detach().to("cpu", torch.float64)
            dots = (q[0::2, :, None, :] * k[1::2, None, :, :]).sum(-1)  # [pairs, Hq, Hkv]
            ref = dots[0:1]
            scale = (
                kw["q"].to(torch.float64)[0].norm(dim=-1)[:, None] * kw["k"].to(torch.float64)[0].norm(dim=-1)[None, :]
            )
            dev = ((dots - ref).abs() / scale).nan_to_num(float("inf"))
            r = self._r(params, kw["q"].shape[-1])
            angle = float(angle_error(kw["positions"].to("cpu"), params["base"], r).max())
            if float(dev.max()) > 8 * tol + 2 * angle:
                i = int(dev.amax(dim=(1, 2)).argmax())
                m, n = int(kw["positions"][2 * i]), int(kw["positions"][2 * i + 1])
                m0, n0 = int(kw["positions"][0]), int(kw["positions"][1])
                found.append(
                    Finding(
                        "relative-position",
                        "rope-position",
                        f"<R(m)q, R(n)k> is not a function of m - n: positions ({m}, {n}) and ({m0}, {n0}) "
                        f"(both m - n = {case.dims['relative']}) differ by {float(dev.max()):.3g} of |q||k|",
                    )
                )
        return found

    def row_label(self, case: Case, kw: Tensors, name: str, row: int) -> str:
        H = case.dims["Hq"] if name == "q" else case.dims["Hkv"]
        t, h = divmod(row, H)
        return f"{name}[t={t}, h={h}] (position {int(kw['positions'][t])})"

    def validate_case(self, case: Case) -> str | None:
        return valid_dims(case.dims, ("T", "Hq", "Hkv", "D"))

    def bench_cases(self, params: Params, device: str, request: BenchRequest) -> list[Case]:
        hq, hkv, D = request.heads(params)
        if params.get("rotary_dim") and params["rotary_dim"] > D:
            D = params["rotary_dim"]
        mp = params.get("max_position", 65536)
        cases = []
        for i, s in enumerate(request.token_shapes(self.name)):
            dims = {"T": s["tokens"], "Hq": hq, "Hkv": hkv, "D": D}
            cases.append(
                Case(
                    f"T={s['tokens']} Hq={hq} Hkv={hkv} D={D} {request.dtype} (positions < {mp})",
                    dims,
                    request.dtype,
                    1000 + i,
                    ("bench",),
                )
            )
        return cases

    def traffic(self, case: Case, params: Params) -> Traffic | None:
        """q, k and the int64 positions read, q and k written whole; 3 FLOPs per rotated element
        (x·cos ∓ y·sin); the angles are not counted."""
        d = case.dims
        e = DTYPE_BYTES[case.dtype]
        T, H, D = int(d["T"]), int(d["Hq"]) + int(d["Hkv"]), int(d["D"])
        return Traffic(T * H * D * e + 8 * T, T * H * D * e, 3 * T * H * self._r(params, D))

    def capture_cases(self, params: Params) -> list[Case]:
        """Several tokens at positions that are neither 0 nor the token index."""
        hq, hkv = capture_heads(params)
        cases = []
        for D in capture_head_dims(params):
            D = max(D, params.get("rotary_dim") or D)
            # float32: the precision a float32 model needs (angles, a cos/sin table) is visible there
            cases.append(capture_case({"T": 3, "Hq": hq, "Hkv": hkv, "D": D, "positions": [1000, 7, 33]}, "float32"))
        return cases

    def capture_twin(self, dims: dict[str, Any]) -> dict[str, Any] | None:
        """One more token, at a position of its own."""
        return {**dims, "T": dims["T"] + 1, "positions": [*dims["positions"], 500]}


OP_CLASS = Rope
