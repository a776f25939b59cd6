"""Standard errors of pooled AUC-ROC and AUC-PR from a :class:`pipeline.auc.ScoreHistogram`.

A stop-gap for the A/B comparisons: the uncertainty issue (11) owns the shared SEs; at merge
:func:`auc_standard_errors` switches to them. Both methods are O(distinct scores) and treat items as
independent (no clustering by request), as the shared ones do.

- AUC-ROC, DeLong et al. (1988): a positive at score ``s`` has placement ``V10 = (neg_{<s} + neg_s / 2) / N``,
  a negative ``V01 = (pos_{>s} + pos_s / 2) / P``; ``Var = S10 / P + S01 / N`` with ``S10``, ``S01`` the
  sample variances (ddof = 1) of the placements over positives and negatives.
- AUC-PR (average precision, sklearn's step form ``AP = (1/P) sum_k pos_k TP_k / T_k`` over distinct scores
  in descending order, ``TP_k`` and ``T_k`` the positives and items at or above score ``k``): the
  infinitesimal jackknife ``Var = sum_j pos_j (dAP/dpos_j)^2 + neg_j (dAP/dneg_j)^2``, the derivatives
  taken with respect to one item's weight (AP is homogeneous of degree 0 in the counts), with
  ``dAP/dpos_j = (TP_j / T_j - AP + sum_{k>=j} pos_k (1/T_k - TP_k/T_k^2)) / P`` and
  ``dAP/dneg_j = -(1/P) sum_{k>=j} pos_k TP_k / T_k^2``.

Both are None below two items of either class.
"""

from __future__ import annotations

import math

import numpy as np

from rankwatch.pipeline.auc import ScoreHistogram

__all__ = ["auc_pr_se", "auc_roc_se", "auc_standard_errors"]


def auc_roc_se(hist: ScoreHistogram) -> float | None:
    """DeLong standard error of the pooled AUC-ROC (None below two positives or two negatives)."""
    pos, neg = hist.pos.astype(np.float64), hist.neg.astype(np.float64)
    n_pos, n_neg = float(pos.sum()), float(neg.sum())
    if n_pos < 2 or n_neg < 2:
        return None
    neg_below = np.cumsum(neg) - neg
    pos_above = n_pos - np.cumsum(pos)
    v10 = (neg_below + 0.5 * neg) / n_neg
    v01 = (pos_above + 0.5 * pos) / n_pos
    auc = float(np.dot(pos, v10)) / n_pos
    s10 = float(np.dot(pos, (v10 - auc) ** 2)) / (n_pos - 1)
    s01 = float(np.dot(neg, (v01 - auc) ** 2)) / (n_neg - 1)
    return math.sqrt(max(s10 / n_pos + s01 / n_neg, 0.0))


def auc_pr_se(hist: ScoreHistogram) -> float | None:
    """Infinitesimal-jackknife standard error of the pooled average precision (None below 2 per class)."""
    pos, neg = hist.pos[::-1].astype(np.float64), hist.neg[::-1].astype(np.float64)  # descending scores
    n_pos, n_neg = float(pos.sum()), float(neg.sum())
    if n_pos < 2 or n_neg < 2:
        return None
    tp = np.cumsum(pos)
    tot = np.cumsum(pos + neg)
    safe = np.where(tot > 0, tot, 1.0)
    precision = tp / safe
    ap = float(np.dot(pos, precision)) / n_pos
    a = pos * (1.0 / safe - tp / (safe * safe))
    b = -pos * tp / (safe * safe)
    a_tail = np.cumsum(a[::-1])[::-1]
    b_tail = np.cumsum(b[::-1])[::-1]
    d_pos = (precision - ap + a_tail) / n_pos
    d_neg = b_tail / n_pos
    return math.sqrt(float(np.dot(pos, d_pos * d_pos) + np.dot(neg, d_neg * d_neg)))


def auc_standard_errors(hist: ScoreHistogram) -> dict[str, float | None]:
    """``{"auc_roc": se, "auc_pr": se}`` of one slice's histogram: the interface the A/B report reads."""
    return {"auc_roc": auc_roc_se(hist), "auc_pr": auc_pr_se(hist)}
