"""Windows: durations, lazy histogram merging equals RankingAggregate.merge, closing order, staging groups."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.auc import ScoreHistogram
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.stream.durations import parse_duration_ms
from rankwatch.pipeline.stream.join import FinalizedBatch
from rankwatch.pipeline.stream.windows import (
    FinalizedStaging,
    SliceAccumulator,
    WindowSet,
    merge_histograms,
)

OPTS = MetricOptions()


@pytest.mark.parametrize(("text", "ms"), [("30s", 30_000), ("5m", 300_000), ("1h", 3_600_000), ("1d", 86_400_000),
                                          ("250ms", 250), (" 2h ", 7_200_000)])
def test_parse_duration(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["", "5", "m", "0m", "-5m", "1.5h", "5 minutes", "1w"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError, match="duration"):
        parse_duration_ms(bad)


def random_part(rng: np.random.Generator) -> RankingAggregate:
    n = int(rng.integers(1, 6))
    lengths = rng.integers(1, 8, size=n)
    total = int(lengths.sum())
    labels = rng.integers(0, 4, size=total) * (rng.random(total) < 0.4)
    scores = np.round(rng.normal(size=total), 1)  # coarse: many ties across parts
    return RankingAggregate.from_lists(labels, scores, np.concatenate(([0], np.cumsum(lengths))), OPTS)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 30))
def test_accumulator_equals_sequential_merge(seed, n_parts):
    rng = np.random.default_rng(seed)
    parts = [random_part(rng) for _ in range(n_parts)]
    acc = SliceAccumulator(OPTS)
    naive = RankingAggregate(OPTS)
    for p in parts:
        acc.add(p)
        naive.merge(p)
    got = acc.aggregate()
    assert got.histogram == naive.histogram
    assert (got.requests, got.requests_with_relevant, got.items) == (naive.requests, naive.requests_with_relevant, naive.items)
    for name in OPTS.rank_metric_names:
        assert got.sums[name].count == naive.sums[name].count
        assert got.sums[name].total == pytest.approx(naive.sums[name].total, abs=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_merge_histograms_equals_a_naive_dict(seed):
    """The multi-way merge (a stable sort of the parts' ascending runs) against counts per score in a dict;
    ties across parts, -0.0 and 0.0 (one score, kept as 0.0), empty parts, and compression beyond the bound."""
    rng = np.random.default_rng(seed)
    parts, counts = [], {}
    for _ in range(int(rng.integers(0, 9))):
        n = int(rng.integers(0, 300))
        scores = np.round(rng.normal(size=n), int(rng.integers(0, 3)))
        scores[rng.random(n) < 0.05] = -0.0
        scores[rng.random(n) < 0.05] = 0.0
        rel = rng.random(n) < 0.3
        parts.append(ScoreHistogram.from_pairs(scores, rel) if n else ScoreHistogram.empty())
        for s, r in zip((scores + 0.0).tolist(), rel.tolist(), strict=True):
            c = counts.setdefault(s, [0, 0])
            c[0 if r else 1] += 1
    got = merge_histograms(parts, 1 << 20)
    assert [(float(s), int(p), int(q)) for s, p, q in zip(got.scores, got.pos, got.neg, strict=True)] == [
        (s, p, q) for s, (p, q) in sorted(counts.items())
    ]
    assert not np.signbit(got.scores[got.scores == 0]).any()
    assert got.pos.dtype == got.neg.dtype == np.int64 and got.new_ties == 0.0
    pairwise = ScoreHistogram.empty()
    for p in parts:
        pairwise = pairwise.merge(p)
    small = max(1, len(counts) // 3)
    assert merge_histograms(parts, small) == pairwise.compressed(small)


def test_window_set_closes_in_end_order_and_counts():
    ws = WindowSet(("1m", "2m"), OPTS)
    part = RankingAggregate.from_lists([1.0, 0.0], [0.2, 0.1], [0, 2], OPTS)
    keys = [(), (("segment", "a"),)]
    for i, start in ((0, 0), (0, 60_000), (1, 0), (0, 120_000)):
        ws.add(i, start, 1, part)
    out = ws.close(120_000, keys, ())
    assert [(w.window, w.start.timestamp()) for w in out] == [("1m", 0.0), ("1m", 60.0), ("2m", 0.0)]
    assert out[0].slices == {(("segment", "a"),): part} and out[0].overall == part
    assert ws.published == {"1m": 2, "2m": 1}
    assert [w.window for w in ws.close(None, keys, ())] == ["1m"]


def test_staging_groups_and_completion():
    st_ = FinalizedStaging(group_ms=100, attribution_window_ms=50, max_items=5)
    batch = FinalizedBatch([], np.array([10, 20, 150]), np.array([0, 0, 0]), np.zeros(4), np.arange(4.0),
                           np.array([0, 1, 2, 4]))
    assert st_.add(batch) == []
    assert st_.complete(149) == []
    [first] = st_.complete(150)  # group 0 ends at 100, plus attribution 50
    np.testing.assert_array_equal(first.ts_ms, [10, 20])
    big = FinalizedBatch([], np.array([160]), np.array([0]), np.zeros(4), np.arange(4.0), np.array([0, 4]))
    [full] = st_.add(big)  # 2 + 4 items >= 5: handed over at once
    np.testing.assert_array_equal(full.ts_ms, [150, 160])
    assert st_.complete(None) == []
