"""Grouping, ordering and the JSON document of the transfer report; undefined values are null, never NaN."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rankwatch.pipeline.transfer.fieller import fieller_interval
from rankwatch.pipeline.transfer.ledger import Difference, LedgerEntry
from rankwatch.pipeline.transfer.report import groups_document, transfer_groups
from rankwatch.pipeline.transfer.statistics import moments, slope_corrected

GROUP_KEYS = ["metric", "online_metric", "segment", "n", "slope_ols", "slope_corrected", "slope_corrected_ci",
              "correlation_corrected", "correlation_corrected_ci", "sign_agreement", "sign_agreement_n",
              "kendall_tau", "predicted_online", "predicted_online_ci", "comparisons"]  # fmt: skip
COMPARISON_KEYS = ["experiment", "candidate", "reference", "segment", "surface", "ratio", "ratio_ci"]


def _entry(i: int, x: float, sx: float, y: float, sy: float, segment: str = "a", metric: str = "ndcg@10",
           online_metric: str | None = None, recorded_at: str = "2026-12-01T10:00:00Z") -> LedgerEntry:  # fmt: skip
    return LedgerEntry(experiment=f"e{i:02d}", candidate=f"c{i}", reference="r", segment=segment, surface="s",
                       metric=metric, online_metric=online_metric, offline=Difference(x, sx, 100),
                       online=Difference(y, sy, 1000), recorded_at=recorded_at)  # fmt: skip


def _entries(seed: int, n: int, **kw: object) -> list[LedgerEntry]:
    rng = np.random.default_rng(seed)
    return [_entry(i, float(rng.normal(0, 1)), 0.2, float(rng.normal(0, 1)), 0.1, **kw) for i in range(n)]


def test_groups_by_metric_pair_and_segment_sorted() -> None:
    entries = (_entries(0, 5, segment="b") + _entries(1, 4, segment="a") + _entries(2, 3, metric="mrr")
               + _entries(3, 3, metric="mrr", online_metric="ctr"))  # fmt: skip
    keys = [(g.metric, g.online_metric, g.segment, g.n) for g in transfer_groups(entries, resamples=50)]
    assert keys == [("mrr", "ctr", "all", 3), ("mrr", "mrr", "all", 3), ("ndcg@10", "ndcg@10", "all", 9)]
    keys = [(g.metric, g.segment, g.n) for g in transfer_groups(entries, metric="ndcg@10", by_segment=True, resamples=50)]
    assert keys == [("ndcg@10", "a", 4), ("ndcg@10", "b", 5)]


def test_group_results_do_not_depend_on_line_order_or_other_groups() -> None:
    entries = _entries(4, 20) + _entries(5, 6, metric="mrr")
    a = groups_document(transfer_groups(entries, metric="ndcg@10", candidate=(0.5, 0.1), seed=3, resamples=300))
    b = groups_document(transfer_groups(entries[::-1], candidate=(0.5, 0.1), seed=3, resamples=300))
    assert a["groups"][0] == b["groups"][1]


def test_document_keys_values_and_ratios() -> None:
    entries = _entries(6, 15) + [_entry(99, 0.0, 0.1, 0.3, 0.1), _entry(98, 0.1, 0.1, 0.3, 0.1)]
    groups = transfer_groups(entries, candidate=(1.0, 0.2), resamples=200)
    doc = groups_document(groups)
    (g,) = doc["groups"]
    assert list(g) == GROUP_KEYS and all(list(c) == COMPARISON_KEYS for c in g["comparisons"])
    assert g["n"] == 17 and g["segment"] == "all"
    x = [e.offline.diff for e in entries]
    y = [e.online.diff for e in entries]
    m = moments(x, y, [e.offline.stderr for e in entries], [e.online.stderr for e in entries])
    assert g["slope_corrected"] == pytest.approx(slope_corrected(m)) and g["predicted_online"] == pytest.approx(slope_corrected(m))
    by_experiment = {c["experiment"]: c for c in g["comparisons"]}
    assert by_experiment["e99"]["ratio"] is None and by_experiment["e99"]["ratio_ci"] is None  # x = 0
    assert by_experiment["e98"]["ratio"] is None  # |x| <= z sx
    f = fieller_interval(y[0], 0.1, x[0], 0.2)
    assert by_experiment["e00"]["ratio"] == (f.ratio if f.bounded else None)
    assert [c["experiment"] for c in g["comparisons"]] == sorted(by_experiment)
    json.dumps(doc, allow_nan=False)


@pytest.mark.parametrize("n", [1, 2])
def test_tiny_groups_serialise_nulls(n: int) -> None:
    entries = [_entry(i, 0.5 + i, 0.01, 0.2 + i, 0.01) for i in range(n)]
    doc = groups_document(transfer_groups(entries, candidate=(0.1, 0.01), resamples=100))
    (g,) = doc["groups"]
    text = json.dumps(doc, allow_nan=False)
    assert "NaN" not in text and g["n"] == n and g["slope_corrected_ci"] is None
    assert g["correlation_corrected_ci"] is None and g["predicted_online_ci"] is None
    if n == 1:
        assert g["slope_ols"] is None and g["slope_corrected"] is None and g["kendall_tau"] is None
        assert g["predicted_online"] is None
    else:
        assert g["slope_ols"] == pytest.approx(1.0) and g["kendall_tau"] == pytest.approx(1.0)
        assert g["predicted_online"] == pytest.approx(0.1 * g["slope_corrected"])
    assert g["sign_agreement"] == 1.0 and g["sign_agreement_n"] == n


def test_all_x_equal_and_no_significant_online_result() -> None:
    entries = [_entry(i, 0.3, 0.01, 0.001 * i, 0.01) for i in range(6)]
    (g,) = groups_document(transfer_groups(entries, resamples=100))["groups"]
    assert g["slope_ols"] is None and g["slope_corrected"] is None and g["correlation_corrected"] is None
    assert g["kendall_tau"] is None and g["sign_agreement"] is None and g["sign_agreement_n"] == 0
    assert g["predicted_online"] is None and g["predicted_online_ci"] is None


def test_a_re_recorded_comparison_counts_once() -> None:
    entries = _entries(7, 5) + [_entry(0, 9.0, 0.1, 9.0, 0.1, recorded_at="2026-12-02T00:00:00Z")]
    (g,) = transfer_groups(entries, resamples=50)
    assert g.n == 5 and any(c.entry.offline.diff == 9.0 for c in g.comparisons)
    assert transfer_groups([], resamples=50) == []
