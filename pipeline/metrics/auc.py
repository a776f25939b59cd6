"""Pooled AUC-ROC and AUC-PR from a mergeable score histogram.

A :class:`ScoreHistogram` keeps, for every distinct score, how many relevant (positive) and non-relevant
(negative) items had it. Two histograms merge exactly (add counts per score), so windows, partitions and
slices combine without losing anything, and both AUCs follow from the counts:

.. math::

    AUC_{ROC} = \\frac{1}{P N} \\sum_b pos_b \\, (neg_{<b} + \\tfrac12 neg_b)

    AP = \\sum_b \\frac{pos_b}{P} \\cdot \\frac{TP_{\\ge b}}{TP_{\\ge b} + FP_{\\ge b}}

which are scikit-learn's ``roc_auc_score`` and ``average_precision_score`` (thresholds at distinct scores).

Memory is bounded: when a histogram holds more than ``max_distinct`` scores, adjacent bins are merged into
one (their scores become ties). A merged ("wide") bin remembers the score range ``[low, high]`` it covers
and is valued at ``high``. Bins always cover disjoint ranges: merging a compressed histogram with other
data puts every bin whose range overlaps a wide bin into one bin with it. So pairs in different bins keep
their true order, and only positive/negative pairs inside a wide bin can be off, each by at most one half
(they count as a tie). ``new_ties`` counts those pairs (except true ties), so ``auc_roc_error_bound`` =
``0.5 * new_ties / (P * N)`` is a hard bound on the error, reported next to the value. Below the cap,
results are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class ScoreHistogram:
    """Counts of positives and negatives per distinct score (ascending); merges exactly.

    ``lows`` is None while every bin is one exact score; after compression it holds the lowest score each
    bin covers (``scores`` holds the highest, the value the bin is ranked at).
    """

    __slots__ = ("scores", "pos", "neg", "new_ties", "lows")

    def __init__(
        self,
        scores: FloatArray,
        pos: IntArray,
        neg: IntArray,
        new_ties: float = 0.0,
        *,
        lows: FloatArray | None = None,
    ) -> None:
        self.scores = scores
        self.pos = pos
        self.neg = neg
        # Positive/negative pairs turned into ties by compression (0 while exact).
        self.new_ties = new_ties
        self.lows = lows

    @property
    def bin_lows(self) -> FloatArray:
        """Lowest score covered by each bin (the bin's score itself while exact)."""
        return self.scores if self.lows is None else self.lows

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
        return _histogram(sc, rel)

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
        if self.lows is not None or other.lows is not None:
            return self._merge_ranges(other)
        # Value sorts only (numpy's vectorised sort is several times faster than an argsort); each side's
        # scores are distinct, so each lands on its own bin.
        both = np.sort(np.concatenate((self.scores, other.scores)))
        uniq = both[np.append(True, both[1:] != both[:-1])]
        pos = np.zeros(uniq.size, dtype=np.int64)
        neg = np.zeros(uniq.size, dtype=np.int64)
        for side in (self, other):
            at = np.searchsorted(uniq, side.scores)
            pos[at] += side.pos
            neg[at] += side.neg
        return ScoreHistogram(uniq, pos, neg, self.new_ties + other.new_ties)

    def _merge_ranges(self, other: ScoreHistogram) -> ScoreHistogram:
        """Merge when a side has wide bins: bins whose ranges overlap (or touch) become one bin."""
        lows = np.concatenate((self.bin_lows, other.bin_lows))
        highs = np.concatenate((self.scores, other.scores))
        order = np.lexsort((highs, lows))
        lows, highs = lows[order], highs[order]
        pos = np.concatenate((self.pos, other.pos))[order]
        neg = np.concatenate((self.neg, other.neg))[order]
        reach = np.maximum.accumulate(highs)
        starts = np.flatnonzero(np.append(True, lows[1:] > reach[:-1]))
        g_pos, g_neg = np.add.reduceat(pos, starts), np.add.reduceat(neg, starts)
        g_low, g_high = lows[starts], np.maximum.reduceat(highs, starts)
        inner = np.add.reduceat(pos * neg, starts)  # true ties, or already counted in new_ties
        wide = g_low < g_high
        added = float(np.sum((g_pos * g_neg - inner)[wide]))
        return ScoreHistogram(
            g_high, g_pos, g_neg, self.new_ties + other.new_ties + added, lows=g_low if wide.any() else None
        )

    def copy(self) -> ScoreHistogram:
        lows = None if self.lows is None else self.lows.copy()
        return ScoreHistogram(self.scores.copy(), self.pos.copy(), self.neg.copy(), self.new_ties, lows=lows)

    def compressed(self, max_distinct: int) -> ScoreHistogram:
        """At most ``max_distinct`` bins, merging runs of adjacent scores; tracks the ties it adds."""
        n = self.scores.size
        if n <= max_distinct:
            return self
        # Bins of (nearly) equal count of distinct scores; a bin keeps its highest score as its value.
        edges = np.linspace(0, n, max_distinct + 1).astype(np.int64)[:-1]
        starts = edges[np.append(True, edges[1:] != edges[:-1])]  # edges ascend: drop repeats
        pos = np.add.reduceat(self.pos, starts)
        neg = np.add.reduceat(self.neg, starts)
        ends = np.append(starts[1:], n) - 1
        # Pairs that were ties before: only bins with both classes have any (an exact histogram of distinct
        # scores has none, and the product of two bin-sized arrays is skipped).
        mixed = (self.pos > 0) & (self.neg > 0)
        already = np.add.reduceat(self.pos * self.neg, starts) if mixed.any() else np.zeros(starts.size, np.int64)
        added = float(np.sum(pos * neg - already))
        return ScoreHistogram(
            self.scores[ends].copy(), pos, neg, self.new_ties + added, lows=self.bin_lows[starts].copy()
        )

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
            # Only compressed histograms carry ranges, so the state of an exact one is unchanged.
            **({} if self.lows is None else {"lows": self.lows.astype("<f8").tobytes()}),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ScoreHistogram:
        return cls(
            np.frombuffer(state["scores"], dtype="<f8").astype(np.float64),
            np.frombuffer(state["pos"], dtype="<i8").astype(np.int64),
            np.frombuffer(state["neg"], dtype="<i8").astype(np.int64),
            float(state["new_ties"]),
            lows=np.frombuffer(state["lows"], dtype="<f8").astype(np.float64) if "lows" in state else None,
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ScoreHistogram)
            and np.array_equal(self.scores, other.scores)
            and np.array_equal(self.pos, other.pos)
            and np.array_equal(self.neg, other.neg)
            and self.new_ties == other.new_ties
            and np.array_equal(self.bin_lows, other.bin_lows)
        )


def histograms_by_group(
    scores: npt.ArrayLike, relevant: npt.ArrayLike, group: npt.ArrayLike, n_groups: int
) -> list[ScoreHistogram]:
    """One histogram per group id in ``range(n_groups)``.

    Items are partitioned by group with one stable radix sort (group ids as a small unsigned type), then
    each group's histogram comes from value sorts of its scores (see :func:`_histogram`). No argsort of
    the float scores is needed: on the 4 M-item benchmark (bench/offline_kernel.py) this is about five
    times faster than sorting ``(group, score)`` pairs with ``np.lexsort``.
    """
    sc = np.asarray(scores, dtype=np.float64)
    rel = np.asarray(relevant, dtype=bool)
    grp = np.asarray(group, dtype=np.int64)
    if not (sc.shape == rel.shape == grp.shape) or sc.ndim != 1:
        raise ValueError("scores, relevant and group must be 1-D arrays of one length")
    if sc.size and not np.all(np.isfinite(sc)):
        raise ValueError("scores must be finite")
    if n_groups == 1 and (sc.size == 0 or (grp.min() == 0 and grp.max() == 0)):
        return [_histogram(sc, rel)]
    if sc.size == 0:
        return [ScoreHistogram.empty() for _ in range(n_groups)]
    if grp.min() < 0 or grp.max() >= n_groups:
        raise ValueError("group ids must lie in range(n_groups)")
    # numpy's stable sort is a radix sort for integer types of 16 bits or less.
    small = np.uint8 if n_groups <= 1 << 8 else np.uint16 if n_groups <= 1 << 16 else np.int64
    by_group = np.argsort(grp.astype(small), kind="stable")
    bounds = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(grp, minlength=n_groups), out=bounds[1:])
    sc, rel = sc[by_group], rel[by_group]
    return [_histogram(sc[a:b], rel[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def histograms_by_request_group(
    scores: npt.ArrayLike, relevant: npt.ArrayLike, request_group: npt.ArrayLike, lengths: npt.ArrayLike, n_groups: int
) -> list[ScoreHistogram]:
    """:func:`histograms_by_group` for flat lists in request order with a group id per request
    (``lengths[j]`` items of list ``j``): the lists, not the items, are sorted by group, and each group's
    items are gathered in blocks. A histogram does not depend on the order of its group's items."""
    sc = np.asarray(scores, dtype=np.float64)
    rel = np.asarray(relevant, dtype=bool)
    grp = np.asarray(request_group, dtype=np.int64)
    size = np.asarray(lengths, dtype=np.int64)
    if grp.shape != size.shape or grp.ndim != 1 or int(size.sum()) != sc.size:
        raise ValueError("request_group and lengths need one entry per list, lengths summing to the items")
    if n_groups == 1 or sc.size == 0:
        return histograms_by_group(sc, rel, np.repeat(grp, size), n_groups)
    if not (sc.shape == rel.shape) or sc.ndim != 1:
        raise ValueError("scores, relevant and group must be 1-D arrays of one length")
    if not np.all(np.isfinite(sc)):
        raise ValueError("scores must be finite")
    if grp.min() < 0 or grp.max() >= n_groups:
        raise ValueError("group ids must lie in range(n_groups)")
    small = np.uint8 if n_groups <= 1 << 8 else np.uint16 if n_groups <= 1 << 16 else np.int64
    lists = np.argsort(grp.astype(small), kind="stable")
    sorted_size = size[lists]
    item_end = np.zeros(grp.size + 1, dtype=np.int64)
    np.cumsum(sorted_size, out=item_end[1:])
    list_bounds = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(grp, minlength=n_groups), out=list_bounds[1:])
    bounds = item_end[list_bounds]
    width = int(size[0])
    if bool(np.all(size == width)):  # lists of one length: gather whole rows (several times faster)
        sc = np.take(sc.reshape(grp.size, width), lists, axis=0).ravel()
        rel = np.take(rel.reshape(grp.size, width), lists, axis=0).ravel()
    else:
        start = np.zeros(grp.size, dtype=np.int64)
        np.cumsum(size[:-1], out=start[1:])
        items = np.repeat(start[lists] - item_end[:-1], sorted_size)
        items += np.arange(sc.size, dtype=np.int64)
        sc, rel = sc[items], rel[items]
    return [_histogram(sc[a:b], rel[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _histogram(scores: FloatArray, relevant: npt.NDArray[np.bool_]) -> ScoreHistogram:
    """Histogram of one group from two value sorts (all scores, positive scores) and one search.

    ``np.sort`` is vectorised and several times faster than ``np.argsort`` or ``np.unique`` (which hashes
    floats); sorting the positive scores first makes the search walk the distinct scores in order.
    """
    if scores.size == 0:
        return ScoreHistogram.empty()
    ordered = np.sort(scores)
    new_value = np.empty(ordered.size, dtype=bool)
    new_value[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new_value[1:])
    # Positives are usually the minority: search their scores among the distinct ones and count.
    if new_value.all():  # no ties at all: every bin holds one item, so neg = 1 - pos (no gathers, no counts)
        pos = np.bincount(np.searchsorted(ordered, np.sort(scores[relevant])), minlength=ordered.size).astype(np.int64, copy=False)
        return ScoreHistogram(ordered, pos, np.subtract(1, pos))
    starts = np.flatnonzero(new_value)
    distinct, count = ordered[starts], np.diff(starts, append=ordered.size).astype(np.int64)
    pos = np.bincount(np.searchsorted(distinct, np.sort(scores[relevant])), minlength=distinct.size).astype(np.int64, copy=False)
    count -= pos
    return ScoreHistogram(distinct, pos, count)
