"""From measured step times to decode tokens per second and dollars per million output tokens.

A decode step produces one token per sequence of the batch, so at batch B and step time t

    tokens/s = B / t          $/Mtok = price per GPU-hour / 3600 / (tokens/s) * 1e6

Posteriors use the benchmark's own machinery (kernalin_ci.bench.stats): per round, the median of an
instance's samples; a Bayesian bootstrap over rounds. The head/base verdict is the step-time verdict
(`faster`: less time per step, more tokens/s); the tokens/s ratio head/base has its own posterior, of
the per-round log(base_step / head_step); each side's tokens/s and $/Mtok have a posterior of the mean
step time over rounds.
"""

from __future__ import annotations

import numpy as np

from kernalin_ci.bench import stats

PER_MILLION = 1e6


def tokens_per_s(step_ms: float, batch: int) -> float:
    return batch / (step_ms / 1e3)


def usd_per_mtok(price_per_hour: float, tokens_s: float) -> float:
    return price_per_hour / 3600.0 / tokens_s * PER_MILLION


def step_ms(parts: list[tuple[float, float]]) -> float:
    """One step's time from timed parts: sum of multiplier x milliseconds. The whole model is one part
    (1 x step); the per-layer estimate is (layers / k) x a block of k layers + 1 x embedding and LM head."""
    return float(sum(m * t for m, t in parts))


def side_summary(steps: np.ndarray, batch: int, price_per_hour: float) -> dict:
    """One instance's step times [rounds, reps] (ms) -> its tokens/s and $/Mtok with 95% HDIs."""
    loc = stats.round_location(np.asarray(steps, dtype=np.float64))  # [rounds]
    draws = np.sort(stats.dirichlet_weights(loc.shape[0]) @ loc)  # posterior of the mean step time
    tps = np.sort(batch / (draws / 1e3))
    cost = np.sort(price_per_hour / 3600.0 / tps * PER_MILLION)
    med = float(stats.sorted_median(draws))
    t_lo, t_hi = stats.hdi(tps)
    c_lo, c_hi = stats.hdi(cost)
    return {
        "step_ms": med,
        "tokens_per_s": tokens_per_s(med, batch),
        "tokens_per_s_hdi": [float(t_lo), float(t_hi)],
        "usd_per_mtok": usd_per_mtok(price_per_hour, tokens_per_s(med, batch)),
        "usd_per_mtok_hdi": [float(c_lo), float(c_hi)],
    }


def point_summary(
    base: np.ndarray,
    head: np.ndarray,
    base2: np.ndarray | None,
    batch: int,
    price_per_hour: float,
    rope: float | None = None,
    rope_min: float = stats.ROPE_MIN,
) -> dict:
    """A serving point's step times, [rounds, reps] per instance -> the JSON of docs/tokens.md."""
    base, head = np.asarray(base, dtype=np.float64), np.asarray(head, dtype=np.float64)
    v = stats.compare_trace(base, head, base2, rope=rope, rope_min=rope_min)
    d = stats.log_ratios(head, base)  # log(base / head) per round = log(tokens/s head / base)
    post = stats.posterior(d[None, :])
    lo, hi = stats.hdi(np.exp(post))
    out = {
        "verdict": v.verdict,
        "step_ratio": v.ratio,
        "step_hdi": list(v.hdi),
        "tokens_per_s_ratio": float(np.exp(stats.sorted_median(post))[0]),
        "tokens_per_s_ratio_hdi": [float(lo[0]), float(hi[0])],
        "p_faster": v.p_faster,
        "p_equivalent": v.p_equivalent,
        "p_slower": v.p_slower,
        "rope": list(v.rope),
        "rope_source": v.rope_source,
        "floor": v.floor,
        "rounds": v.rounds,
        "base": side_summary(base, batch, price_per_hour),
        "head": side_summary(head, batch, price_per_hour),
    }
    out["usd_per_mtok_change"] = out["head"]["usd_per_mtok"] / out["base"]["usd_per_mtok"] - 1.0
    return out
