"""The one metric kernel: per-request RR, NDCG@k, AP@k, P@k, recall@k and hit rate@k over many lists at once.

Lists are given flat: ``labels`` holds the graded relevance of every shown item, list after list, each list
in rank order, and ``offsets`` (length ``n + 1``) marks where list ``j`` starts and ends
(``labels[offsets[j]:offsets[j + 1]]``). Everything is vectorised with numpy; there is no per-request
Python loop. Online windows and offline baselines both call :func:`per_request_metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from rankwatch.pipeline.metrics.options import MetricOptions

Layout = Literal["auto", "grid", "flat"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Integer grades up to this value use the counting path for the ideal DCG (no sort at all).
_MAX_COUNTING_GRADE = 64


@dataclass(frozen=True)
class PerRequestMetrics:
    """Per-request metric values.

    ``values[name][j]`` is the metric of list ``j``; it is NaN when the list has no relevant item
    (R = 0), whatever :attr:`MetricOptions.no_relevant` says: the aggregates apply that policy.
    """

    values: dict[str, FloatArray]
    n_relevant: IntArray
    lengths: IntArray

    @property
    def n_requests(self) -> int:
        return int(self.lengths.size)


def check_lists(labels: npt.ArrayLike, offsets: npt.ArrayLike) -> tuple[FloatArray, IntArray]:
    """Validate and convert flat lists; raise ``ValueError`` on a malformed layout or label."""
    lab = np.ascontiguousarray(labels, dtype=np.float64)
    off = np.ascontiguousarray(offsets, dtype=np.int64)
    if lab.ndim != 1 or off.ndim != 1 or off.size < 1:
        raise ValueError("labels and offsets must be 1-D, offsets at least [0]")
    if off[0] != 0 or off[-1] != lab.size or np.any(np.diff(off) < 0):
        raise ValueError("offsets must start at 0, be non-decreasing and end at len(labels)")
    if lab.size and (not np.all(np.isfinite(lab)) or lab.min() < 0):
        raise ValueError("labels must be finite and >= 0")
    return lab, off


def gains(labels: FloatArray, gain: str) -> FloatArray:
    """Gain of a graded label: ``2**rel - 1`` (exponential) or ``rel`` (linear)."""
    # exp2 is exact for integer grades (expm1(rel * ln 2) is not), which keeps us equal to ranx.
    if gain != "exponential":
        return labels
    out = np.exp2(labels)
    out -= 1.0  # in place: one array instead of two
    return out


def per_request_metrics(
    labels: npt.ArrayLike, offsets: npt.ArrayLike, options: MetricOptions, *, layout: Layout = "auto"
) -> PerRequestMetrics:
    r"""Compute RR, NDCG@k, AP@k, precision@k, recall@k and hit_rate@k for every list.

    Parameters
    ----------
    labels : array of float, shape (n_items,)
        Graded relevance, flat, each list in rank order; ``rel > 0`` means relevant.
    offsets : array of int, shape (n_requests + 1,)
        List boundaries.
    options : MetricOptions
        Cut-offs, gain and MAP normalisation.
    layout : {"auto", "grid", "flat"}
        How the lists are processed; every layout gives the same values. ``"grid"`` pads the lists to
        rows of one length, ``"flat"`` works on the flat items with ``bincount``; ``"auto"`` takes the
        grid unless padding would more than double the size (one very long list among short ones).

    Notes
    -----
    With ``i`` the 1-based rank and R the number of relevant items of the whole list:

    .. math::

        RR = 1 / \min\{i : rel_i > 0\}

        DCG@k = \sum_{i \le k} g(rel_i) / \log_2(i + 1), \quad NDCG@k = DCG@k / IDCG@k

        AP@k = \frac{1}{R} \sum_{i \le k} P@i \, [rel_i > 0]

    where ``g`` is ``2**rel - 1`` or ``rel`` and IDCG@k is the DCG@k of the list's labels sorted descending.
    AP@k divides by ``min(R, k)`` when ``options.map_normalization == "min_relevant_k"``. With
    ``H_k = \sum_{i \le k} [rel_i > 0]`` (ranks past the list's end count as non-relevant):

    .. math::

        P@k = H_k / k, \quad recall@k = H_k / R, \quad hit\_rate@k = [H_k > 0]

    (trec_eval ``P_k``, ``recall_k`` with R the relevant items of the served list, ``success_k``).
    """
    lab, off = check_lists(labels, offsets)
    lengths = np.diff(off)
    n = int(lengths.size)
    width = int(lengths.max()) if n else 0
    if layout not in ("auto", "grid", "flat"):
        raise ValueError(f"layout must be 'auto', 'grid' or 'flat', got {layout!r}")
    if width > 0 and (layout == "grid" or (layout == "auto" and n * width <= 2 * lab.size + 1024)):
        return _per_request_metrics_2d(lab, off, lengths, width, options)
    req = np.repeat(np.arange(n, dtype=np.int64), lengths)
    rank0 = np.arange(lab.size, dtype=np.int64) - np.repeat(off[:-1], lengths)
    relevant = lab > 0
    n_relevant = np.bincount(req[relevant], minlength=n).astype(np.int64)
    has_rel = n_relevant > 0
    values: dict[str, FloatArray] = {"mrr": _reciprocal_rank(relevant, req, rank0, n)}

    item_gain = gains(lab, options.gain)
    kmax = max(options.ndcg_cutoffs, default=0)
    discount = 1.0 / np.log2(np.arange(2, kmax + 2, dtype=np.float64))
    ideal = _IdealDcg(lab, req, rank0, n, options.gain)
    for k in options.ndcg_cutoffs:
        top = rank0 < k
        dcg = _weighted_counts(req[top], item_gain[top] * discount[rank0[top]], n)
        idcg = ideal.at(k, discount)
        values[f"ndcg@{k}"] = _ratio_or_nan(dcg, idcg, has_rel)

    if options.map_cutoffs:
        cum_rel = np.cumsum(relevant, dtype=np.int64)
        before = np.concatenate(([0], cum_rel))[off[:-1]]
        precision = (cum_rel - np.repeat(before, lengths)) / (rank0 + 1.0)
        for k in options.map_cutoffs:
            hit = relevant & (rank0 < k)
            total = _weighted_counts(req[hit], precision[hit], n)
            denom = n_relevant if options.map_normalization == "relevant" else np.minimum(n_relevant, k)
            values[f"map@{k}"] = _ratio_or_nan(total, denom.astype(np.float64), has_rel)
    hit_ks = _hit_cutoffs(options)
    if hit_ks:
        rel_rank = rank0[relevant]
        rel_req = req[relevant]
        hits_at = {k: np.bincount(rel_req[rel_rank < k], minlength=n).astype(np.float64) for k in hit_ks}
        _add_hit_metrics(values, hits_at, n_relevant, has_rel, options)
    return PerRequestMetrics(values=values, n_relevant=n_relevant, lengths=lengths.astype(np.int64))


def _hit_cutoffs(options: MetricOptions) -> tuple[int, ...]:
    """Every k for which the count of relevant items in the top k is needed (P, recall, hit rate)."""
    return tuple(sorted({*options.precision_cutoffs, *options.recall_cutoffs, *options.hit_rate_cutoffs}))


def _add_hit_metrics(
    values: dict[str, FloatArray],
    hits_at: dict[int, FloatArray],
    n_relevant: IntArray,
    has_rel: npt.NDArray[np.bool_],
    options: MetricOptions,
) -> None:
    """precision@k, recall@k and hit_rate@k from ``hits_at[k]``, the relevant items in each list's top k."""
    nan = np.full(n_relevant.shape, np.nan)
    for k in options.precision_cutoffs:
        values[f"precision@{k}"] = np.where(has_rel, hits_at[k] / k, nan)
    for k in options.recall_cutoffs:
        values[f"recall@{k}"] = _ratio_or_nan(hits_at[k], n_relevant.astype(np.float64), has_rel)
    for k in options.hit_rate_cutoffs:
        values[f"hit_rate@{k}"] = np.where(has_rel, (hits_at[k] > 0).astype(np.float64), nan)


def _per_request_metrics_2d(
    lab: FloatArray, off: IntArray, lengths: IntArray, width: int, options: MetricOptions
) -> PerRequestMetrics:
    """The same metrics with the lists as rows of an ``(n, width)`` array, padded with label 0.

    Padding at the end of a list with non-relevant items changes none of the metrics (RR, DCG, the ideal
    DCG, AP and R only see relevant items, and these keep their ranks), so this equals the flat path. It
    is used when padding at most doubles the size, the usual case (top-k lists of similar lengths): row
    operations are contiguous and cumulative sums replace the per-cut-off ``bincount`` passes.
    """
    n = int(lengths.size)
    if lab.size == n * width:
        grid = lab.reshape(n, width)
    else:
        flat = np.zeros(n * width)
        rank0 = np.arange(lab.size, dtype=np.int64) - np.repeat(off[:-1], lengths)
        flat[np.repeat(np.arange(n, dtype=np.int64) * width, lengths) + rank0] = lab
        grid = flat.reshape(n, width)
    relevant = grid > 0
    n_relevant = np.count_nonzero(relevant, axis=1).astype(np.int64)
    has_rel = n_relevant > 0
    rr = np.full(n, np.nan)
    rr[has_rel] = 1.0 / (np.argmax(relevant[has_rel], axis=1) + 1.0)
    values: dict[str, FloatArray] = {"mrr": rr}

    if options.ndcg_cutoffs:
        depth = min(width, max(options.ndcg_cutoffs))
        discount = 1.0 / np.log2(np.arange(2, depth + 2, dtype=np.float64))
        dcg_upto = np.cumsum(gains(grid[:, :depth], options.gain) * discount, axis=1)
        ideal_upto = _ideal_dcg_2d(grid, depth, discount, options.gain)
        for k in options.ndcg_cutoffs:
            col = min(k, depth) - 1
            values[f"ndcg@{k}"] = _ratio_or_nan(dcg_upto[:, col], ideal_upto[:, col], has_rel)

    hit_ks = _hit_cutoffs(options)
    hits_upto: npt.NDArray[np.int64] | None = None
    if options.map_cutoffs or hit_ks:
        # Relevant items within the first j + 1 ranks, shared by MAP and precision/recall/hit rate.
        hits_depth = min(width, max((*options.map_cutoffs, *hit_ks)))
        hits_upto = np.cumsum(relevant[:, :hits_depth], axis=1, dtype=np.int64)
    if options.map_cutoffs:
        assert hits_upto is not None
        depth = min(width, max(options.map_cutoffs))
        top = relevant[:, :depth]
        precision_sum = np.cumsum(np.where(top, hits_upto[:, :depth] / np.arange(1.0, depth + 1.0), 0.0), axis=1)
        for k in options.map_cutoffs:
            col = min(k, depth) - 1
            denom = n_relevant if options.map_normalization == "relevant" else np.minimum(n_relevant, k)
            values[f"map@{k}"] = _ratio_or_nan(precision_sum[:, col], denom.astype(np.float64), has_rel)
    if hit_ks:
        assert hits_upto is not None
        last = hits_upto.shape[1]
        hits_at = {k: hits_upto[:, min(k, last) - 1].astype(np.float64) for k in hit_ks}
        _add_hit_metrics(values, hits_at, n_relevant, has_rel, options)
    return PerRequestMetrics(values=values, n_relevant=n_relevant, lengths=lengths.astype(np.int64))


def _ideal_dcg_2d(grid: FloatArray, depth: int, discount: FloatArray, gain: str) -> FloatArray:
    """``ideal[:, j]`` = IDCG@(j + 1) of every row (a row-wise value sort, vectorised by numpy)."""
    ideal_labels = np.sort(grid, axis=1)[:, ::-1][:, :depth]
    return np.cumsum(gains(ideal_labels, gain) * discount, axis=1)


def _reciprocal_rank(relevant: npt.NDArray[np.bool_], req: IntArray, rank0: IntArray, n: int) -> FloatArray:
    rr = np.full(n, np.nan)
    hits = np.flatnonzero(relevant)
    if hits.size:
        hit_req = req[hits]
        # Items are grouped by list and in rank order, so a list's first hit is where the list id changes.
        first = np.empty(hits.size, dtype=bool)
        first[0] = True
        np.not_equal(hit_req[1:], hit_req[:-1], out=first[1:])
        rr[hit_req[first]] = 1.0 / (rank0[hits[first]] + 1.0)
    return rr


def _weighted_counts(index: IntArray, weights: FloatArray, n: int) -> FloatArray:
    """Sum of ``weights`` per list id (``np.bincount`` with weights, typed as float)."""
    return np.bincount(index, weights=weights, minlength=n).astype(np.float64, copy=False)


def _ratio_or_nan(num: FloatArray, den: FloatArray, defined: npt.NDArray[np.bool_]) -> FloatArray:
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=defined)
    return out


class _IdealDcg:
    """IDCG@k for every list, by counting grades when labels are small integers, else by sorting."""

    def __init__(self, labels: FloatArray, req: IntArray, rank0: IntArray, n: int, gain: str) -> None:
        self._labels, self._req, self._rank0, self._n, self._gain = labels, req, rank0, n, gain
        top = float(labels.max()) if labels.size else 0.0
        self._counting = top <= _MAX_COUNTING_GRADE and bool(np.all(labels == np.floor(labels)))
        self._grade_counts: list[tuple[float, IntArray]] | None = None
        self._sorted_gain: FloatArray | None = None

    def at(self, k: int, discount: FloatArray) -> FloatArray:
        if self._counting:
            return self._by_counting(k, discount)
        return self._by_sorting(k, discount)

    def _by_counting(self, k: int, discount: FloatArray) -> FloatArray:
        if self._grade_counts is None:
            grades = self._labels.astype(np.int64)
            present = np.flatnonzero(np.bincount(grades))
            self._grade_counts = [
                (float(g), np.bincount(self._req[grades == g], minlength=self._n).astype(np.int64))
                for g in present[::-1]
                if g > 0
            ]
        # cum_discount[j] = sum of the first j discounts: the DCG of j items of gain 1.
        cum_discount = np.concatenate(([0.0], np.cumsum(discount[:k])))
        idcg = np.zeros(self._n)
        start = np.zeros(self._n, dtype=np.int64)
        for grade, count in self._grade_counts:
            end = start + count
            g = float(gains(np.array([grade]), self._gain)[0])
            idcg += g * (cum_discount[np.minimum(end, k)] - cum_discount[np.minimum(start, k)])
            start = end
        return idcg

    def _by_sorting(self, k: int, discount: FloatArray) -> FloatArray:
        if self._sorted_gain is None:
            order = np.lexsort((-self._labels, self._req))
            self._sorted_gain = gains(self._labels[order], self._gain)
        top = self._rank0 < k
        return _weighted_counts(self._req[top], self._sorted_gain[top] * discount[self._rank0[top]], self._n)


def offsets_from_lengths(lengths: npt.ArrayLike) -> IntArray:
    """``[0, l0, l0 + l1, ...]`` from list lengths."""
    ln = np.asarray(lengths, dtype=np.int64)
    return np.concatenate(([0], np.cumsum(ln))).astype(np.int64)


def flatten_lists(lists: list[list[float]]) -> tuple[FloatArray, IntArray]:
    """Flat labels and offsets from a list of lists (for tests and small inputs)."""
    lengths = [len(x) for x in lists]
    flat = np.array([v for x in lists for v in x], dtype=np.float64)
    return flat, offsets_from_lengths(lengths)
