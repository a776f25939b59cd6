"""A/B statistics against scipy (Welch, chi-square), naive Benjamini-Hochberg, DeLong and a jackknife."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import average_precision_score, roc_auc_score

from rankwatch.pipeline.experiments.stats import (
    ArmEstimate,
    benjamini_hochberg,
    compare_means,
    compare_values,
    mixture_multiplier,
    mixture_p_value,
    srm_test,
)
from rankwatch.pipeline.metrics.auc import ScoreHistogram
from rankwatch.pipeline.metrics.uncertainty import auc_pr_stderr as auc_pr_se
from rankwatch.pipeline.metrics.uncertainty import auc_roc_stderr as auc_roc_se


def _arm(x: np.ndarray) -> ArmEstimate:
    est = ArmEstimate.from_moments(int(x.size), float(x.sum()), float((x * x).sum()))
    assert est is not None
    return est


@pytest.mark.parametrize("seed", range(12))
def test_welch_matches_scipy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_t, n_c = int(rng.integers(2, 400)), int(rng.integers(2, 400))
    # metric-like values in [0, 1] with ties (many exact 0 and 1) and unequal variances
    t = np.clip(rng.normal(0.5, rng.uniform(0.05, 0.5), n_t), 0, 1)
    c = np.round(np.clip(rng.normal(0.45, rng.uniform(0.05, 0.5), n_c), 0, 1), 1)
    alpha = float(rng.choice([0.01, 0.05, 0.1]))
    cmp = compare_means(_arm(t), _arm(c), alpha=alpha)
    ref = stats.ttest_ind(t, c, equal_var=False)
    ci = ref.confidence_interval(1 - alpha)
    assert cmp.p_value == pytest.approx(ref.pvalue, abs=1e-9, rel=1e-9)
    assert cmp.df == pytest.approx(ref.df, rel=1e-9)
    assert cmp.diff_ci is not None
    assert cmp.diff_ci[0] == pytest.approx(ci.low, abs=1e-9)
    assert cmp.diff_ci[1] == pytest.approx(ci.high, abs=1e-9)
    assert cmp.diff == pytest.approx(t.mean() - c.mean(), abs=1e-12)


def test_lift_delta_method_matches_naive_formula_and_simulation() -> None:
    rng = np.random.default_rng(3)
    t, c = rng.normal(1.1, 0.3, 4000), rng.normal(1.0, 0.3, 5000)
    cmp = compare_means(_arm(t), _arm(c))
    vt, vc = t.var(ddof=1) / t.size, c.var(ddof=1) / c.size
    mt, mc = t.mean(), c.mean()
    assert cmp.lift == pytest.approx(mt / mc - 1, rel=1e-12)
    assert cmp.lift_se == pytest.approx(math.sqrt(vt / mc**2 + mt**2 * vc / mc**4), rel=1e-9)
    # the delta-method SE agrees with the spread of the lift over repeated samples
    lifts = [rng.normal(1.1, 0.3, 4000).mean() / rng.normal(1.0, 0.3, 5000).mean() - 1 for _ in range(400)]
    assert np.std(lifts, ddof=1) == pytest.approx(cmp.lift_se, rel=0.12)


def test_user_unit_reduces_to_requests_with_one_request_per_user_and_matches_cluster_formula() -> None:
    rng = np.random.default_rng(5)
    y = rng.uniform(0, 1, 300)
    one = ArmEstimate.from_unit_sums(300, y.sum(), 300.0, (y * y).sum(), 300.0, y.sum())
    assert one is not None
    ref = _arm(y)
    assert one.mean == pytest.approx(ref.mean, rel=1e-12)
    assert one.var_unit == pytest.approx(ref.var_unit, rel=1e-9)
    # several requests per user: the naive linearisation d_u = (Y_u - r N_u) / mean(N)
    n_u = rng.integers(1, 9, 200).astype(float)
    y_u = np.array([rng.uniform(0, 1, int(k)).sum() for k in n_u])
    est = ArmEstimate.from_unit_sums(200, y_u.sum(), n_u.sum(), (y_u**2).sum(), (n_u**2).sum(), (y_u * n_u).sum())
    assert est is not None
    r = y_u.sum() / n_u.sum()
    d = (y_u - r * n_u) / n_u.mean()
    assert est.mean == pytest.approx(r, rel=1e-12)
    assert est.var_unit == pytest.approx(d.var(ddof=1), rel=1e-9)


def test_mixture_interval_and_p_value_agree_and_shrink() -> None:
    for n in (10, 1000, 50_000, 10**7):
        m = mixture_multiplier(n, 0.05, 50_000)
        assert m > stats.norm.ppf(0.975)
        # the interval excludes 0 exactly when the always-valid p-value is below alpha
        assert mixture_p_value(m * 1.0001, n, 0.05, 50_000) < 0.05 < mixture_p_value(m * 0.9999, n, 0.05, 50_000)
    # tightest (relative to the fixed z) around N*
    ratios = {n: mixture_multiplier(n, 0.05, 50_000) for n in (5_000, 50_000, 5_000_000)}
    assert ratios[50_000] < ratios[5_000] and ratios[50_000] < ratios[5_000_000]


def test_compare_values_normal_theory() -> None:
    cmp = compare_values(0.72, 0.01, 0.70, 0.012, n_units=20_000)
    se = math.hypot(0.01, 0.012)
    assert cmp.diff_se == pytest.approx(se)
    assert cmp.p_value == pytest.approx(2 * stats.norm.sf(0.02 / se), rel=1e-12)
    assert cmp.diff_ci == pytest.approx((0.02 - 1.959963984540054 * se, 0.02 + 1.959963984540054 * se))


@pytest.mark.parametrize("seed", range(8))
def test_srm_matches_scipy_chisquare(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 5))
    shares = rng.uniform(0.5, 2, k)
    obs = rng.multinomial(int(rng.integers(10, 100_000)), shares / shares.sum())
    names = [f"a{i}" for i in range(k)]
    res = srm_test(dict(zip(names, obs.tolist(), strict=True)), dict(zip(names, shares.tolist(), strict=True)))
    ref = stats.chisquare(obs, obs.sum() * shares / shares.sum())
    assert res.p_value == pytest.approx(ref.pvalue, abs=1e-9, rel=1e-9)
    assert res.mismatch == (ref.pvalue < 0.001)


def test_srm_flags_a_broken_split_and_handles_nothing() -> None:
    assert srm_test({"c": 5200, "t": 4800}, {"c": 1, "t": 1}).mismatch
    assert not srm_test({"c": 5020, "t": 4980}, {"c": 1, "t": 1}).mismatch
    empty = srm_test({}, {"c": 1, "t": 1})
    assert empty.p_value is None and not empty.mismatch


def _naive_bh(p: list[float]) -> list[float]:
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    ranked = [p[i] for i in order]
    adj = [min(1.0, min(ranked[j] * m / (j + 1) for j in range(i, m))) for i in range(m)]
    out = [0.0] * m
    for pos, i in enumerate(order):
        out[i] = adj[pos]
    return out


@pytest.mark.parametrize("seed", range(20))
def test_benjamini_hochberg_matches_naive(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 30))
    p = rng.uniform(0, 1, m) ** rng.uniform(0.5, 4)
    p[rng.uniform(size=m) < 0.2] = p[0]  # ties
    values: list[float | None] = [float(x) for x in p]
    holes = [i for i in range(m) if rng.uniform() < 0.2]
    for i in holes:
        values[i] = None
    got = benjamini_hochberg(values)
    present = [i for i in range(m) if values[i] is not None]
    expect = _naive_bh([values[i] for i in present])  # type: ignore[misc]
    for j, i in enumerate(present):
        assert got[i] == pytest.approx(expect[j], abs=1e-12)
    assert all(got[i] is None for i in holes)


def _naive_delong(scores: np.ndarray, rel: np.ndarray) -> float:
    pos, neg = scores[rel], scores[~rel]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    return math.sqrt(v10.var(ddof=1) / pos.size + v01.var(ddof=1) / neg.size)


@pytest.mark.parametrize("seed", range(10))
def test_delong_from_histogram_matches_naive(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 300))
    rel = rng.uniform(size=n) < rng.uniform(0.1, 0.6)
    rel[:2], rel[2:4] = True, False
    scores = np.round(rng.normal(size=n) + rel, int(rng.integers(0, 3)))  # rounding makes ties
    hist = ScoreHistogram.from_pairs(scores, rel)
    assert hist.auc_roc() == pytest.approx(roc_auc_score(rel, scores), abs=1e-12)
    assert auc_roc_se(hist) == pytest.approx(_naive_delong(scores, rel), rel=1e-10)


def test_average_precision_se_matches_the_jackknife() -> None:
    rng = np.random.default_rng(11)
    n = 600
    rel = rng.uniform(size=n) < 0.25
    scores = np.round(rng.normal(size=n) + 1.2 * rel, 2)
    hist = ScoreHistogram.from_pairs(scores, rel)
    ap = average_precision_score(rel, scores)
    loo = np.array([average_precision_score(np.delete(rel, i), np.delete(scores, i)) for i in range(n)])
    jack = math.sqrt((n - 1) / n * ((loo - loo.mean()) ** 2).sum())
    assert hist.average_precision() == pytest.approx(ap, abs=1e-12)
    assert auc_pr_se(hist) == pytest.approx(jack, rel=0.05)


def test_auc_se_none_for_one_class_or_too_few() -> None:
    one = ScoreHistogram.from_pairs(np.array([0.1, 0.2, 0.3]), np.array([True, True, True]))
    assert auc_roc_se(one) is None and auc_pr_se(one) is None
    assert auc_roc_se(ScoreHistogram.empty()) is None
