"""Pooled AUC-ROC / AUC-PR state against scikit-learn and the pairwise definition; merges; compression."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_metrics import auc_roc as naive_auc_roc
from sklearn.metrics import average_precision_score, roc_auc_score

from rankwatch.pipeline.metrics.auc import ScoreHistogram, histograms_by_group

TOL = 1e-9
# Few distinct values give many ties; the extremes check that nothing overflows or loses order.
score_values = st.sampled_from([-1e300, -7.5, -1.0, -0.0, 0.0, 0.25, 0.5, 0.5000001, 1.0, 3.0, 1e12, 1e300])
pairs = st.lists(st.tuples(st.one_of(score_values, st.floats(-1e6, 1e6)), st.booleans()), max_size=120)


def split(p: list[tuple[float, bool]]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([s for s, _ in p], dtype=np.float64), np.array([r for _, r in p], dtype=bool)


@settings(max_examples=150, deadline=None)
@given(p=pairs)
def test_against_scikit_learn_and_pairwise_definition(p: list[tuple[float, bool]]) -> None:
    scores, rel = split(p)
    h = ScoreHistogram.from_pairs(scores, rel)
    assert h.positives == int(rel.sum()) and h.negatives == int((~rel).sum())
    if rel.all() or not rel.any():
        # A single class has no AUC: absent, never 0 and never an error.
        assert h.auc_roc() is None and h.average_precision() is None and h.auc_roc_error_bound() == 0.0
        return
    assert h.auc_roc() == pytest.approx(roc_auc_score(rel, scores), abs=TOL)
    assert h.average_precision() == pytest.approx(average_precision_score(rel, scores), abs=TOL)
    assert h.auc_roc() == pytest.approx(naive_auc_roc(scores.tolist(), rel.tolist()), abs=TOL)


def test_ties_count_one_half() -> None:
    h = ScoreHistogram.from_pairs([1.0, 1.0, 0.0, 2.0], [True, False, False, True])
    # pairs (pos, neg): (1,1) tie 0.5, (1,0) win, (2,1) win, (2,0) win -> 3.5 / 4
    assert h.auc_roc() == pytest.approx(3.5 / 4)
    assert h.scores.tolist() == [0.0, 1.0, 2.0] and h.pos.tolist() == [0, 1, 1] and h.neg.tolist() == [1, 1, 0]


def test_negative_zero_and_zero_are_one_score() -> None:
    h = ScoreHistogram.from_pairs([-0.0, 0.0, 0.0], [True, False, True])
    assert h.n_distinct == 1 and h.pos.tolist() == [2] and h.neg.tolist() == [1]
    assert h.auc_roc() == 0.5


def test_empty_and_invalid_inputs() -> None:
    assert ScoreHistogram.from_pairs([], []).auc_roc() is None
    with pytest.raises(ValueError, match="finite"):
        ScoreHistogram.from_pairs([np.inf], [True])
    with pytest.raises(ValueError, match="length"):
        ScoreHistogram.from_pairs([1.0, 2.0], [True])


@settings(max_examples=80, deadline=None)
@given(a=pairs, b=pairs)
def test_merge_is_exact(a: list[tuple[float, bool]], b: list[tuple[float, bool]]) -> None:
    merged = ScoreHistogram.from_pairs(*split(a)).merge(ScoreHistogram.from_pairs(*split(b)))
    assert merged == ScoreHistogram.from_pairs(*split(a + b))


@settings(max_examples=60, deadline=None)
@given(p=pairs, n_groups=st.integers(1, 6), data=st.data())
def test_histograms_by_group_equal_one_histogram_per_group(p, n_groups: int, data) -> None:
    scores, rel = split(p)
    group = np.array(data.draw(st.lists(st.integers(0, n_groups - 1), min_size=len(p), max_size=len(p))), dtype=np.int64)
    hists = histograms_by_group(scores, rel, group, n_groups)
    assert len(hists) == n_groups
    for g, h in enumerate(hists):
        assert h == ScoreHistogram.from_pairs(scores[group == g], rel[group == g])


def test_histograms_by_group_many_groups_use_a_wider_group_type() -> None:
    rng = np.random.default_rng(3)
    n_groups = 70_000  # beyond uint16
    group = rng.integers(0, n_groups, 200_000)
    scores, rel = rng.normal(size=group.size).round(2), rng.random(group.size) < 0.3
    hists = histograms_by_group(scores, rel, group, n_groups)
    for g in (0, 1, 300, n_groups - 1):
        assert hists[g] == ScoreHistogram.from_pairs(scores[group == g], rel[group == g])
    with pytest.raises(ValueError, match="range"):
        histograms_by_group(scores, rel, group, 10)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(50, 3000),
    cap=st.integers(2, 60),
    tie_grid=st.sampled_from([0, 10, 1000]),
)
def test_compression_error_within_reported_bound(seed: int, n: int, cap: int, tie_grid: int) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=n)
    if tie_grid:
        scores = np.round(scores * tie_grid) / tie_grid
    rel = rng.random(n) < rng.uniform(0.05, 0.95)
    exact = ScoreHistogram.from_pairs(scores, rel)
    small = exact.compressed(cap)
    assert small.n_distinct <= cap
    assert small.positives == exact.positives and small.negatives == exact.negatives
    if exact.auc_roc() is None:
        assert small.auc_roc() is None
        return
    bound = small.auc_roc_error_bound()
    assert abs(small.auc_roc() - exact.auc_roc()) <= bound + 1e-12
    if exact.n_distinct <= cap:
        assert small == exact and bound == 0.0
    # Compressing again and merging keep the bound honest (ties only accumulate).
    again = small.merge(ScoreHistogram.from_pairs(scores[:10], rel[:10])).compressed(max(2, cap // 2))
    full = ScoreHistogram.from_pairs(np.concatenate([scores, scores[:10]]), np.concatenate([rel, rel[:10]]))
    assert abs(again.auc_roc() - full.auc_roc()) <= again.auc_roc_error_bound() + 1e-12


def test_state_round_trip() -> None:
    h = ScoreHistogram.from_pairs([0.5, 0.1, 0.5, 9.0], [True, False, False, True]).compressed(2)
    back = ScoreHistogram.from_state(h.to_state())
    assert back == h and back.new_ties == h.new_ties
    assert all(isinstance(v, bytes) for k, v in h.to_state().items() if k != "new_ties")


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    chunks=st.integers(2, 12),
    cap=st.integers(2, 40),
    tie_grid=st.sampled_from([0, 20]),
    compress_both=st.booleans(),
)
def test_bound_holds_through_merge_and_compress_chains(seed, chunks, cap, tie_grid, compress_both) -> None:
    # What windows and partitions do: merge a new part into a running state, compress, repeat.
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(chunks):
        n = int(rng.integers(1, 200))
        scores = rng.normal(loc=rng.normal(), size=n)
        if tie_grid:
            scores = np.round(scores * tie_grid) / tie_grid
        parts.append((scores, rng.random(n) < rng.uniform(0.1, 0.9)))
    state = ScoreHistogram.empty()
    for scores, rel in parts:
        part = ScoreHistogram.from_pairs(scores, rel)
        state = state.merge(part.compressed(cap) if compress_both else part).compressed(cap)
        assert np.all(np.diff(state.scores) > 0) and np.all(state.bin_lows <= state.scores)
        assert np.all(state.bin_lows[1:] > state.scores[:-1])  # bins cover disjoint ranges
    exact = ScoreHistogram.from_pairs(np.concatenate([s for s, _ in parts]), np.concatenate([r for _, r in parts]))
    assert state.positives == exact.positives and state.negatives == exact.negatives
    if exact.auc_roc() is not None:
        assert abs(state.auc_roc() - exact.auc_roc()) <= state.auc_roc_error_bound() + 1e-12
    assert ScoreHistogram.from_state(state.to_state()) == state


def test_merging_exact_bins_with_equal_scores_adds_no_ties() -> None:
    # A compressed state: one wide bin covering [0.5, 0.7] (one positive, one negative), one exact bin 0.9.
    a = ScoreHistogram(np.array([0.7, 0.9]), np.array([1, 1]), np.array([1, 0]), 1.0, lows=np.array([0.5, 0.9]))
    b = ScoreHistogram.from_pairs([0.9, 0.6, 2.0], [False, False, True])
    merged = a.merge(b)
    # 0.6 falls inside the wide bin: its pair with the positive at 0.5 is now counted; 0.9 ties are true ties.
    assert merged.scores.tolist() == [0.7, 0.9, 2.0] and merged.bin_lows.tolist() == [0.5, 0.9, 2.0]
    assert merged.pos.tolist() == [1, 1, 1] and merged.neg.tolist() == [2, 1, 0]
    assert merged.new_ties == a.new_ties + 1
    assert "lows" not in b.to_state() and "lows" in merged.to_state()
