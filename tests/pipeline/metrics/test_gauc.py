"""GAUC against a naive per-group scikit-learn loop; click-through by position and positive rate against a
naive count; both through the offline path (user_id column) and the mergeable aggregate state."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from rankwatch.pipeline.metrics import gauc as gauc_module
from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.gauc import ScoreImage, group_auc
from rankwatch.pipeline.metrics.gauc_sums import GaucSums, dense_ids
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import compute_baseline
from rankwatch.pipeline.slicing import SliceSpec


def naive_gauc(groups: np.ndarray, scores: np.ndarray, relevant: np.ndarray, weight: str) -> tuple:
    total = weights = 0.0
    used = excluded = 0
    for g in dict.fromkeys(groups.tolist()):
        m = groups == g
        y = relevant[m]
        if y.all() or not y.any():
            excluded += 1
            continue
        w = m.sum() if weight == "impressions" else y.sum()
        total += w * roc_auc_score(y, scores[m])
        weights += w
        used += 1
    return (total / weights if weights else None), used, excluded


def random_scores(rng: np.random.Generator, n: int, kind: int) -> np.ndarray:
    if kind == 0:
        return rng.integers(0, 5, n).astype(float)  # many ties
    if kind == 1:
        return 1.0 + rng.integers(-3, 4, n) * 1e-15  # distinct scores sharing their top bits
    s = rng.normal(size=n) * rng.choice([1.0, -1e-300], n)
    s[rng.random(n) < 0.1] = -0.0  # -0.0 ties with 0.0
    s[rng.random(n) < 0.1] = 0.0
    return s


@pytest.mark.parametrize("way", ["as chosen", "one sort always", "image after the keys' sort", "image", "lexsort"])
def test_group_auc_against_sklearn(monkeypatch: pytest.MonkeyPatch, way: str) -> None:
    """Each way of counting: the keys' sort with the shared buckets recounted (``one sort``, what a call without
    an image takes unless many items tie), a score image's (ties and shared prefixes found over all scores) on the
    keys already sorted (when many tie) or on its own (the offline kernel shares one between its calls), and the
    lexsort used when a group id leaves too few bits for the score."""
    if way == "lexsort":
        monkeypatch.setattr(gauc_module, "_MIN_PREFIX_BITS", 70)
    if way == "one sort always":
        monkeypatch.setattr(gauc_module, "_ONE_SORT_SUSPECTS", 2.0)
    if way == "image after the keys' sort":
        monkeypatch.setattr(gauc_module, "_ONE_SORT_SUSPECTS", -1.0)
    rng = np.random.default_rng(3)
    for trial in range(150):
        n, n_groups = int(rng.integers(1, 300)), int(rng.integers(1, 25))
        groups = rng.integers(0, n_groups, n)
        scores = random_scores(rng, n, trial % 3)
        relevant = rng.random(n) < rng.choice([0.05, 0.4, 0.95])
        image = ScoreImage.of(scores, relevant, n_groups) if way == "image" else None
        auc = group_auc(groups, scores, relevant, n_groups, image=image).auc()
        for g in range(n_groups):
            m = groups == g
            if m.any() and 0 < relevant[m].sum() < m.sum():
                assert auc[g] == pytest.approx(roc_auc_score(relevant[m], scores[m]), abs=1e-12)
            else:
                assert np.isnan(auc[g])


def test_one_sort_and_the_image_agree_exactly_on_large_inputs() -> None:
    """The two ways to the same counts, bit for bit, on inputs large enough for the limit on shared buckets to
    choose either: distinct floats (one sort), a few ties among them (one sort, recounted), many ties (image)."""
    rng = np.random.default_rng(7)
    for ties in (0.0, 0.01, 0.5):
        n, n_groups = 200_000, 3_000
        groups = np.repeat(rng.integers(0, n_groups, n // 20), 20)
        scores = rng.random(n)
        tied = rng.random(n) < ties
        scores[tied] = np.round(scores[tied], 2)
        relevant = rng.random(n) < 0.1
        chosen = group_auc(groups, scores, relevant, n_groups)
        via_image = group_auc(groups, scores, relevant, n_groups, image=ScoreImage.of(scores, relevant, n_groups))
        assert np.array_equal(chosen.pos, via_image.pos) and np.array_equal(chosen.neg, via_image.neg)
        assert np.array_equal(chosen.numerator, via_image.numerator)  # sums of halves: exact in any order


def test_empty_and_one_class_inputs() -> None:
    empty = group_auc(np.empty(0, np.int64), np.empty(0), np.empty(0, bool), 3)
    assert empty.auc().shape == (3,) and np.isnan(empty.auc()).all() and empty.pos.tolist() == [0, 0, 0]
    one = group_auc(np.zeros(4, np.int64), np.arange(4.0), np.ones(4, bool), 1)
    assert np.isnan(one.auc()[0]) and one.pos.tolist() == [4]
    with pytest.raises(ValueError, match="range"):
        group_auc(np.array([5]), np.array([1.0]), np.array([True]), 2)
    with pytest.raises(ValueError, match="other items"):
        group_auc(np.array([0]), np.array([1.0]), np.array([True]), 1, image=ScoreImage.of([1.0, 2.0], [1, 0], 1))


def evaluation_frame(rng: np.random.Generator, n_requests: int) -> pd.DataFrame:
    rows = []
    for q in range(n_requests):
        n = int(rng.integers(1, 12))
        user = f"u{int(rng.integers(0, 25))}"
        segment, surface = rng.choice(["a", "b"]), rng.choice(["x", "y", "z"])
        scores = random_scores(rng, n, q % 3)
        labels = rng.integers(0, 3, n) * (rng.random(n) < 0.35)
        for i in range(n):
            rows.append({"request_id": f"r{q}", "item_id": f"i{i}", "score": scores[i], "label": int(labels[i]),
                         "user_id": user, "segment": segment, "surface": surface})  # fmt: skip
    return pd.DataFrame(rows)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), group=st.sampled_from(["user", "request"]),
       weight=st.sampled_from(["impressions", "clicks"]))  # fmt: skip
def test_offline_gauc_per_slice_against_naive_loop(seed: int, group: str, weight: str) -> None:
    frame = evaluation_frame(np.random.default_rng(seed), 60)
    options = MetricOptions(gauc_group=group, gauc_weight=weight)  # type: ignore[arg-type]
    result = compute_baseline(frame, options=options)
    key = "user_id" if group == "user" else "request_id"
    expected = naive_gauc(frame[key].to_numpy(), frame["score"].to_numpy(), frame["label"].to_numpy() > 0, weight)
    overall = result.overall.values()
    assert (overall["gauc_groups"], overall["gauc_groups_excluded"]) == expected[1:]
    assert overall["gauc"] == (None if expected[0] is None else pytest.approx(expected[0], abs=1e-12))
    for slice_key, agg in result.slices.items():
        part = frame[(frame["segment"] == dict(slice_key)["segment"]) & (frame["surface"] == dict(slice_key)["surface"])]
        exp = naive_gauc(part[key].to_numpy(), part["score"].to_numpy(), part["label"].to_numpy() > 0, weight)
        got = agg.values()
        assert (got["gauc_groups"], got["gauc_groups_excluded"]) == exp[1:]
        assert got["gauc"] == (None if exp[0] is None else pytest.approx(exp[0], abs=1e-12))


def test_offline_without_user_id_has_null_gauc_and_request_gauc_needs_none() -> None:
    frame = evaluation_frame(np.random.default_rng(1), 30).drop(columns=["user_id"])
    values = compute_baseline(frame).overall.values()
    assert values["gauc"] is None and values["gauc_groups"] is None
    by_request = compute_baseline(frame, options=MetricOptions(gauc_group="request")).overall.values()
    assert by_request["gauc"] is not None


def test_a_request_with_two_users_is_refused() -> None:
    frame = evaluation_frame(np.random.default_rng(2), 5)
    sizes = frame["request_id"].value_counts()
    request = sizes.index[sizes > 1][0]
    frame.loc[frame.index[frame["request_id"] == request][-1], "user_id"] = "someone-else"
    with pytest.raises(ValueError, match="user_id 'someone-else' differs"):
        compute_baseline(frame)


def naive_positions(lists: list[list[int]], ranks: int) -> tuple[list[int], list[int], int]:
    shown, positive = [0] * ranks, [0] * ranks
    for ls in lists:
        for r, rel in enumerate(ls[:ranks]):
            shown[r] += 1
            positive[r] += rel > 0
    return shown, positive, sum(1 for ls in lists for rel in ls if rel > 0)


@settings(max_examples=50, deadline=None)
@given(lists=st.lists(st.lists(st.integers(0, 3), max_size=15), min_size=1, max_size=20), ranks=st.integers(1, 12))
def test_click_through_by_position_against_naive_counts(lists: list[list[int]], ranks: int) -> None:
    from rankwatch.pipeline.metrics.kernel import flatten_lists

    labels, offsets = flatten_lists(lists)  # type: ignore[arg-type]
    options = MetricOptions(ctr_ranks=ranks)
    agg = RankingAggregate.from_lists(labels, np.arange(labels.size, dtype=float), offsets, options)
    shown, positive, positives = naive_positions(lists, ranks)
    assert agg.ctr_shown.tolist() == shown and agg.ctr_positive.tolist() == positive
    assert agg.positives == positives
    items = sum(len(ls) for ls in lists)
    assert agg.values()["positive_rate"] == (positives / items if items else None)
    assert agg.position_ctr() == [None if s == 0 else p / s for p, s in zip(positive, shown, strict=True)]


def test_offline_overall_positions_equal_the_sum_of_slices_and_a_direct_count() -> None:
    frame = evaluation_frame(np.random.default_rng(4), 80)
    result = compute_baseline(frame)
    alone = compute_baseline(frame, slice_spec=SliceSpec(by=()))
    assert result.overall.ctr_shown.tolist() == alone.overall.ctr_shown.tolist()
    assert result.overall.ctr_positive.tolist() == alone.overall.ctr_positive.tolist()
    assert result.overall.positives == alone.overall.positives == int((frame["label"] > 0).sum())


def test_state_round_trip_and_open_groups_merge() -> None:
    rng = np.random.default_rng(9)
    keys, scores, rel = rng.integers(0, 6, 200), rng.normal(size=200), rng.random(200) < 0.4
    a = GaucSums(open_keys=keys[:120], open_scores=scores[:120], open_relevant=rel[:120])
    b = GaucSums(open_keys=keys[120:], open_scores=scores[120:], open_relevant=rel[120:])
    a.merge(b, max_open_items=1_000)
    expected = naive_gauc(keys, scores, rel, "impressions")
    assert a.value("impressions") == (pytest.approx(expected[0], abs=1e-12), *expected[1:])
    restored = GaucSums.from_state(a.to_state())
    assert restored.value("impressions") == a.value("impressions")
    capped = GaucSums()
    capped.merge(a, max_open_items=50)
    assert capped.n_open == 50 and capped.dropped == 150


@pytest.mark.parametrize("width", [1, 3, 12])
def test_click_through_on_lists_of_one_length(width: int) -> None:
    """The divmod path for top-k lists of one length equals the naive count."""
    rng = np.random.default_rng(width)
    lists = [rng.integers(0, 3, width).tolist() for _ in range(40)]
    test_click_through_by_position_against_naive_counts.hypothesis.inner_test(lists, 10)  # type: ignore[attr-defined]


def test_offline_requests_without_user_are_groups_of_their_own() -> None:
    frame = evaluation_frame(np.random.default_rng(8), 40)
    missing = frame["request_id"].isin([f"r{q}" for q in range(0, 40, 3)])
    frame["user_id"] = frame["user_id"].astype(object).where(~missing, None)
    keys = frame["user_id"].where(~missing, "req:" + frame["request_id"]).to_numpy()
    expected = naive_gauc(keys, frame["score"].to_numpy(), frame["label"].to_numpy() > 0, "impressions")
    got = compute_baseline(frame).overall.values()
    assert (got["gauc_groups"], got["gauc_groups_excluded"]) == expected[1:]
    assert got["gauc"] == pytest.approx(expected[0], abs=1e-12)
    shuffled = frame.sample(frac=1.0, random_state=1).reset_index(drop=True)  # the ungrouped reader path
    assert compute_baseline(shuffled).overall.values()["gauc"] == pytest.approx(expected[0], abs=1e-12)


@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(1, 4)), max_size=30), st.booleans())
@settings(max_examples=300, deadline=None)
def test_dense_ids_are_np_uniques_inverse_whatever_the_runs(runs: list[tuple[int, int]], big: bool) -> None:
    """The open groups' user ids, closed over runs of equal keys: np.unique's and pandas' sorted factorize exactly
    (keys in runs, repeated apart, negative, huge; none)."""
    keys = np.repeat(np.array([k for k, _ in runs], dtype=np.int64), [n for _, n in runs])
    if big:
        keys = keys * (2**60 // 4)
    ids, uniques = dense_ids(keys)
    want_uniques, want_ids = np.unique(keys, return_inverse=True)
    assert ids.dtype == np.int64 and np.array_equal(ids, want_ids) and np.array_equal(uniques, want_uniques)
    pd_ids, pd_uniques = pd.factorize(keys, sort=True)
    assert np.array_equal(ids, pd_ids) and np.array_equal(uniques, np.asarray(pd_uniques))


def _online_aggregate(kind: int, options: MetricOptions) -> tuple[RankingAggregate, tuple[np.ndarray, ...]]:
    """Four batches' aggregate with GAUC groups (users) open across them, and its items (users, scores, relevant)."""
    from rankwatch.pipeline.metrics.aggregates import aggregate_groups
    from rankwatch.pipeline.metrics.kernel import per_request_metrics

    rng = np.random.default_rng(kind)
    merged = RankingAggregate(options)
    items: list[list[np.ndarray]] = [[], [], []]
    for _ in range(4):
        lengths = rng.integers(1, 8, 300)
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        scores = random_scores(rng, int(offsets[-1]), kind)
        labels = (rng.random(scores.size) < 0.3).astype(float)
        users = rng.integers(0, 40, lengths.size)
        metrics = per_request_metrics(labels, offsets, options)
        (part,) = aggregate_groups(metrics, labels, scores, np.zeros(lengths.size, np.int64), 1, options,
                                   gauc_keys=users, gauc_open=True)
        merged.merge(part)
        for column, values in zip(items, (np.repeat(users, lengths), scores, labels > 0), strict=True):
            column.append(values)
    return merged, tuple(np.concatenate(c) for c in items)


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_open_groups_closed_with_the_histograms_scores_are_closed_as_without(kind: int) -> None:
    """An online aggregate (a user's items open across batches) closes its GAUC groups with its exact AUC
    histogram's distinct scores (one sort fewer): the same value and SE, bit for bit, as without them, and the
    naive per-group loop's value; a compressed histogram or a capped GAUC passes none."""
    options = MetricOptions()
    merged, (users, scores, relevant) = _online_aggregate(kind, options)
    hinted = merged.copy()
    assert hinted._open_scores() is not None
    weight = options.gauc_weight
    assert hinted.values()["gauc"] == merged.copy().gauc.value(weight)[0]  # closed without the scores
    assert hinted.stderrs()["gauc"] == merged.copy().gauc.stderr(weight)
    expected = naive_gauc(users, scores, relevant, weight)
    assert hinted.values()["gauc"] == pytest.approx(expected[0], abs=1e-12)
    assert hinted.values()["gauc_groups"] == expected[1]
    capped, _ = _online_aggregate(kind, MetricOptions(gauc_max_items=100))
    assert capped.gauc.dropped and capped._open_scores() is None
    coarse, _ = _online_aggregate(kind, MetricOptions(max_distinct_scores=4))
    assert coarse.histogram.lows is not None and coarse._open_scores() is None
