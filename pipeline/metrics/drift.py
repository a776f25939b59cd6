r"""Score-distribution drift: PSI and KS of an online window's scores against the baseline's quantile bins.

The baseline file keeps, per slice, the score distribution as ``B`` quantile bins (default 20): the
inner edges ``e_1 < ... < e_{B-1}`` (quantiles ``i / B`` of the slice's scores, repeated values
dropped, so a slice with few distinct scores has fewer bins) and the item count of each bin, bins being
right-closed: ``(-inf, e_1], (e_1, e_2], ..., (e_{B-1}, +inf)``. An online window bins its own scores
with the same edges, from the AUC histogram it already keeps (no extra online state). With ``E_i`` and
``A_i`` the baseline's and the window's share of items in bin ``i``, floored at ``10^{-4}`` for PSI:

.. math::

    PSI = \sum_i (A_i - E_i) \ln(A_i / E_i), \qquad KS = \max_j \Big| \sum_{i \le j} A_i - \sum_{i \le j} E_i \Big|

KS is the two-sample Kolmogorov-Smirnov statistic taken at the bin edges: never above the exact
statistic of the raw scores (``scipy.stats.ks_2samp``), and equal to it when every score of both sides is
an edge or above the last one. Scores arrive before labels, so drift shows before any click does. Where
the window's histogram was compressed (more distinct scores than ``max_distinct_scores``), a merged bin is
placed at its highest score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rankwatch.pipeline.metrics.auc import ScoreHistogram

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
PSI_FLOOR = 1e-4  # share given to an empty bin, so PSI stays finite (the usual convention)


@dataclass(frozen=True)
class ScoreDistribution:
    """Quantile bins of a slice's scores: inner ``edges`` (ascending) and ``counts`` (one more)."""

    edges: FloatArray
    counts: IntArray

    @property
    def items(self) -> int:
        return int(self.counts.sum())

    @classmethod
    def from_histogram(cls, hist: ScoreHistogram, bins: int) -> ScoreDistribution:
        """Edges at the ``i / bins`` quantiles of the histogram's scores (lower quantile: the smallest
        score whose cumulative count reaches ``i / bins`` of the items), then each bin's count."""
        weights = hist.pos + hist.neg
        if weights.size == 0:
            return cls(np.empty(0), np.zeros(1, dtype=np.int64))
        cum = np.cumsum(weights)
        targets = np.arange(1, bins) * (cum[-1] / bins)
        at = np.minimum(np.searchsorted(cum, targets, side="left"), cum.size - 1)
        edges = np.unique(hist.scores[at])
        edges = edges[edges < hist.scores[-1]]  # an edge at the maximum would leave the last bin empty
        return cls(edges, bin_counts(edges, hist.scores, weights))

    def to_dict(self) -> dict[str, Any]:
        return {"edges": self.edges.tolist(), "counts": self.counts.tolist()}

    @classmethod
    def from_dict(cls, data: Any) -> ScoreDistribution:
        """Parse and check ``{"edges": [...], "counts": [...]}``; ``ValueError`` if malformed."""
        if not isinstance(data, dict):
            raise ValueError("score_distribution must be an object")
        edges = np.asarray(data.get("edges", []), dtype=np.float64)
        counts = np.asarray(data.get("counts", []), dtype=np.int64)
        if edges.ndim != 1 or counts.shape != (edges.size + 1,):
            raise ValueError("score_distribution needs one more count than edges")
        if not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0) or np.any(counts < 0):
            raise ValueError("score_distribution edges must ascend and counts be non-negative")
        return cls(edges, counts)


def bin_counts(edges: FloatArray, scores: npt.ArrayLike, weights: npt.ArrayLike | None = None) -> IntArray:
    """Items per right-closed bin ``(e_{i-1}, e_i]`` (first bin from -inf, last to +inf)."""
    index = np.searchsorted(edges, np.asarray(scores, dtype=np.float64), side="left")
    out = np.bincount(index, weights=weights, minlength=edges.size + 1)
    return np.rint(out).astype(np.int64)


def psi(expected: npt.ArrayLike, actual: npt.ArrayLike, floor: float = PSI_FLOOR) -> float | None:
    """Population stability index of two bin-count vectors (None when a side is empty)."""
    e, a = _shares(expected, actual)
    if e is None or a is None:
        return None
    e, a = np.maximum(e, floor), np.maximum(a, floor)
    return float(np.sum((a - e) * np.log(a / e)))


def ks(expected: npt.ArrayLike, actual: npt.ArrayLike) -> float | None:
    """Largest gap between the two cumulative shares at the bin edges (None when a side is empty)."""
    e, a = _shares(expected, actual)
    if e is None or a is None:
        return None
    return float(np.max(np.abs(np.cumsum(a) - np.cumsum(e))))


def _shares(expected: npt.ArrayLike, actual: npt.ArrayLike) -> tuple[FloatArray | None, FloatArray | None]:
    e = np.asarray(expected, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if e.shape != a.shape:
        raise ValueError("both sides need the same bins")
    te, ta = float(e.sum()), float(a.sum())
    return (e / te if te > 0 else None), (a / ta if ta > 0 else None)


@dataclass(frozen=True)
class ScoreDrift:
    """PSI and KS of one window's scores against a baseline slice, and the window's item count."""

    psi: float | None
    ks: float | None
    items: int


def score_drift(baseline: ScoreDistribution, window: ScoreHistogram) -> ScoreDrift:
    """Bin the window's histogram with the baseline's edges and compare (see the module formulas)."""
    actual = bin_counts(baseline.edges, window.scores, window.pos + window.neg)
    value_psi, value_ks = psi(baseline.counts, actual), ks(baseline.counts, actual)
    if value_psi is not None and not math.isfinite(value_psi):
        value_psi = None
    return ScoreDrift(value_psi, value_ks, int(actual.sum()))
