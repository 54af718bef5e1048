"""rope: rotary position embedding of query and key (docs/ops.md)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
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

SCALINGS = ("none", "linear", "llama3", "yarn")


def at_least_one(v: Any) -> str | None:
    return None if v >= 1 else "must be >= 1"


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
    Param(
        "scaling",
        "none",
        str,
        "frequency table: none, linear, llama3 (Llama-3.1's piecewise rule) or yarn",
        choices=SCALINGS,
    ),
    Param("scaling_factor", None, float, "the context extension factor (linear, llama3, yarn)", check=at_least_one),
    Param(
        "original_max_position",
        None,
        int,
        "the context the model was trained at (llama3, yarn: original_max_position_embeddings)",
        check=positive,
    ),
    Param(
        "low_freq_factor", 1.0, float, "llama3: wavelengths above original/low_freq_factor are scaled", check=positive
    ),
    Param(
        "high_freq_factor", 4.0, float, "llama3: wavelengths below original/high_freq_factor are kept", check=positive
    ),
    Param("beta_fast", 32.0, float, "yarn: rotations at which the ramp starts (kept above)", check=positive),
    Param("beta_slow", 1.0, float, "yarn: rotations at which the ramp ends (scaled below)", check=positive),
    Param(
        "attention_factor",
        None,
        float,
        "yarn: the magnitude cos and sin are multiplied by (unset: 0.1 ln(scaling_factor) + 1)",
        check=positive,
    ),
    Param(
        "mrope_section",
        None,
        list,
        "M-RoPE: frequencies per position row (Qwen2-VL [16, 24, 24]); positions are then [len, T]",
        check=lambda v: (
            None
            if v and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)
            else "must be a non-empty list of positive integers"
        ),
    ),
)


@dataclass(frozen=True)
class RopeSpec:
    """The rotation the params define, at rotary dim r: the frequencies theta_i (float64 [r/2], scaled by the
    `scaling` rule), the magnitude cos and sin are multiplied by (YaRN's attention factor; 1 otherwise) and,
    for M-RoPE, the position row each frequency takes its angle from."""

    style: str
    base: float
    r: int
    theta: torch.Tensor
    magnitude: float = 1.0
    sections: tuple[int, ...] | None = None

    def rows(self) -> torch.Tensor:
        """[r/2]: the position row of each frequency (all 0 without M-RoPE)."""
        if self.sections is None:
            return torch.zeros(self.r // 2, dtype=torch.int64)
        return torch.repeat_interleave(torch.arange(len(self.sections)), torch.tensor(self.sections))

    def positions_per_frequency(self, positions: torch.Tensor) -> torch.Tensor:
        """[T, r/2] float64: the position each token's frequency i is rotated by. positions: [T], or [S, T]
        with M-RoPE."""
        pos = positions.to("cpu", torch.float64)
        if self.sections is None:
            return pos.reshape(-1)[:, None].expand(-1, self.r // 2)
        return pos[self.rows()].T

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """[T, r/2]: a = p_i · theta_i."""
        return self.positions_per_frequency(positions) * self.theta[None, :]

    def rotate(
        self, x: torch.Tensor, positions: torch.Tensor, sign: float = 1.0, table: torch.dtype | None = None
    ) -> torch.Tensor:
        """The definition in float64. x [T, H, D]. `table`: a dtype the cos/sin values are rounded to first
        (what a cos/sin table held in that dtype gives)."""
        x = x.to(torch.float64)
        r = self.r
        a = self.angles(positions)
        cos = self.magnitude * torch.cos(a)[:, None, :]
        sin = sign * self.magnitude * torch.sin(a)[:, None, :]
        if table is not None:
            cos, sin = cos.to(table).to(torch.float64), sin.to(table).to(torch.float64)
        out = x.clone()
        if self.style == "neox":
            x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
            out[..., : r // 2] = x1 * cos - x2 * sin
            out[..., r // 2 : r] = x2 * cos + x1 * sin
        else:
            x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
            out[..., 0:r:2] = x1 * cos - x2 * sin
            out[..., 1:r:2] = x2 * cos + x1 * sin
        return out

    def replace(self, **changes: Any) -> RopeSpec:
        return dataclasses.replace(self, **changes)


def plain_theta(base: float, r: int) -> torch.Tensor:
    """theta_i = base^(-2i/r), float64 [r/2]."""
    return base ** (-2.0 * torch.arange(r // 2, dtype=torch.float64) / r)


def scaled_theta(params: Params, r: int) -> tuple[torch.Tensor, float]:
    """(theta [r/2], magnitude) of the `scaling` rule, in float64, as the public serving code computes them
    (docs/ops.md, "Scaled frequencies")."""
    base = float(params["base"])
    theta = plain_theta(base, r)
    rule = params.get("scaling") or "none"
    if rule == "none":
        return theta, 1.0
    factor = float(params["scaling_factor"])
    if rule == "linear":  # positions / factor
        return theta / factor, 1.0
    orig = float(params["original_max_position"])
    if rule == "llama3":
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        wavelen = 2 * math.pi / theta
        smooth = (orig / wavelen - low) / (high - low)
        blended = (1 - smooth) * theta / factor + smooth * theta
        out = torch.where(wavelen > orig / low, theta / factor, theta)
        medium = (wavelen >= orig / high) & (wavelen <= orig / low)
        return torch.where(medium, blended, out), 1.0
    # yarn: frequencies below the ramp kept, above it interpolated, a linear ramp between (over i < r/2)
    lo_d, hi_d = yarn_range(params, r)
    ramp = ((torch.arange(r // 2, dtype=torch.float64) - lo_d) / (hi_d - lo_d)).clamp(0.0, 1.0)
    theta = theta / factor * ramp + theta * (1 - ramp)
    mag = params.get("attention_factor")
    if mag is None:
        mag = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return theta, float(mag)


def yarn_range(params: Params, r: int) -> tuple[float, float]:
    """YaRN's correction range (low, high) in frequency indices: the index whose wavelength makes beta
    rotations over the original context, floored and ceiled, clipped to [0, r - 1] (high + 0.001 if equal)."""
    base, orig = float(params["base"]), float(params["original_max_position"])

    def dim(rotations: float) -> float:
        return r * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim(float(params["beta_fast"]))), 0)
    high = min(math.ceil(dim(float(params["beta_slow"]))), r - 1)
    return float(low), float(high) + (0.001 if low == high else 0.0)


def shifted_sections(sections: tuple[int, ...]) -> list[tuple[int, ...]]:
    """M-RoPE sections with their boundaries moved by one (each boundary -1, 0 or +1, not all 0; every section
    kept non-empty): an off-by-one row choice at a boundary, the first or last frequency of a section rotated
    by its neighbour's position row."""
    out = []
    for moves in itertools.product((-1, 0, 1), repeat=len(sections) - 1):
        if not any(moves):
            continue
        ends = [e + m for e, m in zip(itertools.accumulate(sections), moves)] + [sum(sections)]
        alt = tuple(b - a for a, b in zip([0, *ends[:-1]], ends))
        if min(alt) > 0:
            out.append(alt)
    return out


def rotary_dim_of(params: Params, D: int) -> int:
    """r: rotary_dim, else twice the M-RoPE sections' sum, else the head dim."""
    sections = params.get("mrope_section")
    return int(params.get("rotary_dim") or (2 * sum(sections) if sections else D))


def spec_of(params: Params, D: int) -> RopeSpec:
    """The rotation of these params at head dim D."""
    r = rotary_dim_of(params, D)
    theta, mag = scaled_theta(params, r)
    sections = params.get("mrope_section")
    return RopeSpec(
        str(params["style"]),
        float(params["base"]),
        r,
        theta,
        mag,
        tuple(int(x) for x in sections) if sections else None,
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
    """The unscaled definition in float64 (RopeSpec.rotate). x [T, H, D], positions [T]."""
    return RopeSpec(style, base, r, plain_theta(base, r)).rotate(x, positions, sign, table)


def check_params(params: Params) -> str | None:
    """What the params say together that no one of them says alone (None: nothing wrong)."""
    rule = params.get("scaling") or "none"
    if rule != "none" and params.get("scaling_factor") is None:
        return f"param scaling={rule} needs scaling_factor"
    if rule in ("llama3", "yarn") and params.get("original_max_position") is None:
        return f"param scaling={rule} needs original_max_position"
    if rule == "llama3" and not params["high_freq_factor"] > params["low_freq_factor"]:
        return "param high_freq_factor must be greater than low_freq_factor (llama3)"
    if rule == "yarn" and not params["beta_fast"] > params["beta_slow"]:
        return "param beta_fast must be greater than beta_slow (yarn)"
    sections, r, D = params.get("mrope_section"), params.get("rotary_dim"), params.get("head_dim")
    if sections and r and sum(sections) != r // 2:
        return f"param mrope_section {sections} must sum to rotary_dim / 2 = {r // 2}"
    if sections and not r and D and 2 * sum(sections) > D:
        return f"param mrope_section {sections} rotates {2 * sum(sections)} dims, more than head_dim {D}"
    return None


# The rounding unit of float32 (the largest relative error of one rounding).
U32 = 2.0**-24
# float32 rope is held to float32 accuracy: with exact angles a correct kernel's rows are off by a few
# roundings of the rotation (x1 cos - x2 sin: ~3 U32) and of cos/sin themselves (1-2 ulps; the GPU's
# approximate sin/cos: absolute error ~2^-20.5 = 7e-7 after range reduction). 1e-5 leaves a margin of
# 10 over the worst of these, and is 10 to 20 times below a cos/sin table stored in float16 (2^-11
# relative per entry, ~1.4e-4 per row). The angle error of a correct kernel grows with the position
# and is allowed separately, per frequency (`angle_error`).
FLOAT32_TOLERANCE = 1e-5


def angle_error(positions: torch.Tensor, base: float, r: int, spec: RopeSpec | None = None) -> torch.Tensor:
    """[T, r/2]: the angle error (radians) a correct float32 kernel may make at each token and frequency.

    A correct kernel forms theta_i = base^(-2i/r) in float32 (torch pow, or exp2 of -2i/r * log2(base)):
    the exponent carries up to 3 roundings of its own size, so theta_i is off by up to 3 |ln theta_i| U32
    relative (measured: 12.8 U32 at most for exp2, base 5e5, r 128, where 3 |ln theta| + 1.3 bounds it),
    plus 2 ulps (4 U32) for pow/exp2 and a reciprocal. The angle p * theta_i adds one rounding, and sin/cos
    of a large angle on a GPU (the approximate instructions reduce the argument by a float32 product with
    1/(2 pi)) up to 2 ulps more of the angle. So the error is at most p * theta_i * (8 + 3 |ln theta_i|) * U32:
    0.03 rad at position 65535 for theta = 1, against the O(1) error of a wrong position, sign, pairing or
    base, and p * theta_i * 2^-11 of an angle formed in float16.

    `spec`: a scaled or multi-section rotation: p is each frequency's own position, theta_i the scaled
    frequency, and the scaling rule's own float32 arithmetic (a division by the factor, Llama-3's blend or
    YaRN's ramp: a few roundings of theta_i each) adds 16 U32 of theta_i."""
    theta0 = plain_theta(base, r)
    if spec is None:
        return positions.to("cpu", torch.float64).abs()[:, None] * (theta0 * (8.0 + 3.0 * theta0.log().abs()) * U32)
    extra = 0.0 if torch.equal(spec.theta, theta0) else 16.0
    per_freq = spec.theta * (8.0 + extra + 3.0 * theta0.log().abs()) * U32
    return spec.positions_per_frequency(positions).abs() * per_freq[None, :]


def row_slack(
    x: torch.Tensor, positions: torch.Tensor, style: str, base: float, r: int, spec: RopeSpec | None = None
) -> torch.Tensor:
    """Extra relative error allowed per row of x [T, H, D] (flattened to T * H): an angle error d_i moves
    the pair of frequency i by at most d_i times its norm n_i (times the magnitude m of a YaRN rotation), so
    the row moves by m sqrt(sum_i d_i^2 n_i^2), relative to the reference row's norm."""
    x = x.to(torch.float64)
    if style == "neox":
        a, b = x[..., : r // 2], x[..., r // 2 : r]
    else:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
    m = spec.magnitude if spec is not None else 1.0
    d = angle_error(positions.to("cpu"), base, r, spec)[:, None, :]  # [T, 1, r/2]
    pairs = a * a + b * b
    moved = m * ((d * d) * pairs).sum(-1).sqrt()
    norm = (m * m * pairs.sum(-1) + (x * x).sum(-1) - pairs.sum(-1)).clamp_min(0).sqrt()
    return (moved / norm.clamp_min(1e-30)).reshape(-1)


class Rope(Op):
    name = "rope"
    params = PARAMS
    written = ("q", "k")  # in-place kernels may return q and k themselves
    decode_role = "rope"
    rotates = True
    shape_symbols = {("q", 0): "T", ("k", 0): "T", ("positions", 0): "T"}  # q, k: [T, H, D], a row per token
    domain_axes = ("head_dim", "num_q_heads", "num_kv_heads", "dtype")
    structural = "rope"

    @staticmethod
    def check_params(params: Params) -> str | None:
        return check_params(params)

    def _shape(self, params: Params, D: int, hq: int, hkv: int) -> dict[str, Any]:
        D = params.get("head_dim") or D
        r = rotary_dim_of(params, D)
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
        beyond = self._beyond_original(params)
        if beyond:  # where a scaled table differs from the plain one: past the original context
            cases.append(
                Case("beyond-original", {**self._shape(params, 128, 4, 2), "T": 29, "positions": beyond}, main, 6)
            )
        if params.get("mrope_section"):  # every section's rows differ, so a frequency in the wrong row is seen
            dims = {**self._shape(params, 128, 4, 2), "T": 31, "sections": "image"}
            cases.append(Case("mrope-sections", dims, main, 7))
        if dtype is None:
            for i, dt in enumerate(("float16", "bfloat16")):
                cases.append(
                    Case(
                        f"positions-{dt}", {**self._shape(params, 64, 8, 2), "T": 37, "positions": special}, dt, 10 + i
                    )
                )
        return cases

    def _beyond_original(self, params: Params) -> list[int]:
        """Positions around and past the original context (scaled tables only; empty otherwise)."""
        rule = params.get("scaling") or "none"
        if rule == "none":
            return []
        mp = params["max_position"]
        orig = params.get("original_max_position") or mp // int(max(params["scaling_factor"], 1))
        want = [orig - 1, orig, orig + 1, 2 * orig, 3 * orig + 17, 4 * orig - 1, mp - 1, mp // 2 + 3]
        return sorted({p for p in want if 0 <= p < mp})

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
        positions = torch.tensor(pos, dtype=torch.int64)
        if params.get("mrope_section"):
            positions = self._mrope_positions(positions, len(params["mrope_section"]), d, mp, g)
        return {"q": q.to(device), "k": k.to(device), "positions": positions.to(device)}

    def _mrope_positions(self, pos: torch.Tensor, S: int, d: dict[str, Any], mp: int, g: Any) -> torch.Tensor:
        """[S, T] from the case's [T] positions. A text token has the same position in every row. The
        `relative` case shifts every row by its own offset (each pair keeps its difference in every row);
        the other cases give image-like tokens (rows t, t + row, t + column, offsets differing per row)
        and, in `sections: image`, independent rows."""
        T = pos.shape[0]
        if d.get("relative"):  # pair (m, m - delta) shifted by the same amount in each row, so it stays a pair
            shift = torch.randint(0, 64, (S, T // 2), generator=g)
            shift[0] = 0
            first = pos[0::2][None, :]
            shift = torch.where(first + shift < mp, shift, -shift).repeat_interleave(2, dim=1)
            return pos[None, :] + shift
        rows = pos[None, :].repeat(S, 1)
        if d.get("sections") == "image":
            rows = torch.randint(0, mp, (S, T), generator=g)
            rows[:, 0] = rows[0, 0]  # one text token
            return rows
        grid = torch.randint(1, 97, (S, T), generator=g)
        grid[0] = 0
        image = torch.arange(T) % 3 != 0  # every third token text (equal rows), the rest image-like
        rows[:, image] = (rows[:, image] + grid[:, image]).clamp(0, mp - 1)
        return rows

    def outputs(self, ret: Any, kw: Tensors) -> Tensors:
        if not isinstance(ret, (tuple, list)) or len(ret) != 2:
            raise TypeError(f"rope entry must return (q_out, k_out), got {type(ret).__name__}")
        return {"q": ret[0], "k": ret[1]}

    def _r(self, params: Params, D: int) -> int:
        return rotary_dim_of(params, D)

    def reference(self, kw: Tensors, params: Params) -> Expected:
        spec = spec_of(params, kw["q"].shape[-1])
        pos = kw["positions"].to("cpu")
        fp32 = kw["q"].dtype == torch.float32
        return Expected(
            {n: spec.rotate(kw[n], pos) for n in ("q", "k")},
            row_slack={n: row_slack(kw[n].to("cpu"), pos, spec.style, spec.base, spec.r, spec) for n in ("q", "k")},
            tolerance=FLOAT32_TOLERANCE if fp32 else None,
        )

    def fingerprints(self, kw: Tensors, params: Params, case: Case) -> list[tuple[str, Tensors]]:
        D = kw["q"].shape[-1]
        spec = spec_of(params, D)
        pos = kw["positions"].to("cpu")
        other = "gptj" if spec.style == "neox" else "neox"

        def both(alt: RopeSpec = spec, positions: torch.Tensor = pos, **kws: Any) -> Tensors:
            return {n: alt.rotate(kw[n], positions, **kws) for n in ("q", "k")}

        T = pos.shape[-1]
        fps = [
            ("rope-pairing", both(spec.replace(style=other))),
            ("rope-sign", both(sign=-1.0)),
            ("rope-position", both(positions=torch.zeros_like(pos))),
            ("rope-position", both(positions=torch.arange(T).expand_as(pos))),
        ]
        if spec.r != D:  # rotary_dim ignored: the whole head rotated
            whole = spec_of({**params, "rotary_dim": D, "mrope_section": None}, D)
            fps.append(("rope-frequency", both(whole, positions=pos if pos.dim() == 1 else pos[0])))
        if not torch.equal(spec.theta, plain_theta(spec.base, spec.r)) or spec.magnitude != 1.0:
            fps.append(("rope-frequency", both(spec.replace(theta=plain_theta(spec.base, spec.r), magnitude=1.0))))
        if params.get("scaling") == "llama3":  # one band edge computed from the other's factor: no blend band
            low, high = params["low_freq_factor"], params["high_freq_factor"]
            for edges in ({"low_freq_factor": high}, {"high_freq_factor": low}):
                theta = scaled_theta({**params, **edges}, spec.r)[0]
                fps.append(("rope-frequency", both(spec.replace(theta=theta))))
        if spec.sections is not None:  # every frequency rotated by the first row (text positions)
            fps.append(("rope-position", both(positions=pos[:1].expand_as(pos))))
            for alt in shifted_sections(spec.sections):  # a section boundary off by one: a frequency on the wrong row
                fps.append(("rope-position", both(spec.replace(sections=alt))))
        if kw["q"].dtype == torch.float32:  # a cos/sin table in half precision
            fps += [("precision", both(table=torch.float16)), ("precision", both(table=torch.bfloat16))]
        return fps

    def properties(self, case: Case, kw: Tensors, outs: Tensors, params: Params) -> list[Finding]:
        """Reference-free: rotations preserve norms (times YaRN's magnitude on the rotated dims);
        <R(m)q, R(n)k> depends on m - n only."""
        found = []
        tol = TOLERANCE[case.dtype]
        spec = spec_of(params, kw["q"].shape[-1])
        m2, r = spec.magnitude**2, spec.r
        for name in ("q", "k"):
            x = kw[name].to(torch.float64)
            y = outs[name].detach().to("cpu", torch.float64)
            rot = (x[..., :r] ** 2).sum(-1)
            nx, ny = (m2 * rot + (x**2).sum(-1) - rot).clamp_min(0).sqrt(), y.norm(dim=-1)
            rel = (ny - nx).abs() / nx.clamp_min(1e-30)
            bad = ~(rel <= 4 * tol)
            if bool(bad.any()):
                t, h = [int(i) for i in bad.nonzero()[0]]
                found.append(
                    Finding(
                        "norm-preservation",
                        "wrong-output",
                        f"{name}: {int(bad.sum())} of {bad.numel()} rows change their norm (a rotation keeps it"
                        f"{', times the magnitude ' + format(spec.magnitude, 'g') if spec.magnitude != 1 else ''}); "
                        f"worst relative change {float(rel.nan_to_num(float('inf')).max()):.3g} at t={t} h={h}, "
                        f"position {self._position_text(kw, t)}",
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
            dev = ((dots - ref).abs() / (max(m2, 1.0) * scale)).nan_to_num(float("inf"))
            pos = kw["positions"].to("cpu")
            angle = float(angle_error(pos, spec.base, r, spec).max())
            if float(dev.max()) > 8 * tol + 2 * angle:
                i = int(dev.amax(dim=(1, 2)).argmax())
                m, n = self._position_text(kw, 2 * i), self._position_text(kw, 2 * i + 1)
                m0, n0 = self._position_text(kw, 0), self._position_text(kw, 1)
                found.append(
                    Finding(
                        "relative-position",
                        "rope-position",
                        f"<R(m)q, R(n)k> is not a function of m - n: positions ({m}, {n}) and ({m0}, {n0}) "
                        f"(both m - n = {case.dims['relative']}) differ by {float(dev.max()):.3g} of |q||k|",
                    )
                )
        return found

    @staticmethod
    def _position_text(kw: Tensors, t: int) -> str:
        pos = kw["positions"]
        if pos.dim() == 1:
            return str(int(pos[t]))
        return "(" + ", ".join(str(int(p)) for p in pos[:, t].tolist()) + ")"

    def row_label(self, case: Case, kw: Tensors, name: str, row: int) -> str:
        H = case.dims["Hq"] if name == "q" else case.dims["Hkv"]
        t, h = divmod(row, H)
        return f"{name}[t={t}, h={h}] (position {self._position_text(kw, t)})"

    def validate_case(self, case: Case) -> str | None:
        return valid_dims(case.dims, ("T", "Hq", "Hkv", "D"))

    def bench_cases(self, params: Params, device: str, request: BenchRequest) -> list[Case]:
        hq, hkv, D = request.heads(params)
        D = max(D, rotary_dim_of(params, D))
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
        """q, k and the int64 positions (one row per M-RoPE section) read, q and k written whole; 3 FLOPs
        per rotated element (x·cos ∓ y·sin); the angles are not counted."""
        d = case.dims
        e = DTYPE_BYTES[case.dtype]
        T, H, D = int(d["T"]), int(d["Hq"]) + int(d["Hkv"]), int(d["D"])
        rows = len(params.get("mrope_section") or (0,))
        return Traffic(T * H * D * e + 8 * T * rows, T * H * D * e, 3 * T * H * self._r(params, D))

    def capture_cases(self, params: Params) -> list[Case]:
        """Several tokens at positions that are neither 0 nor the token index; with a scaled table, two
        of them past the original context (where the scaling shows in the angles)."""
        hq, hkv = capture_heads(params)
        positions = [1000, 7, 33]
        beyond = self._beyond_original(params)
        if beyond:
            positions = [beyond[4 if len(beyond) > 4 else -1], 7, beyond[min(2, len(beyond) - 1)]]
        cases = []
        for D in capture_head_dims(params):
            D = max(D, rotary_dim_of(params, D))
            dims: dict[str, Any] = {"T": 3, "Hq": hq, "Hkv": hkv, "D": D, "positions": positions}
            if params.get("mrope_section"):
                dims["sections"] = "image"
            # float32: the precision a float32 model needs (angles, a cos/sin table) is visible there
            cases.append(capture_case(dims, "float32"))
        return cases

    def capture_twin(self, dims: dict[str, Any]) -> dict[str, Any] | None:
        """One more token, at a position of its own."""
        return {**dims, "T": dims["T"] + 1, "positions": [*dims["positions"], 500]}

    def counterexample_case(
        self, case: Case, params: Params, shape: dict[str, int], index: dict[str, dict[tuple[int, ...], int]]
    ) -> Case | None:
        """T tokens, the counterexample's positions where it names them, the capture's (cycled) for the
        others; M-RoPE's [sections, T] positions are not said here."""
        if "sections" in case.dims:
            return None
        pos = list(case.dims["positions"])
        T = int(shape.get("T", case.dims["T"]))
        if T > 4096:
            return None  # a counterexample this large is not run here
        named = {t[0]: int(v) for t, v in index.get("positions", {}).items() if len(t) == 1 and 0 <= t[0] < T}
        positions = [named.get(t, pos[t % len(pos)]) for t in range(T)]
        return Case("ptx-counterexample", {**case.dims, "T": T, "positions": positions}, case.dtype, case.seed)


OP_CLASS = Rope
