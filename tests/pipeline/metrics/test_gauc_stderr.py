"""GAUC's standard error (groups as units, delta method on the ratio of sums): exact against a naive
per-group scikit-learn loop with the linearisation written out, the same through the online (open
groups, merged batches) state, and 95 % intervals that cover the large-sample GAUC in simulation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from rankwatch.pipeline.metrics.aggregates import aggregate_lists
from rankwatch.pipeline.metrics.gauc import group_auc
from rankwatch.pipeline.metrics.gauc_sums import GaucSums, weighted_moments
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import compute_baseline
from rankwatch.pipeline.slicing import SliceSpec


def naive_gauc_stderr(groups: np.ndarray, scores: np.ndarray, relevant: np.ndarray, weight: str) -> float | None:
    ys, ns = [], []
    for g in dict.fromkeys(groups.tolist()):
        m = groups == g
        y = relevant[m]
        if y.all() or not y.any():
            continue  # one-class groups are left out (and counted elsewhere)
        w = float(m.sum() if weight == "impressions" else y.sum())
        ys.append(w * roc_auc_score(y, scores[m]))
        ns.append(w)
    if len(ys) < 2:
        return None
    y, n = np.array(ys), np.array(ns)
    r = y.sum() / n.sum()
    z = (y - r * n) / n.mean()  # each group's linearised contribution
    return math.sqrt(np.var(z, ddof=1) / len(z))


def _frame(rng: np.random.Generator, n_requests: int) -> pd.DataFrame:
    lengths = rng.integers(1, 8, n_requests)
    rid = np.repeat(np.arange(n_requests), lengths)
    n = rid.size
    user = rng.integers(0, max(n_requests // 3, 2), n_requests)[rid]
    score = rng.integers(0, 6, n).astype(float) if rng.random() < 0.5 else np.round(rng.normal(size=n), 2)
    label = (rng.random(n) < 0.35).astype(int)
    return pd.DataFrame({"request_id": [f"r{i}" for i in rid], "item_id": [f"i{j}" for j in range(n)],
                         "score": score, "label": label, "user_id": [f"u{u}" for u in user],
                         "segment": "s", "surface": "f"})


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("weight", ["impressions", "clicks"])
def test_offline_gauc_stderr_equals_the_naive_linearisation(seed: int, weight: str) -> None:
    rng = np.random.default_rng(seed)
    frame = _frame(rng, int(rng.integers(3, 300)))
    options = MetricOptions(gauc_weight=weight)  # type: ignore[arg-type]
    result = compute_baseline(frame, options=options, slice_spec=SliceSpec(by=()))
    # the rows' own order: a request's items are one group's items whatever the rank order
    want = naive_gauc_stderr(frame["user_id"].to_numpy(), frame["score"].to_numpy(), frame["label"].to_numpy() > 0,
                             weight)
    got = result.overall.stderrs()["gauc"]
    if want is None:
        assert got is None
    else:
        assert got == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_the_online_state_merged_from_batches_gives_the_same_stderr() -> None:
    rng = np.random.default_rng(11)
    n_req = 400
    lengths = rng.integers(2, 9, n_req)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    scores = np.round(rng.normal(size=offsets[-1]), 1)
    labels = (rng.random(offsets[-1]) < 0.3).astype(float)
    users = rng.integers(0, 90, n_req)
    options = MetricOptions()
    parts = []
    for lo, hi in ((0, 150), (150, 400)):  # a user's requests in both batches: groups stay open
        a, b = offsets[lo], offsets[hi]
        parts.append(aggregate_lists(labels[a:b], scores[a:b], offsets[lo:hi + 1] - a, np.zeros(hi - lo, np.int64), 1,
                                     options, gauc_keys=users[lo:hi], gauc_open=True)[0])
    merged = parts[0]
    merged.merge(parts[1])
    item_user = np.repeat(users, lengths)
    assert merged.stderrs()["gauc"] == pytest.approx(naive_gauc_stderr(item_user, scores, labels > 0, "impressions"),
                                                     rel=1e-9)
    assert GaucSums.from_state(merged.gauc.to_state()).stderr("impressions") == merged.stderrs()["gauc"]


def test_too_few_groups_and_old_states_have_no_stderr() -> None:
    one = GaucSums(0.7, 10.0, 1, 0)
    one.moments = [0.49, 100.0, 70.0]
    assert one.stderr("impressions") is None
    old = GaucSums.from_state({**one.to_state(), "sums": [0.7, 10.0, 5, 0, True, 0]} | {"moments": None})
    assert old.moments is None and old.stderr("impressions") is None
    assert GaucSums(available=False).stderr("impressions") is None


def _simulated(rng: np.random.Generator, n_users: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Users with their own model quality (so a user's items correlate), 4-30 items each."""
    size = rng.integers(4, 31, n_users)
    quality = rng.normal(1.0, 0.6, n_users)
    user = np.repeat(np.arange(n_users), size)
    relevant = rng.random(user.size) < 0.3
    scores = rng.normal(size=user.size) + relevant * np.repeat(quality, size)
    return user, scores, relevant


def _gauc_and_se(user: np.ndarray, scores: np.ndarray, relevant: np.ndarray, n_users: int) -> tuple[float, float | None]:
    counts = group_auc(user, scores, relevant, n_users)
    w, s, g, e, m = weighted_moments(counts, np.zeros(n_users, np.int64), 1, "impressions")
    sums = GaucSums(float(w[0]), float(s[0]), int(g[0]), int(e[0]))
    sums.moments = [float(x) for x in m[0]]
    return float(w[0] / s[0]), sums.stderr("impressions")


def test_95_percent_intervals_cover_the_large_sample_gauc() -> None:
    rng = np.random.default_rng(2026)
    truth, _ = _gauc_and_se(*_simulated(rng, 200_000), 200_000)
    reps, covered = 400, 0
    for _ in range(reps):
        value, se = _gauc_and_se(*_simulated(rng, 150), 150)
        assert se is not None and se > 0
        covered += abs(value - truth) <= 1.959964 * se
    # 400 replications: binomial 95 % band around 0.95 is about +-0.021
    assert 0.925 <= covered / reps <= 0.975, covered / reps
