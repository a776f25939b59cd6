"""Benchmark of the offline path and the metric kernel against independent references, in one run.

    python bench/offline_kernel.py [--requests 200000] [--items 20] [--users 20000] [--repeat 5]

Three comparisons on one synthetic evaluation set (string request ids, graded labels 0-3, 10 segments x
5 surfaces = 50 slices, string user ids (``--users 0``: no user_id column, no GAUC), items of a request in
random score order):

1. ``rankwatch end to end``: :func:`pipeline.offline.baseline.compute_baseline` on the pandas DataFrame (validation,
   grouping, rank ordering, kernel, per-slice aggregates and AUC state) against pytrec_eval end to end
   (building its qrels/run dicts from the same DataFrame, then ``evaluate`` for recip_rank, map_cut_10,
   ndcg_cut_5, ndcg_cut_10, P_5, P_10, recall_10, success_10). rankwatch computes those plus, per slice,
   AUC-ROC, AUC-PR, GAUC by user, the positive rate and click-through at ranks 1-10. Goal: >= 5x
   pytrec_eval.
2. ``kernel alone``: :func:`pipeline.metrics.kernel.per_request_metrics` on flat, pre-grouped lists in rank order
   against a plain numpy reference on the same lists as a 2-D array (``np.sort`` per row for the ideal
   DCG). Goal: >= 0.5x the reference. A second line adds the ordering by score on both sides
   (:func:`pipeline.offline.baseline.rank_order` against a 2-D ``argsort``), for information.
3. ``per-slice AUC+AP``: :func:`pipeline.metrics.auc.histograms_by_group` + ``auc_roc`` + ``average_precision``
   for all 50 slices against scikit-learn's ``roc_auc_score`` + ``average_precision_score`` per slice.
   Values must agree to 1e-9. Goal: >= 1.5x scikit-learn.

Every figure is the median of ``--repeat`` runs, rankwatch and its reference alternating (after one untimed
warm-up each) so that other load on a shared machine affects both sides alike; ratios are "reference time
/ rankwatch time" (higher is better for rankwatch). Values are cross-checked, so a fast wrong answer fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rankwatch.pipeline.metrics.auc import histograms_by_group  # noqa: E402
from rankwatch.pipeline.metrics.kernel import offsets_from_lengths, per_request_metrics  # noqa: E402
from rankwatch.pipeline.metrics.options import MetricOptions  # noqa: E402
from rankwatch.pipeline.offline.baseline import compute_baseline, rank_order  # noqa: E402


def make_frame(n_requests: int, n_items: int, n_users: int = 20_000, seed: int = 7) -> pd.DataFrame:
    """A synthetic evaluation set: one row per shown item, grouped by request, unordered within it."""
    rng = np.random.default_rng(seed)
    n = n_requests * n_items
    req = np.repeat(np.arange(n_requests), n_items)
    quality = rng.normal(size=n)
    score = np.round(quality + rng.normal(scale=1.0, size=n), 6) + rng.random(n) * 1e-7  # distinct per list
    grade = np.clip(np.floor(quality * 1.2 - 0.3), 0, 3) * (rng.random(n) < 0.6)
    segments = np.array([f"segment-{i}" for i in range(10)], dtype=object)
    surfaces = np.array([f"surface-{i}" for i in range(5)], dtype=object)
    columns: dict[str, Any] = {}
    if n_users:
        users = pd.array([f"user-{i:06d}" for i in range(n_users)], dtype="str")
        columns["user_id"] = users.take(rng.integers(0, n_users, n_requests)).take(req)
    return pd.DataFrame(
        {
            **columns,
            "request_id": pd.array([f"req-{i:07d}" for i in range(n_requests)], dtype="str").take(req),
            "item_id": pd.array([f"item-{i}" for i in range(n_items * 3)], dtype="str").take(
                rng.permuted(np.tile(np.arange(n_items * 3), (n_requests, 1)), axis=1)[:, :n_items].ravel()
            ),
            "score": score,
            "label": grade.astype(np.int64),
            "segment": pd.array(segments[rng.integers(0, 10, n_requests)], dtype="str").take(req),
            "surface": pd.array(surfaces[rng.integers(0, 5, n_requests)], dtype="str").take(req),
        }
    )


CPU_TIMES: dict[str, list[float]] = {"ours": [], "reference": []}  # process CPU seconds of the last pairing


def paired_times(ours: Callable[[], Any], reference: Callable[[], Any], repeat: int) -> tuple[float, Any, float, Any]:
    """Median wall times of two functions run alternately, so that load from other processes on a shared
    machine hits both sides alike (one warm-up call each is not timed). The CPU times of the same calls
    are kept in ``CPU_TIMES`` (less sensitive to other processes taking the cores)."""
    ours(), reference()
    t_ours: list[float] = []
    t_ref: list[float] = []
    CPU_TIMES["ours"], CPU_TIMES["reference"] = [], []
    out_ours = out_ref = None
    for _ in range(repeat):
        for fn, times in ((ours, t_ours), (reference, t_ref)):
            start, cpu = time.perf_counter(), time.process_time()
            out = fn()
            times.append(time.perf_counter() - start)
            CPU_TIMES["ours" if fn is ours else "reference"].append(time.process_time() - cpu)
            if fn is ours:
                out_ours = out
            else:
                out_ref = out
    return statistics.median(t_ours), out_ours, statistics.median(t_ref), out_ref


TREC_MEASURES = {"recip_rank", "map_cut_10", "ndcg_cut_5", "ndcg_cut_10", "P_5", "P_10", "recall_10", "success_10"}
TREC_NAMES = {
    "mrr": "recip_rank", "map@10": "map_cut_10", "precision@5": "P_5", "precision@10": "P_10",
    "recall@10": "recall_10", "hit_rate@10": "success_10",
}  # fmt: skip


def pytrec_end_to_end(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    import pytrec_eval

    qid = frame["request_id"].to_numpy(dtype=object)
    doc = frame["item_id"].to_numpy(dtype=object).tolist()
    label = frame["label"].to_numpy(dtype=np.int64).tolist()
    score = frame["score"].to_numpy(dtype=np.float64).tolist()
    # Rows are grouped by request: cut at the boundaries and build one dict per request.
    cuts = np.flatnonzero(qid[1:] != qid[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(qid)]
    qrels, run = {}, {}
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        q = qid[a]
        qrels[q] = dict(zip(doc[a:b], label[a:b], strict=True))
        run[q] = dict(zip(doc[a:b], score[a:b], strict=True))
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, TREC_MEASURES)
    return evaluator.evaluate(run)


def numpy_reference(ranked: np.ndarray) -> dict[str, np.ndarray]:
    """MRR, NDCG@5/@10 (exponential gain) and MAP@10 of equal-length lists in rank order (2-D)."""
    n, width = ranked.shape
    rel = ranked > 0
    n_rel = rel.sum(axis=1)
    defined = n_rel > 0
    out = {"mrr": np.where(defined, 1.0 / (np.argmax(rel, axis=1) + 1.0), np.nan)}
    discount = 1.0 / np.log2(np.arange(2, width + 2))
    gain = np.exp2(ranked) - 1.0
    ideal = -np.sort(-gain, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        for k in (5, 10):
            dcg = gain[:, :k] @ discount[:k]
            idcg = ideal[:, :k] @ discount[:k]
            out[f"ndcg@{k}"] = np.where(defined, dcg / idcg, np.nan)
        precision = np.cumsum(rel, axis=1) / np.arange(1, width + 1)
        out["map@10"] = np.where(defined, (precision[:, :10] * rel[:, :10]).sum(axis=1) / n_rel, np.nan)
    return out


def sklearn_per_slice(scores: list[np.ndarray], relevant: list[np.ndarray]) -> list[tuple[float, float]]:
    from sklearn.metrics import average_precision_score, roc_auc_score

    return [(roc_auc_score(r, s), average_precision_score(r, s)) for s, r in zip(scores, relevant, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n_req, n_items, repeat = args.requests, args.items, args.repeat
    frame = make_frame(n_req, n_items, args.users)
    options = MetricOptions()
    print(f"# {n_req:,} requests x {n_items} items = {len(frame):,} rows, 50 slices, median of {repeat} runs")

    # 1. End to end from the DataFrame.
    t_ours, result, t_trec, trec = paired_times(
        lambda: compute_baseline(frame, options=options), lambda: pytrec_end_to_end(frame), repeat
    )
    overall = result.overall.values()
    for ours_name, trec_name in TREC_NAMES.items():
        vals = np.array([q[trec_name] for q in trec.values()])
        n_rel = result.overall.requests_with_relevant
        # pytrec_eval scores R = 0 requests as 0; rankwatch leaves them out by default.
        assert abs(vals.sum() / n_rel - overall[ours_name]) < 1e-9, ours_name
    print(f"# overall GAUC {overall['gauc']} over {overall['gauc_groups']} users ({overall['gauc_groups_excluded']} one-class)")
    hist = result.overall.histogram
    print(
        f"# overall slice: {hist.n_distinct:,} AUC bins (cap {options.max_distinct_scores:,}), "
        f"AUC-ROC error bound {hist.auc_roc_error_bound():.1e}"
    )
    print(
        f"end to end   rankwatch {t_ours:7.3f} s ({n_req / t_ours:12,.0f} req/s)   "
        f"pytrec_eval {t_trec:7.3f} s ({n_req / t_trec:10,.0f} req/s)   ratio {t_trec / t_ours:5.2f}x  (goal >= 5x)"
    )
    c_ours, c_trec = statistics.median(CPU_TIMES["ours"]), statistics.median(CPU_TIMES["reference"])
    print(f"  CPU time   rankwatch {c_ours:7.3f} s   pytrec_eval {c_trec:7.3f} s   ratio {c_trec / c_ours:5.2f}x  (information)")

    # 2. Kernel alone on pre-grouped lists in rank order.
    scores2d = frame["score"].to_numpy().reshape(n_req, n_items)
    labels2d = frame["label"].to_numpy(dtype=np.float64).reshape(n_req, n_items)
    order2d = np.argsort(-scores2d, axis=1, kind="stable")
    ranked2d = np.ascontiguousarray(np.take_along_axis(labels2d, order2d, axis=1))
    flat, offsets = ranked2d.ravel(), offsets_from_lengths(np.full(n_req, n_items))
    t_kernel, ours, t_ref, ref = paired_times(
        lambda: per_request_metrics(flat, offsets, options), lambda: numpy_reference(ranked2d), repeat
    )
    for name, values in ref.items():
        assert np.allclose(values, ours.values[name], rtol=0, atol=1e-9, equal_nan=True), name
    print(
        f"kernel       rankwatch {t_kernel:7.3f} s ({n_req / t_kernel:12,.0f} req/s)   "
        f"numpy 2-D   {t_ref:7.3f} s ({n_req / t_ref:10,.0f} req/s)   ratio {t_ref / t_kernel:5.2f}x  (goal >= 0.5x)"
    )
    codes = np.repeat(np.arange(n_req, dtype=np.int64), n_items)
    raw_scores, raw_labels = frame["score"].to_numpy(), frame["label"].to_numpy(dtype=np.float64)

    def ours_with_order() -> Any:
        order = rank_order(codes, scores=raw_scores)
        return per_request_metrics(raw_labels[order], offsets, options)

    def ref_with_order() -> Any:
        o = np.argsort(-scores2d, axis=1, kind="stable")
        return numpy_reference(np.take_along_axis(labels2d, o, axis=1))

    t_ko, _, t_ro, _ = paired_times(ours_with_order, ref_with_order, repeat)
    print(
        f"  + ordering rankwatch {t_ko:7.3f} s ({n_req / t_ko:12,.0f} req/s)   "
        f"numpy 2-D   {t_ro:7.3f} s ({n_req / t_ro:10,.0f} req/s)   ratio {t_ro / t_ko:5.2f}x  (information)"
    )

    # 3. Per-slice AUC-ROC + AUC-PR.
    slice_id = pd.factorize(frame["segment"].astype(str) + "|" + frame["surface"].astype(str))[0]
    n_slices = int(slice_id.max()) + 1
    relevant = raw_labels > 0
    order_by_slice = np.argsort(slice_id, kind="stable")
    cuts = np.searchsorted(slice_id[order_by_slice], np.arange(1, n_slices))
    sk_scores = np.split(raw_scores[order_by_slice], cuts)
    sk_relevant = np.split(relevant[order_by_slice], cuts)

    def ours_auc() -> list[tuple[float | None, float | None]]:
        hists = histograms_by_group(raw_scores, relevant, slice_id, n_slices)
        return [(h.auc_roc(), h.average_precision()) for h in hists]

    t_auc, ours_values, t_sk, sk_values = paired_times(
        ours_auc, lambda: sklearn_per_slice(sk_scores, sk_relevant), repeat
    )
    worst = max(abs(a - b) for o, s in zip(ours_values, sk_values, strict=True) for a, b in zip(o, s, strict=True))
    assert worst <= 1e-9, worst
    pairs = len(frame)
    print(
        f"AUC+AP       rankwatch {t_auc:7.3f} s ({pairs / t_auc:12,.0f} pairs/s) "
        f"scikit-learn {t_sk:7.3f} s ({pairs / t_sk:10,.0f} pairs/s) ratio {t_sk / t_auc:5.2f}x  (goal >= 1.5x)"
        f"  max |diff| {worst:.1e}"
    )


if __name__ == "__main__":
    main()
