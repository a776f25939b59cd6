"""Helpers of the exporter tests: windows built with the kernel from random lists, baseline files, scrapes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np

from rankwatch.pipeline.metrics.aggregates import RankingAggregate, aggregate_lists
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.slicing import SliceKey

OPTIONS = MetricOptions()
T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def random_window(
    rng: np.random.Generator,
    keys: Sequence[SliceKey],
    *,
    window: str = "5m",
    start: datetime = T0,
    requests_per_slice: int = 20,
    partitions: tuple[int, ...] = (),
    revision: int = 0,
) -> PublishedWindow:
    """A window whose slices hold random graded lists; ``overall`` is the kernel on all of them."""
    lengths = rng.integers(1, 12, size=len(keys) * requests_per_slice)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    labels = rng.integers(0, 3, size=offsets[-1]).astype(float) * (rng.random(offsets[-1]) < 0.3)
    scores = rng.normal(size=offsets[-1]).round(2)
    group = np.repeat(np.arange(len(keys)), requests_per_slice)
    aggs = aggregate_lists(labels, scores, offsets, group, len(keys), OPTIONS)
    overall = RankingAggregate.from_lists(labels, scores, offsets, OPTIONS)
    size = {"5m": timedelta(minutes=5), "1h": timedelta(hours=1)}[window]
    return PublishedWindow(
        window=window,
        start=start,
        end=start + size,
        overall=overall,
        slices=dict(zip(keys, aggs, strict=True)),
        partitions=partitions,
        revision=revision,
    )


def grid_keys(segments: Sequence[str], surfaces: Sequence[str]) -> list[SliceKey]:
    return [(("segment", a), ("surface", b)) for a in segments for b in surfaces]


def write_baseline_file(
    path: str,
    overall: RankingAggregate,
    slices: dict[SliceKey, RankingAggregate],
    *,
    created: datetime = datetime(2026, 11, 30, 9, 0, tzinfo=UTC),
    variant: str | None = None,
    model: str | None = None,
) -> dict[str, object]:
    """A baseline file written by ``pipeline.offline.baseline.write_baseline``; returns the written document."""
    from rankwatch.pipeline.clock import ManualClock
    from rankwatch.pipeline.offline.baseline import BaselineResult, write_baseline
    from rankwatch.pipeline.slicing import SliceSpec

    by = tuple(sorted({k for key in slices for k, _ in key}))
    result = BaselineResult(
        overall=overall,
        slices=slices,
        options=OPTIONS,
        slice_spec=SliceSpec(by=by),
        inputs=("eval.csv",),
        rows=overall.items,
        model=model,
        variant=variant,
    )
    return write_baseline(path, result, clock=ManualClock(created))


Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_exposition(text: str) -> Series:
    """Every sample of a text exposition, keyed by (sample name, label set), via prometheus_client.parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out


def scrape(url: str, *, headers: dict[str, str] | None = None, context: object = None) -> str:
    import urllib.request

    req = urllib.request.Request(url + "/metrics", headers=headers or {})
    with urllib.request.urlopen(req, timeout=10, context=context) as resp:  # type: ignore[arg-type]
        return str(resp.read().decode("utf-8"))


def select(series: Series, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """Samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return {lbls: v for (n, lbls), v in series.items() if n == name and want <= lbls}


def one(series: Series, name: str, **labels: str) -> float:
    found = [v for (n, lbls), v in series.items() if n == name and lbls == frozenset(labels.items())]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]
