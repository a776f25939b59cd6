"""Scrape over HTTP, parse with prometheus_client.parser, compare with the published windows and the baseline."""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np
import pytest
from exporter_helpers import (
    T0,
    grid_keys,
    one,
    parse_exposition,
    random_window,
    scrape,
    select,
    write_baseline_file,
)

from rankwatch.exporters.baselines import BaselineWatcher
from rankwatch.exporters.collector import build_registry
from rankwatch.exporters.health import HealthFigures
from rankwatch.exporters.http import MetricsServer
from rankwatch.exporters.state import MetricsState
from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.slicing import SliceKey

METRICS = MetricOptions().metric_names  # P/R/hit rate, GAUC, positive rate included
SEGMENTS = ("new_user", "returning", "power")
SURFACES = ("home_feed", "search")


def labels_of(key: SliceKey) -> dict[str, str]:
    d = dict(key)
    return {k: d.get(k, "all") for k in ("segment", "surface", "variant")}


def sequential_merge(aggs: list[RankingAggregate]) -> RankingAggregate:
    """Oracle for roll-ups: the kernel's own pairwise merge."""
    out = aggs[0].copy()
    for a in aggs[1:]:
        out.merge(a)
    return out


def assert_series_equal(series: dict, agg: RankingAggregate, **labels: str) -> None:
    values = agg.values()
    for metric in METRICS:
        found = select(series, "rankwatch_ranking_quality", metric=metric, **labels)
        expected = values[metric]
        if expected is None:
            assert not found, f"{metric} {labels}: undefined value must have no sample"
        else:
            assert len(found) == 1, (metric, labels)
            assert next(iter(found.values())) == pytest.approx(expected, abs=1e-12)
    assert one(series, "rankwatch_ranking_requests", **labels) == agg.requests


@pytest.fixture
def world(tmp_path, free_port) -> Iterator[dict]:
    rng = np.random.default_rng(7)
    keys = grid_keys(SEGMENTS, SURFACES)
    w5 = random_window(rng, keys, window="5m", start=T0)
    w1h = random_window(rng, keys, window="1h", start=T0)
    # The baseline covers all slices but one, plus one the online side never saw.
    base_keys = [k for k in keys if k != keys[-1]] + [(("segment", "gone"), ("surface", "search"))]
    base = random_window(rng, base_keys, window="1h", start=T0)
    path = tmp_path / "ranker.json"
    write_baseline_file(str(path), base.overall, base.slices)
    clock = ManualClock(datetime(2026, 11, 30, 10, 10, tzinfo=UTC))
    state = MetricsState(
        windows=("5m", "1h"), pending_requests_limit=1000, label_values_limit=50, version="9.9"
    )
    watcher = BaselineWatcher([path], state)
    watcher.load_initial(strict=True)
    state.publish_window(w5)
    state.publish_window(w1h)
    state.set_stream_stats(
        HealthFigures(
            events={("impressions", "accepted"): 10, ("clicks", "late"): 2},
            rejects={("impressions", "bad_json"): 3},
            pending_requests=5,
            pending_items=40,
            pending_requests_limit=1000,
            evicted_requests=1,
            watermark_ms=int(datetime(2026, 11, 30, 10, 9, tzinfo=UTC).timestamp() * 1000),
            label_values={"segment": 3},
            label_overflow={"segment": 4},
            label_values_limit=50,
        )
    )
    state.set_consumer_lag({("impressions", 0): 12, ("clicks", 1): 0})
    server = MetricsServer(build_registry(state, event_clock=clock), port=free_port).start()
    try:
        yield {"w5": w5, "w1h": w1h, "base": base, "keys": keys, "url": server.url, "state": state}
    finally:
        server.stop()


def test_online_offline_drift_and_sample_sizes_for_every_slice(world) -> None:
    series = parse_exposition(scrape(world["url"]))
    base: PublishedWindow = world["base"]
    for pw in (world["w5"], world["w1h"]):
        online = {"source": "online", "window": pw.window}
        assert_series_equal(series, pw.overall, **online, **labels_of(()))
        for key, agg in pw.slices.items():
            assert_series_equal(series, agg, **online, **labels_of(key))
        # Roll-ups: one segment over all surfaces, one surface over all segments.
        for seg in SEGMENTS:
            parts = [a for k, a in pw.slices.items() if dict(k)["segment"] == seg]
            assert_series_equal(
                series, sequential_merge(parts), **online, segment=seg, surface="all", variant="all"
            )
        for surf in SURFACES:
            parts = [a for k, a in pw.slices.items() if dict(k)["surface"] == surf]
            assert_series_equal(
                series, sequential_merge(parts), **online, segment="all", surface=surf, variant="all"
            )
    offline = {"source": "offline", "window": "baseline"}
    assert_series_equal(series, base.overall, **offline, **labels_of(()))
    for key, agg in base.slices.items():
        assert_series_equal(series, agg, **offline, **labels_of(key))
    # Drift = online - offline for every slice on both sides, every metric with two values.
    for pw in (world["w5"], world["w1h"]):
        pairs = [((), pw.overall, base.overall)] + [
            (k, a, base.slices[k]) for k, a in pw.slices.items() if k in base.slices
        ]
        n_drift = 0
        for key, on, off in pairs:
            for metric in METRICS:
                v_on, v_off = on.values()[metric], off.values()[metric]
                found = select(
                    series,
                    "rankwatch_ranking_quality_drift",
                    metric=metric,
                    window=pw.window,
                    **labels_of(key),
                )
                if v_on is None or v_off is None:
                    assert not found
                else:
                    n_drift += 1
                    assert next(iter(found.values())) == pytest.approx(v_on - v_off, abs=1e-12)
        assert len(select(series, "rankwatch_ranking_quality_drift", window=pw.window)) == n_drift
        # Missing on one side: reported, never invented.
        assert one(series, "rankwatch_drift_unmatched_slices", window=pw.window, only_in="online") == 1
        assert one(series, "rankwatch_drift_unmatched_slices", window=pw.window, only_in="offline") == 1
        assert not select(series, "rankwatch_ranking_quality_drift", segment="gone")
        assert not select(series, "rankwatch_ranking_quality_drift", segment="power", surface="search")


def test_cumulative_parts_and_health(world) -> None:
    series = parse_exposition(scrape(world["url"]))
    w5: PublishedWindow = world["w5"]
    # Fed from the smallest window only (5m), once per finalized request.
    for key, agg in [((), w5.overall), *w5.slices.items()]:
        lbl = labels_of(key)
        assert one(series, "rankwatch_finalized_requests_total", **lbl) == agg.requests
        for metric in ("mrr", "ndcg@5", "ndcg@10", "map@10"):
            assert one(series, "rankwatch_ranking_metric_sum", metric=metric, **lbl) == pytest.approx(
                agg.sums[metric].total
            )
            assert (
                one(series, "rankwatch_ranking_metric_count", metric=metric, **lbl) == agg.sums[metric].count
            )
    assert one(series, "rankwatch_events_total", stream="impressions", outcome="accepted") == 10
    assert one(series, "rankwatch_rejected_events_total", stream="impressions", reason="bad_json") == 3
    assert one(series, "rankwatch_consumer_lag", topic="impressions", partition="0") == 12
    assert one(series, "rankwatch_watermark_delay_seconds") == 60.0
    assert one(series, "rankwatch_pending_requests") == 5
    assert one(series, "rankwatch_pending_requests_limit") == 1000
    assert one(series, "rankwatch_pending_items") == 40
    assert one(series, "rankwatch_requests_evicted_total") == 1
    assert one(series, "rankwatch_label_values", label="segment") == 3
    assert one(series, "rankwatch_label_values_limit") == 50
    assert one(series, "rankwatch_label_overflow_total", label="segment") == 4
    assert one(series, "rankwatch_baseline_load_errors_total", baseline="ranker.json") == 0
    assert one(series, "rankwatch_baseline_loaded", baseline="ranker.json") == 1
    assert one(series, "rankwatch_baseline_slices", baseline="ranker.json") == len(world["base"].slices) + 1
    age = one(series, "rankwatch_baseline_age_seconds", baseline="ranker.json")
    created = datetime(2026, 11, 30, 9, 0, tzinfo=UTC).timestamp()
    assert age >= 0 and math.isfinite(age) and age == pytest.approx(max(0.0, _now() - created), abs=60)
    assert one(series, "rankwatch_windows_published_total", window="5m") == 1
    assert one(series, "rankwatch_windows_published_total", window="1h") == 1
    assert abs(one(series, "rankwatch_last_publish_timestamp_seconds", window="5m") - _now()) < 60
    assert one(series, "rankwatch_build_info", version="9.9") == 1


def _now() -> float:
    return datetime.now(UTC).timestamp()


def test_republication_does_not_double_count_and_partitions_merge() -> None:
    rng = np.random.default_rng(3)
    keys = grid_keys(("a", "b"), ("x",))
    part0 = random_window(rng, keys, partitions=(0,))
    part1 = random_window(rng, keys, partitions=(1,))
    state = MetricsState()
    assert state.publish_window(part0)
    assert not state.publish_window(part0)  # same identity and revision: ignored
    assert state.publish_window(part1)  # same start, other partition: merged into the gauge
    snap = state.snapshot()
    merged = sequential_merge([part0.overall, part1.overall])
    assert snap.online["5m"].series[("all", "all", "all")].requests == merged.requests
    assert snap.online["5m"].series[("all", "all", "all")].metrics["auc_roc"] == pytest.approx(
        merged.values()["auc_roc"]
    )
    assert snap.windows_published["5m"] == 2
    finalized = {s.labels["segment"]: s.value for s in snap.finalized if s.labels["surface"] == "all"}
    assert finalized["all"] == part0.overall.requests + part1.overall.requests
    # An older window start feeds the counters but does not replace the gauges.
    older = random_window(rng, keys, start=T0.replace(hour=9))
    state.publish_window(older)
    snap2 = state.snapshot()
    assert snap2.online["5m"].start == T0
    finalized2 = {s.labels["segment"]: s.value for s in snap2.finalized if s.labels["surface"] == "all"}
    assert finalized2["all"] == finalized["all"] + older.overall.requests


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_scrape_passes_promtool_check_metrics(world) -> None:
    text = scrape(world["url"])
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr


def test_summary_parts_aggregate_a_fleet_exactly() -> None:
    """Two instances, each with its own partitions: summed _sum / summed _count = mean of the union."""
    rng = np.random.default_rng(21)
    keys = grid_keys(SEGMENTS, SURFACES)
    instances = [MetricsState(), MetricsState()]
    union: dict[SliceKey, list[RankingAggregate]] = {}
    for minute in range(0, 30, 5):
        for part, state in enumerate(instances):
            pw = random_window(rng, keys, start=T0.replace(minute=minute), partitions=(part,))
            state.publish_window(pw)
            for key, agg in [((), pw.overall), *pw.slices.items()]:
                union.setdefault(key, []).append(agg)
    from prometheus_client import generate_latest

    scrapes = [parse_exposition(generate_latest(build_registry(s)).decode()) for s in instances]
    for key, aggs in union.items():
        merged = sequential_merge(aggs)
        lbl = labels_of(key)
        for metric in ("mrr", "ndcg@10", "map@10"):
            total = sum(one(s, "rankwatch_ranking_metric_sum", metric=metric, **lbl) for s in scrapes)
            count = sum(one(s, "rankwatch_ranking_metric_count", metric=metric, **lbl) for s in scrapes)
            assert total / count == pytest.approx(merged.values()[metric], abs=1e-12)
        assert sum(one(s, "rankwatch_finalized_requests_total", **lbl) for s in scrapes) == merged.requests


def test_a_producer_value_all_is_not_mistaken_for_a_rollup() -> None:
    rng = np.random.default_rng(22)
    pw = random_window(rng, grid_keys(("all", "new_user"), ("home_feed", "search")))
    state = MetricsState()
    state.publish_window(pw)
    series = state.snapshot().online["5m"].series
    key = (("segment", "all"), ("surface", "search"))
    assert series[("_all", "search", "all")].requests == pw.slices[key].requests
    both = [a for k, a in pw.slices.items() if dict(k)["surface"] == "search"]
    assert series[("all", "search", "all")].requests == sum(a.requests for a in both)  # the roll-up


def test_cached_exposition_equals_prometheus_client_rendering(monkeypatch) -> None:
    """Oracle: prometheus-client's own encoders over the same registry, both formats, across changes."""
    from prometheus_client import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    import rankwatch.exporters.collector as collector_module

    rng = np.random.default_rng(31)
    keys = grid_keys(SEGMENTS, SURFACES)
    clock = ManualClock(datetime(2026, 11, 30, 10, 20, tzinfo=UTC))
    state = MetricsState(wall_clock=lambda: 1_800_000_000.0)
    registry = build_registry(state, event_clock=clock, wall_clock=lambda: 1_800_000_000.0)
    assert registry.exposition is not None
    renders = {"n": 0}
    original = collector_module._ranking_families

    def counting(snap):
        renders["n"] += 1
        return original(snap)

    monkeypatch.setattr(collector_module, "_ranking_families", counting)
    om_accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"

    def check() -> None:
        body, ctype = registry.exposition.render(None)
        assert ctype.startswith("text/plain")
        assert body == generate_latest(registry)
        body, ctype = registry.exposition.render(om_accept)
        assert ctype.startswith("application/openmetrics-text")
        assert body == generate_openmetrics(registry)

    check()
    for minute in (0, 5):
        state.publish_window(random_window(rng, keys, start=T0.replace(minute=minute)))
        check()
        state.set_consumer_lag({("impressions", 0): minute})  # health only: the ranking text is reused
        before = renders["n"]
        check()
        assert renders["n"] - before == 2  # the two oracle renderings only, none by the cache


def test_registering_another_collector_turns_the_cache_off(free_port) -> None:
    from prometheus_client import Gauge

    state = MetricsState()
    registry = build_registry(state)
    Gauge("other_metric", "another collector", registry=registry).set(3)
    assert registry.exposition is None
    server = MetricsServer(registry, port=free_port).start()
    try:
        series = parse_exposition(scrape(server.url))
    finally:
        server.stop()
    version = state.snapshot().version_label
    assert one(series, "other_metric") == 3 and one(series, "rankwatch_build_info", version=version) == 1


def test_cached_exposition_stays_bounded_under_many_accept_headers() -> None:
    state = MetricsState()
    registry = build_registry(state)
    exposition = registry.exposition
    assert exposition is not None
    for minor in range(50):
        body, ctype = exposition.render(f"application/openmetrics-text;version=1.0.{minor}")
        assert ctype.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    assert len(exposition._cache) <= 4


def test_standard_errors_and_window_sufficient_statistics(world) -> None:
    """rankwatch_ranking_quality_stderr equals the aggregates' SEs online and the baseline file's offline;
    the window statistics are each slice's (n, sum, sum of squares), and they give the SE back exactly."""
    series = parse_exposition(scrape(world["url"]))
    base: PublishedWindow = world["base"]
    for pw in (world["w5"], world["w1h"]):
        for key, agg in [((), pw.overall), *pw.slices.items()]:
            lbl = labels_of(key)
            for metric, se in agg.stderrs().items():
                found = select(series, "rankwatch_ranking_quality_stderr", metric=metric, source="online",
                               window=pw.window, **lbl)  # fmt: skip
                assert (list(found.values()) == []) if se is None else list(found.values()) == [pytest.approx(se)]
            for metric, s in agg.sums.items():
                at = {"metric": metric, "window": pw.window, **lbl}
                n = one(series, "rankwatch_ranking_window_observations", **at)
                total = one(series, "rankwatch_ranking_window_sum_of_values", **at)
                sq = one(series, "rankwatch_ranking_window_sum_of_squares", **at)
                assert (n, total) == (s.count, pytest.approx(s.total))
                if n >= 2 and s.stderr() is not None:
                    assert math.sqrt(max(sq - total * total / n, 0.0) / (n - 1) / n) == pytest.approx(
                        s.stderr(), rel=1e-6, abs=1e-12
                    )
        start = one(series, "rankwatch_ranking_window_start_timestamp_seconds", window=pw.window)
        assert start == pw.start.timestamp()
    checked = 0
    for key, agg in [((), base.overall), *base.slices.items()]:
        for metric, se in agg.stderrs().items():
            found = select(series, "rankwatch_ranking_quality_stderr", metric=metric, source="offline",
                           window="baseline", **labels_of(key))  # fmt: skip
            if se is not None and found:  # the slice the exporter folds away is absent
                assert list(found.values()) == [pytest.approx(se)]
                checked += 1
    assert checked >= 6 * len(base.slices)
