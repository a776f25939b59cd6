"""Standard errors against independent oracles: scipy, exact integer arithmetic, naive DeLong, sklearn."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_metrics import request_metrics
from scipy import stats
from sklearn.metrics import average_precision_score

from rankwatch.pipeline.metrics.aggregates import MetricSum, RankingAggregate, aggregate_lists
from rankwatch.pipeline.metrics.auc import ScoreHistogram
from rankwatch.pipeline.metrics.clusters import (
    FOLDED_CLUSTERS,
    N_CLUSTERS,
    ClusterHistograms,
    cluster_histograms_by_group,
    request_buckets,
)
from rankwatch.pipeline.metrics.kernel import flatten_lists
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.metrics.uncertainty import (
    auc_pr_stderr,
    auc_roc_stderr,
    clustered_variance,
    delong_variance,
    interval,
    mean_stderr,
    merge_moments,
    shifted_moments,
    z_value,
)

OPTIONS = MetricOptions()


# -- oracles --------------------------------------------------------------------------------------------
def naive_delong(scores: np.ndarray, relevant: np.ndarray) -> float:
    """DeLong et al. (1988) from its definition: O(m * n) kernel matrix."""
    x, y = scores[relevant], scores[~relevant]
    psi = (x[:, None] > y[None, :]) + 0.5 * (x[:, None] == y[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    return float(np.var(v10, ddof=1) / x.size + np.var(v01, ddof=1) / y.size)


def naive_clustered_delong(scores: np.ndarray, relevant: np.ndarray, cluster: np.ndarray) -> float:
    """Obuchowski (1997): per-cluster sums of placements, written out with loops over clusters."""
    x, y = scores[relevant], scores[~relevant]
    m, n = x.size, y.size
    psi = (x[:, None] > y[None, :]) + 0.5 * (x[:, None] == y[None, :])
    auc = psi.mean()
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    cx, cy = cluster[relevant], cluster[~relevant]
    ks = sorted(set(cluster.tolist()))
    k = len(ks)
    s10 = s01 = s11 = 0.0
    for c in ks:
        a = v10[cx == c].sum() - (cx == c).sum() * auc
        b = v01[cy == c].sum() - (cy == c).sum() * auc
        s10 += a * a
        s01 += b * b
        s11 += a * b
    s10 *= k / ((k - 1) * m)
    s01 *= k / ((k - 1) * n)
    s11 *= k / (k - 1)
    return s10 / m + s01 / n + 2 * s11 / (m * n)


def numeric_ap_variance(scores: np.ndarray, relevant: np.ndarray, cluster: np.ndarray | None) -> float:
    """Infinitesimal jackknife by central finite differences of sklearn's weighted average precision."""
    eps = 1e-6
    units = np.arange(scores.size) if cluster is None else cluster
    uniq = np.unique(units)
    infl = []
    for u in uniq:
        w = np.ones(scores.size)
        w[units == u] += eps
        hi = average_precision_score(relevant, scores, sample_weight=w)
        w[units == u] -= 2 * eps
        lo = average_precision_score(relevant, scores, sample_weight=w)
        infl.append((hi - lo) / (2 * eps))
    k = uniq.size
    return float(np.dot(infl, infl)) * k / (k - 1)


def pairs(rng: np.random.Generator, n: int, distinct: int) -> tuple[np.ndarray, np.ndarray]:
    scores = rng.integers(0, distinct, n) / 7.0  # few distinct values: many ties
    relevant = rng.random(n) < 0.3 + 0.4 * (scores > scores.mean())
    relevant[:2], relevant[2:4] = True, False
    return scores, relevant


def whole_clusters(scores: np.ndarray, relevant: np.ndarray, bucket: np.ndarray) -> ClusterHistograms:
    return cluster_histograms_by_group(scores, relevant, bucket, np.zeros(scores.size, np.int64), 1)[0]


# -- means ----------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(-1e3, 1e3), min_size=0, max_size=60), split=st.integers(0, 60))
def test_mean_stderr_equals_scipy_sem_and_merges(values: list[float], split: int) -> None:
    v = np.array(values)
    count, total, m2 = shifted_moments(v, np.zeros(v.size, np.int64), 1)
    got = mean_stderr(int(count[0]), float(total[0]), float(m2[0]))
    if v.size < 2:
        assert got is None
        return
    assert got == pytest.approx(float(stats.sem(v)), rel=1e-9, abs=1e-12)
    a, b = v[:split], v[split:]
    parts = [shifted_moments(p, np.zeros(p.size, np.int64), 1) for p in (a, b)]
    merged = merge_moments(*[(int(c[0]), float(t[0]), float(q[0])) for c, t, q in parts])
    assert mean_stderr(*merged) == pytest.approx(float(stats.sem(v)), rel=1e-9, abs=1e-12)


def test_grouped_moments_equal_numpy_per_group() -> None:
    rng = np.random.default_rng(1)
    v, g = rng.random(5000), rng.integers(0, 7, 5000)
    count, total, m2 = shifted_moments(v, g, 9)
    assert count[7] == count[8] == 0 and m2[8] == 0.0
    for k in range(7):
        sel = v[g == k]
        assert count[k] == sel.size and total[k] == pytest.approx(sel.sum(), rel=1e-12)
        assert m2[k] == pytest.approx(((sel - sel.mean()) ** 2).sum(), rel=1e-10, abs=0.0)


def test_variance_of_1e7_values_near_one_half_is_exact() -> None:
    """10^7 values within 1e-12 of 0.5, in ten chunks merged with Chan's update, against integer arithmetic."""
    rng = np.random.default_rng(2)
    k = rng.integers(-4000, 4001, 10_000_000)
    values = 0.5 + k * 2.0**-42  # |x - 0.5| <= 4000 * 2**-42 < 1e-12, exact in float64
    acc = MetricSum()
    for chunk in np.array_split(values, 10):
        c, t, q = shifted_moments(chunk, np.zeros(chunk.size, np.int64), 1)
        acc.merge(MetricSum(int(c[0]), float(t[0]), 0.0, float(q[0])))
    ki = [int(x) for x in np.bincount(k + 4000)]  # exact: counts of each integer
    n = sum(ki)
    s1 = sum(c * (j - 4000) for j, c in enumerate(ki))
    s2 = sum(c * (j - 4000) ** 2 for j, c in enumerate(ki))
    exact_var = Fraction(s2 * n - s1 * s1, n * (n - 1)) * Fraction(1, 2**84)
    got = acc.stderr()
    assert got is not None
    assert got**2 * n == pytest.approx(float(exact_var), rel=1e-9)
    textbook = (np.sum(values**2) - np.sum(values) ** 2 / n) / (n - 1)  # what a sum of squares gives
    assert abs(textbook - float(exact_var)) > 1000 * abs(got**2 * n - float(exact_var))


# -- AUC-ROC --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_delong_from_histogram_equals_naive_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores, relevant = pairs(rng, int(rng.integers(6, 400)), int(rng.integers(2, 40)))
    hist = ScoreHistogram.from_pairs(scores, relevant)
    assert delong_variance(hist) == pytest.approx(naive_delong(scores, relevant), rel=1e-12, abs=1e-15)
    assert auc_roc_stderr(hist) == pytest.approx(math.sqrt(naive_delong(scores, relevant)), rel=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_clustered_delong_equals_naive_obuchowski(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    scores, relevant = pairs(rng, int(rng.integers(20, 300)), int(rng.integers(3, 30)))
    bucket = rng.integers(0, N_CLUSTERS, scores.size)
    clusters = whole_clusters(scores, relevant, bucket)
    naive = naive_clustered_delong(scores, relevant, bucket)
    assert clustered_variance("roc", clusters) == pytest.approx(naive, rel=1e-10)
    got = auc_roc_stderr(ScoreHistogram.from_pairs(scores, relevant), clusters)
    # the reported SE is the larger of the clustered and the item-level (DeLong) one
    assert got == pytest.approx(math.sqrt(max(naive, naive_delong(scores, relevant))), rel=1e-10)


# -- AUC-PR ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_ap_infinitesimal_jackknife_equals_sklearn_derivatives(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    scores, relevant = pairs(rng, int(rng.integers(15, 120)), int(rng.integers(3, 25)))
    hist = ScoreHistogram.from_pairs(scores, relevant)
    assert auc_pr_stderr(hist) ** 2 == pytest.approx(numeric_ap_variance(scores, relevant, None), rel=1e-5)
    bucket = rng.integers(0, 5, scores.size)
    clusters = whole_clusters(scores, relevant, bucket)
    clustered = numeric_ap_variance(scores, relevant, bucket)
    assert clustered_variance("pr", clusters) == pytest.approx(clustered, rel=1e-5)
    got = auc_pr_stderr(hist, clusters)
    assert got**2 == pytest.approx(max(clustered, numeric_ap_variance(scores, relevant, None)), rel=1e-5)


# -- undefined cases ------------------------------------------------------------------------------------
def test_stderr_is_null_never_zero_when_undefined() -> None:
    assert mean_stderr(0, 0.0, 0.0) is None and mean_stderr(1, 0.4, 0.0) is None
    assert mean_stderr(3, float("nan"), 0.0) is None
    one_class = ScoreHistogram.from_pairs([0.1, 0.2, 0.3], [True, True, True])
    assert auc_roc_stderr(one_class) is None and auc_pr_stderr(one_class) is None
    single_pos = ScoreHistogram.from_pairs([0.1, 0.2, 0.3], [True, False, False])
    assert auc_roc_stderr(single_pos) is None
    assert auc_roc_stderr(ScoreHistogram.empty()) is None
    # one request: one cluster, no clustered SE
    sc, rel = np.array([0.1, 0.5, 0.7, 0.2]), np.array([True, False, True, False])
    assert auc_roc_stderr(ScoreHistogram.from_pairs(sc, rel), whole_clusters(sc, rel, np.zeros(4, np.int64))) is None
    assert interval(None, 0.1) is None and interval(0.5, None) is None


def test_interval_shapes() -> None:
    lo, hi = interval(0.5, 0.1, 0.95, "wald")  # type: ignore[misc]
    assert (lo, hi) == pytest.approx((0.5 - 1.959964 * 0.1, 0.5 + 1.959964 * 0.1), rel=1e-6)
    lo, hi = interval(0.9, 0.05)  # type: ignore[misc]
    assert 0.0 < lo < 0.9 < hi < 1.0 and hi - 0.9 < 0.9 - lo  # the logit interval follows the skew
    assert z_value(0.99, one_sided=True) == pytest.approx(stats.norm.ppf(0.99))
    assert z_value(0.95) == pytest.approx(stats.norm.ppf(0.975))


# -- the aggregate's stderr block -----------------------------------------------------------------------
def random_lists(rng: np.random.Generator, n: int) -> list[list[tuple[float, float]]]:
    out = []
    for _ in range(n):
        size = int(rng.integers(0, 12))
        out.append([(float(rng.choice([0, 0, 0, 1, 2])), float(rng.integers(0, 9) / 4)) for _ in range(size)])
    return out


def flat(reqs: list[list[tuple[float, float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    labels, offsets = flatten_lists([[lab for lab, _ in r] for r in reqs])
    return labels, np.array([s for r in reqs for _, s in r], dtype=np.float64), offsets


@pytest.mark.parametrize("seed", range(5))
def test_aggregate_stderrs_equal_oracles_and_survive_merges(seed: int) -> None:
    rng = np.random.default_rng(300 + seed)
    reqs = random_lists(rng, int(rng.integers(40, 120)))
    labels, scores, offsets = flat(reqs)
    whole = RankingAggregate.from_lists(labels, scores, offsets, OPTIONS)
    ses = whole.stderrs()
    per = [request_metrics([lab for lab, _ in r]) for r in reqs]
    for name in OPTIONS.rank_metric_names:
        if name not in per[0]:  # precision/recall/hit rate: their values are checked against pytrec_eval
            continue
        per_request = [p[name] for p in per if p[name] is not None]
        expected = float(stats.sem(per_request)) if len(per_request) >= 2 else None
        assert ses[name] == (None if expected is None else pytest.approx(expected, rel=1e-9, abs=1e-12))
    rel = labels > 0
    lengths = np.diff(offsets)
    bucket = np.repeat(request_buckets(scores, lengths), lengths)
    assert min(rel.sum(), (~rel).sum()) >= 2 and len(set(bucket.tolist())) >= 2
    expected = max(naive_clustered_delong(scores, rel, bucket), naive_delong(scores, rel))
    assert ses["auc_roc"] == pytest.approx(math.sqrt(expected), rel=1e-9)
    # merging random splits gives the same stderr block and cluster state
    parts = rng.integers(0, 3, len(reqs))
    merged = RankingAggregate(OPTIONS)
    for p in range(3):
        sub = [r for r, q in zip(reqs, parts, strict=True) if q == p]
        merged.merge(RankingAggregate.from_lists(*flat(sub), OPTIONS))
    assert merged.clusters == whole.clusters
    for name, value in merged.stderrs().items():
        assert value == (None if ses[name] is None else pytest.approx(ses[name], rel=1e-9, abs=1e-12))
    again = RankingAggregate.from_state(whole.to_state(), OPTIONS)
    assert again.stderrs() == ses


def test_old_states_without_m2_or_clusters_still_load() -> None:
    rng = np.random.default_rng(9)
    agg = RankingAggregate.from_lists(*flat(random_lists(rng, 60)), OPTIONS)
    state = agg.to_state()
    state["sums"] = {k: v[:3] for k, v in state["sums"].items()}
    del state["clusters"]
    old = RankingAggregate.from_state(state, OPTIONS)
    assert old.clusters is None
    for name in OPTIONS.rank_metric_names:
        new_se = agg.stderrs()[name]
        assert old.stderrs()[name] == (None if new_se is None else pytest.approx(new_se, rel=1e-6))
    assert old.stderrs()["auc_roc"] == auc_roc_stderr(agg.histogram)  # pooled DeLong without clusters


def test_request_buckets_do_not_depend_on_batching() -> None:
    rng = np.random.default_rng(4)
    reqs = random_lists(rng, 300)
    labels, scores, offsets = flat(reqs)
    whole = request_buckets(scores, np.diff(offsets))
    halves = [request_buckets(*(lambda f: (f[1], np.diff(f[2])))(flat(part))) for part in (reqs[:130], reqs[130:])]
    assert np.array_equal(whole, np.concatenate(halves))
    assert set(whole.tolist()) <= set(range(N_CLUSTERS)) and len(set(whole.tolist())) > 150  # 300 requests (some identical), 1,024 buckets
    aggs = aggregate_lists(labels, scores, offsets, rng.integers(0, 3, len(reqs)), 3, OPTIONS)
    assert sum(a.clusters.n_bins for a in aggs if a.clusters is not None) >= 1


def test_request_buckets_hash_score_values_not_the_sign_of_zero() -> None:
    """A score of -0.0 equals 0.0: the same request read back from a writer that drops the sign of zero
    (pandas ``to_json``) must land in the same bucket, or its clustered AUC SE differs (it did, by up to
    0.036 %, between a Kafka backlog and its ground truth)."""
    lengths = np.array([3, 2, 1])
    signed = np.array([-0.0, 0.5, -1.25, -0.0, 2.0, -0.0])
    unsigned = np.array([0.0, 0.5, -1.25, 0.0, 2.0, 0.0])
    assert np.array_equal(request_buckets(signed, lengths), request_buckets(unsigned, lengths))
    assert not np.array_equal(request_buckets(np.array([-1.25, 0.5, 0.0]), lengths[:1]),
                              request_buckets(np.array([1.25, 0.5, 0.0]), lengths[:1]))


def test_cluster_state_is_bounded_and_merges_exactly() -> None:
    rng = np.random.default_rng(6)
    n = 20_000
    scores, rel = rng.random(n), rng.random(n) < 0.2
    bucket = rng.integers(0, N_CLUSTERS, n)
    zeros = np.zeros(n, np.int64)
    full = cluster_histograms_by_group(scores, rel, bucket, zeros, 1, max_bins=10**9)[0]
    small = cluster_histograms_by_group(scores, rel, bucket, zeros, 1, max_bins=4096)[0]
    # bounded: buckets folded to 64 (whole requests still), then equal-count runs; counts kept
    assert small.clusters == FOLDED_CLUSTERS and set(small.bucket.tolist()) <= set(range(FOLDED_CLUSTERS))
    assert small.n_bins <= 4096 + FOLDED_CLUSTERS and small.pos.sum() == rel.sum() and small.neg.sum() == (~rel).sum()
    # the runs only coarsen the scores: the same clustering at full resolution gives nearly the same SE
    for which in ("roc", "pr"):
        exact = clustered_variance(which, full.folded())
        assert clustered_variance(which, small) == pytest.approx(exact, rel=0.03), which
    # merging parts equals the whole (below the bound), and a folded part folds the merge
    half = n // 2
    a = cluster_histograms_by_group(scores[:half], rel[:half], bucket[:half], zeros[:half], 1, max_bins=10**9)[0]
    b = cluster_histograms_by_group(scores[half:], rel[half:], bucket[half:], zeros[half:], 1, max_bins=10**9)[0]
    assert ClusterHistograms.merge_many([a, b], max_bins=10**9) == full
    assert ClusterHistograms.merge_many([a.folded(), b], max_bins=10**9) == full.folded()
    assert ClusterHistograms.from_state(small.to_state()) == small


@pytest.mark.parametrize("clustered", [False, True])
def test_an_se_has_the_same_digits_whatever_blas_threads_the_machine_has(clustered: bool) -> None:
    """The SEs' sums do not go through BLAS's dot product, which splits a long vector over its threads (the last
    digits then depended on the machine's cores): one BLAS thread or the default, the same float, bit for bit."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 40, size=20_000)
    scores = rng.random(int(lengths.sum()))  # ~400k distinct scores: vectors far past BLAS's threading size
    relevant = rng.random(scores.size) < 0.2
    hist = ScoreHistogram.from_pairs(scores, relevant)
    bucket = np.repeat(request_buckets(scores, lengths), lengths)
    clusters = whole_clusters(scores, relevant, bucket) if clustered else None
    with threadpool_limits(limits=1, user_api="blas"):
        one = (auc_roc_stderr(hist, clusters), auc_pr_stderr(hist, clusters))
    for _ in range(3):
        assert (auc_roc_stderr(hist, clusters), auc_pr_stderr(hist, clusters)) == one
