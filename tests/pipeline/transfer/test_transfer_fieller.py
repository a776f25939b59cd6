"""Fieller's interval of y / x against an independent brute-force scan of the defining inequality."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.pipeline.transfer.fieller import Z95, fieller_interval


def _scan(y: float, sy: float, x: float, sx: float, lo: float, hi: float) -> tuple[float, float]:
    """Smallest and largest r on a fine grid around [lo, hi] with (y - r x)^2 <= z^2 (sy^2 + r^2 sx^2)."""
    width = hi - lo
    grid = np.linspace(lo - width, hi + width, 400_001)
    inside = grid[(y - grid * x) ** 2 <= Z95**2 * (sy**2 + grid**2 * sx**2)]
    return float(inside.min()), float(inside.max())


@pytest.mark.parametrize("seed", range(40))
def test_bounded_interval_matches_a_grid_scan(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sx, sy = rng.uniform(0.001, 0.01), rng.uniform(0.001, 0.01)
    x = rng.choice([-1, 1]) * rng.uniform(2.2, 8.0) * sx  # |x| > z sx: bounded
    y = rng.normal(0, 0.02)
    f = fieller_interval(y, sy, x, sx)
    assert f.bounded and f.ratio == pytest.approx(y / x) and f.lo <= f.ratio <= f.hi
    lo, hi = _scan(y, sy, x, sx, f.lo, f.hi)
    step = 3 * (f.hi - f.lo) / 400_000
    assert abs(lo - f.lo) <= step and abs(hi - f.hi) <= step


def test_unbounded_when_the_offline_interval_holds_zero() -> None:
    for x, sx in ((0.0, 0.01), (0.0, 0.0), (Z95 * 0.01, 0.01), (-0.015, 0.01)):
        f = fieller_interval(0.3, 0.1, x, sx)
        assert not f.bounded and f.ratio is None and f.lo is None and f.hi is None
    assert fieller_interval(0.3, 0.1, Z95 * 0.01 * 1.0001, 0.01).bounded
    # beyond the boundary the defining inequality holds for arbitrarily large |r|: no finite interval
    x, sx, y, sy = 0.01, 0.01, 0.003, 0.001
    r = 1e9
    assert (y - r * x) ** 2 <= Z95**2 * (sy**2 + r**2 * sx**2)


def test_exact_values_without_noise_and_the_quadratic_roots() -> None:
    f = fieller_interval(0.5, 0.0, 2.0, 0.0)
    assert (f.ratio, f.lo, f.hi) == (0.25, 0.25, 0.25)
    y, sy, x, sx = 0.02, 0.004, 0.05, 0.01
    a, b, c = x**2 - Z95**2 * sx**2, -2 * x * y, y**2 - Z95**2 * sy**2
    roots = sorted(np.roots([a, b, c]).real)
    f = fieller_interval(y, sy, x, sx)
    assert [f.lo, f.hi] == pytest.approx(roots, rel=1e-12)
