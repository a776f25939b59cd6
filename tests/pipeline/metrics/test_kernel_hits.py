"""precision@k, recall@k and hit_rate@k against pytrec_eval (P_k, recall_k, success_k), ranx and a naive loop."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.metrics.kernel import flatten_lists, per_request_metrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import compute_baseline
from rankwatch.pipeline.slicing import SliceSpec

TOL = 1e-12
LAYOUTS = ("grid", "flat")

grades = st.integers(min_value=0, max_value=3)
one_list = st.one_of(
    st.lists(grades, max_size=25),
    st.lists(st.just(0), min_size=1, max_size=8),  # all zero
    st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=8),  # all relevant
    st.lists(grades, min_size=1, max_size=1),  # one item
)
many_lists = st.lists(one_list, min_size=1, max_size=30)
cutoffs = st.lists(st.sampled_from([1, 2, 3, 5, 10, 20, 40]), min_size=1, max_size=3, unique=True).map(tuple)


def options_for(ks: tuple[int, ...]) -> MetricOptions:
    return MetricOptions(precision_cutoffs=ks, recall_cutoffs=ks, hit_rate_cutoffs=ks)


def ours(lists: list[list[int]], ks: tuple[int, ...], layout: str) -> dict[str, np.ndarray]:
    labels, offsets = flatten_lists(lists)  # type: ignore[arg-type]
    return per_request_metrics(labels, offsets, options_for(ks), layout=layout).values  # type: ignore[arg-type]


def naive(ls: list[int], k: int) -> tuple[float, float, float] | None:
    relevant = sum(1 for r in ls if r > 0)
    if relevant == 0:
        return None
    top = sum(1 for r in ls[:k] if r > 0)
    return top / k, top / relevant, 1.0 if top else 0.0


def trec_inputs(lists: list[list[int]]) -> tuple[dict, dict]:
    qrels, run = {}, {}
    for j, ls in enumerate(lists):
        if ls:
            qrels[f"q{j:04d}"] = {f"d{i:03d}": int(r) for i, r in enumerate(ls)}
            run[f"q{j:04d}"] = {f"d{i:03d}": float(len(ls) - i) for i in range(len(ls))}
    return qrels, run


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=many_lists, ks=cutoffs, layout=st.sampled_from(LAYOUTS))
def test_against_naive_and_pytrec_eval(lists: list[list[int]], ks: tuple[int, ...], layout: str) -> None:
    import pytrec_eval

    got = ours(lists, ks, layout)
    qrels, run = trec_inputs(lists)
    names = {f"{m}_{','.join(map(str, ks))}" for m in ("P", "recall", "success")}
    trec = pytrec_eval.RelevanceEvaluator(qrels, names).evaluate(run) if qrels else {}
    for j, ls in enumerate(lists):
        for k in ks:
            expected = naive(ls, k)
            values = (got[f"precision@{k}"][j], got[f"recall@{k}"][j], got[f"hit_rate@{k}"][j])
            if expected is None:  # R = 0: NaN here, the aggregates apply the policy
                assert all(np.isnan(v) for v in values)
                if ls:  # trec_eval scores such a query 0 on all three
                    t = trec[f"q{j:04d}"]
                    assert t[f"P_{k}"] == t[f"recall_{k}"] == t[f"success_{k}"] == 0.0
                continue
            assert values == pytest.approx(expected, abs=TOL)
            t = trec[f"q{j:04d}"]
            assert values == pytest.approx((t[f"P_{k}"], t[f"recall_{k}"], t[f"success_{k}"]), abs=TOL)


@pytest.fixture(scope="module")
def ranx_evaluate():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ranx import Qrels, Run, evaluate
    return Qrels, Run, evaluate


@pytest.mark.parametrize("layout", LAYOUTS)
def test_against_ranx_seeded_batch(ranx_evaluate, layout: str) -> None:
    Qrels, Run, evaluate = ranx_evaluate
    rng = np.random.default_rng(13)
    lists: list[list[int]] = []
    for _ in range(800):
        kind, n = rng.integers(0, 4), int(rng.integers(1, 40))
        if kind == 0:
            lists.append(rng.integers(1, 4, n).tolist())  # all relevant
        elif kind == 1:
            lists.append([int(rng.integers(1, 4))])  # one item
        else:
            lists.append((rng.integers(0, 4, n) * (rng.random(n) < 0.3)).tolist())
    ks = (1, 3, 5, 10, 20, 50)  # 50 is beyond every list
    got = ours(lists, ks, layout)
    keep = [j for j, ls in enumerate(lists) if any(r > 0 for r in ls)]  # ranx needs a relevant item
    qrels, run = trec_inputs([lists[j] for j in keep])
    q, r = Qrels(qrels), Run(run)
    names = [f"{m}@{k}" for m in ("precision", "recall", "hit_rate") for k in ks]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluate(q, r, names, return_mean=False)
    for pos, j in enumerate(keep):
        for name in names:
            assert got[name][j] == pytest.approx(r.scores[name][f"q{pos:04d}"], abs=TOL), name


def test_tied_scores_offline_against_pytrec_eval() -> None:
    """Offline ranks ties in input order; naming items so trec_eval's tie rule (docno descending) gives the
    same order makes the two comparable on tied scores, lists shorter than k and R = 0 requests."""
    import pytrec_eval

    rng = np.random.default_rng(5)
    rows, qrels, run = [], {}, {}
    for q in range(300):
        n = int(rng.integers(1, 15))
        scores = rng.integers(0, 4, n).astype(float)  # many ties
        labels = rng.integers(0, 3, n) * (rng.random(n) < 0.4)
        qid = f"q{q:04d}"
        qrels[qid], run[qid] = {}, {}
        for i in range(n):
            doc = f"d{999 - i:03d}"  # input order == docno descending
            rows.append({"request_id": qid, "item_id": doc, "score": scores[i], "label": int(labels[i])})
            qrels[qid][doc], run[qid][doc] = int(labels[i]), float(scores[i])
    ks = (1, 5, 10, 20)
    result = compute_baseline(pd.DataFrame(rows), options=options_for(ks), slice_spec=SliceSpec(by=()))
    trec = pytrec_eval.RelevanceEvaluator(qrels, {"P_1,5,10,20", "recall_1,5,10,20", "success_1,5,10,20"}).evaluate(run)
    defined = [qid for qid in qrels if any(v > 0 for v in qrels[qid].values())]
    values = result.overall.values()
    for k in ks:
        for ours_name, trec_name in (("precision", "P"), ("recall", "recall"), ("hit_rate", "success")):
            expected = np.mean([trec[qid][f"{trec_name}_{k}"] for qid in defined])
            assert values[f"{ours_name}@{k}"] == pytest.approx(expected, abs=1e-12)
    zero = compute_baseline(
        pd.DataFrame(rows), options=MetricOptions(precision_cutoffs=(5,), no_relevant="zero"), slice_spec=SliceSpec(by=())
    ).overall.values()
    assert zero["precision@5"] == pytest.approx(np.mean([trec[q]["P_5"] for q in qrels]), abs=1e-12)


def test_defaults_and_options() -> None:
    names = MetricOptions().rank_metric_names
    assert names[-4:] == ("precision@5", "precision@10", "recall@10", "hit_rate@10")
    with pytest.raises(ValueError, match="cut-off"):
        MetricOptions(recall_cutoffs=(0,))
    assert MetricOptions.from_dict(MetricOptions(hit_rate_cutoffs=(3,)).to_dict()).hit_rate_cutoffs == (3,)
    empty = per_request_metrics(np.empty(0), np.array([0]), MetricOptions())
    assert empty.values["precision@5"].size == 0
