"""Turning slice keys into bounded Prometheus label sets, merging the aggregates that land on one label set.

The streaming core caps label values already (SPEC section 3); the exporter caps again as a last defence
(a bug, a restored old snapshot or a hand-built window must not be able to create unbounded series). Where
capping or the absence of a ``model`` label makes two slices share one label set, their aggregates are
merged exactly with the kernel's mergeable state, so the exposed value is the value of the union.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from rankwatch.pipeline.metrics.aggregates import MetricSum, RankingAggregate
from rankwatch.pipeline.metrics.auc import ScoreHistogram
from rankwatch.pipeline.metrics.clusters import ClusterHistograms
from rankwatch.pipeline.slicing import ALL_VALUE, OVERFLOW_VALUE, LabelCapper, SliceKey

LabelSet = tuple[str, str, str]  # (segment, surface, variant), "all" where the slice does not split
OVERALL_LABELS: LabelSet = (ALL_VALUE, ALL_VALUE, ALL_VALUE)
_ALWAYS_ADMITTED = frozenset({ALL_VALUE, OVERFLOW_VALUE})


class ExporterLabelCapper:
    """First come, first kept, per label; later values become ``__other__`` and are counted.

    ``all`` and ``__other__`` are always admitted: they are the exporter's own values. ``overflow[label]``
    counts label sets (not events) that were folded.
    """

    def __init__(self, max_values: int) -> None:
        if max_values < 1:
            raise ValueError("max_values must be >= 1")
        self.max_values = max_values
        # The stream's own first-come capper; the exporter only adds its always-admitted values.
        self._capper = LabelCapper(max_values)

    @property
    def overflow(self) -> dict[str, int]:
        return self._capper.overflow

    def cap_value(self, label: str, value: str) -> str:
        return value if value in _ALWAYS_ADMITTED else self._capper.cap(label, value)

    def labels_of(self, key: SliceKey) -> LabelSet:
        """Capped ``(segment, surface, variant)`` of a slice key; ``model`` has no label and is dropped."""
        values = {label: escape_value(value) for label, value in key}
        segment = self.cap_value("segment", values.get("segment", ALL_VALUE))
        surface = self.cap_value("surface", values.get("surface", ALL_VALUE))
        variant = self.cap_value("variant", values.get("variant", ALL_VALUE))
        return (segment, surface, variant)


def escape_value(value: str) -> str:
    """A producer's own label value ``all`` is shown as ``_all``: ``all`` means "not split" (a roll-up)."""
    return "_all" if value == ALL_VALUE else value


def merge_aggregates(aggs: Sequence[RankingAggregate]) -> RankingAggregate:
    """The aggregate of the union of ``aggs`` (all computed with the same options).

    Equal to folding :meth:`RankingAggregate.merge` over the list, but exact score histograms are combined
    with one sort instead of one per pair, so folding 100,000 slices into ``__other__`` stays cheap
    (compressed histograms, with wide bins, take the kernel's pairwise merge).
    A single aggregate is returned as is (callers treat aggregates as read-only).
    """
    if not aggs:
        raise ValueError("nothing to merge")
    if len(aggs) == 1:
        return aggs[0]
    options = aggs[0].options
    if any(a.histogram.lows is not None for a in aggs):
        # Compressed histograms have wide bins whose ranges must be merged with care (and their error
        # bound kept valid): the kernel's own pairwise merge does that.
        out = aggs[0].copy()
        for agg in aggs[1:]:
            out.merge(agg)
        return out
    out = RankingAggregate(options)
    totals: dict[str, MetricSum] = {name: MetricSum() for name in options.rank_metric_names}
    for agg in aggs:
        if agg.options != options:
            raise ValueError("cannot merge aggregates computed with different metric options")
        out.requests += agg.requests
        out.requests_with_relevant += agg.requests_with_relevant
        out.items += agg.items
        for name, s in agg.sums.items():
            totals.setdefault(name, MetricSum()).merge(s)
        out.merge_positions_and_gauc(agg)
    out.sums = totals
    if all(a.clusters is not None or a.items == 0 for a in aggs):
        out.clusters = ClusterHistograms.merge_many([a.clusters for a in aggs if a.clusters is not None])
    else:
        out.clusters = None
    hists = [a.histogram for a in aggs if a.histogram.scores.size]
    new_ties = float(sum(a.histogram.new_ties for a in aggs))
    if hists:
        uniq, inverse = np.unique(np.concatenate([h.scores for h in hists]), return_inverse=True)
        pos = np.bincount(inverse, weights=np.concatenate([h.pos for h in hists]), minlength=uniq.size)
        neg = np.bincount(inverse, weights=np.concatenate([h.neg for h in hists]), minlength=uniq.size)
        hist = ScoreHistogram(uniq, pos.astype(np.int64), neg.astype(np.int64), new_ties)
        out.histogram = hist.compressed(options.max_distinct_scores)
    else:
        out.histogram = ScoreHistogram(out.histogram.scores, out.histogram.pos, out.histogram.neg, new_ties)
    return out


def group_by_labels(
    parts: Iterable[tuple[SliceKey, RankingAggregate]], capper: ExporterLabelCapper
) -> dict[LabelSet, RankingAggregate]:
    """Capped label set -> merged aggregate, for slices of one or more published windows."""
    grouped: dict[LabelSet, list[RankingAggregate]] = {}
    for key, agg in parts:
        grouped.setdefault(capper.labels_of(key), []).append(agg)
    return {labels: merge_aggregates(aggs) for labels, aggs in grouped.items()}


def rollups(series: Mapping[LabelSet, RankingAggregate]) -> dict[LabelSet, RankingAggregate]:
    """Single-label roll-ups of slices that split on two or more labels.

    For slices ``(segment, surface)`` this adds ``(segment, all, all)`` per segment and ``(all, surface,
    all)`` per surface; the overall slice and slices that split on one label only add nothing. Exact:
    roll-ups merge the slices' aggregates.
    """
    out: dict[LabelSet, list[RankingAggregate]] = {}
    for labels, agg in series.items():
        split = [i for i, value in enumerate(labels) if value != ALL_VALUE]
        if len(split) < 2:
            continue
        for i in split:
            rolled = tuple(labels[j] if j == i else ALL_VALUE for j in range(3))
            out.setdefault(rolled, []).append(agg)  # type: ignore[arg-type]
    return {labels: merge_aggregates(aggs) for labels, aggs in out.items() if labels not in series}
