"""``ClusterHistograms.from_bins`` and ``merge_many`` against a deliberately naive dict of bins."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from rankwatch.pipeline.metrics.clusters import MAX_BINS, ClusterHistograms


def _naive(bucket: np.ndarray, scores: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> list[tuple[int, float, int, int]]:
    bins: dict[tuple[int, float], list[int]] = defaultdict(lambda: [0, 0])
    for b, s, p, n in zip(bucket.tolist(), scores.tolist(), pos.tolist(), neg.tolist(), strict=True):
        bins[(b, s + 0.0)][0] += p  # -0.0 and 0.0 are one score
        bins[(b, s + 0.0)][1] += n
    return [(b, s, p, n) for (b, s), (p, n) in sorted(bins.items())]


def _rows(h: ClusterHistograms) -> list[tuple[int, float, int, int]]:
    return [(int(b), float(s) + 0.0, int(p), int(n)) for b, s, p, n in zip(h.bucket, h.scores, h.pos, h.neg, strict=True)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("high", [4, 1024, 1 << 20])  # few buckets, the product's 1024, beyond 16 bits
def test_from_bins_sums_duplicate_bins_like_a_naive_dict(seed: int, high: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    bucket = rng.integers(0, high, n)
    scores = np.round(rng.normal(size=n), int(rng.integers(0, 3)))  # many ties
    scores[rng.random(n) < 0.1] = -0.0
    scores[rng.random(n) < 0.1] = 0.0
    pos, neg = rng.integers(0, 4, n), rng.integers(0, 4, n)
    got = ClusterHistograms.from_bins(bucket, scores, pos, neg)
    assert _rows(got) == _naive(bucket, scores, pos, neg)


def test_from_bins_of_nothing_is_empty() -> None:
    assert ClusterHistograms.from_bins([], [], [], []).n_bins == 0


def test_merge_many_equals_the_bins_of_all_parts() -> None:
    rng = np.random.default_rng(3)
    parts, raw = [], []
    for _ in range(5):
        n = 500
        cols = (rng.integers(0, 1024, n), np.round(rng.random(n), 2), rng.integers(0, 3, n), rng.integers(0, 3, n))
        parts.append(ClusterHistograms.from_bins(*cols))
        raw.append(cols)
    merged = ClusterHistograms.merge_many(parts, max_bins=MAX_BINS)
    assert _rows(merged) == _naive(*(np.concatenate([c[i] for c in raw]) for i in range(4)))


def _float32_scores(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 values as float64 (the keyed path of from_bins), with ties, both zeros and infinities."""
    scores = np.round(rng.normal(size=n), int(rng.integers(0, 3))).astype(np.float32).astype(np.float64)
    scores[rng.random(n) < 0.05] = -0.0
    scores[rng.random(n) < 0.05] = 0.0
    scores[rng.random(n) < 0.02] = np.inf
    scores[rng.random(n) < 0.02] = -np.inf
    scores[rng.random(n) < 0.02] = float(np.float32(1e-42))  # a float32 subnormal
    return scores


@pytest.mark.parametrize("seed", range(8))
def test_from_bins_of_float32_scores_like_a_naive_dict(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    bucket = rng.integers(0, int(rng.choice([1, 64, 1024, 1 << 16])), n)
    scores = _float32_scores(rng, n)
    pos, neg = rng.integers(0, 4, n), rng.integers(0, 4, n)
    got = ClusterHistograms.from_bins(bucket, scores, pos, neg)
    assert _rows(got) == _naive(bucket, scores, pos, neg)


@pytest.mark.parametrize("seed", range(6))
def test_merge_many_of_sorted_parts_like_a_naive_dict(seed: int) -> None:
    """The merge's input: parts each sorted by (bucket, score), some folded (bucket % 64 breaks the runs),
    float32 scores with ties across parts; a part with a finer score sends the merge down the general path."""
    rng = np.random.default_rng(seed)
    parts, raw = [], []
    for k in range(int(rng.integers(2, 8))):
        n = int(rng.integers(0, 600))
        cols = (rng.integers(0, 1024, n), _float32_scores(rng, n), rng.integers(0, 3, n), rng.integers(0, 3, n))
        if seed % 3 == 2 and k == 1 and n:
            cols[1][0] = 0.1  # not a float32 value
        part = ClusterHistograms.from_bins(*cols)
        if rng.random() < 0.3:
            part = part.folded()
        parts.append(part)
        raw.append(cols)
    folded = any(p.clusters == 64 for p in parts if p.n_bins)
    merged = ClusterHistograms.merge_many(parts, max_bins=1 << 20)
    bucket, scores, pos, neg = (np.concatenate([c[i] for c in raw]) for i in range(4))
    assert _rows(merged) == _naive(bucket % 64 if folded else bucket, scores, pos, neg)


def test_from_bins_of_one_bin_and_of_nan() -> None:
    one = ClusterHistograms.from_bins([3], [0.5], [1], [2])
    assert _rows(one) == [(3, 0.5, 1, 2)]
    nan = ClusterHistograms.from_bins([1, 1, 0], [np.nan, 0.5, 0.25], [1, 1, 1], [0, 0, 0])  # the general path
    assert _rows(nan)[:2] == [(0, 0.25, 1, 0), (1, 0.5, 1, 0)] and nan.n_bins == 3
