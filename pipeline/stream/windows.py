"""Event-time tumbling windows and their per-slice accumulators.

A window of size ``size`` covers ``[start, start + size)`` with ``start`` a multiple of ``size`` since the
epoch. It holds one accumulator per slice plus the overall one. A staged batch of finalized requests goes
through the kernel once (:meth:`WindowSet.add_batch`) and arrives as
:class:`pipeline.metrics.aggregates.RankingAggregate` parts; an accumulator adds counts and
metric sums at once and merges the AUC score histograms lazily, many at a time, once the pending parts
hold more distinct scores than the merged histogram (amortised ``O(log)`` work per score instead of
re-merging a large histogram for every batch). The merged result equals ``RankingAggregate.merge`` of the
parts: counts are integers, so the histogram is exact below ``MetricOptions.max_distinct_scores``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple, Protocol

import numpy as np

from rankwatch.pipeline.clock import ms_to_datetime
from rankwatch.pipeline.metrics.aggregates import RankingAggregate, aggregate_groups
from rankwatch.pipeline.metrics.auc import ScoreHistogram
from rankwatch.pipeline.metrics.clusters import ClusterHistograms
from rankwatch.pipeline.metrics.kernel import PerRequestMetrics, per_request_metrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.slicing import SliceKey
from rankwatch.pipeline.stream.durations import parse_duration_ms
from rankwatch.pipeline.stream.join import FinalizedBatch

_MIN_COMPACT_BINS = 65_536


def merge_histograms(parts: list[ScoreHistogram], max_distinct: int) -> ScoreHistogram:
    """One histogram with the counts of all ``parts`` (a multi-way ``ScoreHistogram.merge``)."""
    parts = [p for p in parts if p.n_distinct]
    if not parts:
        return ScoreHistogram.empty()
    if len(parts) == 1:
        return parts[0].compressed(max_distinct)
    # Each part's scores ascend: a stable sort (timsort) merges those runs, several times faster than the
    # comparison sort inside np.unique; integer sums per distinct score, as its bincount had them.
    scores = np.concatenate([p.scores for p in parts])
    order = np.argsort(scores, kind="stable")
    scores = scores[order]
    new = np.empty(scores.size, dtype=bool)
    new[0] = True
    np.not_equal(scores[1:], scores[:-1], out=new[1:])  # -0.0 == 0.0, one score ...
    starts = np.flatnonzero(new)
    uniq = scores[starts]
    uniq += 0.0  # ... kept as 0.0 (np.unique kept whichever its unstable sort put first)
    pos = np.add.reduceat(np.concatenate([p.pos for p in parts]).astype(np.int64, copy=False)[order], starts)
    neg = np.add.reduceat(np.concatenate([p.neg for p in parts]).astype(np.int64, copy=False)[order], starts)
    ties = float(sum(p.new_ties for p in parts))
    return ScoreHistogram(uniq, pos, neg, ties).compressed(max_distinct)


class SliceAccumulator:
    """A growing :class:`RankingAggregate` whose histogram merges are batched."""

    __slots__ = ("agg", "pending", "pending_bins", "pending_clusters")

    def __init__(self, options: MetricOptions) -> None:
        self.agg = RankingAggregate(options)
        self.pending: list[ScoreHistogram] = []
        self.pending_bins = 0
        self.pending_clusters: list[ClusterHistograms] = []

    def add(self, part: RankingAggregate) -> None:
        agg = self.agg
        agg.requests += part.requests
        agg.requests_with_relevant += part.requests_with_relevant
        agg.items += part.items
        for name, s in part.sums.items():
            agg.sums[name].merge(s)
        if part.clusters is None or agg.clusters is None:
            agg.clusters = agg.clusters if part.items == 0 else None
        elif part.clusters.n_bins:
            self.pending_clusters.append(part.clusters)
        agg.merge_positions_and_gauc(part)
        n = part.histogram.n_distinct
        if n:
            self.pending.append(part.histogram)
            self.pending_bins += n
            if self.pending_bins > max(_MIN_COMPACT_BINS, agg.histogram.n_distinct):
                self._compact()

    def _compact(self) -> None:
        if self.pending:
            merged = merge_histograms([self.agg.histogram, *self.pending], self.agg.options.max_distinct_scores)
            self.agg.histogram = merged
            self.pending = []
            self.pending_bins = 0
        if self.pending_clusters and self.agg.clusters is not None:
            self.agg.clusters = ClusterHistograms.merge_many([self.agg.clusters, *self.pending_clusters])
        self.pending_clusters = []

    def aggregate(self) -> RankingAggregate:
        self._compact()
        return self.agg

    def to_state(self) -> dict[str, Any]:
        out = {"agg": self.agg.to_state(), "pending": [h.to_state() for h in self.pending]}
        if self.pending_clusters:
            out["pending_clusters"] = [c.to_state() for c in self.pending_clusters]
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any], options: MetricOptions) -> SliceAccumulator:
        out = cls(options)
        out.agg = RankingAggregate.from_state(state["agg"], options)
        out.pending = [ScoreHistogram.from_state(h) for h in state["pending"]]
        out.pending_bins = sum(h.n_distinct for h in out.pending)
        out.pending_clusters = [ClusterHistograms.from_state(c) for c in state.get("pending_clusters", [])]
        return out


@dataclass
class OpenWindow:
    """One window being filled: the overall accumulator and one per slice combination id."""

    overall: SliceAccumulator
    slices: dict[int, SliceAccumulator] = field(default_factory=dict)


class BatchParts(NamedTuple):
    """:meth:`WindowSet.kernel` of a staged batch: a row ``(window start of every size..., combo)`` and its
    :class:`RankingAggregate` part for each distinct row, and the batch's per-request metrics."""

    rows: list[list[int]]
    parts: list[RankingAggregate]
    metrics: PerRequestMetrics


class WindowsElsewhere(Protocol):
    """Where :meth:`StreamProcessor.offload_windows` hands the aggregation half."""

    published: dict[str, int]  # windows published by size, as ``stats().windows_published`` reports them

    def aggregate(self, batch: FinalizedBatch, combo_keys: list[SliceKey]) -> None:
        """A staged batch for the kernel; ``combo_keys`` is the processor's table of slice keys (it only grows)."""

    def close(self, horizon_ms: int | None, partitions: tuple[int, ...]) -> None:
        """Publish the windows that end by ``horizon_ms`` (every window when None)."""


class WindowSet:
    """All open windows of all sizes, keyed by ``(size index, start_ms)``.

    Sizes in ``counted_only`` (indexes) are opened, closed and counted in ``published`` as the others, but hold no
    sums and publish no :class:`PublishedWindow`: for a caller that reads only the other sizes' windows
    (``rankwatch replay`` without ``--windows-out`` reads only the largest).
    """

    def __init__(self, windows: tuple[str, ...], options: MetricOptions) -> None:
        self.labels = tuple(windows)
        self.sizes_ms = tuple(parse_duration_ms(w) for w in windows)
        if len(set(self.sizes_ms)) != len(self.sizes_ms):
            raise ValueError("window sizes must be distinct")
        self.options = options
        self.open: dict[tuple[int, int], OpenWindow | None] = {}  # None: a window of a counted-only size
        self.published: dict[str, int] = {w: 0 for w in self.labels}
        self.counted_only: frozenset[int] = frozenset()

    def add(self, size_index: int, start_ms: int, combo: int, part: RankingAggregate) -> None:
        key = (size_index, start_ms)
        win = self.open.get(key)
        if win is None:
            if size_index in self.counted_only:
                self.open[key] = None
                return
            win = self.open[key] = OpenWindow(SliceAccumulator(self.options))
        win.overall.add(part)
        acc = win.slices.get(combo)
        if acc is None:
            acc = win.slices[combo] = SliceAccumulator(self.options)
        acc.add(part)

    def add_batch(self, batch: FinalizedBatch, slice_keys: list[SliceKey]) -> PerRequestMetrics:
        """One kernel call for a staged batch; its parts per (window starts, slice) go to the accumulators, in
        slice-key order. Returns the batch's per-request metrics (the user-unit experiments fold them)."""
        return self.add_parts(self.kernel(batch), slice_keys)

    def kernel(self, batch: FinalizedBatch) -> BatchParts:
        """The stateless half of :meth:`add_batch`: the batch's parts per (window starts, combo). It reads no
        window, so the parts of several batches can be made at once, by threads (numpy's sorts release the GIL)."""
        sizes = self.sizes_ms
        ts = batch.ts_ms
        starts = [ts - ts % size for size in sizes]
        if all(int(st[0]) == int(st[-1]) and (st == st[0]).all() for st in starts):
            # The usual case (a staged group lies inside one window of every size): rows differ by combo
            # only, and a 1-d unique gives the same sorted rows and inverse as the row-wise one.
            combos, inverse = np.unique(batch.combo, return_inverse=True)
            uniq = np.empty((combos.size, len(sizes) + 1), dtype=np.int64)
            for i, st in enumerate(starts):
                uniq[:, i] = st[0]
            uniq[:, -1] = combos
        else:
            keys = np.stack([*starts, batch.combo], axis=1)
            uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        metrics = per_request_metrics(batch.labels, batch.offsets, self.options)
        parts = aggregate_groups(
            metrics, batch.labels, batch.scores, inverse.reshape(-1), len(uniq), self.options,
            gauc_keys=batch.users, gauc_open=True,  # a user's requests span batches
        )
        return BatchParts(uniq.tolist(), parts, metrics)

    def add_parts(self, made: BatchParts, slice_keys: list[SliceKey]) -> PerRequestMetrics:
        """The stateful half of :meth:`add_batch`: ``made`` (:meth:`kernel` of the batch) into the accumulators.

        Parts are added in slice-key order, not combo-id order: combo ids depend on arrival order, and the order
        of float additions into the overall accumulators must not."""
        n_sizes = len(self.sizes_ms)
        for row, part in sorted(zip(made.rows, made.parts, strict=True),
                                key=lambda rp: (rp[0][:-1], slice_keys[rp[0][-1]])):
            for i in range(n_sizes):
                self.add(i, row[i], row[-1], part)
        return made.metrics

    def close(
        self, horizon_ms: int | None, slice_keys: list[SliceKey], partitions: tuple[int, ...]
    ) -> list[PublishedWindow]:
        """Publish and forget every window whose ``end <= horizon_ms`` (all when None), ordered by end, size."""
        due = [
            (start + self.sizes_ms[i], self.sizes_ms[i], i, start)
            for i, start in self.open
            if horizon_ms is None or start + self.sizes_ms[i] <= horizon_ms
        ]
        out = []
        for _end, _, i, start in sorted(due):
            win = self.open.pop((i, start))
            if win is None:  # counted only
                self.published[self.labels[i]] += 1
                continue
            slices: dict[SliceKey, RankingAggregate] = {}
            for combo, acc in win.slices.items():
                key = slice_keys[combo]
                if key != ():  # with an empty slice spec there is only the overall slice
                    slices[key] = acc.aggregate()
            label = self.labels[i]
            self.published[label] += 1
            out.append(
                PublishedWindow(
                    window=label,
                    start=ms_to_datetime(start),
                    end=ms_to_datetime(start) + timedelta(milliseconds=self.sizes_ms[i]),
                    overall=win.overall.aggregate(),
                    slices=slices,
                    partitions=partitions,
                )
            )
        return out

    def to_state(self) -> list[Any]:
        if self.counted_only:
            raise ValueError("windows counted only have no state to save")
        return [
            [i, start, win.overall.to_state(), [[c, acc.to_state()] for c, acc in win.slices.items()]]
            for (i, start), win in self.open.items() if win is not None
        ]

    def load_state(self, state: list[Any], published: dict[str, int]) -> None:
        for i, start, overall, slices in state:
            win = OpenWindow(SliceAccumulator.from_state(overall, self.options))
            for c, acc in slices:
                win.slices[int(c)] = SliceAccumulator.from_state(acc, self.options)
            self.open[(int(i), int(start))] = win
        self.published.update(published)


class FinalizedStaging:
    """Finalized requests waiting for one kernel call, grouped by ``request_ts // group_ms``.

    ``group_ms`` is the gcd of the window sizes, so every window boundary is a group boundary. A group is
    handed to the kernel when it is complete (the stepped watermark passed its last possible deadline,
    ``(k + 1) * group_ms + attribution_window``), when it holds ``max_items`` items, or on flush. Requests
    enter a group bucket by bucket in deadline order, so the kernel calls -- and hence the float sums of
    every window -- are the same whatever the arrival order was (within the allowed disorder).
    """

    def __init__(self, *, group_ms: int, attribution_window_ms: int, max_items: int = 200_000) -> None:
        self.group_ms = group_ms
        self.attribution_window_ms = attribution_window_ms
        self.max_items = max_items
        self.groups: dict[int, list[FinalizedBatch]] = {}
        self.items: dict[int, int] = {}

    def add(self, batch: FinalizedBatch) -> list[FinalizedBatch]:
        """Stage a finalized bucket; returns groups that reached ``max_items``."""
        keys = batch.ts_ms // self.group_ms
        first = int(keys[0])
        if np.all(keys == first):
            parts = [(first, batch)]
        else:
            parts = [(int(k), batch.select(keys == k)) for k in np.unique(keys)]
        out = []
        for k, part in parts:
            self.groups.setdefault(k, []).append(part)
            self.items[k] = self.items.get(k, 0) + part.n_items
            if self.items[k] >= self.max_items:
                out.append(self._pop(k))
        return out

    def complete(self, watermark_ms: int | None) -> list[FinalizedBatch]:
        """Pop the groups that can receive no more requests (all when ``watermark_ms`` is None)."""
        keys = sorted(
            k for k in self.groups
            if watermark_ms is None or (k + 1) * self.group_ms + self.attribution_window_ms <= watermark_ms
        )
        return [self._pop(k) for k in keys]

    def _pop(self, k: int) -> FinalizedBatch:
        del self.items[k]
        return FinalizedBatch.concat(self.groups.pop(k))

    def to_state(self) -> list[Any]:
        return [[k, [b.to_state() for b in batches]] for k, batches in self.groups.items()]

    def load_state(self, state: list[Any]) -> None:
        for k, batches in state:
            self.groups[int(k)] = [FinalizedBatch.from_state(b) for b in batches]
            self.items[int(k)] = sum(b.n_items for b in self.groups[int(k)])
