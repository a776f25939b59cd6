"""Label capping and exact merging of aggregates that share a label set."""

from __future__ import annotations

import numpy as np
from exporter_helpers import OPTIONS, grid_keys, random_window
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.exporters.folding import ExporterLabelCapper, group_by_labels, merge_aggregates, rollups
from rankwatch.pipeline.metrics.aggregates import RankingAggregate


def same(a: RankingAggregate, b: RankingAggregate) -> bool:
    """Equal counts, sums and histograms (scores compared as numbers: -0.0 == 0.0)."""
    ha, hb = a.histogram, b.histogram
    return (
        a.values() == b.values()
        and {k: (s.count, s.total, s.total_sq) for k, s in a.sums.items()}
        == {k: (s.count, s.total, s.total_sq) for k, s in b.sums.items()}
        and np.array_equal(ha.scores, hb.scores)
        and np.array_equal(ha.pos, hb.pos)
        and np.array_equal(ha.neg, hb.neg)
        and ha.new_ties == hb.new_ties
    )


def pairwise(aggs: list[RankingAggregate]) -> RankingAggregate:
    out = aggs[0].copy()
    for a in aggs[1:]:
        out.merge(a)
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12))
def test_merge_aggregates_equals_pairwise_merge(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    pw = random_window(rng, grid_keys([f"s{i}" for i in range(n)], ("x",)), requests_per_slice=3)
    parts = list(pw.slices.values())
    assert same(merge_aggregates(parts), pairwise(parts))
    assert merge_aggregates([RankingAggregate(OPTIONS), RankingAggregate(OPTIONS)]) == RankingAggregate(
        OPTIONS
    )


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "all", "__other__"]), max_size=40),
    cap=st.integers(1, 6),
)
def test_capper_first_come_first_kept(values: list[str], cap: int) -> None:
    capper = ExporterLabelCapper(cap)
    out = [capper.cap_value("segment", v) for v in values]
    admitted: list[str] = []
    folded = 0
    for v, o in zip(values, out, strict=True):
        if v in ("all", "__other__") or v in admitted:
            assert o == v
        elif len(admitted) < cap:
            admitted.append(v)
            assert o == v
        else:
            folded += 1
            assert o == "__other__"
    assert capper.overflow.get("segment", 0) == folded
    assert len({o for o in out} - {"all", "__other__"}) <= cap


def test_grouping_merges_collisions_and_rollups_are_exact() -> None:
    rng = np.random.default_rng(9)
    keys = [
        (("segment", "a"), ("surface", "x"), ("model", "m1")),
        (("segment", "a"), ("surface", "x"), ("model", "m2")),  # same label set without a model label
        (("segment", "b"), ("surface", "x"), ("model", "m1")),
    ]
    pw = random_window(rng, keys)
    grouped = group_by_labels(pw.slices.items(), ExporterLabelCapper(10))
    assert set(grouped) == {("a", "x", "all"), ("b", "x", "all")}
    assert same(grouped[("a", "x", "all")], pairwise([pw.slices[keys[0]], pw.slices[keys[1]]]))
    rolled = rollups(grouped)
    assert set(rolled) == {("a", "all", "all"), ("b", "all", "all"), ("all", "x", "all")}
    assert same(rolled[("all", "x", "all")], pairwise(list(pw.slices.values())))


def test_compressed_histograms_take_the_kernels_merge() -> None:
    from dataclasses import replace

    rng = np.random.default_rng(10)
    options = replace(OPTIONS, max_distinct_scores=8)
    parts = []
    for _ in range(4):
        n = 30
        offsets = np.arange(0, 3 * n + 1, 3)
        labels = (rng.random(3 * n) < 0.3).astype(float)
        parts.append(RankingAggregate.from_lists(labels, rng.random(3 * n), offsets, options))
    assert any(p.histogram.lows is not None for p in parts)
    merged = merge_aggregates(parts)
    assert same(merged, pairwise(parts))
    assert merged.histogram.n_distinct <= 8
