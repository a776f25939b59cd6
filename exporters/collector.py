"""The prometheus-client custom collector of rankwatch.

``collect()`` takes one :class:`exporters.state.Snapshot` (a reference copied under the state's lock) and
only reads it: no metric is updated here. The large families (quality, drift, sample sizes, cumulative
parts) are tuples of ready ``Sample`` objects built when the data changed, so a scrape costs little more
than the text formatting itself. Two time-dependent gauges are computed from the snapshot and the clocks:
the watermark delay (event-time clock) and the baseline age (wall clock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample

from rankwatch.exporters import names
from rankwatch.exporters.state import MetricsState, Snapshot
from rankwatch.exporters.transfer import transfer_families
from rankwatch.pipeline.clock import Clock


class WallClock:
    """``pipeline.clock.Clock`` reading the system time (the pipeline itself never does)."""

    def now(self) -> datetime:
        return datetime.now(UTC)


def _family(name: str, documentation: str, typ: str, samples: list[Sample] | tuple[Sample, ...]) -> Metric:
    metric = Metric(name, documentation, typ)
    metric.samples = samples  # type: ignore[assignment]  # a tuple iterates like the list it expects
    return metric


class RankwatchCollector(Collector):
    """Yields every rankwatch family from one snapshot of a :class:`MetricsState`.

    Parameters
    ----------
    event_clock
        The clock the watermark is compared with (wall clock in the service, the accelerated clock in the
        demo): ``rankwatch_watermark_delay_seconds = event_clock.now() - watermark``.
    wall_clock
        Seconds since the epoch for ``rankwatch_baseline_age_seconds``.
    """

    def __init__(
        self,
        state: MetricsState,
        *,
        event_clock: Clock | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self._event_clock: Clock = event_clock or WallClock()
        self._wall = wall_clock

    def describe(self) -> list[Metric]:
        """Every family, without samples: registries use it for name checks and ``name[]`` filters."""
        return [Metric(m.name, m.documentation, m.type) for m in self.collect()]

    def collect(self) -> Iterator[Metric]:
        snap = self.state.snapshot()
        yield from _ranking_families(snap)
        yield from self.health_families(snap)

    def health_families(self, snap: Snapshot) -> Iterator[Metric]:
        """The small, often changing families (events, health, baselines), computed from ``snap``."""
        yield from transfer_families(snap.transfer, snap.transfer_load_errors)  # a copy, no statistics
        h = snap.health
        yield _family(
            names.EVENTS,
            "Events by stream and outcome (accepted, duplicate, rejected, orphan, late).",
            "counter",
            [
                Sample(names.EVENTS + "_total", {"stream": s, "outcome": o}, float(n))
                for (s, o), n in sorted(h.events.items())
            ],
        )
        yield _family(
            names.REJECTED_EVENTS,
            "Rejected events by stream and reason code.",
            "counter",
            [
                Sample(names.REJECTED_EVENTS + "_total", {"stream": s, "reason": r}, float(n))
                for (s, r), n in sorted(h.rejects.items())
            ],
        )
        yield _family(
            names.CONSUMER_LAG,
            "Messages behind the high watermark per topic partition.",
            "gauge",
            [
                Sample(names.CONSUMER_LAG, {"topic": t, "partition": str(p)}, float(n))
                for (t, p), n in sorted(snap.consumer_lag.items())
            ],
        )
        yield _family(names.KAFKA_OUTAGE, "1 while Kafka is unreachable by the consumer, else 0.", "gauge",
                      [Sample(names.KAFKA_OUTAGE, {}, 1.0 if snap.kafka_outage[0] else 0.0)])
        yield _family(names.KAFKA_OUTAGE_SECONDS, "Seconds spent in Kafka outages since start.", "counter",
                      [Sample(names.KAFKA_OUTAGE_SECONDS + "_total", {}, snap.kafka_outage[1])])
        if snap.schema_registry is not None:
            yield _family(names.SCHEMA_REGISTRY_UP, "1 while the schema registry answers, 0 in an outage.", "gauge",
                          [Sample(names.SCHEMA_REGISTRY_UP, {}, 1.0 if snap.schema_registry[0] else 0.0)])
            yield _family(names.SCHEMA_REGISTRY_OUTAGE_SECONDS, "Seconds spent in schema registry outages since start.",
                          "counter", [Sample(names.SCHEMA_REGISTRY_OUTAGE_SECONDS + "_total", {},
                                             snap.schema_registry[1])])
        delay: list[Sample] = []
        if h.watermark_ms is not None:
            now_ms = self._event_clock.now().timestamp() * 1000.0
            delay.append(Sample(names.WATERMARK_DELAY, {}, max(now_ms - h.watermark_ms, 0.0) / 1000.0))
        yield _family(
            names.WATERMARK_DELAY, "Event-time clock minus the event-time watermark.", "gauge", delay
        )
        yield _family(
            names.PENDING_REQUESTS,
            "Requests waiting to be finalized.",
            "gauge",
            [Sample(names.PENDING_REQUESTS, {}, float(h.pending_requests))],
        )
        limit = h.pending_requests_limit
        yield _family(
            names.PENDING_REQUESTS_LIMIT,
            "Cap on pending requests (oldest finalized early beyond it).",
            "gauge",
            [] if limit is None else [Sample(names.PENDING_REQUESTS_LIMIT, {}, float(limit))],
        )
        yield _family(
            names.PENDING_ITEMS,
            "Items of the pending requests.",
            "gauge",
            [Sample(names.PENDING_ITEMS, {}, float(h.pending_items))],
        )
        yield _family(
            names.REQUESTS_EVICTED,
            "Requests finalized early because the pending cap was reached.",
            "counter",
            [Sample(names.REQUESTS_EVICTED + "_total", {}, float(h.evicted_requests))],
        )
        yield _family(
            names.LABEL_VALUES,
            "Distinct values admitted per slice label.",
            "gauge",
            [Sample(names.LABEL_VALUES, {"label": k}, float(v)) for k, v in sorted(h.label_values.items())],
        )
        label_limit = h.label_values_limit
        yield _family(
            names.LABEL_VALUES_LIMIT,
            "Cap on distinct values per slice label.",
            "gauge",
            [] if label_limit is None else [Sample(names.LABEL_VALUES_LIMIT, {}, float(label_limit))],
        )
        yield _family(
            names.LABEL_OVERFLOW,
            "Events whose label value was folded into __other__ by the stream's cap.",
            "counter",
            [
                Sample(names.LABEL_OVERFLOW + "_total", {"label": k}, float(v))
                for k, v in sorted(h.label_overflow.items())
            ],
        )
        yield _family(
            names.EXPORTER_LABEL_OVERFLOW,
            "Slices folded into __other__ by the exporter's own label cap.",
            "counter",
            [
                Sample(names.EXPORTER_LABEL_OVERFLOW + "_total", {"label": k}, float(v))
                for k, v in sorted(snap.exporter_overflow.items())
            ],
        )
        now = self._wall()
        yield _family(
            names.BASELINE_AGE,
            "Seconds since the served baseline was computed.",
            "gauge",
            [
                Sample(names.BASELINE_AGE, {"baseline": b.name}, max(now - b.created, 0.0))
                for b in snap.baselines
            ],
        )
        yield _family(
            names.BASELINE_LOAD_ERRORS,
            "Failed baseline loads (corrupt, half written or missing file).",
            "counter",
            [
                Sample(names.BASELINE_LOAD_ERRORS + "_total", {"baseline": k}, float(v))
                for k, v in sorted(snap.baseline_errors.items())
            ],
        )
        yield _family(
            names.BASELINE_LOADED,
            "1 when the baseline file on disk is the one served, 0 after a failed load.",
            "gauge",
            [
                Sample(names.BASELINE_LOADED, {"baseline": k}, 1.0 if v else 0.0)
                for k, v in sorted(snap.baseline_loaded.items())
            ],
        )
        yield _family(
            names.BASELINE_SLICES,
            "Slices (overall included) served from each baseline file.",
            "gauge",
            [
                Sample(names.BASELINE_SLICES, {"baseline": k}, float(v))
                for k, v in sorted(snap.baseline_slices.items())
            ],
        )
        yield _family(
            names.LAST_PUBLISH_TIMESTAMP,
            "Wall-clock time of the last window publication per window size.",
            "gauge",
            [
                Sample(names.LAST_PUBLISH_TIMESTAMP, {"window": k}, v)
                for k, v in sorted(snap.last_publish.items())
            ],
        )
        yield _family(
            names.WINDOWS_PUBLISHED,
            "Windows published per window size.",
            "counter",
            [
                Sample(names.WINDOWS_PUBLISHED + "_total", {"window": k}, float(v))
                for k, v in sorted(snap.windows_published.items())
            ],
        )
        yield _family(
            names.BUILD_INFO,
            "rankwatch version; always 1.",
            "gauge",
            [Sample(names.BUILD_INFO, {"version": snap.version_label}, 1.0)],
        )


def _ranking_families(snap: Snapshot) -> Iterator[Metric]:
    yield _family(
        names.RANKING_QUALITY,
        "Ranking quality per metric and slice: online = last published window, offline = baseline file.",
        "gauge",
        snap.quality,
    )
    yield _family(
        names.RANKING_QUALITY_DRIFT,
        "Online minus offline quality, for slices and metrics present on both sides.",
        "gauge",
        snap.drift,
    )
    yield _family(
        names.RANKING_REQUESTS, "Requests behind each quality value (sample size).", "gauge", snap.requests
    )
    yield _family(
        names.RANKING_QUALITY_STDERR,
        "Standard error of each quality value (s/sqrt(n) for means, clustered DeLong / jackknife for AUCs).",
        "gauge",
        snap.stderr,
    )
    window_stats: dict[str, list[Sample]] = {names.WINDOW_OBSERVATIONS: [], names.WINDOW_SUM: [], names.WINDOW_SUM_OF_SQUARES: [],
                    names.WINDOW_START: []}  # fmt: skip
    for sample in snap.window_stats:
        window_stats[sample.name].append(sample)
    for name, doc in (
        (names.WINDOW_OBSERVATIONS, "Per-request values behind an online window's metric (its n), this instance."),
        (names.WINDOW_SUM, "Sum of the per-request values of an online window's metric, this instance."),
        (names.WINDOW_SUM_OF_SQUARES, "Sum of squares of those values (fleet SE = sum over instances)."),
        (names.WINDOW_START, "Start of the online window of each size that this instance exposes."),
    ):
        yield _family(name, doc, "gauge", window_stats[name])
    yield _family(
        names.POSITION_CTR,
        "Share of shown items with rel > 0 at each rank 1..K: online = last window, offline = baseline.",
        "gauge",
        snap.position_ctr,
    )
    yield _family(
        names.GAUC_ITEMS_DROPPED,
        "Items of the window left out of GAUC by the gauc_max_items cap (absent while under it).",
        "gauge",
        snap.gauc_items_dropped,
    )
    yield _family(
        names.SCORE_DRIFT,
        "PSI and KS of the window's scores against the baseline slice's quantile bins.",
        "gauge",
        snap.score_drift,
    )
    yield _family(
        names.SCORE_DRIFT_ITEMS, "Items of the window behind each score-drift value.", "gauge", snap.score_drift_items
    )
    yield _family(
        names.DRIFT_UNMATCHED_SLICES,
        "Slices present on one side only (no drift computed for them).",
        "gauge",
        snap.unmatched,
    )
    yield _family(
        names.RANKING_METRIC,
        "Cumulative per-request metric sums and counts of finalized requests (fleet-exact means via rate).",
        "summary",
        snap.summary,
    )
    yield _family(
        names.FINALIZED_REQUESTS,
        "Finalized requests per slice (from the smallest window).",
        "counter",
        snap.finalized,
    )


class _Families:
    """A ready list of families, in the shape the exposition encoders take (anything with ``collect()``)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class CachedExposition:
    """The exposition of one :class:`RankwatchCollector`, with the text of the large families kept while
    the state behind them is unchanged.

    Quality, drift, sample sizes and the cumulative parts change only when a window is published or the
    baselines change, but make up nearly all of a scrape; their text is rendered once per change and per
    format (Prometheus text or OpenMetrics, by ``Accept``), by prometheus-client's own encoders, and joined
    with the freshly rendered health families of the same snapshot. The bytes equal what
    ``generate_latest`` gives for a registry holding only this collector.
    """

    _EOF = b"# EOF\n"  # OpenMetrics terminator: only once, at the very end
    _MAX_FORMATS = 4

    def __init__(self, collector: RankwatchCollector) -> None:
        self._collector = collector
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[object, ...], bytes]] = {}

    def render(self, accept_header: str | None = None) -> tuple[bytes, str]:
        """``(body, content type)`` for a scrape with this ``Accept`` header."""
        encoder, content_type = choose_encoder(accept_header or "")
        snap = self._collector.state.snapshot()
        key = (snap.quality, snap.drift, snap.requests, snap.unmatched, snap.summary, snap.finalized)
        with self._lock:
            cached = self._cache.get(content_type)
        if cached is not None and all(a is b for a, b in zip(cached[0], key, strict=True)):
            ranking = cached[1]
        else:
            ranking = encoder(_Families(list(_ranking_families(snap)))).removesuffix(self._EOF)  # type: ignore[arg-type]
            with self._lock:
                if len(self._cache) >= self._MAX_FORMATS and content_type not in self._cache:
                    self._cache.clear()  # the content type echoes the client's Accept: keep the cache bounded
                self._cache[content_type] = (key, ranking)  # holds the tuples, so identity stays meaningful
        health = encoder(_Families(list(self._collector.health_families(snap))))  # type: ignore[arg-type]
        return ranking + health, content_type


class RankwatchRegistry(CollectorRegistry):
    """A registry holding the rankwatch collector, with a :class:`CachedExposition` for the HTTP server.

    Registering any other collector drops the cache (``exposition`` becomes None), so the server falls
    back to prometheus-client's own rendering of the whole registry.
    """

    def __init__(self, collector: RankwatchCollector) -> None:
        super().__init__(auto_describe=False)
        self.exposition: CachedExposition | None = None
        self.register(collector)
        self.exposition = CachedExposition(collector)

    def register(self, collector: Collector) -> None:
        super().register(collector)
        self.exposition = None


def build_registry(
    state: MetricsState, *, event_clock: Clock | None = None, wall_clock: Callable[[], float] = time.time
) -> RankwatchRegistry:
    """A registry holding only the rankwatch collector (no process/platform collectors)."""
    return RankwatchRegistry(RankwatchCollector(state, event_clock=event_clock, wall_clock=wall_clock))
