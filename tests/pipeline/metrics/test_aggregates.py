"""Mergeable aggregates: merging random splits equals the whole; values follow the naive definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_metrics import mean_metrics
from sklearn.metrics import average_precision_score, roc_auc_score

from rankwatch.pipeline.metrics.aggregates import (
    MetricSum,
    RankingAggregate,
    aggregate_groups,
    aggregate_lists,
)
from rankwatch.pipeline.metrics.auc import ScoreHistogram
from rankwatch.pipeline.metrics.kernel import flatten_lists, per_request_metrics
from rankwatch.pipeline.metrics.options import MetricOptions

TOL = 1e-9
item = st.tuples(st.sampled_from([0, 0, 0, 1, 2, 3]), st.sampled_from([-2.0, 0.0, 0.1, 0.5, 0.9, 1.5, 3.0]))
requests = st.lists(st.lists(item, max_size=15), min_size=1, max_size=40)
options_st = st.builds(
    MetricOptions,
    ndcg_cutoffs=st.sampled_from([(5, 10), (1, 3)]),
    map_cutoffs=st.sampled_from([(10,), (2, 5)]),
    gain=st.sampled_from(["exponential", "linear"]),
    map_normalization=st.sampled_from(["relevant", "min_relevant_k"]),
    no_relevant=st.sampled_from(["skip", "zero"]),
)


def flat(reqs: list[list[tuple[int, float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    labels, offsets = flatten_lists([[float(lab) for lab, _ in r] for r in reqs])
    scores = np.array([s for r in reqs for _, s in r], dtype=np.float64)
    return labels, scores, offsets


def aggregate(reqs: list[list[tuple[int, float]]], options: MetricOptions) -> RankingAggregate:
    labels, scores, offsets = flat(reqs)
    return RankingAggregate.from_lists(labels, scores, offsets, options)


def assert_same(a: RankingAggregate, b: RankingAggregate) -> None:
    assert (a.requests, a.requests_with_relevant, a.items) == (b.requests, b.requests_with_relevant, b.items)
    assert set(a.sums) == set(b.sums)
    for name in a.sums:
        assert a.sums[name].count == b.sums[name].count
        assert a.sums[name].total == pytest.approx(b.sums[name].total, abs=TOL)
        assert a.sums[name].total_sq == pytest.approx(b.sums[name].total_sq, abs=TOL)
    assert a.histogram == b.histogram


@settings(max_examples=80, deadline=None)
@given(reqs=requests, options=options_st, data=st.data())
def test_merge_of_random_splits_equals_whole(reqs, options: MetricOptions, data) -> None:
    parts = data.draw(st.lists(st.integers(0, 2), min_size=len(reqs), max_size=len(reqs)))
    merged = RankingAggregate(options)
    for p in range(3):
        merged.merge(aggregate([r for r, q in zip(reqs, parts, strict=True) if q == p], options))
    assert_same(merged, aggregate(reqs, options))


@settings(max_examples=80, deadline=None)
@given(reqs=requests, options=options_st)
def test_values_follow_naive_definitions(reqs, options: MetricOptions) -> None:
    agg = aggregate(reqs, options)
    label_lists = [[lab for lab, _ in r] for r in reqs]
    naive = mean_metrics(
        label_lists, no_relevant=options.no_relevant, ndcg_cutoffs=options.ndcg_cutoffs,
        map_cutoffs=options.map_cutoffs, gain=options.gain, map_normalization=options.map_normalization,
    )  # fmt: skip
    values = agg.values()
    assert values["requests"] == len(reqs)
    assert values["requests_with_relevant"] == sum(1 for ls in label_lists if any(x > 0 for x in ls))
    assert values["items"] == sum(len(r) for r in reqs)
    for name, expected in naive.items():
        assert (values[name] is None) == (expected is None)
        if expected is not None:
            assert values[name] == pytest.approx(expected, abs=TOL)
    scores = [s for r in reqs for _, s in r]
    rel = [lab > 0 for r in reqs for lab, _ in r]
    if 0 < sum(rel) < len(rel):
        assert values["auc_roc"] == pytest.approx(roc_auc_score(rel, scores), abs=TOL)
        assert values["auc_pr"] == pytest.approx(average_precision_score(rel, scores), abs=TOL)
    else:
        assert values["auc_roc"] is None and values["auc_pr"] is None


def test_no_relevant_policy() -> None:
    reqs = [[(1, 0.9), (0, 0.1)], [(0, 0.5), (0, 0.4)]]
    skip = aggregate(reqs, MetricOptions()).values()
    zero = aggregate(reqs, MetricOptions(no_relevant="zero")).values()
    assert skip["mrr"] == 1.0 and zero["mrr"] == 0.5
    assert skip["requests"] == zero["requests"] == 2 and skip["requests_with_relevant"] == 1


def test_empty_aggregate_values_are_absent() -> None:
    v = RankingAggregate(MetricOptions()).values()
    assert v["requests"] == 0 and v["mrr"] is None and v["auc_roc"] is None and v["auc_pr"] is None


@settings(max_examples=40, deadline=None)
@given(reqs=requests, options=options_st, n_groups=st.integers(1, 4), data=st.data())
def test_aggregate_lists_by_group_equals_separate_aggregates(reqs, options, n_groups, data) -> None:
    group = np.array(data.draw(st.lists(st.integers(0, n_groups - 1), min_size=len(reqs), max_size=len(reqs))))
    labels, scores, offsets = flat(reqs)
    grouped = aggregate_lists(labels, scores, offsets, group, n_groups, options)
    for g in range(n_groups):
        assert_same(grouped[g], aggregate([r for r, q in zip(reqs, group, strict=True) if q == g], options))
    metrics = per_request_metrics(labels, offsets, options)
    again = aggregate_groups(metrics, labels, scores, group, n_groups, options)
    for a, b in zip(grouped, again, strict=True):
        assert a == b


def test_merge_refuses_different_options_and_copy_is_independent() -> None:
    a = aggregate([[(1, 0.5)]], MetricOptions())
    with pytest.raises(ValueError, match="options"):
        a.merge(aggregate([[(1, 0.5)]], MetricOptions(gain="linear")))
    b = a.copy()
    b.merge(a)
    assert a.requests == 1 and b.requests == 2


def test_merge_compresses_past_the_cap_and_stays_within_bound() -> None:
    rng = np.random.default_rng(5)
    options = MetricOptions(max_distinct_scores=64)
    reqs = [[(int(rng.integers(0, 2)), float(rng.normal())) for _ in range(10)] for _ in range(100)]
    merged = RankingAggregate(options)
    for r in reqs:
        merged.merge(aggregate([r], options))
    assert merged.histogram.n_distinct <= 64
    exact = ScoreHistogram.from_pairs([s for r in reqs for _, s in r], [lab > 0 for r in reqs for lab, _ in r])
    assert abs(merged.histogram.auc_roc() - exact.auc_roc()) <= merged.histogram.auc_roc_error_bound() + 1e-12


def test_state_round_trip_and_metric_sum() -> None:
    options = MetricOptions(map_normalization="min_relevant_k")
    a = aggregate([[(1, 0.2), (0, 0.9)], [(2, 0.3)], []], options)
    assert RankingAggregate.from_state(a.to_state(), options) == a
    s = MetricSum()
    for x in (0.5, 1.0, 0.0):
        s.merge(MetricSum(1, x, x * x))
    assert s.mean() == pytest.approx(0.5)
    assert s.stderr() == pytest.approx(math.sqrt(0.25 / 3))
    assert MetricSum(1, 0.3, 0.09).stderr() is None and MetricSum().mean() is None
