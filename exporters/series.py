"""Series values of one published window or baseline, and the drift between them.

These are plain data (label set -> metric -> value); :mod:`exporters.state` turns them into Prometheus
samples once per update, so a scrape only copies references.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rankwatch.exporters.folding import LabelSet
from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.auc import ScoreHistogram
from rankwatch.pipeline.metrics.drift import ScoreDistribution, ScoreDrift, score_drift

Value = float | None


@dataclass(frozen=True)
class SeriesValues:
    """What one slice shows: its sample size and each metric's value (None where undefined).

    ``stderr`` holds each metric's standard error (None where undefined); ``moments`` the per-request
    metrics' ``(count, sum, sum of squares)``, the window's sufficient statistics (online only).
    """

    requests: int
    metrics: Mapping[str, Value]
    stderr: Mapping[str, Value] = field(default_factory=dict)
    moments: Mapping[str, tuple[int, float, float]] = field(default_factory=dict)
    # click-through at ranks 1..K; the window's score histogram (online) or the baseline's
    # score distribution (offline), the two sides of the score-drift statistics
    position_ctr: tuple[Value, ...] = ()
    score_histogram: ScoreHistogram | None = None
    score_distribution: ScoreDistribution | None = None
    gauc_items_dropped: int = 0

    @classmethod
    def of(cls, agg: RankingAggregate) -> SeriesValues:
        values = agg.values()
        ses = agg.stderrs()
        metrics: dict[str, Value] = {}
        stderr: dict[str, Value] = {}
        for name in agg.options.metric_names:
            v, se = values.get(name), ses.get(name)
            metrics[name] = None if v is None else float(v)
            stderr[name] = None if se is None else float(se)
        moments = {name: (s.count, s.total, s.total_sq) for name, s in agg.sums.items()}
        return cls(
            requests=agg.requests, metrics=metrics, stderr=stderr, moments=moments,
            position_ctr=tuple(agg.position_ctr()), score_histogram=agg.histogram, gauc_items_dropped=agg.gauc.dropped,
        )


def score_drifts(
    online: Mapping[LabelSet, SeriesValues], offline: Mapping[LabelSet, SeriesValues]
) -> dict[LabelSet, ScoreDrift]:
    """PSI/KS of every online slice's scores against its baseline slice's distribution (both present)."""
    out: dict[LabelSet, ScoreDrift] = {}
    for labels, on in online.items():
        off = offline.get(labels)
        if off is None or off.score_distribution is None or on.score_histogram is None:
            continue
        out[labels] = score_drift(off.score_distribution, on.score_histogram)
    return out


@dataclass(frozen=True)
class DriftResult:
    """Drift of one online window against the offline baselines.

    ``values[(labels, metric)] = online - offline`` for every label set and metric with a value on both
    sides. ``online_only`` / ``offline_only`` list the label sets present on one side only (online
    roll-ups are not counted: they are extras, not slices a baseline is expected to have).
    """

    values: Mapping[tuple[LabelSet, str], float]
    online_only: tuple[LabelSet, ...]
    offline_only: tuple[LabelSet, ...]


def drift(
    online: Mapping[LabelSet, SeriesValues],
    online_primary: frozenset[LabelSet],
    offline: Mapping[LabelSet, SeriesValues],
) -> DriftResult:
    """Online minus offline for every slice and metric present on both sides; nothing is invented.

    .. math:: drift_{m,s} = q^{online}_{m,s} - q^{offline}_{m,s}

    A metric undefined on either side (e.g. AUC of a one-class slice) has no drift value.
    """
    values: dict[tuple[LabelSet, str], float] = {}
    for labels, on in online.items():
        off = offline.get(labels)
        if off is None:
            continue
        for metric, v_on in on.metrics.items():
            v_off = off.metrics.get(metric)
            if v_on is not None and v_off is not None:
                values[(labels, metric)] = v_on - v_off
    online_only = tuple(sorted(lbl for lbl in online_primary if lbl not in offline))
    offline_only = tuple(sorted(lbl for lbl in offline if lbl not in online))
    return DriftResult(values=values, online_only=online_only, offline_only=offline_only)
