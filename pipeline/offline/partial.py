"""Map / merge form of an offline baseline: partial baselines of disjoint requests, merged exactly.

A :class:`PartialBaseline` holds what :func:`pipeline.offline.baseline.compute_baseline` needs to know about a set
of *complete* requests: the overall :class:`~pipeline.metrics.aggregates.RankingAggregate`, one aggregate per
*uncapped* slice key, and the number of requests per value of every slice label. Partials of disjoint
request sets merge by adding their aggregates (``RankingAggregate.merge``, so any state an aggregate
gains flows through); :meth:`PartialBaseline.finish` then applies the label caps once, over all
requests, so the kept values and ``label_overflow`` equal the in-memory path:

    kept(label) = the ``max_values_per_label`` values with the most requests (ties by name),
    slice(r)    = (v if v in kept(label) else "__other__" for each label value v of request r),
    label_overflow[label] = sum of requests(v) over the folded values v.

This is the whole contract a chunked, Spark, Dask or Ray computation needs (docs/metrics.md): map every
group of complete requests with :func:`partial_baseline`, ship :meth:`PartialBaseline.to_bytes`, merge
with :func:`merge_partials`, call :meth:`PartialBaseline.finish`. A request must not be split between two
partials (its metrics would be computed on half a list).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from rankwatch.pipeline.metrics.aggregates import RankingAggregate, aggregate_groups
from rankwatch.pipeline.metrics.kernel import offsets_from_lengths, per_request_metrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import BaselineResult, gauc_user_keys, rank_order
from rankwatch.pipeline.offline.readers import EvaluationSet, RequestLabels, validate_rows
from rankwatch.pipeline.slicing import OVERFLOW_VALUE, SLICE_LABELS, UNKNOWN_VALUE, SliceKey, SliceSpec

__all__ = ["PARTIAL_FORMAT", "PartialBaseline", "merge_partials", "partial_baseline", "partial_of_frame"]

PARTIAL_FORMAT = "rankwatch-partial/1"
RawKey = tuple[str, ...]  # one uncapped value per label of ``slice_by``


@dataclass
class PartialBaseline:
    """Mergeable state of a baseline over a set of complete requests (see the module docstring).

    ``label_counts[label][value]`` counts requests; a label whose column was never seen is absent from
    ``seen_labels`` (then ``model``/``variant`` of the result are None, as in the in-memory path).
    ``error`` carries the first invalid-data message of a distributed map step to the driver.
    """

    options: MetricOptions
    slice_by: tuple[str, ...]
    overall: RankingAggregate
    raw_slices: dict[RawKey, RankingAggregate] = field(default_factory=dict)
    label_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    seen_labels: set[str] = field(default_factory=set)
    rows: int = 0
    skipped_rows: int = 0
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def empty(cls, options: MetricOptions, slice_by: tuple[str, ...]) -> PartialBaseline:
        return cls(options=options, slice_by=tuple(slice_by), overall=RankingAggregate(options))

    @property
    def requests(self) -> int:
        return self.overall.requests

    def count_skipped(self, by_reason: dict[str, int]) -> None:
        """Add rows dropped before validation (bad JSON, bad CSV lines) or by it."""
        for reason, n in by_reason.items():
            if n:
                self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + int(n)
                self.skipped_rows += int(n)

    def merge(self, other: PartialBaseline) -> PartialBaseline:
        """Add ``other``'s requests (a disjoint set) to this partial, in place; returns ``self``."""
        if other.options != self.options or other.slice_by != self.slice_by:
            raise ValueError("cannot merge partial baselines of different metric options or slice labels")
        self.overall.merge(other.overall)
        for key, agg in other.raw_slices.items():
            mine = self.raw_slices.get(key)
            if mine is None:
                self.raw_slices[key] = agg.copy()
            else:
                mine.merge(agg)
        for label, counts in other.label_counts.items():
            target = self.label_counts.setdefault(label, {})
            for value, n in counts.items():
                target[value] = target.get(value, 0) + n
        self.seen_labels |= other.seen_labels
        self.rows += other.rows
        self.count_skipped(other.skipped_by_reason)
        self.error = self.error or other.error
        return self

    def finish(self, *, inputs: tuple[str, ...] = (), max_values_per_label: int = 50) -> BaselineResult:
        """The baseline of all merged requests, label caps applied (equal to ``compute_baseline``)."""
        spec = SliceSpec(by=self.slice_by, max_values_per_label=max_values_per_label)
        kept: list[set[str]] = []
        overflow: dict[str, int] = {}
        for label in self.slice_by:
            counts = self.label_counts.get(label, {})
            ranked = sorted((v for v, n in counts.items() if n > 0), key=lambda v: (-counts[v], v))
            kept.append(set(ranked[:max_values_per_label]))
            folded = sum(counts[v] for v in ranked[max_values_per_label:])
            if folded:
                overflow[label] = folded
        slices: dict[SliceKey, RankingAggregate] = {}
        for raw, agg in self.raw_slices.items():
            key = tuple(
                (label, value if value in kept[i] else OVERFLOW_VALUE)
                for i, (label, value) in enumerate(zip(self.slice_by, raw, strict=True))
            )
            if key in slices:
                slices[key].merge(agg)
            else:
                slices[key] = agg.copy()
        return BaselineResult(
            overall=self.overall.copy(),
            slices=slices,
            options=self.options,
            slice_spec=spec,
            inputs=tuple(inputs),
            rows=self.rows,
            skipped_rows=self.skipped_rows,
            skipped_by_reason=dict(self.skipped_by_reason),
            label_overflow=overflow,
            model=self._single_value("model"),
            variant=self._single_value("variant"),
        )

    def _single_value(self, label: str) -> str | None:
        if label not in self.seen_labels:
            return None
        present = [v for v, n in self.label_counts.get(label, {}).items() if n > 0]
        return present[0] if len(present) == 1 and present[0] != UNKNOWN_VALUE else None

    # -- serialisation ----------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        return {
            "format": PARTIAL_FORMAT,
            "options": self.options.to_dict(),
            "slice_by": list(self.slice_by),
            "overall": self.overall.to_state(),
            "raw_slices": [[list(k), a.to_state()] for k, a in self.raw_slices.items()],
            "label_counts": self.label_counts,
            "seen_labels": sorted(self.seen_labels),
            "rows": self.rows,
            "skipped_rows": self.skipped_rows,
            "skipped_by_reason": self.skipped_by_reason,
            "error": self.error,
        }

    def to_bytes(self) -> bytes:
        """MessagePack of :meth:`to_state` (floats as IEEE doubles, so a round trip is exact)."""
        return msgspec.msgpack.encode(self.to_state())

    @classmethod
    def from_bytes(cls, data: bytes) -> PartialBaseline:
        state = msgspec.msgpack.decode(data)
        if not isinstance(state, dict) or state.get("format") != PARTIAL_FORMAT:
            raise ValueError(f"not a {PARTIAL_FORMAT} partial baseline")
        options = MetricOptions.from_dict(state["options"])
        return cls(
            options=options,
            slice_by=tuple(state["slice_by"]),
            overall=RankingAggregate.from_state(state["overall"], options),
            raw_slices={tuple(k): RankingAggregate.from_state(a, options) for k, a in state["raw_slices"]},
            label_counts={str(k): {str(v): int(n) for v, n in c.items()} for k, c in state["label_counts"].items()},
            seen_labels=set(state["seen_labels"]),
            rows=int(state["rows"]),
            skipped_rows=int(state["skipped_rows"]),
            skipped_by_reason={str(k): int(v) for k, v in state["skipped_by_reason"].items()},
            error=state["error"],
        )


def partial_baseline(
    evalset: EvaluationSet, options: MetricOptions, slice_by: tuple[str, ...] = ("segment", "surface")
) -> PartialBaseline:
    """Map step: the partial baseline of a validated set of complete requests.

    The same kernel calls as :func:`pipeline.offline.baseline.compute_baseline` (rank order, per-request metrics,
    ``aggregate_groups``), with slices keyed by their uncapped label values.
    """
    out = PartialBaseline.empty(options, slice_by)
    out.count_skipped(evalset.skipped_by_reason)
    n = evalset.n_requests
    if n == 0 or evalset.rows == 0:
        return out
    codes, scores, labels = evalset.request_codes, evalset.scores, evalset.relevance
    ranked = rank_order(codes, position=evalset.positions, scores=scores)
    lengths = np.bincount(codes, minlength=n)
    ranked_labels, ranked_scores = labels[ranked], scores[ranked]
    metrics = per_request_metrics(ranked_labels, offsets_from_lengths(lengths), options)
    # GAUC sums are closed per partial: exact when every user's rows are in one partial, which
    # offline_stream guarantees by partitioning by user when GAUC is by user (docs/metrics.md).
    gauc_keys = gauc_user_keys(evalset)
    out.overall = aggregate_groups(metrics, ranked_labels, ranked_scores, np.zeros(n, np.int64), 1, options,
                                   gauc_keys=gauc_keys)[0]  # fmt: skip
    out.rows = evalset.rows
    per_label: dict[str, RequestLabels] = {}
    for label in dict.fromkeys((*SLICE_LABELS, *slice_by)):
        found = evalset.labels.get(label)
        if found is not None:
            out.seen_labels.add(label)
        found = found or RequestLabels(np.zeros(n, np.int64), (UNKNOWN_VALUE,))
        per_label[label] = found
        counts = np.bincount(found.codes, minlength=len(found.values))
        tally = out.label_counts.setdefault(label, {})
        for i in np.flatnonzero(counts):  # two codes may name one value: add, do not overwrite
            tally[found.values[i]] = tally.get(found.values[i], 0) + int(counts[i])
    if slice_by:
        combined = np.zeros(n, dtype=np.int64)
        for label in slice_by:
            found = per_label[label]
            combined = pd.factorize(combined * len(found.values) + found.codes)[0].astype(np.int64)
        group, first = _groups_and_first(combined)
        aggs = aggregate_groups(metrics, ranked_labels, ranked_scores, group, first.size, options, gauc_keys=gauc_keys)
        for g, j in enumerate(first):
            raw = tuple(per_label[label].values[int(per_label[label].codes[j])] for label in slice_by)
            if raw in out.raw_slices:
                out.raw_slices[raw].merge(aggs[g])
            else:
                out.raw_slices[raw] = aggs[g]
    return out


def partial_of_frame(
    frame: pd.DataFrame,
    options: MetricOptions,
    slice_by: tuple[str, ...] = ("segment", "surface"),
    *,
    skip_invalid: bool = False,
    source: str = "<frame>",
) -> PartialBaseline:
    """Map step on a DataFrame of complete requests (a Dask or Ray partition): validate, then score.

    Rows are numbered 1.. in frame order for error messages; an empty partition, or one whose rows are
    all skipped as invalid, gives a partial with no requests (not an error).
    """
    n = len(frame)
    evalset = validate_rows(frame, [source], np.zeros(n, dtype=np.int64), np.arange(1, n + 1, dtype=np.int64),
                            skip_invalid=skip_invalid)  # fmt: skip
    return partial_baseline(evalset, options, slice_by)


def _groups_and_first(combined: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    group = pd.factorize(combined)[0].astype(np.int64)
    first = np.full(int(group.max()) + 1, -1, dtype=np.int64)
    first[group[::-1]] = np.arange(group.size - 1, -1, -1, dtype=np.int64)  # last write wins: first row
    return group, first


def merge_partials(partials: Iterable[PartialBaseline | bytes]) -> PartialBaseline:
    """Merge step: partials (or their bytes) of disjoint request sets into one (at least one needed)."""
    merged: PartialBaseline | None = None
    for p in partials:
        part = PartialBaseline.from_bytes(p) if isinstance(p, bytes | bytearray) else p
        merged = part if merged is None else merged.merge(part)
    if merged is None:
        raise ValueError("merge_partials needs at least one partial")
    return merged
