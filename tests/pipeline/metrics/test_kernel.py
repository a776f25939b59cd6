"""The metric kernel against the seed values, pytrec_eval, ranx and a naive implementation (1e-9)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from naive_metrics import request_metrics

from rankwatch.pipeline.metrics.kernel import (
    check_lists,
    flatten_lists,
    offsets_from_lengths,
    per_request_metrics,
)
from rankwatch.pipeline.metrics.options import MetricOptions

TOL = 1e-9
LAYOUTS = ("grid", "flat")


def metrics_of(lists: list[list[float]], options: MetricOptions, layout: str = "auto") -> dict[str, np.ndarray]:
    labels, offsets = flatten_lists(lists)
    return per_request_metrics(labels, offsets, options, layout=layout).values  # type: ignore[arg-type]


def hits(ranks: list[int], length: int = 10) -> list[float]:
    return [1.0 if i in ranks else 0.0 for i in range(1, length + 1)]


# -- seed values from the issue --------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_seed_mrr_first_hits_at_2_1_5(layout: str) -> None:
    lists = [hits([2], 5), hits([1], 5), hits([5], 5)]
    rr = metrics_of(lists, MetricOptions(), layout)["mrr"]
    assert rr.tolist() == pytest.approx([0.5, 1.0, 0.2], abs=TOL)
    assert rr.mean() == pytest.approx((0.5 + 1 + 0.2) / 3, abs=TOL)
    assert round(rr.mean(), 4) == 0.5667


@pytest.mark.parametrize("layout", LAYOUTS)
def test_seed_ap_relevant_at_1_3_5(layout: str) -> None:
    ap = metrics_of([hits([1, 3, 5], 5)], MetricOptions(map_cutoffs=(5,)), layout)["map@5"][0]
    assert ap == pytest.approx((1 + 2 / 3 + 3 / 5) / 3, abs=TOL)
    assert round(ap, 4) == 0.7556


@pytest.mark.parametrize("layout", LAYOUTS)
def test_seed_ndcg5_graded(layout: str) -> None:
    exp = metrics_of([[3, 2, 0, 1, 0]], MetricOptions(ndcg_cutoffs=(5,)), layout)["ndcg@5"][0]
    lin = metrics_of([[3, 2, 0, 1, 0]], MetricOptions(ndcg_cutoffs=(5,), gain="linear"), layout)["ndcg@5"][0]
    # DCG = 7/1 + 3/log2(3) + 1/log2(5); the ideal list is [3, 2, 1, 0, 0].
    ideal_exp = 7 + 3 / math.log2(3) + 1 / math.log2(4)
    assert exp == pytest.approx((7 + 3 / math.log2(3) + 1 / math.log2(5)) / ideal_exp, abs=TOL)
    ideal_lin = 3 + 2 / math.log2(3) + 1 / math.log2(4)
    assert lin == pytest.approx((3 + 2 / math.log2(3) + 1 / math.log2(5)) / ideal_lin, abs=TOL)
    assert (round(exp, 4), round(lin, 4)) == (0.9926, 0.9854)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_seed_three_binary_lists_true_values_not_the_second_source(layout: str) -> None:
    lists = [hits([1, 4, 7]), hits([2, 5, 8]), hits([3, 6, 9])]
    v = metrics_of(lists, MetricOptions(ndcg_cutoffs=(10,), map_cutoffs=(10,)), layout)
    table = np.column_stack([v["ndcg@10"], v["map@10"], v["mrr"]]).round(4)
    assert table.tolist() == [[0.8278, 0.6429, 1.0], [0.6257, 0.4250, 0.5], [0.5431, 0.3333, 0.3333]]
    assert v["map@10"].tolist() == pytest.approx([(1 + 2 / 4 + 3 / 7) / 3, (1 / 2 + 2 / 5 + 3 / 8) / 3, 1 / 3], abs=TOL)
    # The wrong "second source" values are not what we compute.
    assert abs(v["ndcg@10"][0] - 0.791) > 0.01 and abs(v["map@10"][1] - 0.467) > 0.01


# -- random data against pytrec_eval and ranx -------------------------------------------------------------
grades = st.integers(min_value=0, max_value=4)
one_list = st.one_of(
    st.lists(grades, max_size=25),
    st.lists(st.just(0), min_size=1, max_size=8),  # all zero
    st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=8),  # all relevant
    st.lists(grades, min_size=1, max_size=1),  # one item
)
many_lists = st.lists(one_list, min_size=1, max_size=30)
cutoffs = st.lists(st.sampled_from([1, 2, 3, 5, 10, 20, 40]), min_size=1, max_size=3, unique=True).map(tuple)


def trec_inputs(lists: list[list[int]]) -> tuple[dict, dict]:
    """qrels/run with strictly decreasing scores by rank, so pytrec_eval's tie rule never applies."""
    qrels, run = {}, {}
    for j, ls in enumerate(lists):
        if ls:
            qid = f"q{j:04d}"
            qrels[qid] = {f"d{i:03d}": int(rel) for i, rel in enumerate(ls)}
            run[qid] = {f"d{i:03d}": float(len(ls) - i) for i in range(len(ls))}
    return qrels, run


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=many_lists, ks=cutoffs, layout=st.sampled_from(LAYOUTS))
def test_against_pytrec_eval(lists: list[list[int]], ks: tuple[int, ...], layout: str) -> None:
    import pytrec_eval

    options = MetricOptions(ndcg_cutoffs=ks, map_cutoffs=ks, gain="linear")
    ours = metrics_of(lists, options, layout)  # type: ignore[arg-type]
    qrels, run = trec_inputs(lists)
    if not qrels:
        return
    k_list = ",".join(map(str, ks))
    trec = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", f"map_cut_{k_list}", f"ndcg_cut_{k_list}"}).evaluate(run)
    for j, ls in enumerate(lists):
        defined = any(rel > 0 for rel in ls)
        if not defined:
            # No relevant item: NaN here (the aggregates apply the policy); trec_eval scores 0.
            assert all(np.isnan(ours[name][j]) for name in ours)
            if ls:
                assert trec[f"q{j:04d}"]["recip_rank"] == 0.0 and trec[f"q{j:04d}"][f"map_cut_{ks[0]}"] == 0.0
            continue
        t = trec[f"q{j:04d}"]
        assert ours["mrr"][j] == pytest.approx(t["recip_rank"], abs=TOL)
        for k in ks:
            assert ours[f"map@{k}"][j] == pytest.approx(t[f"map_cut_{k}"], abs=TOL)
            assert ours[f"ndcg@{k}"][j] == pytest.approx(t[f"ndcg_cut_{k}"], abs=TOL)  # trec: linear gain


@pytest.fixture(scope="module")
def ranx_evaluate():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ranx import Qrels, Run, evaluate
    return Qrels, Run, evaluate


def check_against_ranx(ranx_evaluate, lists: list[list[int]], ks: tuple[int, ...], layout: str) -> None:
    Qrels, Run, evaluate = ranx_evaluate
    exp = metrics_of(lists, MetricOptions(ndcg_cutoffs=ks, map_cutoffs=()), layout)  # type: ignore[arg-type]
    lin = metrics_of(lists, MetricOptions(ndcg_cutoffs=ks, map_cutoffs=(), gain="linear"), layout)  # type: ignore[arg-type]
    keep = [j for j, ls in enumerate(lists) if any(rel > 0 for rel in ls)]
    if not keep:
        return
    qrels, run = trec_inputs([lists[j] for j in keep])
    q, r = Qrels(qrels), Run(run)
    names = [f"ndcg_burges@{k}" for k in ks] + [f"ndcg@{k}" for k in ks]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluate(q, r, names, return_mean=False)
    for pos, j in enumerate(keep):
        qid = f"q{pos:04d}"
        for k in ks:
            assert exp[f"ndcg@{k}"][j] == pytest.approx(r.scores[f"ndcg_burges@{k}"][qid], abs=TOL)
            assert lin[f"ndcg@{k}"][j] == pytest.approx(r.scores[f"ndcg@{k}"][qid], abs=TOL)


# ranx builds numba structures per call (about 0.5 s), so hypothesis drives a few calls and one seeded
# batch of a thousand lists covers the edge cases in bulk.
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lists=many_lists, ks=cutoffs, layout=st.sampled_from(LAYOUTS))
def test_ndcg_against_ranx(ranx_evaluate, lists: list[list[int]], ks: tuple[int, ...], layout: str) -> None:
    check_against_ranx(ranx_evaluate, lists, ks, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ndcg_against_ranx_seeded_batch(ranx_evaluate, layout: str) -> None:
    rng = np.random.default_rng(2026)
    lists: list[list[int]] = []
    for _ in range(1000):
        kind = rng.integers(0, 5)
        n = int(rng.integers(1, 40))
        if kind == 0:
            lists.append([0] * n)
        elif kind == 1:
            lists.append(rng.integers(1, 5, n).tolist())
        elif kind == 2:
            lists.append([int(rng.integers(0, 5))])
        else:
            lists.append((rng.integers(0, 5, n) * (rng.random(n) < 0.3)).tolist())
    check_against_ranx(ranx_evaluate, lists, (1, 3, 5, 10, 20, 50), layout)


# -- options and layouts against the naive implementation -------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(
    lists=st.lists(st.lists(st.sampled_from([0, 0, 0, 1, 2, 3, 0.5, 7.25, 70]), max_size=30), min_size=1, max_size=25),
    ks=cutoffs,
    gain=st.sampled_from(["exponential", "linear"]),
    norm=st.sampled_from(["relevant", "min_relevant_k"]),
    layout=st.sampled_from(("auto", "grid", "flat")),
)
def test_against_naive_definitions(lists, ks, gain, norm, layout) -> None:
    # Non-integer and large grades take the sorting path for the ideal DCG.
    options = MetricOptions(ndcg_cutoffs=ks, map_cutoffs=ks, gain=gain, map_normalization=norm)
    ours = metrics_of(lists, options, layout)
    for j, ls in enumerate(lists):
        naive = request_metrics(ls, ndcg_cutoffs=ks, map_cutoffs=ks, gain=gain, map_normalization=norm)
        for name, value in naive.items():
            if value is None:
                assert np.isnan(ours[name][j])
            else:
                assert ours[name][j] == pytest.approx(value, rel=1e-12, abs=TOL)


@settings(max_examples=30, deadline=None)
@given(lists=many_lists, ks=cutoffs)
def test_layouts_agree_and_report_counts(lists: list[list[int]], ks: tuple[int, ...]) -> None:
    labels, offsets = flatten_lists(lists)
    options = MetricOptions(ndcg_cutoffs=ks, map_cutoffs=ks)
    grid = per_request_metrics(labels, offsets, options, layout="grid")
    flat = per_request_metrics(labels, offsets, options, layout="flat")
    assert grid.lengths.tolist() == flat.lengths.tolist() == [len(ls) for ls in lists]
    assert grid.n_relevant.tolist() == flat.n_relevant.tolist() == [sum(1 for x in ls if x > 0) for ls in lists]
    for name in options.rank_metric_names:
        np.testing.assert_allclose(grid.values[name], flat.values[name], rtol=0, atol=1e-12)


def test_min_relevant_k_normalisation_by_hand() -> None:
    # R = 4 relevant, k = 2: the top two are relevant, so AP@2 = 2/4 by R and 2/2 by min(R, k).
    lists = [[1, 1, 1, 1, 0]]
    assert metrics_of(lists, MetricOptions(map_cutoffs=(2,)))["map@2"][0] == pytest.approx(0.5)
    assert metrics_of(lists, MetricOptions(map_cutoffs=(2,), map_normalization="min_relevant_k"))["map@2"][0] == 1.0


def test_k_beyond_list_and_shorter_lists() -> None:
    v = metrics_of([[0, 1], [2]], MetricOptions(ndcg_cutoffs=(1, 100), map_cutoffs=(100,)))
    assert v["ndcg@100"].tolist() == pytest.approx([1 / math.log2(3), 1.0])
    assert v["ndcg@1"].tolist() == pytest.approx([0.0, 1.0])
    assert v["map@100"].tolist() == pytest.approx([0.5, 1.0])


def test_empty_lists_and_no_lists() -> None:
    v = metrics_of([[], [1], []], MetricOptions())
    assert np.isnan(v["mrr"][0]) and v["mrr"][1] == 1.0 and np.isnan(v["ndcg@5"][2])
    none = per_request_metrics(np.empty(0), np.array([0]), MetricOptions())
    assert none.n_requests == 0 and all(a.size == 0 for a in none.values.values())
    only_empty = per_request_metrics(np.empty(0), np.array([0, 0, 0]), MetricOptions())
    assert np.isnan(only_empty.values["map@10"]).all() and only_empty.lengths.tolist() == [0, 0]


def test_bad_layout_and_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="layout"):
        per_request_metrics([1.0], [0, 1], MetricOptions(), layout="diagonal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="labels"):
        check_lists([-1.0], [0, 1])
    with pytest.raises(ValueError, match="labels"):
        check_lists([np.nan], [0, 1])
    with pytest.raises(ValueError, match="offsets"):
        check_lists([1.0, 0.0], [0, 1])
    with pytest.raises(ValueError, match="offsets"):
        check_lists([1.0, 0.0], [0, 2, 1, 2])


def test_offsets_from_lengths() -> None:
    assert offsets_from_lengths([2, 0, 3]).tolist() == [0, 2, 2, 5]
    assert offsets_from_lengths([]).tolist() == [0]
