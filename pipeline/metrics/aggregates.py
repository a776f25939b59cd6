"""Mergeable aggregates of the kernel's output: what a slice of a window (or a baseline) holds.

A :class:`RankingAggregate` keeps, per metric, the count, sum, sum of squares and centred sum of squares
``m2`` of per-request values (so means and their standard errors merge exactly, see
:mod:`pipeline.metrics.uncertainty`), the request and item counts, a :class:`pipeline.metrics.auc.ScoreHistogram` for the
pooled AUCs and a :class:`pipeline.metrics.clusters.ClusterHistograms` for their request-clustered SEs. ``a.merge(b)`` equals the aggregate of the union
of their requests (up to float summation order for the sums; exactly for counts and AUC state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rankwatch.pipeline.metrics.auc import ScoreHistogram, histograms_by_request_group
from rankwatch.pipeline.metrics.clusters import (
    ClusterHistograms,
    cluster_histograms_by_request_group,
    request_buckets,
)
from rankwatch.pipeline.metrics.gauc import ScoreImage, request_group_auc
from rankwatch.pipeline.metrics.gauc_sums import GaucSums, weighted_moments
from rankwatch.pipeline.metrics.kernel import PerRequestMetrics, offsets_from_lengths, per_request_metrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.metrics.positions import position_counts, rates
from rankwatch.pipeline.metrics.uncertainty import (
    auc_pr_stderr,
    auc_roc_stderr,
    mean_stderr,
    merge_moments,
    shifted_moments_counted,
)

ResultValue = float | int | None


@dataclass
class MetricSum:
    """Count, sum, sum of squares and centred sum of squares ``m2`` of one metric's per-request values.

    ``total_sq`` is kept for the exporter's sufficient statistics (Prometheus sums it across instances);
    the SE uses ``m2`` (stable). Built without ``m2`` (old states), it is derived from ``total_sq``.
    """

    count: int = 0
    total: float = 0.0
    total_sq: float = 0.0
    m2: float | None = None

    def __post_init__(self) -> None:
        if self.m2 is None:
            self.m2 = max(self.total_sq - self.total * self.total / self.count, 0.0) if self.count else 0.0

    def merge(self, other: MetricSum) -> None:
        _, _, m2 = merge_moments((self.count, self.total, self.m2 or 0.0), (other.count, other.total, other.m2 or 0.0))
        self.count += other.count
        self.total += other.total
        self.total_sq += other.total_sq
        self.m2 = m2

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def stderr(self) -> float | None:
        """Standard error of the mean, :math:`s/\\sqrt n` (None below two samples)."""
        return mean_stderr(self.count, self.total, self.m2 or 0.0)


class RankingAggregate:
    """Everything needed to report one slice: request/item counts, metric sums, AUC state."""

    __slots__ = (
        "options", "requests", "requests_with_relevant", "items", "sums", "histogram", "clusters",
        # positive items, shown/positive items per rank 1..ctr_ranks, GAUC state
        "positives", "ctr_shown", "ctr_positive", "gauc",
    )  # fmt: skip

    def __init__(self, options: MetricOptions) -> None:
        self.options = options
        self.requests = 0
        self.requests_with_relevant = 0
        self.items = 0
        self.sums: dict[str, MetricSum] = {name: MetricSum() for name in options.rank_metric_names}
        self.histogram = ScoreHistogram.empty()
        # None only for aggregates restored from states written before clusters existed.
        self.clusters: ClusterHistograms | None = ClusterHistograms.empty()
        self.positives = 0
        self.ctr_shown = np.zeros(options.ctr_ranks, dtype=np.int64)
        self.ctr_positive = np.zeros(options.ctr_ranks, dtype=np.int64)
        self.gauc = GaucSums()

    # -- building -------------------------------------------------------------------------------------
    @classmethod
    def from_lists(
        cls, labels: npt.ArrayLike, scores: npt.ArrayLike, offsets: npt.ArrayLike, options: MetricOptions,
        *, gauc_keys: npt.ArrayLike | None = None,
    ) -> RankingAggregate:
        """Aggregate of flat ranked lists (labels and scores in rank order, list boundaries in offsets);
        ``gauc_keys``: dense user codes per list, for GAUC by user (see :func:`aggregate_groups`)."""
        lab = np.asarray(labels, dtype=np.float64)
        metrics = per_request_metrics(lab, offsets, options)
        group = np.zeros(metrics.n_requests, dtype=np.int64)
        return aggregate_groups(
            metrics, lab, np.asarray(scores, dtype=np.float64), group, 1, options, gauc_keys=gauc_keys
        )[0]

    def merge(self, other: RankingAggregate) -> None:
        """Add ``other``'s requests to this aggregate (in place)."""
        if other.options != self.options:
            raise ValueError("cannot merge aggregates computed with different metric options")
        self.requests += other.requests
        self.requests_with_relevant += other.requests_with_relevant
        self.items += other.items
        for name, s in other.sums.items():
            self.sums[name].merge(s)
        self.histogram = self.histogram.merge(other.histogram).compressed(self.options.max_distinct_scores)
        self.clusters = merge_clusters(self.clusters, other.clusters, other.items)
        self.merge_positions_and_gauc(other)

    def merge_positions_and_gauc(self, other: RankingAggregate) -> None:
        """Add ``other``'s positive items, per-rank counts and GAUC state (for mergers that add the other
        fields themselves, e.g. the windows' batched accumulator)."""
        self.positives += other.positives
        self.ctr_shown = self.ctr_shown + other.ctr_shown
        self.ctr_positive = self.ctr_positive + other.ctr_positive
        self.gauc.merge(other.gauc, self.options.gauc_max_items)

    def copy(self) -> RankingAggregate:
        out = RankingAggregate(self.options)
        out.merge(self)
        return out

    # -- reading --------------------------------------------------------------------------------------
    def values(self) -> dict[str, ResultValue]:
        """The result-document entry: counts, then every metric (None where undefined)."""
        out: dict[str, ResultValue] = {
            "requests": self.requests,
            "requests_with_relevant": self.requests_with_relevant,
            "items": self.items,
        }
        for name in self.options.rank_metric_names:
            out[name] = self.sums[name].mean()
        out["auc_roc"] = self.histogram.auc_roc()
        out["auc_pr"] = self.histogram.average_precision()
        out["gauc"], out["gauc_groups"], out["gauc_groups_excluded"] = self.gauc.value(self.options.gauc_weight,
                                                                                      self._open_scores())
        out["gauc_items_dropped"] = self.gauc.dropped  # online: items past gauc_max_items (0 offline)
        out["positive_rate"] = self.positives / self.items if self.items else None
        out["positives"] = self.positives
        return out

    def stderrs(self) -> dict[str, float | None]:
        """The result document's ``"stderr"`` entry: SE of every metric, same keys (None where undefined)."""
        out: dict[str, float | None] = {name: self.sums[name].stderr() for name in self.options.rank_metric_names}
        for name, s in self.sums.items():  # metrics added by other code paths get one too
            out.setdefault(name, s.stderr())
        defined = self.histogram.auc_roc() is not None
        out["auc_roc"] = auc_roc_stderr(self.histogram, self.clusters) if defined else None
        out["auc_pr"] = auc_pr_stderr(self.histogram, self.clusters) if defined else None
        out["gauc"] = self.gauc.stderr(self.options.gauc_weight, self._open_scores())  # groups (users) as units
        return out

    def _open_scores(self) -> npt.NDArray[np.float64] | None:
        """The sorted distinct scores of GAUC's open items where the AUC histogram has them: an exact histogram
        counting as many items as are open (both are given every item of every list; GAUC keeps up to its cap),
        so the same items. None otherwise."""
        h = self.histogram
        if h.lows is not None or self.gauc.n_open == 0 or int(h.pos.sum() + h.neg.sum()) != self.gauc.n_open:
            return None
        return h.scores

    def position_ctr(self) -> list[float | None]:
        """Click-through at ranks 1..``ctr_ranks``: positive / shown items at the rank, None where none shown."""
        return rates(self.ctr_positive, self.ctr_shown)

    def position_values(self) -> dict[str, list[float | None] | list[int]]:
        """The result document's list entries: click-through and shown items per rank 1..K."""
        return {"position_ctr": self.position_ctr(), "position_shown": self.ctr_shown.tolist()}

    def to_state(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "requests_with_relevant": self.requests_with_relevant,
            "items": self.items,
            "sums": {k: [s.count, s.total, s.total_sq, s.m2] for k, s in self.sums.items()},
            "histogram": self.histogram.to_state(),
            **({} if self.clusters is None else {"clusters": self.clusters.to_state()}),
            "positions": [self.positives, self.ctr_shown.tolist(), self.ctr_positive.tolist()],
            "gauc": self.gauc.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], options: MetricOptions) -> RankingAggregate:
        out = cls(options)
        out.requests = int(state["requests"])
        out.requests_with_relevant = int(state["requests_with_relevant"])
        out.items = int(state["items"])
        for k, (c, t, t2, *m2) in state["sums"].items():  # m2 absent in old states
            out.sums[k] = MetricSum(int(c), float(t), float(t2), float(m2[0]) if m2 else None)
        out.histogram = ScoreHistogram.from_state(state["histogram"])
        out.clusters = ClusterHistograms.from_state(state["clusters"]) if "clusters" in state else None
        if "positions" in state:
            positives, shown, positive = state["positions"]
            out.positives = int(positives)
            out.ctr_shown = np.asarray(shown, dtype=np.int64)
            out.ctr_positive = np.asarray(positive, dtype=np.int64)
        if "gauc" in state:
            out.gauc = GaucSums.from_state(state["gauc"])
        return out

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RankingAggregate)
            and self.options == other.options
            and self.to_state() == other.to_state()
        )

    def __repr__(self) -> str:
        return f"RankingAggregate({self.values()!r})"


def merge_clusters(
    mine: ClusterHistograms | None, other: ClusterHistograms | None, other_items: int
) -> ClusterHistograms | None:
    """Merged clustered state; None (no clustered SE) once a non-empty side comes from an old state."""
    if mine is None or other is None:
        return mine if other_items == 0 else None
    return ClusterHistograms.merge_many([mine, other])


def aggregate_groups(
    metrics: PerRequestMetrics,
    labels: npt.NDArray[np.float64],
    scores: npt.NDArray[np.float64],
    request_group: npt.ArrayLike,
    n_groups: int,
    options: MetricOptions,
    *,
    gauc_keys: npt.ArrayLike | None = None,
    gauc_open: bool = False,
    score_image: ScoreImage | None = None,
    positions: bool = True,
    histograms: list[ScoreHistogram] | None = None,
    request_bucket: npt.NDArray[np.int64] | None = None,
    cluster_codes: npt.NDArray[np.uint32] | None = None,
) -> list[RankingAggregate]:
    """Aggregates of many groups (slices) at once from per-request metrics.

    ``request_group[j]`` is the group id (``0 <= id < n_groups``) of list ``j``; ``labels`` and ``scores``
    are the flat item arrays the metrics were computed from. One pass of ``bincount`` per metric.

    ``gauc_keys[j]`` is the GAUC group key (the user) of list ``j``, needed when
    ``options.gauc_group == "user"`` (without it GAUC is unavailable, null). Offline every user is
    complete and the keys are dense codes: GAUC sums are closed here. With ``gauc_open`` (online, a
    user's requests arrive in several batches) the items are kept with their key for the window.
    ``score_image`` (:meth:`pipeline.metrics.gauc.ScoreImage.of` of ``scores``) shares GAUC's score transform
    between calls on the same items. ``positions=False`` leaves the click-through counts and positive
    items at zero, for a caller that sums them from finer groups (integers: exact). ``histograms``: the
    groups' exact score histograms when the caller has built them already. ``request_bucket`` and
    ``cluster_codes``: :func:`pipeline.metrics.clusters.request_buckets` of the lists and
    :func:`pipeline.metrics.clusters.score_label_codes` of the same items, to share them between calls.
    """
    grp = np.asarray(request_group, dtype=np.int64)
    if grp.shape != (metrics.n_requests,):
        raise ValueError("request_group needs one group id per request")
    has_rel = metrics.n_relevant > 0
    requests = np.bincount(grp, minlength=n_groups)
    with_rel = np.bincount(grp[has_rel], minlength=n_groups)
    items = np.bincount(grp, weights=metrics.lengths, minlength=n_groups)
    sums: dict[str, tuple[Any, Any, Any, Any]] = {}
    zero = options.no_relevant == "zero"
    g = grp if zero else grp[has_rel]  # the same lists for every metric: group and count them once
    g_count = np.bincount(g, minlength=n_groups)
    for name, vals in metrics.values.items():
        v = np.where(has_rel, vals, 0.0) if zero else vals[has_rel]
        count, total, m2 = shifted_moments_counted(v, g, n_groups, g_count)
        sums[name] = (count, total, np.bincount(g, weights=v * v, minlength=n_groups), m2)
    relevant = labels > 0
    if histograms is not None:
        hists = histograms
    elif n_groups == 1:  # one group: no item-level group ids needed
        hists = [ScoreHistogram.from_pairs(scores, relevant)]
    else:
        hists = histograms_by_request_group(scores, relevant, grp, metrics.lengths, n_groups)
    if request_bucket is None:
        request_bucket = request_buckets(scores, metrics.lengths)
    clusters = cluster_histograms_by_request_group(
        scores, relevant, request_bucket, grp, metrics.lengths, n_groups, coded=cluster_codes
    )
    out = []
    for gi in range(n_groups):
        agg = RankingAggregate(options)
        agg.requests = int(requests[gi])
        agg.requests_with_relevant = int(with_rel[gi])
        agg.items = int(items[gi])
        for name, (c, t, t2, m2) in sums.items():
            agg.sums[name] = MetricSum(int(c[gi]), float(t[gi]), float(t2[gi]), float(m2[gi]))
        agg.histogram = hists[gi].compressed(options.max_distinct_scores)
        agg.clusters = clusters[gi]
        out.append(agg)
    if positions:
        offsets = offsets_from_lengths(metrics.lengths)
        shown, positive, positives = position_counts(labels, offsets, grp, n_groups, options.ctr_ranks)
        for gi, agg in enumerate(out):
            agg.positives = int(positives[gi])
            agg.ctr_shown, agg.ctr_positive = shown[gi], positive[gi]
    _add_gauc(out, metrics, scores, labels > 0, grp, n_groups, options, gauc_keys, gauc_open, score_image)
    return out


def _add_gauc(
    out: list[RankingAggregate],
    metrics: PerRequestMetrics,
    scores: npt.NDArray[np.float64],
    relevant: npt.NDArray[np.bool_],
    grp: npt.NDArray[np.int64],
    n_groups: int,
    options: MetricOptions,
    gauc_keys: npt.ArrayLike | None,
    gauc_open: bool,
    score_image: ScoreImage | None,
) -> None:
    """GAUC state of every group: closed sums, or the open items of each group (online)."""
    if options.gauc_group == "request":
        keys: npt.NDArray[np.int64] | None = np.arange(metrics.n_requests, dtype=np.int64)
        gauc_open = False  # a finalized request is complete
    else:
        keys = None if gauc_keys is None else np.asarray(gauc_keys, dtype=np.int64)
    if keys is None:
        for agg in out:
            agg.gauc.available = False
        return
    if keys.shape != (metrics.n_requests,):
        raise ValueError("gauc_keys needs one key per request")
    if gauc_open:
        item_group = np.repeat(grp, metrics.lengths)
        item_key = np.repeat(keys, metrics.lengths)
        by_group = np.argsort(item_group, kind="stable")
        bounds = np.searchsorted(item_group[by_group], np.arange(n_groups + 1))
        for gi, agg in enumerate(out):
            take = by_group[bounds[gi] : bounds[gi + 1]][: options.gauc_max_items]
            agg.gauc = GaucSums(open_keys=item_key[take], open_scores=scores[take], open_relevant=relevant[take])
            agg.gauc.dropped = int(bounds[gi + 1] - bounds[gi]) - int(take.size)
        return
    if options.gauc_group == "request":
        pair, slice_of_pair = keys, grp
    elif n_groups == 1:
        pair, slice_of_pair = keys, np.zeros(int(keys.max()) + 1 if keys.size else 0, dtype=np.int64)
    else:
        import pandas as pd  # here only: the streaming core closes its groups apart (gauc_sums.dense_ids), without pandas

        span = int(keys.max()) + 1 if keys.size else 1
        pair, uniq = pd.factorize(grp * span + keys)
        slice_of_pair = (np.asarray(uniq, dtype=np.int64) // span).astype(np.int64)
    n_pairs = int(slice_of_pair.size)
    image = score_image or ScoreImage.of(scores, relevant, n_pairs)
    pair = np.asarray(pair, dtype=np.int64)
    counts = request_group_auc(pair, metrics.lengths, metrics.n_relevant, n_pairs, image)
    weighted, weight, groups, excluded, moments = weighted_moments(counts, slice_of_pair, n_groups, options.gauc_weight)
    for gi, agg in enumerate(out):
        m0, m1, m2 = (float(x) for x in moments[gi])
        agg.gauc = GaucSums(float(weighted[gi]), float(weight[gi]), int(groups[gi]), int(excluded[gi]), moments=(m0, m1, m2))


def aggregate_lists(
    labels: npt.ArrayLike,
    scores: npt.ArrayLike,
    offsets: npt.ArrayLike,
    request_group: npt.ArrayLike,
    n_groups: int,
    options: MetricOptions,
    *,
    gauc_keys: npt.ArrayLike | None = None,
    gauc_open: bool = False,
) -> list[RankingAggregate]:
    """Per-group aggregates straight from flat lists: the kernel plus :func:`aggregate_groups`."""
    lab = np.asarray(labels, dtype=np.float64)
    metrics = per_request_metrics(lab, offsets, options)
    return aggregate_groups(
        metrics, lab, np.asarray(scores, dtype=np.float64), request_group, n_groups, options,
        gauc_keys=gauc_keys, gauc_open=gauc_open,
    )  # fmt: skip
