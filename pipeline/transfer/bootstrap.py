"""Seeded bootstrap over comparisons: intervals of the corrected slope and correlation, and of a prediction.

Layout: :class:`BootstrapInterval`; :class:`TransferBootstrap`; :func:`bootstrap_transfer` (the one entry
point); :func:`bca_interval` and :func:`percentile_interval` (the interval rules, shared by the three
statistics); :func:`jackknife_slopes` (leave-one-out values for the acceleration).

The comparisons ``(x_i, sx_i, y_i, sy_i)`` are resampled with replacement as whole rows, ``B`` times, from
``numpy.random.default_rng(seed)``: first the ``B x n`` index matrix, then (with a candidate) ``B`` normal
draws. Each resample's moments give its corrected slope and correlation (the kernels of
:mod:`.statistics`, vectorised over the resamples).

Intervals are BCa (bias-corrected and accelerated, Efron 1987) by default: the quantiles (numpy's default
linear interpolation) of the defined resamples at the levels

    alpha_j = Phi(z0 + (z0 + z_j) / (1 - a (z0 + z_j))),    z_j = Phi^-1(0.025), Phi^-1(0.975),

with the bias correction ``z0 = Phi^-1(share of resamples below the estimate, ties counted half)`` and the
acceleration ``a = sum(d_i^3) / (6 (sum(d_i^2))^(3/2))``, ``d_i = mean(t_(.)) - t_(i)`` over the
leave-one-out jackknife values ``t_(i)`` (the undefined ones left out; ``a = 0`` when fewer than two).
``method="percentile"`` gives the plain 2.5 % / 97.5 % quantiles. Why BCa: the corrected slope is a ratio
with a noisy denominator, skewed at a few dozen comparisons; at 40 comparisons the percentile interval
covered the true slope 90-91 % of the time in bench/transfer_simulation.py, BCa 92-94 % (docs/transfer.md).

Undefined resamples (denominator ``<= 0``: the resample's offline spread is no larger than its noise) are
dropped and counted. They stand for a slope beyond any bound, of unknown sign, so when more than
``(1 - level) / 2`` of the resamples are undefined a finite percentile interval would misstate the
uncertainty and the interval is ``None`` (as Fieller's interval is unbounded when the denominator's
interval holds 0).

Prediction for a candidate with offline difference ``d`` (SE ``sd``): the point is
``slope_corrected * d``; its interval is taken from the draws ``slope_b * (d + e_b)`` with
``e_b ~ N(0, sd^2)``, joining the slope's uncertainty with the candidate's own (BCa: ``z0`` from these
draws against ``slope_corrected * d``, the acceleration from the jackknife values ``t_(i) * d``). It is an interval for the
online difference the fitted line expects, not for one experiment's measurement (that would add the
scatter around the line and the experiment's own standard error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr, ndtri

from rankwatch.pipeline.transfer.statistics import (
    batch_moments,
    corrected_correlation_values,
    corrected_slope_values,
)

__all__ = [
    "BootstrapInterval",
    "TransferBootstrap",
    "bca_interval",
    "bootstrap_transfer",
    "jackknife_statistics",
    "percentile_interval",
]

FloatArray = npt.NDArray[np.float64]
METHODS = ("bca", "percentile")


@dataclass(frozen=True)
class BootstrapInterval:
    """``[lo, hi]`` (both ``None`` when undefined) from ``valid`` of ``resamples`` defined resamples."""

    lo: float | None
    hi: float | None
    valid: int
    resamples: int

    @property
    def interval(self) -> list[float] | None:
        return None if self.lo is None or self.hi is None else [self.lo, self.hi]


@dataclass(frozen=True)
class TransferBootstrap:
    slope_corrected: BootstrapInterval
    correlation_corrected: BootstrapInterval
    predicted_online: BootstrapInterval | None  # None without a candidate


def _defined(values: FloatArray, level: float) -> FloatArray | None:
    """The finite values, or None when more than ``(1 - level) / 2`` of them are undefined (or all are)."""
    finite = values[np.isfinite(values)]
    missing = values.size - finite.size
    if finite.size == 0 or missing > (1.0 - level) / 2.0 * values.size:
        return None
    return finite


def percentile_interval(values: FloatArray, level: float = 0.95) -> BootstrapInterval:
    """Percentile interval of the finite ``values``; undefined when more than ``(1 - level) / 2`` are not."""
    finite = _defined(values, level)
    valid = int(np.isfinite(values).sum())
    if finite is None:
        return BootstrapInterval(None, None, valid, int(values.size))
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(finite, [tail, 1.0 - tail])
    return BootstrapInterval(float(lo), float(hi), valid, int(values.size))


def bca_interval(
    values: FloatArray, estimate: float | None, jackknife: FloatArray, level: float = 0.95
) -> BootstrapInterval:
    """BCa interval of the bootstrap ``values`` around ``estimate`` (formulas in the module docstring).

    Undefined when the estimate is, when too many resamples are (as :func:`percentile_interval`), when
    every defined resample lies on one side of the estimate, or when the acceleration bends a level past 1.
    """
    finite = _defined(values, level)
    valid = int(np.isfinite(values).sum())
    undefined = BootstrapInterval(None, None, valid, int(values.size))
    if finite is None or estimate is None or not math.isfinite(estimate):
        return undefined
    below = (np.sum(finite < estimate) + 0.5 * np.sum(finite == estimate)) / finite.size
    if not 0.0 < below < 1.0:
        return undefined
    z0 = float(ndtri(below))
    jk = jackknife[np.isfinite(jackknife)]
    accel = 0.0
    if jk.size >= 2:
        d = jk.mean() - jk
        spread = float(np.sum(d * d))
        accel = float(np.sum(d * d * d)) / (6.0 * spread**1.5) if spread > 0 else 0.0
    tail = (1.0 - level) / 2.0
    zs = ndtri(np.array([tail, 1.0 - tail]))
    bend = 1.0 - accel * (z0 + zs)
    if np.any(bend <= 0):
        return undefined
    levels = ndtr(z0 + (z0 + zs) / bend)
    lo, hi = np.quantile(finite, levels)
    return BootstrapInterval(float(lo), float(hi), valid, int(values.size))


def jackknife_statistics(x: FloatArray, y: FloatArray, sx: FloatArray, sy: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Leave-one-out corrected slopes and correlations (NaN where undefined; all NaN when ``n < 3``)."""
    n = len(x)
    if n < 3:
        nan = np.full(n, np.nan)
        return nan, nan
    others = np.nonzero(~np.eye(n, dtype=bool))[1].reshape(n, n - 1)
    s_xx, s_yy, s_xy, mvx, mvy = batch_moments(x[others], y[others], sx[others], sy[others])
    return corrected_slope_values(s_xx, s_xy, mvx), corrected_correlation_values(s_xx, s_yy, s_xy, mvx, mvy)


def bootstrap_transfer(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    sx: npt.ArrayLike,
    sy: npt.ArrayLike,
    *,
    resamples: int = 2000,
    seed: int = 0,
    candidate: tuple[float, float] | None = None,
    level: float = 0.95,
    method: str = "bca",
) -> TransferBootstrap:
    """Bootstrap intervals over the comparisons (see the module docstring).

    ``candidate = (d, sd)`` adds the predicted online difference's interval; ``method`` is ``"bca"`` or
    ``"percentile"``. Memory is ``O(resamples * n)``.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    xa, ya, sxa, sya = (np.asarray(a, dtype=np.float64) for a in (x, y, sx, sy))
    n = len(xa)
    rng = np.random.default_rng(seed)
    if n == 0:
        slopes = corr = np.full(resamples, np.nan)
    else:
        idx = rng.integers(0, n, size=(resamples, n))
        s_xx, s_yy, s_xy, mvx, mvy = batch_moments(xa[idx], ya[idx], sxa[idx], sya[idx])
        slopes = corrected_slope_values(s_xx, s_xy, mvx)
        corr = corrected_correlation_values(s_xx, s_yy, s_xy, mvx, mvy)
    draws = None
    if candidate is not None:
        d, sd = (float(v) for v in candidate)
        if not (math.isfinite(d) and math.isfinite(sd) and sd >= 0):
            raise ValueError(f"candidate needs a finite diff and stderr >= 0, got {candidate}")
        draws = slopes * (d + rng.normal(0.0, 1.0, size=resamples) * sd)
    if method == "percentile":
        predicted = None if draws is None else percentile_interval(draws, level)
        return TransferBootstrap(percentile_interval(slopes, level), percentile_interval(corr, level), predicted)
    m = batch_moments(xa, ya, sxa, sya)
    slope = float(corrected_slope_values(m[0], m[2], m[3]))
    rho = float(corrected_correlation_values(*m))
    jk_slope, jk_corr = jackknife_statistics(xa, ya, sxa, sya)
    predicted = None
    if draws is not None and candidate is not None:
        d = float(candidate[0])
        predicted = bca_interval(draws, slope * d, jk_slope * d, level)
    return TransferBootstrap(bca_interval(slopes, slope, jk_slope, level), bca_interval(corr, rho, jk_corr, level),
                             predicted)  # fmt: skip
