"""Piecewise α-β fits: recovery of known parameters and breakpoints, interval coverage."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.calibration.efficiency import fit_efficiency
from ddlsim.calibration.fit import _irls, _robust, _scaled, fit_alpha_beta
from ddlsim.calibration.schema import CalibrationError

# Truth: an eager protocol up to 32 KiB (α 5 µs, 10 GB/s), then rendezvous (α 20 µs, 20 GB/s).
A1, B1, A2, B2, BREAK = 5e-6, 1e-10, 2e-5, 5e-11, 65536
SIZES = 2.0 ** np.arange(3, 31)  # 8 B … 1 GiB


def truth(x):
    return np.where(x < BREAK, A1 + B1 * x, A2 + B2 * x)


def draw(seed: int, noise: float, reps: int):
    rng = np.random.default_rng(seed)
    x = np.repeat(SIZES, reps)
    return x, truth(x) * np.exp(rng.normal(0.0, noise, x.size))


def test_fit_recovers_alpha_beta_and_breakpoint_within_2_percent():
    x, t = draw(seed=7, noise=0.01, reps=5)
    fit = fit_alpha_beta(x, t, seed=0)
    assert len(fit.segments) == 2
    s1, s2 = fit.segments
    assert s2.min_bytes == BREAK  # located to within one size step: here exactly
    for got, want in ((s1.alpha_s, A1), (s1.beta_s_per_B, B1), (s2.alpha_s, A2),
                      (s2.beta_s_per_B, B2)):
        assert got == pytest.approx(want, rel=0.02)
    assert fit.rel_rmse == pytest.approx(0.01, rel=0.3)
    assert fit.predict_s(BREAK * 4) == pytest.approx(truth(BREAK * 4), rel=0.02)


def test_no_spurious_breakpoint_on_a_single_regime():
    rng = np.random.default_rng(3)
    x = np.repeat(SIZES, 2)
    t = (3e-6 + 2e-10 * x) * np.exp(rng.normal(0.0, 0.05, x.size))
    fit = fit_alpha_beta(x, t, bootstrap=0)
    assert len(fit.segments) == 1
    assert fit.segments[0].beta_s_per_B == pytest.approx(2e-10, rel=0.05)


def test_95_percent_intervals_cover_the_truth_at_roughly_their_rate():
    """40 independent draws (seeds 0…39) at 5 % noise: each interval must cover its true
    parameter in at least 34 (85 %). Nominal 95 %; measured on 300 draws the percentile
    bootstrap covers 0.89–0.95 here, so 34/40 fails only if coverage fell well below nominal
    (P[Bin(40, 0.92) < 34] ≈ 5 %; the seeds are fixed, so the outcome is deterministic)."""
    hits = np.zeros(4, dtype=int)
    for seed in range(40):
        x, t = draw(seed=1000 + seed, noise=0.05, reps=2)
        fit = fit_alpha_beta(x, t, seed=seed, bootstrap=200)
        if len(fit.segments) != 2:
            continue
        s1, s2 = fit.segments
        for i, (ci, true) in enumerate(((s1.alpha_ci_s, A1), (s1.beta_ci_s_per_B, B1),
                                        (s2.alpha_ci_s, A2), (s2.beta_ci_s_per_B, B2))):
            hits[i] += ci[0] <= true <= ci[1]
    assert (hits >= 34).all(), hits


def test_fit_is_deterministic_for_a_seed():
    x, t = draw(seed=1, noise=0.05, reps=1)
    a, b = fit_alpha_beta(x, t, seed=5), fit_alpha_beta(x, t, seed=5)
    assert a == b


def test_bootstrap_refit_solves_the_same_problem_as_least_squares():
    """IRLS (used for the vectorised bootstrap) and scipy's soft-L1 least_squares minimise
    the same convex objective, so they agree on the original sample."""
    x, t = draw(seed=2, noise=0.05, reps=2)
    keep = x >= BREAK
    u, v, _, _ = _scaled(x[keep], t[keep])
    a, b, scale = _robust(u, v)
    ia, ib = _irls(u[None, :], v[None, :], scale, iters=200)
    assert ia[0] == pytest.approx(a, rel=1e-5) and ib[0] == pytest.approx(b, rel=1e-5)


@pytest.mark.parametrize("x, t, msg", [
    ([1, 2, 3], [1e-6, 2e-6], "equal length"),
    ([1, 2, 3], [1e-6, 0.0, 1e-6], "> 0"),
    ([-1, 2, 3], [1e-6, 1e-6, 1e-6], ">= 0"),
    ([8, 8, 8, 8], [1e-6, 1e-6, 1e-6, 1e-6], "distinct sizes"),
])
def test_fit_rejects_unusable_data(x, t, msg):
    with pytest.raises(CalibrationError, match=msg):
        fit_alpha_beta(x, t)


def test_efficiency_fit_recovers_saturation_curve():
    flops = 2.0 * np.array([32, 64, 128, 256, 512, 1024, 2048, 4096], float) ** 3
    rate = 1.2e12 * flops / (flops + 3e8)
    r_max, x_half, err = fit_efficiency(flops, rate)
    assert r_max == pytest.approx(1.2e12, rel=0.01)
    assert x_half == pytest.approx(3e8, rel=0.01)
    assert err < 1e-6
