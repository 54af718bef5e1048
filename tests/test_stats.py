"""kernalin_ci.bench.stats on real H200 traces (tests/data/gpu-traces, copied from ../shared/gpu-traces)."""

from pathlib import Path

import numpy as np
import pytest

from kernalin_ci.bench import stats

TRACES = Path(__file__).resolve().parent / "data" / "gpu-traces"


def variants(name):
    return np.load(TRACES / f"timings_{name}.npz")["t"]  # [rounds, variants, reps]


def long_run(t, b, h):
    m = np.median(t, axis=2)
    return float(np.median(m[:, h] / m[:, b]))


def test_dirichlet_weights_are_fixed_normalised_and_flat_on_average():
    w = stats.dirichlet_weights(7)
    assert w.shape == (stats.DRAWS, 7)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    assert (w > 0).all()
    np.testing.assert_allclose(w.mean(axis=0), 1 / 7, atol=0.01)  # Dirichlet(1,..,1): flat in expectation
    assert stats.dirichlet_weights(7) is w  # drawn once per number of rounds
    rng = np.random.default_rng([stats.SEED, 7, stats.DRAWS])
    e = rng.standard_exponential((stats.DRAWS, 7))
    np.testing.assert_allclose(w, e / e.sum(axis=1, keepdims=True))  # reproducible from the fixed seed


def test_posterior_is_the_weighted_mean_of_round_log_ratios():
    t = variants("attn")
    base, head = t[:30, 0], t[:30, 3]
    d = np.log(np.median(head, axis=1) / np.median(base, axis=1))  # robust per-round location: the median
    draws = np.sort(stats.dirichlet_weights(30) @ d)
    v = stats.compare_trace(base, head)
    assert v.ratio == pytest.approx(np.exp(np.median(draws)), rel=1e-12)
    lo, hi = stats.hdi(np.exp(draws)[None, :])
    assert v.hdi == pytest.approx((float(lo[0]), float(hi[0])))
    rho = stats.ROPE_MIN
    assert v.p_slower == pytest.approx(np.mean(draws > np.log1p(rho)))
    assert v.p_faster == pytest.approx(np.mean(draws < np.log1p(-rho)))
    assert v.p_faster + v.p_slower + v.p_equivalent == pytest.approx(1.0)


def test_hdi_is_the_narrowest_interval_holding_95_percent():
    x = np.sort(np.random.default_rng(3).lognormal(0.0, 0.6, 20000))  # skewed: HDI differs from equal tails
    lo, hi = stats.hdi(x[None, :])
    lo, hi = float(lo[0]), float(hi[0])
    inside = np.mean((x >= lo) & (x <= hi))
    assert inside == pytest.approx(0.95, abs=1e-3)
    q_lo, q_hi = np.quantile(x, [0.025, 0.975])
    assert hi - lo < q_hi - q_lo
    assert lo < q_lo  # shifted towards the mode of a right-skewed distribution


def test_aa_pair_of_identical_builds_is_equivalent():
    t = variants("attn")
    v = stats.compare_trace(t[:, 0], t[:, 1])
    assert v.verdict == "equivalent"
    assert v.p_equivalent >= 0.95
    assert v.ratio == pytest.approx(long_run(t, 0, 1), abs=2e-4)  # the steady 0.04% offset, well inside
    assert v.rope == pytest.approx((1 - stats.ROPE_MIN, 1 + stats.ROPE_MIN))
    assert v.rope_source == "minimum" and v.floor is None


@pytest.mark.parametrize("name,variant", [("attn", 2), ("attn", 5), ("rope", 2), ("copy", 2)])
def test_real_effects_are_found_in_both_directions(name, variant):
    t = variants(name)
    truth = long_run(t, 0, variant)  # about +1.1% .. +5.7%
    slower = stats.compare_trace(t[:, 0], t[:, variant], t[:, 1])
    assert slower.verdict == "slower" and slower.p_slower >= 0.95
    assert slower.hdi[0] <= truth * 1.001 and slower.hdi[1] >= truth * 0.999
    assert slower.floor is not None and slower.floor < 0.002  # identical builds: within 0.2%
    faster = stats.compare_trace(t[:, variant], t[:, 0])
    assert faster.verdict == "faster" and faster.p_faster >= 0.95
    assert faster.ratio == pytest.approx(1 / slower.ratio, rel=2e-3)


def test_fixed_rope_turns_a_small_effect_into_equivalent():
    t = variants("attn")
    v = stats.compare_trace(t[:, 0], t[:, 2], t[:, 1], rope=0.02)  # 1.1% inside +-2%
    assert v.verdict == "equivalent" and v.rope == pytest.approx((0.98, 1.02)) and v.rope_source == "fixed"


def noisier(t, s):
    """The trace on a machine s times noisier: log-time deviations from each variant's median scaled by s."""
    lt = np.log(t)
    c = np.median(lt, axis=(0, 2), keepdims=True)
    return np.exp(c + s * (lt - c))


def test_rope_follows_the_measured_floor_on_a_noisy_machine():
    t = noisier(variants("attn"), 8.0)[:10]
    v = stats.compare_trace(t[:, 0], t[:, 3], t[:, 1])
    assert v.floor > stats.ROPE_MIN  # ten rounds x8 noise: identical builds seen further apart than 0.5%
    assert v.rope_source == "floor"
    assert v.rope_half_width == pytest.approx(stats.FLOOR_MULTIPLE * v.floor)
    lo, hi = v.aa_hdi
    assert v.floor == pytest.approx(max(1 - lo, hi - 1))
    quiet = stats.compare_trace(variants("attn")[:10, 0], variants("attn")[:10, 3], variants("attn")[:10, 1])
    assert quiet.rope_source == "minimum" and quiet.floor < v.floor


def test_no_verdict_below_min_rounds():
    t = variants("attn")
    few = stats.compare_trace(t[: stats.MIN_ROUNDS - 1, 0], t[: stats.MIN_ROUNDS - 1, 5])
    assert few.verdict == "inconclusive" and few.p_slower >= 0.95  # the mass is there, the rounds are not
    enough = stats.compare_trace(t[: stats.MIN_ROUNDS, 0], t[: stats.MIN_ROUNDS, 5])
    assert enough.verdict == "slower"


def test_compare_many_equals_one_by_one():
    t = variants("rope")
    triples = [(t[:n, 0], t[:n, k], t[:n, 1] if k % 2 else None) for n in (5, 17, 200) for k in (1, 2, 3, 4)]
    many = stats.compare_many(triples)
    for (b, h, b2), v in zip(triples, many):
        one = stats.compare_trace(b, h, b2)
        assert v.verdict == one.verdict and v.rounds == one.rounds and v.rope_source == one.rope_source
        for key in ("ratio", "hdi", "p_faster", "p_slower", "p_equivalent", "rope", "floor", "aa_ratio"):
            if getattr(one, key) is None:
                assert getattr(v, key) is None
            else:
                assert getattr(v, key) == pytest.approx(getattr(one, key), rel=1e-9, abs=1e-12)  # BLAS order only
        assert v.posterior_hist["edges"] == pytest.approx(one.posterior_hist["edges"], rel=1e-9)


def test_false_alarms_on_aa_windows_stay_below_one_percent():
    """Every window of 5, 10, 20 rounds of the attn and rope A/A pairs, both orientations."""
    alarms = total = 0
    for name in ("attn", "rope"):
        t = variants(name)
        for b, h in ((0, 1), (1, 0)):
            for n in (5, 10, 20):
                idx = np.arange(t.shape[0] - n + 1)[:, None] + np.arange(n)[None, :]
                d = stats.log_ratios(t[idx, b][:, :, 0::2], t[idx, h][:, :, 0::2])
                a = stats.log_ratios(t[idx, b][:, :, 0::2], t[idx, b][:, :, 1::2])
                v = stats.judge_arrays(d, a)["verdict"]
                alarms += int(np.isin(v, ("faster", "slower")).sum())
                total += len(v)
    assert total > 2000
    assert alarms / total <= 0.01


def test_looks_are_geometric():
    looks = list(stats.looks(1000))
    assert looks[:6] == [5, 6, 8, 10, 12, 15]
    assert all(b > a for a, b in zip(looks, looks[1:]))
    assert len(looks) <= 25
    assert stats.is_look(5) and not stats.is_look(7) and not stats.is_look(4)


def test_verdict_json_has_the_spec_fields():
    t = variants("copy")
    j = stats.compare_trace(t[:, 0], t[:, 3], t[:, 1]).to_json()
    assert j["verdict"] == "slower"
    for key in ("ratio", "p_faster", "p_slower", "p_equivalent"):
        assert isinstance(j[key], float)
    assert len(j["hdi"]) == 2 and len(j["rope"]) == 2
    h = j["posterior_hist"]
    assert len(h["edges"]) == stats.HIST_BINS + 1
    mass = sum(d * (b - a) for d, a, b in zip(h["density"], h["edges"], h["edges"][1:]))
    assert mass == pytest.approx(1.0)
    assert stats.Verdict.from_json(j) == stats.compare_trace(t[:, 0], t[:, 3], t[:, 1])
