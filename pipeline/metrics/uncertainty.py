r"""Standard errors and confidence intervals of every value rankwatch reports (pure functions).

Public functions (the A/B code uses them per arm):

- :func:`shifted_moments` -- per-group count, sum and centred sum of squares ``M2`` of values, stable;
- :func:`merge_moments` -- Chan et al.'s exact merge of two ``(n, sum, M2)``;
- :func:`mean_stderr` ``(n, total, m2)`` -- SE of a per-request mean, :math:`s/\sqrt n`;
- :func:`auc_roc_stderr` ``(hist, clusters=None)`` -- DeLong's SE from a score histogram, request-clustered
  when the clustered state is given;
- :func:`auc_pr_stderr` ``(hist, clusters=None)`` -- infinitesimal-jackknife SE of average precision;
- :func:`ratio_variance` ``(n, sum_y, sum_n, sum_yy, sum_nn, sum_yn)`` -- delta-method variance of a ratio
  of sums over independent units (GAUC over groups, a user-unit A/B arm's mean);
- :func:`interval` ``(value, se, level, method)`` -- a two-sided interval, ``"logit"`` or ``"wald"``.

Every SE is None (never 0) when it is undefined: fewer than two requests, one class, a null value.

**Means.** :math:`SE = s/\sqrt n`, :math:`s^2 = M_2/(n-1)`, :math:`M_2 = \sum (x_i-\bar x)^2`. ``M2`` is
computed in two passes around a shift (one value of the group, subtracted exactly by Sterbenz's lemma when
values are of one magnitude), never as :math:`\sum x^2 - (\sum x)^2/n`, which loses every digit when the
values are nearly equal. Parts merge with :math:`M_2 = M_{2a} + M_{2b} + \delta^2 n_a n_b / n`.

**AUC-ROC (DeLong).** With :math:`P` positives, :math:`N` negatives and, per distinct score :math:`b`,
the placements :math:`V_{10}(b) = (neg_{<b} + \tfrac12 neg_b)/N` and :math:`V_{01}(b) = (pos_{>b} +
\tfrac12 pos_b)/P` (cumulative counts, O(distinct scores)):

.. math:: Var = \frac{S_{10}}{P} + \frac{S_{01}}{N},\quad
          S_{10} = \frac{\sum_b pos_b (V_{10}(b)-A)^2}{P-1},\quad S_{01} = \frac{\sum_b neg_b (V_{01}(b)-A)^2}{N-1}

**Clustered (Obuchowski 1997).** Items of one request are correlated. With request buckets :math:`k`
(:mod:`pipeline.metrics.clusters`), :math:`K` non-empty buckets and per-item influences :math:`\psi` (for AUC-ROC
:math:`\psi_+ = (V_{10}-A)/P`, :math:`\psi_- = (V_{01}-A)/N`, which makes this Obuchowski's clustered
DeLong):

.. math:: Var = \frac{K}{K-1} \sum_k \Big(\sum_{i \in k} \psi_i\Big)^2

**AUC-PR.** :math:`AP = \sum_b \frac{pos_b}{P} \frac{T_b}{T_b+F_b}` (:math:`T_b, F_b` positives and
negatives scoring :math:`\ge b`). Its influence per positive at :math:`c` is
:math:`(prec_c - AP)/P + \sum_{b\le c} pos_b F_b / (P (T_b+F_b)^2)` and per negative
:math:`-\sum_{b\le c} pos_b T_b / (P (T_b+F_b)^2)` (derivatives of the weighted AP); the variance is the
clustered sum above, or :math:`\frac{n}{n-1}\sum_i \psi_i^2` without clusters.

**Intervals.** ``"logit"``: :math:`\operatorname{expit}(\operatorname{logit} v \pm z\,SE/(v(1-v)))`, for
values in (0, 1) (all of rankwatch's); it stays inside [0, 1] and follows the skew of small samples.
``"wald"``: :math:`v \pm z\,SE`. The coverage simulation (bench/coverage.py, docs/metrics.md) decides.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Literal

import numpy as np
import numpy.typing as npt

from rankwatch.pipeline.metrics.auc import ScoreHistogram
from rankwatch.pipeline.metrics.clusters import ClusterHistograms

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
IntervalMethod = Literal["logit", "wald"]


# -- means ----------------------------------------------------------------------------------------------
def shifted_moments(
    values: FloatArray, group: IntArray, n_groups: int
) -> tuple[IntArray, FloatArray, FloatArray]:
    """``(count, total, m2)`` per group, ``m2`` by a shifted two-pass sum (stable for near-equal values)."""
    return shifted_moments_counted(values, group, n_groups, np.bincount(group, minlength=n_groups))


def shifted_moments_counted(
    values: FloatArray, group: IntArray, n_groups: int, count: IntArray
) -> tuple[IntArray, FloatArray, FloatArray]:
    """:func:`shifted_moments` given ``count = np.bincount(group, minlength=n_groups)``, for a caller
    with several value arrays over the same groups (the metrics of one aggregation) that counts once.

    With one group every shift and mean is one number: they are broadcast instead of gathered per value
    (the same arithmetic, so the same results).
    """
    if n_groups == 1 and values.size:
        d = values - values[-1]  # shift[group] holds the last value written
        d_sum = np.bincount(group, weights=d, minlength=1)
        r = d - d_sum[0] / count[0]
    else:
        shift = np.zeros(n_groups)
        shift[group] = values  # any one value of each group (the last written)
        d = values - shift[group]
        d_sum = np.bincount(group, weights=d, minlength=n_groups)
        d_mean = np.divide(d_sum, count, out=np.zeros(n_groups), where=count > 0)
        r = d - d_mean[group]
    m2 = np.bincount(group, weights=r * r, minlength=n_groups)
    total = np.bincount(group, weights=values, minlength=n_groups)
    return count.astype(np.int64), total.astype(np.float64), m2.astype(np.float64)


def merge_moments(
    a: tuple[int, float, float], b: tuple[int, float, float]
) -> tuple[int, float, float]:
    """Chan's exact merge of two ``(n, sum, M2)`` triples."""
    na, ta, ma = a
    nb, tb, mb = b
    if na == 0:
        return nb, tb, mb
    if nb == 0:
        return na, ta, ma
    n = na + nb
    delta = tb / nb - ta / na
    return n, ta + tb, ma + mb + delta * delta * (na * nb / n)


def mean_stderr(n: int, total: float, m2: float) -> float | None:
    """:math:`\\sqrt{M_2/(n-1)}/\\sqrt n`; None below two values or when undefined."""
    if n < 2 or not math.isfinite(total) or not math.isfinite(m2):
        return None
    return math.sqrt(max(m2, 0.0) / (n - 1) / n)


def ratio_variance(n: int, sum_y: float, sum_n: float, sum_yy: float, sum_nn: float, sum_yn: float) -> float | None:
    r"""Delta-method variance of :math:`r = \sum_u Y_u / \sum_u N_u` over ``n`` independent units.

    The linearised contribution of unit :math:`u` is :math:`(Y_u - r N_u)/\bar N`; its sample variance
    is :math:`(s_{YY} - 2 r s_{YN} + r^2 s_{NN}) / \bar N^2` with the (co)variances over units (ddof = 1),
    and the variance of :math:`r` that over ``n``. None below two units or without weight.
    """
    if n < 2 or sum_n <= 0:
        return None
    r = sum_y / sum_n
    mean_n = sum_n / n
    s_yy = (sum_yy - sum_y * sum_y / n) / (n - 1)
    s_nn = (sum_nn - sum_n * sum_n / n) / (n - 1)
    s_yn = (sum_yn - sum_y * sum_n / n) / (n - 1)
    return max(s_yy - 2.0 * r * s_yn + r * r * s_nn, 0.0) / (mean_n * mean_n) / n


# -- influence functions of the pooled AUCs -------------------------------------------------------------
def _dot(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    r""":math:`\sum_i a_i b_i` by numpy's own (pairwise, single-threaded) summation, not ``np.dot``.

    ``np.dot`` calls BLAS, whose dot product above a size is split over its threads, so the last digits of an
    SE depended on how many cores the machine has (OpenBLAS: 5 of the 14 SEs of a replay's result document
    changed with ``OPENBLAS_NUM_THREADS=1``); and the threads spin after each call (0.3 s of CPU in that
    document, taken from the other processes). The same inputs now give the same SE on every machine.
    """
    return float(np.multiply(a, b, dtype=np.float64).sum())


def _auc_roc_influence(pos: IntArray, neg: IntArray) -> tuple[float, FloatArray, FloatArray]:
    p, n = float(pos.sum()), float(neg.sum())
    v10 = (np.cumsum(neg) - neg + 0.5 * neg) / n
    v01 = (p - np.cumsum(pos) + 0.5 * pos) / p
    auc = _dot(pos, v10) / p
    return auc, (v10 - auc) / p, (v01 - auc) / n


def _auc_pr_influence(pos: IntArray, neg: IntArray) -> tuple[float, FloatArray, FloatArray]:
    p = float(pos.sum())
    tp = np.cumsum(pos[::-1])[::-1].astype(np.float64)  # positives scoring >= b
    fp = np.cumsum(neg[::-1])[::-1].astype(np.float64)
    prec = tp / (tp + fp)
    ap = _dot(pos, prec) / p
    sq = (tp + fp) ** 2
    a = np.cumsum(pos * fp / sq) / p
    b = np.cumsum(pos * tp / sq) / p
    return ap, (prec - ap) / p + a, -b


def delong_variance(hist: ScoreHistogram) -> float | None:
    """DeLong's variance of the pooled AUC-ROC (items independent); None unless ``P, N >= 2``."""
    pos, neg = hist.pos, hist.neg
    p, n = int(pos.sum()), int(neg.sum())
    if p < 2 or n < 2:
        return None
    _, psi_pos, psi_neg = _auc_roc_influence(pos, neg)
    s10 = _dot(pos, (psi_pos * p) ** 2) / (p - 1)
    s01 = _dot(neg, (psi_neg * n) ** 2) / (n - 1)
    return s10 / p + s01 / n


def _item_variance(which: str, hist: ScoreHistogram) -> float | None:
    """Variance treating items as independent: DeLong for AUC-ROC, the item-level jackknife for AP."""
    pos, neg = hist.pos, hist.neg
    if int(pos.sum()) < 2 or int(neg.sum()) < 2:
        return None
    if which == "roc":
        return delong_variance(hist)
    _, psi_pos, psi_neg = _auc_pr_influence(pos, neg)
    n = float(pos.sum() + neg.sum())
    return (_dot(pos, psi_pos**2) + _dot(neg, psi_neg**2)) * n / (n - 1)


def clustered_variance(which: str, clusters: ClusterHistograms) -> float | None:
    """Request-clustered variance (``which`` = ``"roc"`` or ``"pr"``) over the cluster state's own grid."""
    _grid, at, pos, neg = clusters.pooled()  # ``at``: each bin's distinct score
    if int(pos.sum()) < 2 or int(neg.sum()) < 2:
        return None
    _, psi_pos, psi_neg = _auc_roc_influence(pos, neg) if which == "roc" else _auc_pr_influence(pos, neg)
    per_bin = clusters.pos * psi_pos[at] + clusters.neg * psi_neg[at]
    per_bucket = np.bincount(clusters.bucket, weights=per_bin)
    k = int(np.count_nonzero(np.bincount(clusters.bucket, weights=clusters.pos + clusters.neg)))
    if k < 2:
        return None
    return _dot(per_bucket, per_bucket) * k / (k - 1)


def _clustered(which: str, hist: ScoreHistogram, clusters: ClusterHistograms | None) -> float | None:
    """The larger of the clustered and the item-level variance (item-level alone without clusters).

    The clustered estimate is right when quality is correlated within requests but noisy with few
    requests; the item-level one has many more degrees of freedom. Taking the larger, as Angrist and
    Pischke (2009, section 8.2) advise for robust standard errors in small samples, covers 93-97 % on
    50- and 5,000-request windows (docs/metrics.md).
    """
    item = _item_variance(which, hist)
    if item is None or clusters is None or not clusters.n_bins:
        return item
    clustered = clustered_variance(which, clusters)
    # None with a single request bucket: a request-level uncertainty cannot be estimated from one.
    return None if clustered is None else max(item, clustered)


def auc_roc_stderr(hist: ScoreHistogram, clusters: ClusterHistograms | None = None) -> float | None:
    """SE of the pooled AUC-ROC: clustered DeLong with ``clusters``, plain DeLong without."""
    var = _clustered("roc", hist, clusters)
    return None if var is None else math.sqrt(max(var, 0.0))


def auc_pr_stderr(hist: ScoreHistogram, clusters: ClusterHistograms | None = None) -> float | None:
    """SE of the pooled AUC-PR (average precision) by the (clustered) infinitesimal jackknife."""
    var = _clustered("pr", hist, clusters)
    return None if var is None else math.sqrt(max(var, 0.0))


# -- intervals ------------------------------------------------------------------------------------------
def z_value(level: float = 0.95, *, one_sided: bool = False) -> float:
    """Standard normal quantile of a two-sided (or one-sided) confidence level."""
    if not 0.0 < level < 1.0:
        raise ValueError("level must lie in (0, 1)")
    return NormalDist().inv_cdf(level if one_sided else 0.5 + level / 2)


def interval(
    value: float | None, se: float | None, level: float = 0.95, method: IntervalMethod = "logit"
) -> tuple[float, float] | None:
    """Two-sided confidence interval; None when value or SE is null.

    ``"logit"`` needs ``0 < value < 1``; at 0 or 1 (a degenerate sample) it falls back to Wald clipped to
    [0, 1].
    """
    if value is None or se is None:
        return None
    z = z_value(level)
    if method == "logit" and 0.0 < value < 1.0:
        centre = math.log(value / (1.0 - value))
        half = z * se / (value * (1.0 - value))
        return _expit(centre - half), _expit(centre + half)
    lo, hi = value - z * se, value + z * se
    return (max(lo, 0.0), min(hi, 1.0)) if method == "logit" else (lo, hi)


def _expit(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
