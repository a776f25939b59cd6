"""Across comparisons: how online differences ``y`` follow offline differences ``x``, from sample moments.

Layout: :class:`Moments` and :func:`moments` (the sufficient statistics); array kernels
:func:`ols_slope_values`, :func:`corrected_slope_values`, :func:`corrected_correlation_values` (NaN where
undefined; the bootstrap calls them on a whole batch of resamples); scalar results :func:`slope_ols`,
:func:`slope_corrected`, :func:`correlation_corrected` (``None`` where undefined); :func:`sign_agreement`;
:func:`kendall_tau_b`.

With ``n`` comparisons, ``x_i`` the offline difference with SE ``sx_i``, ``y_i`` the online one with SE
``sy_i``, and sample (co)variances with ``ddof = 1``:

- ``slope_ols = S_xy / S_xx`` (undefined when ``S_xx = 0``, i.e. all ``x`` equal, or ``n < 2``);
- ``slope_corrected = S_xy / (S_xx - mean(sx^2))``: the BCES errors-in-variables slope (Akritas & Bershady
  1996). ``S_xx`` estimates ``Var(true x) + mean(sx^2)``, so ``S_xy / S_xx`` is attenuated toward 0 by the
  reliability ``Var(true x) / S_xx``; subtracting the known noise removes the bias. Noise in ``y`` does not
  bias the slope (independent of ``x``'s). Undefined when the denominator is ``<= 0`` (the spread of the
  offline differences is no larger than their noise);
- ``correlation_corrected = S_xy / sqrt((S_xx - mean(sx^2)) (S_yy - mean(sy^2)))``: the correlation of the
  true differences (Spearman's disattenuation). Undefined when either factor is ``<= 0``; not clipped to
  ``[-1, 1]``: a value beyond means the standard errors overstate the noise or ``n`` is small;
- ``sign_agreement``: over the comparisons whose online interval excludes 0 (``|y| > z sy``), the share
  with ``x y > 0`` (an offline difference of exactly 0 has no sign and counts as a disagreement);
- ``kendall_tau`` = Kendall's tau-b of ``x`` and ``y`` (ties in either handled), from scipy.

Why moments: the slopes and the correlation are functions of six numbers; a bootstrap resample only needs
those six recomputed, which vectorises over thousands of resamples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from rankwatch.pipeline.transfer.fieller import Z95

__all__ = [
    "Moments",
    "corrected_correlation_values",
    "corrected_slope_values",
    "correlation_corrected",
    "kendall_tau_b",
    "moments",
    "ols_slope_values",
    "sign_agreement",
    "slope_corrected",
    "slope_ols",
]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Moments:
    """Sample moments of ``n`` comparisons (``ddof = 1``; NaN when ``n < 2``)."""

    n: int
    s_xx: float
    s_yy: float
    s_xy: float
    mean_vx: float  # mean(sx^2)
    mean_vy: float  # mean(sy^2)


def batch_moments(x: FloatArray, y: FloatArray, sx: FloatArray, sy: FloatArray) -> tuple[FloatArray, ...]:
    """``(S_xx, S_yy, S_xy, mean sx^2, mean sy^2)`` along the last axis (one row per resample).

    Rows are shifted by their first value before the two-pass variance, so a row of equal values has
    ``S = 0`` exactly (not a rounding residue that would turn into a huge slope).
    """
    n = x.shape[-1]
    if n < 2:
        nan = np.full(x.shape[:-1], np.nan)
        return nan, nan, nan, np.mean(sx * sx, axis=-1), np.mean(sy * sy, axis=-1)
    dx = x - x[..., :1]
    dy = y - y[..., :1]
    dx = dx - dx.mean(axis=-1, keepdims=True)
    dy = dy - dy.mean(axis=-1, keepdims=True)
    s_xx = (dx * dx).sum(axis=-1) / (n - 1)
    s_yy = (dy * dy).sum(axis=-1) / (n - 1)
    s_xy = (dx * dy).sum(axis=-1) / (n - 1)
    return s_xx, s_yy, s_xy, np.mean(sx * sx, axis=-1), np.mean(sy * sy, axis=-1)


def moments(x: npt.ArrayLike, y: npt.ArrayLike, sx: npt.ArrayLike, sy: npt.ArrayLike) -> Moments:
    """The :class:`Moments` of the comparisons ``(x_i, sx_i, y_i, sy_i)``."""
    arrays = [np.asarray(a, dtype=np.float64) for a in (x, y, sx, sy)]
    values = batch_moments(*arrays)
    return Moments(len(arrays[0]), *(float(v) for v in values))


def ols_slope_values(s_xx: FloatArray, s_xy: FloatArray) -> FloatArray:
    """``S_xy / S_xx``, NaN where ``S_xx <= 0`` or undefined."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s_xx > 0, s_xy / s_xx, np.nan)


def corrected_slope_values(s_xx: FloatArray, s_xy: FloatArray, mean_vx: FloatArray) -> FloatArray:
    """``S_xy / (S_xx - mean(sx^2))``, NaN where the denominator is ``<= 0`` or undefined."""
    den = s_xx - mean_vx
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, s_xy / den, np.nan)


def corrected_correlation_values(
    s_xx: FloatArray, s_yy: FloatArray, s_xy: FloatArray, mean_vx: FloatArray, mean_vy: FloatArray
) -> FloatArray:
    """``S_xy / sqrt((S_xx - mean(sx^2)) (S_yy - mean(sy^2)))``, NaN where either factor is ``<= 0``."""
    dx, dy = s_xx - mean_vx, s_yy - mean_vy
    ok = (dx > 0) & (dy > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, s_xy / np.sqrt(np.where(ok, dx * dy, 1.0)), np.nan)


def _scalar(value: FloatArray | float) -> float | None:
    v = float(value)
    return v if math.isfinite(v) else None


def slope_ols(m: Moments) -> float | None:
    """OLS slope of online on offline differences; ``None`` when all ``x`` are equal or ``n < 2``."""
    return _scalar(ols_slope_values(np.asarray(m.s_xx, np.float64), np.asarray(m.s_xy, np.float64)))


def slope_corrected(m: Moments) -> float | None:
    """Errors-in-variables (BCES) slope; ``None`` when ``S_xx - mean(sx^2) <= 0`` or ``n < 2``."""
    return _scalar(corrected_slope_values(*(np.asarray(v, np.float64) for v in (m.s_xx, m.s_xy, m.mean_vx))))


def correlation_corrected(m: Moments) -> float | None:
    """Disattenuated correlation; ``None`` when either noise-corrected variance is ``<= 0`` or ``n < 2``."""
    value = corrected_correlation_values(*(np.asarray(v, np.float64) for v in (m.s_xx, m.s_yy, m.s_xy, m.mean_vx, m.mean_vy)))
    return _scalar(value)


def sign_agreement(
    x: npt.ArrayLike, y: npt.ArrayLike, sy: npt.ArrayLike, z: float = Z95
) -> tuple[float | None, int]:
    """``(share, count)``: of the ``count`` comparisons with ``|y| > z sy``, the share with ``x y > 0``.

    The share is ``None`` when no online interval excludes 0.
    """
    xa, ya, sya = (np.asarray(a, dtype=np.float64) for a in (x, y, sy))
    significant = np.abs(ya) > z * sya
    count = int(significant.sum())
    if count == 0:
        return None, 0
    agree = int(((xa * ya) > 0)[significant].sum())
    return agree / count, count


def kendall_tau_b(x: npt.ArrayLike, y: npt.ArrayLike) -> float | None:
    """Kendall's tau-b of ``x`` and ``y``; ``None`` when ``n < 2`` or either is constant."""
    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(xa) < 2:
        return None
    return _scalar(stats.kendalltau(xa, ya, variant="b").statistic)
