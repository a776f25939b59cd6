"""The vectorised bootstrap against a naive loop (same seed, same draws), the slope's jackknife t interval
against a naive leave-one-out loop, their seeding and their null rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm
from scipy.stats import t as student_t

from rankwatch.pipeline.transfer.bootstrap import bootstrap_transfer


def _data(seed: int, n: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    xi = rng.normal(0, 1, n)
    sx, sy = rng.uniform(0.1, 0.5, n), rng.uniform(0.05, 0.3, n)
    return xi + rng.normal(0, 1, n) * sx, 0.8 * xi + rng.normal(0, 0.2, n) + rng.normal(0, 1, n) * sy, sx, sy


def _cov(a: list[float], b: list[float]) -> float:
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    return sum((p - ma) * (q - mb) for p, q in zip(a, b, strict=True)) / (len(a) - 1)


def _stats(rows: list[tuple[float, float, float, float]]) -> tuple[float, float]:
    xs, ys = [r[0] for r in rows], [r[1] for r in rows]
    vx, vy = sum(r[2] ** 2 for r in rows) / len(rows), sum(r[3] ** 2 for r in rows) / len(rows)
    dx, dy = _cov(xs, xs) - vx, _cov(ys, ys) - vy
    slope = _cov(xs, ys) / dx if dx > 0 else math.nan
    corr = _cov(xs, ys) / math.sqrt(dx * dy) if dx > 0 and dy > 0 else math.nan
    return slope, corr


def _naive(x, y, sx, sy, B: int, seed: int, candidate: tuple[float, float]) -> dict[str, list[float] | None]:
    """Loop bootstrap: one resample at a time; percentile and BCa by the textbook formulas."""
    rng = np.random.default_rng(seed)
    rows = list(zip(x.tolist(), y.tolist(), sx.tolist(), sy.tolist(), strict=True))
    n = len(rows)
    draws = [_stats([rows[i] for i in rng.integers(0, n, size=n)]) for _ in range(B)]
    slopes, corrs = [d[0] for d in draws], [d[1] for d in draws]
    noise = [rng.normal() * candidate[1] for _ in range(B)]
    preds = [s * (candidate[0] + e) for s, e in zip(slopes, noise, strict=True)]
    est_slope, est_corr = _stats(rows)
    jk = [_stats(rows[:i] + rows[i + 1:]) for i in range(n)]

    def percentile(values: list[float]) -> list[float] | None:
        ok = [v for v in values if not math.isnan(v)]
        if B - len(ok) > 0.025 * B:
            return None
        return [float(np.quantile(ok, 0.025)), float(np.quantile(ok, 0.975))]

    def bca(values: list[float], est: float, jack: list[float]) -> list[float] | None:
        ok = [v for v in values if not math.isnan(v)]
        if B - len(ok) > 0.025 * B:
            return None
        z0 = norm.ppf((sum(v < est for v in ok) + 0.5 * sum(v == est for v in ok)) / len(ok))
        jv = [v for v in jack if not math.isnan(v)]
        mean = sum(jv) / len(jv)
        a = sum((mean - v) ** 3 for v in jv) / (6 * sum((mean - v) ** 2 for v in jv) ** 1.5)
        levels = [norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z))) for z in (norm.ppf(0.025), norm.ppf(0.975))]
        return [float(np.quantile(ok, q)) for q in levels]

    return {
        "percentile": [percentile(slopes), percentile(corrs), percentile(preds)],
        "bca": [bca(slopes, est_slope, [j[0] for j in jk]), bca(corrs, est_corr, [j[1] for j in jk]),
                bca(preds, est_slope * candidate[0], [j[0] * candidate[0] for j in jk])],
    }  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("method", ["bca", "percentile"])
def test_vectorised_equals_a_naive_loop(seed: int, method: str) -> None:
    x, y, sx, sy = _data(seed, n=12 + seed)
    candidate = (0.7, 0.2)
    got = bootstrap_transfer(x, y, sx, sy, resamples=150, seed=seed, candidate=candidate, method=method,
                             slope_interval="bootstrap")  # fmt: skip
    expected = _naive(x, y, sx, sy, 150, seed, candidate)[method]
    for interval, want in zip((got.slope_corrected, got.correlation_corrected, got.predicted_online), expected,
                              strict=True):  # fmt: skip
        if want is None:
            assert interval.interval is None
        else:
            assert interval.interval == pytest.approx(want, rel=1e-9, abs=1e-12)


def _naive_jackknife_t(x, y, sx, sy) -> list[float] | None:
    """Textbook jackknife: leave each comparison out, se^2 = (n-1)/n sum (t_i - mean)^2, t with n - 2 df."""
    rows = list(zip(x.tolist(), y.tolist(), sx.tolist(), sy.tolist(), strict=True))
    n = len(rows)
    est = _stats(rows)[0]
    loo = [_stats(rows[:i] + rows[i + 1:])[0] for i in range(n)]
    if math.isnan(est) or any(math.isnan(v) for v in loo):
        return None
    mean = sum(loo) / n
    se = math.sqrt((n - 1) / n * sum((v - mean) ** 2 for v in loo))
    q = student_t.ppf(0.975, n - 2)
    return [est - q * se, est + q * se]


@pytest.mark.parametrize("seed", range(6))
def test_slope_jackknife_t_equals_a_naive_loop(seed: int) -> None:
    x, y, sx, sy = _data(seed, n=5 + 3 * seed)
    got = bootstrap_transfer(x, y, sx, sy, resamples=50, seed=seed).slope_corrected
    want = _naive_jackknife_t(x, y, sx, sy)
    assert got.kind == "jackknife" and got.resamples == len(x)
    if want is None:
        assert got.interval is None
    else:
        assert got.interval == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_slope_jackknife_t_is_null_when_a_leave_one_out_slope_is() -> None:
    # four comparisons; without the outlier the offline spread (0.01 apart) is below its noise (sx = 0.05)
    x, y = np.array([0.0, 0.01, 0.02, 1.0]), np.array([0.0, 0.01, 0.02, 1.0])
    sx, sy = np.full(4, 0.05), np.full(4, 0.01)
    got = bootstrap_transfer(x, y, sx, sy, resamples=50).slope_corrected
    assert _naive_jackknife_t(x, y, sx, sy) is None
    assert got.interval is None and got.valid == 3 and got.resamples == 4


def test_same_seed_same_intervals_other_seed_others() -> None:
    x, y, sx, sy = _data(1, 30)
    a = bootstrap_transfer(x, y, sx, sy, seed=5, candidate=(1.0, 0.1))
    b = bootstrap_transfer(x, y, sx, sy, seed=5, candidate=(1.0, 0.1))
    c = bootstrap_transfer(x, y, sx, sy, seed=6, candidate=(1.0, 0.1))
    assert a == b and a.correlation_corrected != c.correlation_corrected
    assert a.slope_corrected == c.slope_corrected  # the jackknife does not resample
    assert a.correlation_corrected.valid == a.correlation_corrected.resamples == 2000
    lo, hi = a.slope_corrected.interval
    assert lo < 0.8 < hi  # the data's true slope
    boot = bootstrap_transfer(x, y, sx, sy, seed=5, slope_interval="bootstrap").slope_corrected
    assert boot.kind == "bootstrap" and boot.valid == boot.resamples == 2000


def test_too_many_undefined_resamples_give_no_interval() -> None:
    # n = 2: a resample drawing the same comparison twice has S_xx = 0, about half of them
    boot = bootstrap_transfer([0.0, 1.0], [0.0, 1.0], [0.01, 0.01], [0.01, 0.01], resamples=400, seed=0,
                              candidate=(1.0, 0.0))  # fmt: skip
    assert boot.slope_corrected.interval is None and boot.slope_corrected.kind == "jackknife"
    assert 150 < boot.correlation_corrected.valid < 250 and boot.correlation_corrected.interval is None
    assert boot.predicted_online is not None and boot.predicted_online.interval is None
    one = bootstrap_transfer([0.3], [0.1], [0.01], [0.01], resamples=10)
    assert one.slope_corrected.interval is None and one.slope_corrected.valid == 0
    assert one.correlation_corrected.valid == 0
    assert one.predicted_online is None


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_transfer([1.0], [1.0], [0.0], [0.0], resamples=0)
    with pytest.raises(ValueError, match="candidate"):
        bootstrap_transfer([1.0], [1.0], [0.0], [0.0], candidate=(math.nan, 0.1))
    with pytest.raises(ValueError, match="method"):
        bootstrap_transfer([1.0], [1.0], [0.0], [0.0], method="t")
    with pytest.raises(ValueError, match="slope_interval"):
        bootstrap_transfer([1.0], [1.0], [0.0], [0.0], slope_interval="fieller")
