"""MetricsState: cardinality bounds, concurrency (no deadlock, no torn scrape), folding exactness."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import numpy as np
import pytest
from exporter_helpers import OPTIONS, T0, grid_keys, parse_exposition, scrape, select

from rankwatch.exporters.collector import build_registry
from rankwatch.exporters.http import MetricsServer
from rankwatch.exporters.state import MetricsState
from rankwatch.pipeline.metrics.aggregates import RankingAggregate, aggregate_lists
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.stream.processor import StreamConfig


def test_cardinality_attack_is_bounded_and_counted() -> None:
    """100,000 distinct segment values reach the exporter (bypassing the stream's cap)."""
    n = 100_000
    rng = np.random.default_rng(0)
    one_request = RankingAggregate.from_lists(rng.random(4) < 0.5, rng.random(4), [0, 4], OPTIONS)
    overall = RankingAggregate.from_lists(np.zeros(n), np.zeros(n), np.arange(n + 1), OPTIONS)
    # Every slice shares one read-only aggregate of one request (building 100,000 distinct ones is slow).
    keys = [(("segment", f"seg-{i}"), ("surface", "home_feed")) for i in range(n)]
    pw = PublishedWindow("5m", T0, T0 + timedelta(minutes=5), overall, dict.fromkeys(keys, one_request))
    cap = 50
    state = MetricsState(max_label_values=cap)
    state.publish_window(pw)
    from prometheus_client import generate_latest

    series = parse_exposition(generate_latest(build_registry(state)).decode())
    segments = {
        dict(lbls)["segment"] for lbls in select(series, "rankwatch_ranking_requests", source="online")
    }
    # cap admitted values, "__other__", and "all" (overall and the surface roll-up).
    assert len(segments) == cap + 2 and "__other__" in segments
    label_sets = len(select(series, "rankwatch_ranking_requests"))  # one per (label set, source, window)
    assert label_sets <= 2 * (cap + 3)  # admitted values, __other__, overall, the surface roll-up
    # quality and its SE, requests, the cumulative summary (_sum, _count) and finalized counter, the window
    # statistics (n, sum, sum of squares per per-request metric), ctr by rank, drift
    per_label_set = (2 * len(OPTIONS.metric_names) + 1 + 2 * len(OPTIONS.rank_metric_names) + 1
                     + 3 * len(OPTIONS.rank_metric_names) + OPTIONS.ctr_ranks + 3)
    assert len(series) < label_sets * per_label_set + 100  # + health families
    assert state.snapshot().exporter_overflow == {"segment": n - cap}
    other = [
        v
        for lbls, v in select(
            series, "rankwatch_ranking_requests", segment="__other__", surface="home_feed"
        ).items()
    ]
    assert other == [n - cap]  # folded slices are merged, not dropped: their requests still count
    total = sum(select(series, "rankwatch_ranking_requests", source="online", surface="home_feed").values())
    roll = select(series, "rankwatch_ranking_requests", source="online", segment="all", surface="home_feed")
    assert total - sum(roll.values()) == n


def test_summary_window_is_the_smallest() -> None:
    assert MetricsState(windows=("1h", "5m", "1d")).summary_window == "5m"
    with pytest.raises(ValueError):
        MetricsState(windows=("5 minutes",))
    config = StreamConfig(windows=("1h", "30s"), max_pending_requests=777)
    state = MetricsState.for_stream(config)
    assert state.summary_window == "30s"
    assert state.snapshot().health.pending_requests_limit == 777


def _labelled_window(k: int, keys, j: int) -> PublishedWindow:
    """Publication ``j``: every slice has exactly ``k`` requests with one hit at rank 1."""
    n = len(keys)
    offsets = np.arange(0, 2 * n * k + 1, 2)
    labels = np.tile([1.0, 0.0], n * k)
    scores = np.tile([0.9, 0.1], n * k)
    group = np.repeat(np.arange(n), k)
    aggs = aggregate_lists(labels, scores, offsets, group, n, OPTIONS)
    overall = RankingAggregate.from_lists(labels, scores, offsets, OPTIONS)
    start = T0 + timedelta(minutes=5 * j)
    return PublishedWindow(
        "5m", start, start + timedelta(minutes=5), overall, dict(zip(keys, aggs, strict=True))
    )


def test_concurrent_scrapes_see_whole_publications(free_port) -> None:
    """Scrape in a loop while windows publish: no deadlock, and each scrape shows one publication only."""
    keys = grid_keys([f"s{i}" for i in range(10)], ("x", "y", "z"))
    state = MetricsState()
    server = MetricsServer(build_registry(state), port=free_port).start()
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[int] = []

    def publisher() -> None:
        try:
            j = 0
            while not stop.is_set():
                pw = _labelled_window(j % 40 + 1, keys, j)
                state.publish_window(pw)
                state.set_consumer_lag({("impressions", 0): j})
                j += 1
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def scraper() -> None:
        try:
            while not stop.is_set():
                series = parse_exposition(scrape(server.url))
                sizes = set(
                    select(series, "rankwatch_ranking_requests", source="online", window="5m").values()
                )
                slices = select(
                    series, "rankwatch_ranking_requests", source="online", segment="s0", surface="x"
                )
                if not sizes:
                    continue
                assert len(slices) == 1
                k = next(iter(slices.values()))
                # Per slice k requests, the overall 30k, roll-ups 3k (per segment) and 10k (per surface).
                assert sizes <= {k, 3 * k, 10 * k, 30 * k}, sizes
                assert set(select(series, "rankwatch_ranking_quality", metric="mrr").values()) == {1.0}
                seen.append(int(k))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=publisher)] + [threading.Thread(target=scraper) for _ in range(2)]
    for t in threads:
        t.start()
    # Run until the scrapers saw a few distinct publications (or an error), up to a deadline: not a fixed time.
    deadline = time.monotonic() + 60.0
    while len(set(seen)) <= 3 and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=20)
    server.stop()
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors[0]
    assert len(set(seen)) > 3, f"within 60 s the scrapes saw too few distinct publications: {sorted(set(seen))}"
