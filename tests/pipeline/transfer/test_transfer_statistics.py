"""Slopes, corrected correlation, sign agreement and tau-b against numpy, scipy and naive loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from rankwatch.pipeline.transfer.fieller import Z95
from rankwatch.pipeline.transfer.statistics import (
    correlation_corrected,
    kendall_tau_b,
    moments,
    sign_agreement,
    slope_corrected,
    slope_ols,
)


def _data(seed: int, n: int = 25) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    xi = rng.normal(0, 1, n)
    sx, sy = rng.uniform(0.1, 0.6, n), rng.uniform(0.05, 0.4, n)
    return xi + rng.normal(0, 1, n) * sx, 0.7 * xi + rng.normal(0, 0.3, n) + rng.normal(0, 1, n) * sy, sx, sy


def _naive_cov(a: list[float], b: list[float]) -> float:
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    return sum((p - ma) * (q - mb) for p, q in zip(a, b, strict=True)) / (len(a) - 1)


def _naive_tau_b(x: list[float], y: list[float]) -> float:
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif dx * dy > 0:
                concordant += 1
            else:
                discordant += 1
    return (concordant - discordant) / math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))


@pytest.mark.parametrize("seed", range(20))
def test_every_statistic_against_an_oracle(seed: int) -> None:
    x, y, sx, sy = _data(seed, n=int(np.random.default_rng(seed).integers(3, 60)))
    m = moments(x, y, sx, sy)
    assert m.s_xx == pytest.approx(np.cov(x, y)[0, 0], rel=1e-10)
    assert m.s_xy == pytest.approx(np.cov(x, y)[0, 1], rel=1e-10, abs=1e-14)
    assert slope_ols(m) == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-9)
    xs, ys = x.tolist(), y.tolist()
    vx, vy = sum(s * s for s in sx) / len(sx), sum(s * s for s in sy) / len(sy)
    den_x, den_y = _naive_cov(xs, xs) - vx, _naive_cov(ys, ys) - vy
    expected_slope = _naive_cov(xs, ys) / den_x if den_x > 0 else None
    expected_corr = _naive_cov(xs, ys) / math.sqrt(den_x * den_y) if den_x > 0 and den_y > 0 else None
    got_slope, got_corr = slope_corrected(m), correlation_corrected(m)
    assert (got_slope is None) == (expected_slope is None) and (got_corr is None) == (expected_corr is None)
    if expected_slope is not None:
        assert got_slope == pytest.approx(expected_slope, rel=1e-9)
    if expected_corr is not None:
        assert got_corr == pytest.approx(expected_corr, rel=1e-9)
    significant = [i for i in range(len(x)) if abs(y[i]) > Z95 * sy[i]]
    share, count = sign_agreement(x, y, sy)
    assert count == len(significant)
    if significant:
        assert share == pytest.approx(sum(x[i] * y[i] > 0 for i in significant) / len(significant))
    assert kendall_tau_b(x, y) == pytest.approx(_naive_tau_b(xs, ys), rel=1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_tau_b_with_ties_against_scipy_and_a_naive_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 4, 30).astype(float), rng.integers(0, 3, 30).astype(float)
    expected = _naive_tau_b(x.tolist(), y.tolist())
    assert kendall_tau_b(x, y) == pytest.approx(expected, rel=1e-12)
    assert kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y, variant="b").statistic, rel=1e-12)


def test_edge_cases_are_none_not_nan() -> None:
    one = moments([0.1], [0.2], [0.01], [0.01])
    assert (slope_ols(one), slope_corrected(one), correlation_corrected(one), kendall_tau_b([0.1], [0.2])) == (None,) * 4
    flat = moments([0.1] * 5, [0.1, 0.2, 0.3, 0.4, 0.5], [0.0] * 5, [0.0] * 5)
    assert flat.s_xx == 0.0 and slope_ols(flat) is None and slope_corrected(flat) is None
    assert kendall_tau_b([0.1] * 5, [1, 2, 3, 4, 5]) is None
    two = moments([0.0, 1.0], [0.0, 2.0], [0.0, 0.0], [0.0, 0.0])
    assert slope_ols(two) == 2.0 and slope_corrected(two) == 2.0
    noisy = moments([0.0, 1.0], [0.0, 2.0], [1.0, 1.0], [0.0, 0.0])  # S_xx = 0.5 <= mean(sx^2) = 1
    assert slope_corrected(noisy) is None and correlation_corrected(noisy) is None
    assert sign_agreement([1.0, -1.0], [0.001, 0.002], [1.0, 1.0]) == (None, 0)
    assert sign_agreement([0.0, -1.0, 1.0], [1.0, -1.0, -1.0], [0.01, 0.01, 0.01]) == (1 / 3, 3)
    # without offline noise the corrected slope is the OLS slope
    x, y, _sx, sy = _data(3)
    m = moments(x, y, np.zeros_like(x), sy)
    assert slope_corrected(m) == pytest.approx(slope_ols(m), rel=1e-12)
