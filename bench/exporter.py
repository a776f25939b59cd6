"""Scrape cost of the rankwatch collector against plain labelled prometheus-client Gauges, same run.

Setup: 50 segments x 5 surfaces x 3 variants = 750 slices, two windows (5m, 1h), six metrics: 9,000
``rankwatch_ranking_quality`` series (plus the overall slice). The reference is a registry of plain
``prometheus_client.Gauge`` objects with the same label names holding exactly the same series and values
(copied from the collector's own exposition), so both sides format identical text.

Rows:
- ``quality only``: the 9,000-series quality family alone (roll-ups off) through ``generate_latest``,
  vs one labelled Gauge;
- ``full scrape``: every family the exporter serves (roll-ups, sample sizes, drift, cumulative parts,
  health) through ``generate_latest`` -- what the first scrape after a publication costs -- vs one
  labelled Gauge per family with the same series;
- ``full scrape, cached``: the same with the state unchanged since the last scrape (the usual case), served
  by :class:`exporters.collector.CachedExposition`;
- ``over HTTP, plain`` / ``over HTTP, like Prometheus`` (OpenMetrics + gzip): a GET against each side's
  HTTP server (rankwatch: :class:`exporters.http.MetricsServer`; reference: prometheus-client's WSGI app
  behind the same server class).

Prints medians of ``--repeats`` alternating runs and the ratio reference/rankwatch (> 1: rankwatch faster).
Goal: rankwatch no slower than the plain Gauges (ratio >= 1).

    python bench/exporter.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rankwatch.exporters.collector import RankwatchCollector, build_registry  # noqa: E402
from rankwatch.exporters.http import MetricsServer  # noqa: E402
from rankwatch.exporters.state import MetricsState  # noqa: E402
from rankwatch.pipeline.metrics.aggregates import RankingAggregate, aggregate_lists  # noqa: E402
from rankwatch.pipeline.metrics.options import MetricOptions  # noqa: E402
from rankwatch.pipeline.published import PublishedWindow  # noqa: E402

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
# What Prometheus 2.x sends when it scrapes.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
OPTIONS = MetricOptions()


def build_windows(rng: np.random.Generator) -> list[PublishedWindow]:
    keys = [
        (("segment", f"seg{a:02d}"), ("surface", f"surf{b}"), ("variant", f"var{c}"))
        for a in range(50)
        for b in range(5)
        for c in range(3)
    ]
    out = []
    for window, size in (("5m", timedelta(minutes=5)), ("1h", timedelta(hours=1))):
        per_slice = 8
        lengths = rng.integers(2, 15, size=len(keys) * per_slice)
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        labels = (rng.random(offsets[-1]) < 0.3) * rng.integers(1, 4, size=offsets[-1]).astype(float)
        scores = rng.normal(size=offsets[-1]).round(3)
        group = np.repeat(np.arange(len(keys)), per_slice)
        aggs = aggregate_lists(labels, scores, offsets, group, len(keys), OPTIONS)
        overall = RankingAggregate.from_lists(labels, scores, offsets, OPTIONS)
        out.append(PublishedWindow(window, T0, T0 + size, overall, dict(zip(keys, aggs, strict=True))))
    return out


class _OnlyFamily(Collector):
    def __init__(self, inner: RankwatchCollector, name: str) -> None:
        self.inner, self.name = inner, name

    def collect(self) -> Iterator:  # type: ignore[type-arg]
        return (m for m in self.inner.collect() if m.name == self.name)


def plain_gauges_like(text: str) -> CollectorRegistry:
    """A registry of plain labelled Gauges holding exactly the series of an exposition."""
    registry = CollectorRegistry(auto_describe=False)
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            by_name.setdefault(sample.name, []).append((sample.labels, sample.value))
    for name, samples in by_name.items():
        label_names = sorted(samples[0][0])
        gauge = Gauge(name, f"reference for {name}", label_names, registry=registry)
        for labels, value in samples:
            if label_names:
                gauge.labels(**labels).set(value)
            else:
                gauge.set(value)
    return registry


def median_times(funcs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in funcs}
    for f in funcs.values():
        f()  # warm-up
    for _ in range(repeats):
        for name, f in funcs.items():
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def count_samples(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    windows = build_windows(rng)

    # Quality family only, no roll-ups: 9,000 slice series + 12 overall.
    bare = MetricsState(rollups=False)
    t = time.perf_counter()
    for pw in windows:
        bare.publish_window(pw)
    publish_s = (time.perf_counter() - t) / len(windows)
    quality = CollectorRegistry(auto_describe=False)
    quality.register(_OnlyFamily(RankwatchCollector(bare), "rankwatch_ranking_quality"))
    quality_text = generate_latest(quality).decode()
    quality_ref = plain_gauges_like(quality_text)
    assert generate_latest(quality_ref).decode().count("\n") >= quality_text.count("\n") - 2

    # Full scrape: every family, roll-ups on.
    full_state = MetricsState()
    for pw in windows:
        full_state.publish_window(pw)
    full = build_registry(full_state)
    full_text = generate_latest(full).decode()
    full_ref = plain_gauges_like(full_text)

    rows = []
    for label, ours, ref, text in (
        ("quality only", quality, quality_ref, quality_text),
        ("full scrape", full, full_ref, full_text),
    ):
        med = median_times(
            {"rankwatch": lambda r=ours: generate_latest(r), "gauges": lambda r=ref: generate_latest(r)},
            args.repeats,
        )
        rows.append((label, count_samples(text), med["rankwatch"], med["gauges"]))

    # Unchanged state (the usual case between publications): the cached exposition.
    assert full.exposition is not None
    cache = full.exposition
    assert cache.render()[0] == generate_latest(full)
    med = median_times({"rankwatch": cache.render, "gauges": lambda: generate_latest(full_ref)}, args.repeats)
    rows.append(("full scrape, cached", count_samples(full_text), med["rankwatch"], med["gauges"]))

    ours_server = MetricsServer(full, port=0).start()
    ref_server = MetricsServer(full_ref, port=0).start()  # prometheus-client's own WSGI app behind it
    try:
        for label, headers in (
            ("over HTTP, plain", {}),
            ("over HTTP, like Prometheus", {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}),
        ):

            def get(url: str, headers: dict[str, str] = headers) -> bytes:
                req = urllib.request.Request(url + "/metrics", headers=headers)
                with urllib.request.urlopen(req, timeout=30) as resp:
                    return bytes(resp.read())

            med = median_times(
                {"rankwatch": lambda: get(ours_server.url), "gauges": lambda: get(ref_server.url)},
                args.repeats,
            )
            rows.append((label, count_samples(full_text), med["rankwatch"], med["gauges"]))
    finally:
        ours_server.stop()
        ref_server.stop()

    print(f"publish_window with 750 slices (roll-ups off): {publish_s * 1000:.1f} ms per window")
    print(f"{'case':<28}{'series':>8}{'rankwatch ms':>14}{'gauges ms':>12}{'ratio':>8}")
    for label, n, ours_s, ref_s in rows:
        print(f"{label:<28}{n:>8}{ours_s * 1000:>14.2f}{ref_s * 1000:>12.2f}{ref_s / ours_s:>8.2f}")
    print(
        "ratio = gauges time / rankwatch time (>= 1: rankwatch no slower); medians of", args.repeats, "runs"
    )


if __name__ == "__main__":
    main()
