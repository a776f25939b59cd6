"""The exporter's state: published windows, baselines, cumulative parts and health, behind a lock.

Writers (the stream's owner, the Kafka consumer, scheduler jobs) call the ``set_*`` / ``publish_window``
methods; they take turns on a writer lock, and each update rebuilds the affected Prometheus samples once,
as immutable tuples, into a new :class:`Snapshot`, which is then swapped in under the snapshot lock.
:meth:`MetricsState.snapshot` hands out the current snapshot under that lock, so a scrape copies nothing
large, never waits for a rebuild, and every value of one scrape comes from one consistent state (no torn
reads: a window's values, sample sizes and drift are replaced together).
"""

from __future__ import annotations

import importlib.metadata
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from prometheus_client.samples import Sample

from rankwatch.exporters.baselines import LoadedBaseline
from rankwatch.exporters.folding import (
    OVERALL_LABELS,
    ExporterLabelCapper,
    LabelSet,
    group_by_labels,
    merge_aggregates,
    rollups,
)
from rankwatch.exporters.health import HealthFigures, health_from_stats
from rankwatch.exporters.samples import (
    cumulative_samples,
    drift_samples,
    position_ctr_samples,
    quality_samples,
    score_drift_samples,
    series_sources,
    uncertainty_samples,
)
from rankwatch.exporters.series import DriftResult, SeriesValues, drift, score_drifts
from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.stream.durations import parse_duration_ms
from rankwatch.pipeline.stream.processor import StreamConfig

_SEEN_IDENTITIES = 100_000  # republication memory; old identities are forgotten first


_Grouped = tuple[PublishedWindow, dict[LabelSet, RankingAggregate]]


@dataclass(frozen=True)
class OnlineWindow:
    """The last published window of one size (all partitions of that start merged)."""

    window: str
    start: datetime
    end: datetime
    series: Mapping[LabelSet, SeriesValues]
    primary: frozenset[LabelSet]  # slices and overall, not roll-ups


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape or a terminal view needs, consistent with itself."""

    version: int
    quality: tuple[Sample, ...]
    drift: tuple[Sample, ...]
    requests: tuple[Sample, ...]
    unmatched: tuple[Sample, ...]
    summary: tuple[Sample, ...]
    finalized: tuple[Sample, ...]
    health: HealthFigures
    consumer_lag: Mapping[tuple[str, int], int]
    windows_published: Mapping[str, int]
    last_publish: Mapping[str, float]
    baselines: tuple[LoadedBaseline, ...]
    baseline_errors: Mapping[str, int]
    baseline_loaded: Mapping[str, bool]
    baseline_slices: Mapping[str, int]
    exporter_overflow: Mapping[str, int]
    online: Mapping[str, OnlineWindow]
    offline: Mapping[LabelSet, SeriesValues]
    drifts: Mapping[str, DriftResult]
    version_label: str
    label_values_limit: int | None
    stderr: tuple[Sample, ...] = ()
    window_stats: tuple[Sample, ...] = ()

    position_ctr: tuple[Sample, ...] = ()
    score_drift: tuple[Sample, ...] = ()
    score_drift_items: tuple[Sample, ...] = ()
    gauc_items_dropped: tuple[Sample, ...] = ()
    kafka_outage: tuple[bool, float] = (False, 0.0)  # (in an outage now, outage seconds so far)
    schema_registry: tuple[bool, float] | None = None  # (answering now, outage seconds); None: not used
    # samples of the rankwatch_transfer_* families (exporters/transfer.py), computed at load time
    transfer: Mapping[str, tuple[Sample, ...]] = field(default_factory=dict)
    transfer_load_errors: int = 0


@dataclass
class _Cumulative:
    """Fleet-exact cumulative parts of one label set: per metric (sum, count), finalized requests."""

    sums: dict[str, list[float]] = field(default_factory=dict)  # metric -> [sum, count]
    requests: int = 0


class MetricsState:
    """Thread-safe store behind the Prometheus collector.

    Parameters
    ----------
    windows
        Online window sizes in use; the smallest feeds the cumulative ``rankwatch_ranking_metric`` summary
        and ``rankwatch_finalized_requests_total`` (each finalized request is counted once).
    max_label_values
        The exporter's own cap per label (a last defence behind the stream's cap; keep it at or above it).
    wall_clock
        Seconds since the epoch, for publish timestamps and baseline ages (wall time, because Prometheus
        compares them with ``time()``).
    version
        The ``rankwatch_build_info{version}`` label; default: the installed ``rankwatch`` distribution's.
    rollups
        Also expose single-label roll-ups of the online slices (e.g. one segment over all surfaces).
    """

    def __init__(
        self,
        *,
        windows: Iterable[str] = ("5m", "1h"),
        max_label_values: int = 100,
        pending_requests_limit: int | None = None,
        label_values_limit: int | None = None,
        wall_clock: Callable[[], float] = time.time,
        version: str | None = None,
        rollups: bool = True,
    ) -> None:
        sizes = sorted(set(windows), key=parse_duration_ms)
        if not sizes:
            raise ValueError("at least one window size is needed")
        self.summary_window = sizes[0]
        self._wall = wall_clock
        self._rollups = rollups
        # Writers serialize on _write_lock and build the next snapshot while holding it; _lock only guards
        # the swap of the snapshot reference, so a scrape never waits for a rebuild.
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._capper = ExporterLabelCapper(max_label_values)
        self._version_label = version if version is not None else _installed_version()
        self._pending_limit = pending_requests_limit
        self._label_limit = label_values_limit
        self._seen: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        # window size -> (start, partitions -> (window, its slices grouped by capped label set))
        self._parts: dict[str, tuple[datetime, dict[tuple[int, ...], _Grouped]]] = {}
        self._online: dict[str, OnlineWindow] = {}
        self._offline: dict[LabelSet, SeriesValues] = {}
        self._baselines: tuple[LoadedBaseline, ...] = ()
        self._baseline_errors: dict[str, int] = {}
        self._baseline_loaded: dict[str, bool] = {}
        self._baseline_slices: dict[str, int] = {}
        self._cumulative: dict[LabelSet, _Cumulative] = {}
        self._windows_published: dict[str, int] = {}
        self._last_publish: dict[str, float] = {}
        self._health = HealthFigures(
            pending_requests_limit=pending_requests_limit, label_values_limit=label_values_limit
        )
        self._lag: dict[tuple[str, int], int] = {}
        self._outage: tuple[bool, float] = (False, 0.0)
        self._registry: tuple[bool, float] | None = None
        self._transfer: dict[str, tuple[Sample, ...]] = {}
        self._transfer_errors = 0
        self._version = 0
        self._drifts: dict[str, DriftResult] = {}
        self._quality: tuple[Sample, ...] = ()
        self._requests: tuple[Sample, ...] = ()
        self._stderr: tuple[Sample, ...] = ()
        self._window_stats: tuple[Sample, ...] = ()
        self._drift: tuple[Sample, ...] = ()
        self._unmatched: tuple[Sample, ...] = ()
        self._summary: tuple[Sample, ...] = ()
        self._finalized: tuple[Sample, ...] = ()
        self._position_ctr: tuple[tuple[Sample, ...], tuple[Sample, ...]] = ((), ())
        self._score_drift: tuple[tuple[Sample, ...], tuple[Sample, ...]] = ((), ())
        self._views: tuple[
            Mapping[str, OnlineWindow], Mapping[LabelSet, SeriesValues], Mapping[str, DriftResult]
        ]
        self._views = (MappingProxyType({}), MappingProxyType({}), MappingProxyType({}))
        self._swap(self._build_snapshot_locked())

    @classmethod
    def for_stream(cls, config: StreamConfig, **kwargs: Any) -> MetricsState:
        """A state matching a stream processor's windows and caps (the exporter's label cap is twice the
        stream's, so it only bites on slices that bypassed the stream's capper)."""
        kwargs.setdefault("max_label_values", 2 * config.slice_spec.max_values_per_label)
        return cls(
            windows=config.windows,
            pending_requests_limit=config.max_pending_requests,
            label_values_limit=config.slice_spec.max_values_per_label,
            **kwargs,
        )

    # -- writers ---------------------------------------------------------------------------------------
    def publish_window(self, pw: PublishedWindow) -> bool:
        """Take a published window; returns False for a republication already seen (same or older revision).

        The online gauges show the latest window start of each size; windows of the same start from other
        partitions are merged into it; an older start only feeds the cumulative counters.
        """
        return self.publish_windows([pw])[0]

    def publish_windows(self, windows: Iterable[PublishedWindow]) -> list[bool]:
        """:meth:`publish_window` of each window in order, with the online gauges rebuilt once at the end.

        The rebuild (merging every partition's window of the newest start, AUCs, rollups, drift) costs
        milliseconds; a Kafka backlog replayed fast publishes many windows per second, so the service hands
        them over in batches (``rankwatch run``: once a second) and pays for one rebuild per batch.
        """
        taken: list[bool] = []
        with self._write_lock:
            touched: list[str] = []
            for pw in windows:
                result = self._take_locked(pw)
                taken.append(result is not None)
                if result and pw.window not in touched:
                    touched.append(pw.window)
            for window in touched:
                self._online[window] = self._online_window(window)
            if touched:
                self._rebuild_series()
            if any(taken):
                self._swap(self._build_snapshot_locked())
        return taken

    def _take_locked(self, pw: PublishedWindow) -> bool | None:
        """Account for one window: None for a republication, True if the online window of its size changed."""
        identity = pw.identity
        seen_revision = self._seen.get(identity)
        if seen_revision is not None and pw.revision <= seen_revision:
            return None
        self._seen[identity] = pw.revision
        self._seen.move_to_end(identity)
        while len(self._seen) > _SEEN_IDENTITIES:
            self._seen.popitem(last=False)
        self._windows_published[pw.window] = self._windows_published.get(pw.window, 0) + 1
        self._last_publish[pw.window] = self._wall()
        # Cap labels once per publication, so folded slices are counted once.
        grouped = (pw, group_by_labels(pw.slices.items(), self._capper))
        if seen_revision is None and pw.window == self.summary_window:
            self._add_cumulative(*grouped)
            self._summary, self._finalized = cumulative_samples(self._cumulative)
        current = self._parts.get(pw.window)
        if current is None or pw.start > current[0]:
            self._parts[pw.window] = (pw.start, {pw.partitions: grouped})
        elif pw.start == current[0]:
            current[1][pw.partitions] = grouped
        else:
            return False  # an older start: only the cumulative counters change
        return True

    def set_stream_stats(self, stats: Any) -> None:
        """Copy the health figures of a ``StreamStats`` (or take a ready :class:`HealthFigures`)."""
        figures = (
            stats
            if isinstance(stats, HealthFigures)
            else health_from_stats(
                stats, pending_requests_limit=self._pending_limit, label_values_limit=self._label_limit
            )
        )
        with self._write_lock:
            self._health = figures
            self._swap(self._build_snapshot_locked())

    def set_consumer_lag(self, lag: Mapping[tuple[str, int], int]) -> None:
        """Messages behind the high watermark per ``(topic, partition)``; replaces the previous figures."""
        with self._write_lock:
            self._lag = {(str(t), int(p)): int(n) for (t, p), n in lag.items()}
            self._swap(self._build_snapshot_locked())

    def set_kafka_outage(self, active: bool, seconds_total: float) -> None:
        """Whether Kafka is unreachable now, and the seconds spent in outages since start."""
        with self._write_lock:
            self._outage = (bool(active), float(seconds_total))
            self._swap(self._build_snapshot_locked())

    def set_schema_registry(self, up: bool | None, outage_seconds: float) -> None:
        """Whether the schema registry answers (None: no Confluent-framed topic), and its outage seconds."""
        value = None if up is None else (bool(up), float(outage_seconds))
        if value == self._registry:
            return
        with self._write_lock:
            self._registry = value
            self._swap(self._build_snapshot_locked())

    def set_baselines(self, baselines: Iterable[LoadedBaseline]) -> None:
        """Replace the served baselines. Where two files give one label set, the first one listed wins."""
        with self._write_lock:
            self._baselines = tuple(baselines)
            self._offline = {}
            self._baseline_slices = {}
            for baseline in self._baselines:
                exposed = 0
                for raw, values in baseline.rows:
                    labels = self._capper.labels_of(tuple(raw.items()))
                    if labels not in self._offline:
                        self._offline[labels] = values
                        exposed += 1
                self._baseline_slices[baseline.name] = exposed
                self._baseline_loaded.setdefault(baseline.name, True)
            self._rebuild_series()
            self._swap(self._build_snapshot_locked())

    def record_baseline_load(self, name: str, *, ok: bool) -> None:
        """Note a load attempt of baseline ``name``; a failure counts in ``..._load_errors_total``."""
        with self._write_lock:
            self._baseline_loaded[name] = ok
            if not ok:
                self._baseline_errors[name] = self._baseline_errors.get(name, 0) + 1
            else:
                self._baseline_errors.setdefault(name, 0)
            self._swap(self._build_snapshot_locked())

    def set_transfer(self, samples: Mapping[str, tuple[Sample, ...]] | None, load_errors: int) -> None:
        """Serve the transfer samples (None: keep the current ones) and the ledgers' load error count."""
        with self._write_lock:
            if samples is not None:
                self._transfer = dict(samples)
            self._transfer_errors = load_errors
            self._swap(self._build_snapshot_locked())

    # -- readers ---------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The current consistent snapshot (immutable; safe to read without the lock)."""
        with self._lock:
            return self._snapshot

    # -- internals (lock held) ------------------------------------------------------------------------
    def _add_cumulative(self, pw: PublishedWindow, slices: Mapping[LabelSet, RankingAggregate]) -> None:
        pairs = [(OVERALL_LABELS, pw.overall), *slices.items()]
        for labels, agg in pairs:
            cum = self._cumulative.setdefault(labels, _Cumulative())
            cum.requests += agg.requests
            for metric, s in agg.sums.items():
                acc = cum.sums.setdefault(metric, [0.0, 0.0])
                acc[0] += s.total
                acc[1] += s.count

    def _online_window(self, window: str) -> OnlineWindow:
        start, parts = self._parts[window]
        windows = [pw for pw, _ in parts.values()]
        if len(parts) == 1:
            slices = dict(next(iter(parts.values()))[1])
        else:
            by_labels: dict[LabelSet, list[RankingAggregate]] = {}
            for _, grouped in parts.values():
                for labels, agg in grouped.items():
                    by_labels.setdefault(labels, []).append(agg)
            slices = {labels: merge_aggregates(aggs) for labels, aggs in by_labels.items()}
        overall = merge_aggregates([pw.overall for pw in windows])
        primary = frozenset([*slices, OVERALL_LABELS])
        series = {labels: SeriesValues.of(agg) for labels, agg in slices.items()}
        series[OVERALL_LABELS] = SeriesValues.of(overall)
        if self._rollups:
            for labels, agg in rollups(slices).items():
                series[labels] = SeriesValues.of(agg)
        return OnlineWindow(window=window, start=start, end=windows[0].end, series=series, primary=primary)

    def _rebuild_series(self) -> None:
        self._drifts = {w: drift(ow.series, ow.primary, self._offline) for w, ow in self._online.items()}
        sources = series_sources(self._online, self._offline)
        self._quality, self._requests = quality_samples(sources)
        self._stderr, self._window_stats = uncertainty_samples(sources, self._online)
        self._drift, self._unmatched = drift_samples(self._drifts)
        self._position_ctr = position_ctr_samples(sources)
        self._score_drift = score_drift_samples(
            {w: score_drifts(ow.series, self._offline) for w, ow in self._online.items()}
        )
        # Read-only copies for snapshots, made once per change rather than once per snapshot.
        self._views = (
            MappingProxyType(dict(self._online)),
            MappingProxyType(dict(self._offline)),
            MappingProxyType(dict(self._drifts)),
        )

    def _swap(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    def _build_snapshot_locked(self) -> Snapshot:
        self._version += 1
        return Snapshot(
            version=self._version,
            quality=self._quality,
            drift=self._drift,
            requests=self._requests,
            unmatched=self._unmatched,
            summary=self._summary,
            finalized=self._finalized,
            health=self._health,
            consumer_lag=dict(self._lag),
            windows_published=dict(self._windows_published),
            last_publish=dict(self._last_publish),
            baselines=self._baselines,
            baseline_errors=dict(self._baseline_errors),
            baseline_loaded=dict(self._baseline_loaded),
            baseline_slices=dict(self._baseline_slices),
            exporter_overflow=dict(self._capper.overflow),
            online=self._views[0],
            offline=self._views[1],
            drifts=self._views[2],
            version_label=self._version_label,
            label_values_limit=self._health.label_values_limit,
            stderr=self._stderr,
            window_stats=self._window_stats,
            position_ctr=self._position_ctr[0],
            gauc_items_dropped=self._position_ctr[1],
            score_drift=self._score_drift[0],
            score_drift_items=self._score_drift[1],
            kafka_outage=self._outage,
            schema_registry=self._registry,
            transfer=self._transfer,
            transfer_load_errors=self._transfer_errors,
        )


def _installed_version() -> str:
    try:
        return importlib.metadata.version("rankwatch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
