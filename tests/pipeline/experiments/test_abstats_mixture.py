"""The always-valid (normal-mixture) intervals and p-values that decide the default verdict, against an
independent oracle and an A/A simulation with continuous looks.

Oracle: the mixture likelihood ratio of Robbins (1970) as Johari et al. (2017, "Peeking at A/B tests")
define the mSPRT, integrated numerically with scipy instead of the closed form the code uses: an estimate
``d ~ N(theta, se^2)``, a mixing distribution ``theta ~ N(0, tau^2)``, ``eta = tau^2 / se^2`` (the code's
``N rho^2``), ``Lambda(z) = integral phi(t; 0, eta) exp(t z - t^2 / 2) dt`` in units of ``se``; p-value
``min(1, 1 / Lambda)``; the confidence sequence is every ``theta_0`` the test at ``theta_0`` does not reject,
so its half-width in SEs solves ``Lambda(m) = 1 / alpha`` (found with ``brentq``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from rankwatch.pipeline.experiments.stats import (
    ArmEstimate,
    compare_means,
    mixture_multiplier,
    mixture_p_value,
    mixture_rho2,
)


def oracle_log_lambda(z: float, eta: float) -> float:
    """log of the mixture likelihood ratio by quadrature (no closed form); scaled by the integrand's value
    at its peak so that large ``z`` does not overflow."""
    sd = math.sqrt(eta)

    def log_integrand(t: float) -> float:
        return float(stats.norm.logpdf(t, 0.0, sd)) + t * z - t * t / 2.0

    centre = eta * z / (1.0 + eta)  # where the integrand peaks: integrate around it
    width = 12.0 * math.sqrt(eta / (1.0 + eta)) + 1.0
    shift = log_integrand(centre)
    value, _ = integrate.quad(lambda t: math.exp(log_integrand(t) - shift), centre - width, centre + width,
                              epsabs=0, epsrel=1e-12, limit=200)
    return shift + math.log(value)


def oracle_p_value(z: float, eta: float) -> float:
    return min(1.0, math.exp(-oracle_log_lambda(z, eta)))


def oracle_multiplier(eta: float, alpha: float) -> float:
    return float(optimize.brentq(lambda m: oracle_log_lambda(m, eta) + math.log(alpha), 0.0, 50.0,
                                 xtol=1e-13, rtol=1e-13))


@pytest.mark.parametrize("n_units", [200, 5_000, 50_000, 2_000_000])
@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_p_value_and_interval_equal_the_integrated_mixture(n_units: int, alpha: float) -> None:
    n_star = 50_000
    eta = n_units * mixture_rho2(alpha, n_star)
    for z in (0.0, 0.5, 1.96, 2.8, 3.5, 5.0):
        want = oracle_p_value(z, eta)
        assert mixture_p_value(z, n_units, alpha, n_star) == pytest.approx(want, rel=1e-8, abs=1e-300), z
        assert mixture_p_value(-z, n_units, alpha, n_star) == pytest.approx(want, rel=1e-8, abs=1e-300), -z
    assert mixture_multiplier(n_units, alpha, n_star) == pytest.approx(oracle_multiplier(eta, alpha), rel=1e-8)


def test_reference_values() -> None:
    """Fixed numbers (computed once with the quadrature above) that pin the default tuning."""
    # rho^2 = (-2 ln a + ln(1 - 2 ln a)) / N* at a = 0.05, N* = 50,000
    assert mixture_rho2(0.05, 50_000) == pytest.approx((5.991464547107979 + math.log(6.991464547107979)) / 50_000,
                                                       rel=1e-15)
    eta = 50_000 * mixture_rho2(0.05, 50_000)
    assert eta == pytest.approx(7.9361546, rel=1e-7)
    assert oracle_multiplier(eta, 0.05) == pytest.approx(mixture_multiplier(50_000, 0.05, 50_000), rel=1e-9)
    # quadrature: half-width 3.035209 SE at N* (vs 1.96 fixed); z = 3 at N* gives p = 0.054948
    assert mixture_multiplier(50_000, 0.05, 50_000) == pytest.approx(3.035209, abs=1e-6)
    assert mixture_p_value(3.0, 50_000, 0.05, 50_000) == pytest.approx(0.054948, abs=1e-6)
    assert oracle_p_value(3.0, eta) == pytest.approx(0.054948, abs=1e-6)


def test_the_tuning_makes_the_boundary_nearly_tightest_at_n_star() -> None:
    """``rho^2`` is the closed-form approximation of the mixing variance that minimises the half-width at
    ``N*`` (Howard et al. 2021, eq. 14): the numerical optimum is within 1 % of it and the half-width
    within 0.1 %."""
    alpha, n_star = 0.05, 50_000

    def half(log_eta: float) -> float:
        return oracle_multiplier(math.exp(log_eta), alpha)

    best = optimize.minimize_scalar(half, bounds=(-3.0, 6.0), method="bounded", options={"xatol": 1e-8})
    eta = n_star * mixture_rho2(alpha, n_star)
    assert math.exp(best.x) == pytest.approx(eta, rel=0.3)
    assert mixture_multiplier(n_star, alpha, n_star) == pytest.approx(best.fun, rel=1e-3)


def test_compare_means_uses_the_mixture_on_the_welch_z() -> None:
    rng = np.random.default_rng(5)
    t, c = rng.normal(0.31, 1.0, 3_000), rng.normal(0.25, 1.1, 2_500)
    at = ArmEstimate.from_moments(t.size, float(t.sum()), float((t * t).sum()))
    ac = ArmEstimate.from_moments(c.size, float(c.sum()), float((c * c).sum()))
    assert at is not None and ac is not None
    cmp = compare_means(at, ac)
    se = math.sqrt(t.var(ddof=1) / t.size + c.var(ddof=1) / c.size)
    d = t.mean() - c.mean()
    eta = (t.size + c.size) * mixture_rho2(0.05, 50_000)
    assert cmp.p_value_sequential == pytest.approx(oracle_p_value(d / se, eta), rel=1e-8)
    m = oracle_multiplier(eta, 0.05)
    assert cmp.diff_ci_sequential == pytest.approx((d - m * se, d + m * se), rel=1e-9)


def test_aa_with_continuous_looks_keeps_false_positives_below_alpha() -> None:
    """A/A: 2,000 experiments, each looked at after every 50 units per arm up to 10,000 (200 looks). The
    always-valid p-value ever below alpha in at most alpha of them; the fixed-horizon p-value, peeked at
    the same way, in far more (so the simulation can tell the two apart)."""
    rng = np.random.default_rng(20261202)
    alpha, sims, step, looks = 0.05, 2_000, 50, 200
    # Skewed, discrete per-unit values (like a click metric): the normal theory is only asymptotic.
    draw = lambda: rng.binomial(3, 0.2, size=(sims, step * looks)).astype(np.float64)  # noqa: E731
    t, c = draw(), draw()
    n = step * np.arange(1, looks + 1)
    idx = n - 1

    def moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, q = np.cumsum(x, axis=1)[:, idx], np.cumsum(x * x, axis=1)[:, idx]
        mean = s / n
        return mean, (q - s * mean) / (n - 1)

    (mt, vt), (mc, vc) = moments(t), moments(c)
    se = np.sqrt(vt / n + vc / n)
    z = (mt - mc) / se
    p_seq = np.vectorize(lambda zz, nn: mixture_p_value(float(zz), float(nn), alpha, 50_000))(z, 2 * n[None, :])
    p_fixed = 2 * stats.norm.sf(np.abs(z))
    seq_rate = float((p_seq.min(axis=1) < alpha).mean())
    fixed_rate = float((p_fixed.min(axis=1) < alpha).mean())
    # the Monte Carlo SE of a rate near 0.05 over 2,000 runs is 0.005: <= alpha with room to spare
    print(f"A/A false positives with 200 looks: always-valid {seq_rate:.4f}, fixed {fixed_rate:.4f}")
    assert seq_rate <= alpha, f"always-valid false positives {seq_rate:.3f} > {alpha}"
    assert fixed_rate > 3 * alpha, f"peeking at the fixed p-value gave only {fixed_rate:.3f}"
