"""Prometheus samples from the exporter state's series: pure functions, no locks, no state.

Layout: :func:`series_sources` (the online windows' series, then the baselines'), then one function per
pair of families (quality and request counts, standard errors and window statistics, click-through by
position and dropped GAUC items, cumulative summaries, quality drift, score drift). Each returns two
tuples of samples. Why separate: :class:`exporters.state.MetricsState` decides *when* they are built
(once per change, under its write lock); what they contain is serialisation, testable on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client.samples import Sample

from rankwatch.exporters import names
from rankwatch.exporters.folding import LabelSet
from rankwatch.exporters.series import DriftResult, SeriesValues

Source = tuple[str, str, Mapping[LabelSet, SeriesValues]]  # (source, window, series)
SamplePair = tuple[tuple[Sample, ...], tuple[Sample, ...]]


def series_sources(online: Mapping[str, Any], offline: Mapping[LabelSet, SeriesValues]) -> list[Source]:
    """``(source, window, series)``: each online window size's slices, then the baselines'."""
    sources: list[Source] = [(names.SOURCE_ONLINE, w, ow.series) for w, ow in sorted(online.items())]
    sources.append((names.SOURCE_OFFLINE, names.BASELINE_WINDOW, offline))
    return sources

def quality_samples(sources: list[Source]) -> SamplePair:
    quality: list[Sample] = []
    requests: list[Sample] = []
    for source, window, series in sources:
        for (segment, surface, variant), values in sorted(series.items()):
            base = {
                "source": source,
                "window": window,
                "segment": segment,
                "surface": surface,
                "variant": variant,
            }
            requests.append(Sample(names.RANKING_REQUESTS, base, float(values.requests)))
            for metric, value in values.metrics.items():
                if value is not None:
                    quality.append(Sample(names.RANKING_QUALITY, {"metric": metric, **base}, value))
    return tuple(quality), tuple(requests)

def uncertainty_samples(sources: list[Source], online: Mapping[str, Any]) -> SamplePair:
    """Standard errors of every value, and each online window's sufficient statistics per slice."""
    stderr: list[Sample] = []
    stats: list[Sample] = []
    for source, window, series in sources:
        for (segment, surface, variant), values in sorted(series.items()):
            base = {"window": window, "segment": segment, "surface": surface, "variant": variant}
            for metric, se in values.stderr.items():
                if se is not None:
                    labels = {"metric": metric, "source": source, **base}
                    stderr.append(Sample(names.RANKING_QUALITY_STDERR, labels, se))
            for metric, (count, total, total_sq) in values.moments.items():
                labels = {"metric": metric, **base}
                stats.append(Sample(names.WINDOW_OBSERVATIONS, labels, float(count)))
                stats.append(Sample(names.WINDOW_SUM, labels, total))
                stats.append(Sample(names.WINDOW_SUM_OF_SQUARES, labels, total_sq))
    for window, ow in sorted(online.items()):
        stats.append(Sample(names.WINDOW_START, {"window": window}, ow.start.timestamp()))
    return tuple(stderr), tuple(stats)

def position_ctr_samples(sources: list[Source]) -> SamplePair:
    """``rankwatch_position_ctr{rank}`` of every online window and baseline slice, and
    ``rankwatch_gauc_items_dropped`` where the online GAUC cap was hit."""
    out: list[Sample] = []
    dropped: list[Sample] = []
    for source, window, series in sources:
        for (segment, surface, variant), values in sorted(series.items()):
            base = {"source": source, "window": window, "segment": segment, "surface": surface, "variant": variant}
            for rank, value in enumerate(values.position_ctr, start=1):
                if value is not None:
                    out.append(Sample(names.POSITION_CTR, {"rank": str(rank), **base}, value))
            if values.gauc_items_dropped:  # the online GAUC cap was hit: GAUC covers the kept users only
                labels = {k: v for k, v in base.items() if k != "source"}
                dropped.append(Sample(names.GAUC_ITEMS_DROPPED, labels, float(values.gauc_items_dropped)))
    return tuple(out), tuple(dropped)

def cumulative_samples(cumulative: Mapping[LabelSet, Any]) -> SamplePair:
    summary: list[Sample] = []
    finalized: list[Sample] = []
    sum_name, count_name = names.RANKING_METRIC + "_sum", names.RANKING_METRIC + "_count"
    for (segment, surface, variant), cum in sorted(cumulative.items()):
        base = {"segment": segment, "surface": surface, "variant": variant}
        finalized.append(Sample(names.FINALIZED_REQUESTS + "_total", base, float(cum.requests)))
        for metric, (total, count) in cum.sums.items():
            labels = {"metric": metric, **base}
            summary.append(Sample(sum_name, labels, total))
            summary.append(Sample(count_name, labels, count))
    return tuple(summary), tuple(finalized)


def drift_samples(drifts: Mapping[str, DriftResult]) -> SamplePair:
    out: list[Sample] = []
    unmatched: list[Sample] = []
    for window, result in sorted(drifts.items()):
        for ((segment, surface, variant), metric), value in sorted(result.values.items()):
            labels = {
                "metric": metric,
                "window": window,
                "segment": segment,
                "surface": surface,
                "variant": variant,
            }
            out.append(Sample(names.RANKING_QUALITY_DRIFT, labels, value))
        for only_in, slices in (("online", result.online_only), ("offline", result.offline_only)):
            unmatched.append(
                Sample(
                    names.DRIFT_UNMATCHED_SLICES, {"window": window, "only_in": only_in}, float(len(slices))
                )
            )
    return tuple(out), tuple(unmatched)


def score_drift_samples(by_window: Mapping[str, Mapping[LabelSet, Any]]) -> SamplePair:
    """``rankwatch_score_drift{statistic}`` (PSI, KS; absent where undefined) and the items compared."""
    values: list[Sample] = []
    items: list[Sample] = []
    for window, drifts in sorted(by_window.items()):
        for (segment, surface, variant), d in sorted(drifts.items()):
            base = {"window": window, "segment": segment, "surface": surface, "variant": variant}
            items.append(Sample(names.SCORE_DRIFT_ITEMS, base, float(d.items)))
            for statistic, value in (("psi", d.psi), ("ks", d.ks)):
                if value is not None:
                    values.append(Sample(names.SCORE_DRIFT, {"statistic": statistic, **base}, value))
    return tuple(values), tuple(items)
