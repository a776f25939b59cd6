"""Pooled AUC-ROC and AUC-PR from a mergeable score histogram.

A :class:`ScoreHistogram` keeps, for every distinct score, how many relevant (positive) and non-relevant
(negative) items had it. Two histograms merge exactly (add counts per score), so windows, partitions and
slices combine without losing anything, and both AUCs follow from the counts:

.. math::

    AUC_{ROC} = \\frac{1}{P N} \\sum_b pos_b \\, (neg_{<b} + \\tfrac12 neg_b)

    AP = \\sum_b \\frac{pos_b}{P} \\cdot \\frac{TP_{\\ge b}}{TP_{\\ge b} + FP_{\\ge b}}

which are scikit-learn's ``roc_auc_score`` and ``average_precision_score`` (thresholds at distinct scores).

Memory is bounded: when a histogram holds more than ``max_distinct`` scores, adjacent bins are merged into
one (their scores become ties). Only positive/negative pairs that were strictly ordered and now share a bin
can change the AUC-ROC, each by one half, so ``auc_roc_error_bound`` = ``0.5 * new_ties / (P * N)`` is a
hard bound on the error, reported next to the value. Below the cap, results are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class ScoreHistogram:
    """Counts of positives and negatives per distinct score (ascending); merges exactly."""

    __slots__ = ("scores", "pos", "neg", "new_ties")

    def __init__(self, scores: FloatArray, pos: IntArray, neg: IntArray, new_ties: float = 0.0) -> None:
        self.scores = scores
        self.pos = pos
        self.neg = neg
        # Positive/negative pairs turned into ties by compression (0 while exact).
        self.new_ties = new_ties

    @classmethod
    def empty(cls) -> ScoreHistogram:
        return cls(np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64))

    @classmethod
    def from_pairs(cls, scores: npt.ArrayLike, relevant: npt.ArrayLike) -> ScoreHistogram:
        sc = np.asarray(scores, dtype=np.float64)
        rel = np.asarray(relevant, dtype=bool)
        if sc.shape != rel.shape or sc.ndim != 1:
            raise ValueError("scores and relevant must be 1-D arrays of one length")
        if sc.size and not np.all(np.isfinite(sc)):
            raise ValueError("scores must be finite")
        uniq, inverse = np.unique(sc, return_inverse=True)
        pos = np.bincount(inverse, weights=rel, minlength=uniq.size).astype(np.int64)
        neg = np.bincount(inverse, minlength=uniq.size).astype(np.int64) - pos
        return cls(uniq, pos, neg)

    @property
    def positives(self) -> int:
        return int(self.pos.sum())

    @property
    def negatives(self) -> int:
        return int(self.neg.sum())

    @property
    def n_distinct(self) -> int:
        return int(self.scores.size)

    def merge(self, other: ScoreHistogram) -> ScoreHistogram:
        """A new histogram with the counts of both."""
        if other.scores.size == 0:
            return self.copy()
        if self.scores.size == 0:
            return other.copy()
        uniq, inverse = np.unique(np.concatenate((self.scores, other.scores)), return_inverse=True)
        pos = np.bincount(inverse, weights=np.concatenate((self.pos, other.pos)), minlength=uniq.size)
        neg = np.bincount(inverse, weights=np.concatenate((self.neg, other.neg)), minlength=uniq.size)
        return ScoreHistogram(uniq, pos.astype(np.int64), neg.astype(np.int64), self.new_ties + other.new_ties)

    def copy(self) -> ScoreHistogram:
        return ScoreHistogram(self.scores.copy(), self.pos.copy(), self.neg.copy(), self.new_ties)

    def compressed(self, max_distinct: int) -> ScoreHistogram:
        """At most ``max_distinct`` bins, merging runs of adjacent scores; tracks the ties it adds."""
        n = self.scores.size
        if n <= max_distinct:
            return self
        # Bins of (nearly) equal count of distinct scores; a bin keeps its highest score as its value.
        edges = np.linspace(0, n, max_distinct + 1).astype(np.int64)
        starts = np.unique(edges[:-1])
        pos = np.add.reduceat(self.pos, starts)
        neg = np.add.reduceat(self.neg, starts)
        ends = np.append(starts[1:], n) - 1
        already = np.add.reduceat(self.pos * self.neg, starts)  # pairs that were ties before
        added = float(np.sum(pos * neg - already))
        return ScoreHistogram(self.scores[ends].copy(), pos, neg, self.new_ties + added)

    def auc_roc(self) -> float | None:
        """Probability that a positive outscores a negative, ties one half; None for a single class."""
        p, n = self.positives, self.negatives
        if p == 0 or n == 0:
            return None
        neg_below = np.cumsum(self.neg) - self.neg
        return float(np.sum(self.pos * (neg_below + 0.5 * self.neg)) / (p * n))

    def auc_roc_error_bound(self) -> float:
        """Largest possible absolute error of :meth:`auc_roc` caused by compression (0.0 when exact)."""
        p, n = self.positives, self.negatives
        return 0.0 if p == 0 or n == 0 else 0.5 * self.new_ties / (p * n)

    def average_precision(self) -> float | None:
        """scikit-learn's average precision over the pooled items; None for a single class."""
        p, n = self.positives, self.negatives
        if p == 0 or n == 0:
            return None
        # Thresholds from the highest score down.
        tp = np.cumsum(self.pos[::-1])
        fp = np.cumsum(self.neg[::-1])
        pos_desc = self.pos[::-1]
        hit = pos_desc > 0
        return float(np.sum(pos_desc[hit] * (tp[hit] / (tp[hit] + fp[hit]))) / p)

    def to_state(self) -> dict[str, Any]:
        """Plain state (bytes for arrays) for snapshots; inverse of :meth:`from_state`."""
        return {
            "scores": self.scores.astype("<f8").tobytes(),
            "pos": self.pos.astype("<i8").tobytes(),
            "neg": self.neg.astype("<i8").tobytes(),
            "new_ties": self.new_ties,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ScoreHistogram:
        return cls(
            np.frombuffer(state["scores"], dtype="<f8").astype(np.float64),
            np.frombuffer(state["pos"], dtype="<i8").astype(np.int64),
            np.frombuffer(state["neg"], dtype="<i8").astype(np.int64),
            float(state["new_ties"]),
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ScoreHistogram)
            and np.array_equal(self.scores, other.scores)
            and np.array_equal(self.pos, other.pos)
            and np.array_equal(self.neg, other.neg)
            and self.new_ties == other.new_ties
        )


def histograms_by_group(
    scores: npt.ArrayLike, relevant: npt.ArrayLike, group: npt.ArrayLike, n_groups: int
) -> list[ScoreHistogram]:
    """One histogram per group id in ``range(n_groups)``, with a single sort over all items."""
    sc = np.asarray(scores, dtype=np.float64)
    rel = np.asarray(relevant, dtype=bool)
    grp = np.asarray(group, dtype=np.int64)
    order = np.lexsort((sc, grp))
    sc, rel, grp = sc[order], rel[order], grp[order]
    if sc.size == 0:
        return [ScoreHistogram.empty() for _ in range(n_groups)]
    new_bin = np.empty(sc.size, dtype=bool)
    new_bin[0] = True
    new_bin[1:] = (sc[1:] != sc[:-1]) | (grp[1:] != grp[:-1])
    starts = np.flatnonzero(new_bin)
    pos = np.add.reduceat(rel.astype(np.int64), starts)
    total = np.diff(np.append(starts, sc.size))
    bin_scores, bin_group = sc[starts], grp[starts]
    bounds = np.searchsorted(bin_group, np.arange(n_groups + 1))
    return [
        ScoreHistogram(bin_scores[a:b].copy(), pos[a:b].copy(), (total[a:b] - pos[a:b]).astype(np.int64))
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
