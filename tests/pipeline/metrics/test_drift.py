"""Score drift: quantile bins, PSI against a naive loop, KS against scipy.stats.ks_2samp."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import ks_2samp

from rankwatch.pipeline.metrics.auc import ScoreHistogram
from rankwatch.pipeline.metrics.drift import PSI_FLOOR, ScoreDistribution, bin_counts, ks, psi, score_drift
from rankwatch.pipeline.offline.baseline import compute_baseline, parse_baseline


def hist_of(scores: np.ndarray) -> ScoreHistogram:
    return ScoreHistogram.from_pairs(scores, np.zeros(scores.size, dtype=bool))


def naive_psi(expected: list[int], actual: list[int]) -> float:
    te, ta = sum(expected), sum(actual)
    total = 0.0
    for e, a in zip(expected, actual, strict=True):
        pe, pa = max(e / te, PSI_FLOOR), max(a / ta, PSI_FLOOR)
        total += (pa - pe) * math.log(pa / pe)
    return total


def naive_bins(edges: np.ndarray, scores: np.ndarray) -> list[int]:
    counts = [0] * (edges.size + 1)
    for s in scores:
        i = 0
        while i < edges.size and s > edges[i]:
            i += 1
        counts[i] += 1
    return counts


samples = st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0, 7.5]), min_size=1, max_size=200)


@settings(max_examples=80, deadline=None)
@given(base=samples, window=samples, bins=st.integers(2, 25))
def test_bins_psi_and_ks_against_naive_and_scipy(base: list[float], window: list[float], bins: int) -> None:
    b, w = np.array(base), np.array(window)
    dist = ScoreDistribution.from_histogram(hist_of(b), bins)
    assert dist.counts.tolist() == naive_bins(dist.edges, b) and dist.items == b.size
    assert dist.edges.size <= bins - 1 and np.all(np.diff(dist.edges) > 0)
    drift = score_drift(dist, hist_of(w))
    actual = naive_bins(dist.edges, w)
    assert drift.items == w.size
    assert drift.psi == pytest.approx(naive_psi(dist.counts.tolist(), actual), abs=1e-12)
    exact = ks_2samp(b, w, method="asymp").statistic
    assert drift.ks is not None and drift.ks <= exact + 1e-12  # taken at the edges only: never above
    # With every distinct baseline score but the largest an edge, and window scores among them, the
    # empirical CDFs only jump at edges: the binned KS is the exact one.
    distinct = np.unique(b)
    if np.array_equal(dist.edges, distinct[:-1]) and np.isin(w, distinct).all():
        assert drift.ks == pytest.approx(exact, abs=1e-12)


def test_continuous_scores_quantiles_and_identity() -> None:
    rng = np.random.default_rng(0)
    b = rng.normal(size=20_000)
    dist = ScoreDistribution.from_histogram(hist_of(b), 20)
    assert dist.edges.size == 19
    assert np.allclose(dist.counts, 1_000, atol=1)  # quantile bins hold equal shares
    same = score_drift(dist, hist_of(b))
    assert same.psi == pytest.approx(0.0, abs=1e-12) and same.ks == pytest.approx(0.0, abs=1e-12)
    shifted = score_drift(dist, hist_of(b + 0.5))
    assert shifted.psi > 0.2 and shifted.ks == pytest.approx(ks_2samp(b, b + 0.5).statistic, abs=0.02)


def test_empty_sides_and_bad_input() -> None:
    empty = ScoreDistribution.from_histogram(ScoreHistogram.empty(), 20)
    assert empty.edges.size == 0 and empty.counts.tolist() == [0]
    assert psi([0, 0], [1, 2]) is None and ks([1, 2], [0, 0]) is None
    assert score_drift(empty, hist_of(np.array([1.0]))).psi is None
    with pytest.raises(ValueError, match="same bins"):
        psi([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="one more count"):
        ScoreDistribution.from_dict({"edges": [1.0], "counts": [1]})
    with pytest.raises(ValueError, match="ascend"):
        ScoreDistribution.from_dict({"edges": [2.0, 1.0], "counts": [1, 1, 1]})
    assert bin_counts(np.array([0.0, 1.0]), [-1.0, 0.0, 0.5, 1.0, 2.0]).tolist() == [2, 2, 1]


def test_baseline_file_keeps_each_slice_distribution() -> None:
    rng = np.random.default_rng(1)
    n = 600
    frame = pd.DataFrame({
        "request_id": np.repeat(np.arange(n // 6), 6).astype(str), "item_id": np.tile(np.arange(6), n // 6).astype(str),
        "score": rng.normal(size=n), "label": (rng.random(n) < 0.3).astype(int),
        "segment": np.repeat(rng.choice(["a", "b"], n // 6), 6), "surface": "s",
    })  # fmt: skip
    result = compute_baseline(frame)
    doc = result.document()
    for entry in [doc["overall"], *doc["slices"]]:
        dist = ScoreDistribution.from_dict(entry["score_distribution"])
        assert dist.items == entry["items"]
    from rankwatch.pipeline.clock import ManualClock
    from rankwatch.pipeline.offline.baseline import baseline_document

    clock = ManualClock(pd.Timestamp("2026-12-01", tz="UTC").to_pydatetime())
    file_doc = baseline_document(result, clock=clock)
    parse_baseline(file_doc)  # valid
    file_doc["result"]["slices"][0]["score_distribution"] = {"edges": [1.0, 0.0], "counts": [1, 1, 1]}
    with pytest.raises(ValueError, match="score_distribution"):
        parse_baseline(file_doc)
