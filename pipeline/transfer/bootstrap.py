"""Seeded bootstrap over comparisons: intervals of the corrected slope and correlation, and of a prediction.

Layout: :class:`BootstrapInterval`; :class:`TransferBootstrap`; :func:`bootstrap_transfer` (the one entry
point); :func:`jackknife_t_interval` (the corrected slope's interval by default); :func:`bca_interval` and
:func:`percentile_interval` (the bootstrap interval rules, shared by the three statistics);
:func:`jackknife_statistics` (leave-one-out values: the slope's standard error, the BCa acceleration).

The corrected slope's interval is by default a **jackknife t interval** (``slope_interval="jackknife_t"``):

    slope_corrected +- t_{n-2, 0.975} * se_jack,    se_jack = sqrt((n - 1) / n * sum((t_(i) - mean t_(.))^2)),

over the ``n`` leave-one-out corrected slopes ``t_(i)``; undefined (``None``) when the estimate is, when
``n < 3``, or when any leave-one-out slope is undefined (dropping one comparison leaves an offline spread no
larger than its noise: the slope is barely identified, an unbounded set as Fieller's). Why: at 40
comparisons the BCa interval of the bootstrap below covered the true slope 91.5-93.6 % of the time in
bench/transfer_simulation.py, the jackknife t interval 94.8-96.6 % (94.8-97.0 % at 20 comparisons,
95.0-96.5 % at 80; docs/transfer.md). The jackknife's variance is inflated by the ratio's right tail, which
is what a symmetric interval of a skewed ratio needs; the bootstrap-t with the BCES analytic variance
(Akritas & Bershady 1996) covered 92.3-94.9 % and a Fieller interval with the influence-function
covariance of numerator and denominator 89-91 %. It needs no resampling, so it does not depend on the seed.
``slope_interval="bootstrap"`` gives the slope the bootstrap interval of ``method``, as the other two.

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
covered the true slope 90-91 % of the time in bench/transfer_simulation.py, BCa 92-94 % (docs/transfer.md);
the correlation and the prediction use it.

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
from scipy import stats
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
    "jackknife_t_interval",
    "percentile_interval",
]

FloatArray = npt.NDArray[np.float64]
METHODS = ("bca", "percentile")
SLOPE_INTERVALS = ("jackknife_t", "bootstrap")


@dataclass(frozen=True)
class BootstrapInterval:
    """``[lo, hi]`` (both ``None`` when undefined) from ``valid`` of ``resamples`` defined resamples.

    ``kind`` is ``"bootstrap"`` or ``"jackknife"`` (then ``valid`` of ``resamples`` leave-one-out fits).
    """

    lo: float | None
    hi: float | None
    valid: int
    resamples: int
    kind: str = "bootstrap"

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


def jackknife_t_interval(estimate: float | None, jackknife: FloatArray, level: float = 0.95) -> BootstrapInterval:
    """Jackknife t interval ``estimate +- t_{n-2} se_jack`` of the ``n`` leave-one-out values (module docstring).

    Undefined when the estimate is, when ``n < 3`` or when any leave-one-out value is undefined.
    """
    n = int(jackknife.size)
    valid = int(np.isfinite(jackknife).sum())
    if estimate is None or not math.isfinite(estimate) or n < 3 or valid < n:
        return BootstrapInterval(None, None, valid, n, "jackknife")
    d = jackknife - jackknife.mean()
    se = math.sqrt((n - 1) / n * float(np.square(d).sum()))  # not BLAS's dot: the same digits on every machine
    half = float(stats.t.ppf(0.5 + level / 2.0, n - 2)) * se
    return BootstrapInterval(estimate - half, estimate + half, valid, n, "jackknife")


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
    slope_interval: str = "jackknife_t",
) -> TransferBootstrap:
    """Intervals over the comparisons (see the module docstring).

    ``candidate = (d, sd)`` adds the predicted online difference's interval; ``method`` (``"bca"`` or
    ``"percentile"``) is the bootstrap interval of the correlation and the prediction, and of the slope
    when ``slope_interval`` is ``"bootstrap"`` rather than ``"jackknife_t"``. Memory is ``O(resamples * n)``.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if slope_interval not in SLOPE_INTERVALS:
        raise ValueError(f"slope_interval must be one of {SLOPE_INTERVALS}, got {slope_interval!r}")
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
    slope = rho = math.nan
    if n:
        m = batch_moments(xa, ya, sxa, sya)
        slope, rho = float(corrected_slope_values(m[0], m[2], m[3])), float(corrected_correlation_values(*m))
    jk_slope, jk_corr = jackknife_statistics(xa, ya, sxa, sya)
    if method == "percentile":
        predicted = None if draws is None else percentile_interval(draws, level)
        slope_iv, corr_iv = percentile_interval(slopes, level), percentile_interval(corr, level)
    else:
        predicted = None
        if draws is not None and candidate is not None:
            d = float(candidate[0])
            predicted = bca_interval(draws, slope * d, jk_slope * d, level)
        slope_iv, corr_iv = bca_interval(slopes, slope, jk_slope, level), bca_interval(corr, rho, jk_corr, level)
    if slope_interval == "jackknife_t":
        slope_iv = jackknife_t_interval(slope, jk_slope, level)
    return TransferBootstrap(slope_iv, corr_iv, predicted)
