"""An independent check of ``rankwatch offline --format json`` on held-out data: every ``stderr`` equals its
own computation (scipy's s/sqrt(n) of naive per-request values; DeLong and the clustered DeLong written out
pair by pair; AUC-PR by finite differences of scikit-learn's weighted average precision)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from naive_metrics import request_metrics
from scipy import stats
from sklearn.metrics import average_precision_score

from rankwatch.cli import main
from rankwatch.pipeline.metrics.clusters import request_buckets
from rankwatch.pipeline.traffic.generator import TrafficConfig, evaluation_frame


def _delong(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, float]:
    psi = (x[:, None] > y[None, :]) + 0.5 * (x[:, None] == y[None, :])
    return float(psi.mean()), psi.mean(axis=1), psi.mean(axis=0), float(
        np.var(psi.mean(axis=1), ddof=1) / x.size + np.var(psi.mean(axis=0), ddof=1) / y.size
    )


def naive_auc_roc_se(scores: np.ndarray, relevant: np.ndarray, cluster: np.ndarray) -> float | None:
    """max(DeLong, Obuchowski's clustered DeLong), from the pairwise kernel."""
    x, y = scores[relevant], scores[~relevant]
    if x.size < 2 or y.size < 2:
        return None
    auc, v10, v01, pooled = _delong(x, y)
    cx, cy = cluster[relevant], cluster[~relevant]
    ks = np.unique(cluster)
    a = np.array([v10[cx == c].sum() - (cx == c).sum() * auc for c in ks])
    b = np.array([v01[cy == c].sum() - (cy == c).sum() * auc for c in ks])
    k, m, n = ks.size, x.size, y.size
    clustered = k / (k - 1) * (np.sum(a * a) / m**2 + np.sum(b * b) / n**2 + 2 * np.sum(a * b) / (m * n))
    return math.sqrt(max(pooled, clustered))


def naive_auc_pr_se(scores: np.ndarray, relevant: np.ndarray, cluster: np.ndarray) -> float:
    """max(item-level, clustered) infinitesimal jackknife by central differences of sklearn's weighted AP."""

    def variance(units: np.ndarray) -> float:
        infl = []
        for u in np.unique(units):
            w = np.ones(scores.size)
            w[units == u] += 1e-6
            hi = average_precision_score(relevant, scores, sample_weight=w)
            w[units == u] -= 2e-6
            infl.append((hi - average_precision_score(relevant, scores, sample_weight=w)) / 2e-6)
        k = len(infl)
        return float(np.dot(infl, infl)) * k / (k - 1)

    return math.sqrt(max(variance(np.arange(scores.size)), variance(cluster)))


@pytest.fixture(scope="module")
def held_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, dict]:
    frame = evaluation_frame(TrafficConfig(seed=1234, items_per_request=12), 90)
    path = Path(tmp_path_factory.mktemp("heldout")) / "heldout.csv"
    frame.to_csv(path, index=False)
    return frame, path  # type: ignore[return-value]


def run(capsys: pytest.CaptureFixture[str], path: Path) -> dict:
    assert main(["offline", str(path), "--by", "segment", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_offline_json_stderr_matches_an_independent_computation(held_out, capsys) -> None:
    frame, path = held_out
    doc = run(capsys, path)
    entries = [(frame, doc["overall"])]
    entries += [(frame[frame.segment == s["segment"]], s) for s in doc["slices"]]
    assert len(entries) == 4
    for part, entry in entries:
        requests = [g.sort_values("position") for _, g in part.groupby("request_id", sort=False)]
        per = [request_metrics(g.label.tolist()) for g in requests]
        for name in ("mrr", "ndcg@5", "ndcg@10", "map@10"):
            values = [p[name] for p in per if p[name] is not None]
            assert entry["stderr"][name] == pytest.approx(float(stats.sem(values)), rel=1e-9), name
            assert entry[name] == pytest.approx(float(np.mean(values)), rel=1e-12)
        scores = np.concatenate([g.score.to_numpy(float) for g in requests])
        relevant = np.concatenate([g.label.to_numpy() > 0 for g in requests])
        lengths = np.array([len(g) for g in requests])
        bucket = np.repeat(request_buckets(scores, lengths), lengths)
        assert entry["stderr"]["auc_roc"] == pytest.approx(naive_auc_roc_se(scores, relevant, bucket), rel=1e-9)
        if entry is doc["overall"]:  # finite differences over every item: the overall slice only (a few s)
            assert entry["stderr"]["auc_pr"] == pytest.approx(naive_auc_pr_se(scores, relevant, bucket), rel=1e-5)
        else:
            assert entry["stderr"]["auc_pr"] > 0
