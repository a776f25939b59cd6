"""The traffic generator: deterministic, realistic, and its ground truth agrees with its own events."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from rankwatch.pipeline.events.validation import Rejection, decode_feedback, decode_impression
from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.traffic.generator import (
    ROW_COLUMNS,
    Regression,
    TrafficConfig,
    evaluation_frame,
    generate_events,
    generate_with_truth,
    ground_truth_rows,
)

START = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
CFG = TrafficConfig(seed=4, start=START, duration_s=900, requests_per_second=0.5, duplicate_rate=0.1,
                    malformed_rate=0.1, out_of_order_ms=20_000, item_form_share=0.3, rfc3339_share=0.5,
                    orphan_rate=0.1, late_rate=0.1)


def test_deterministic():
    a = list(generate_events(CFG))
    assert a == list(generate_events(CFG))
    assert a != list(generate_events(replace(CFG, seed=5)))


def test_delivery_order_respects_disorder_bound():
    events = list(generate_events(CFG))
    running_max = 0
    for e in events:
        if e.stream == "clicks" and b"-slow" in e.value:
            continue  # deliberately delivered late
        assert e.ts_ms >= running_max - CFG.out_of_order_ms
        running_max = max(running_max, e.ts_ms)


def test_ground_truth_is_the_naive_join_of_the_valid_events():
    events, truth = generate_with_truth(CFG)
    assert list(truth.columns) == list(ROW_COLUMNS)
    assert truth.equals(ground_truth_rows(CFG))
    # naive oracle: decode everything, first copy of each event id, max grade inside the attribution window
    seen, requests, feedback = set(), {}, defaultdict(list)
    kinds = defaultdict(int)
    for e in events:
        dec = decode_impression(e.value) if e.stream == "impressions" else decode_feedback(e.value)
        if isinstance(dec, Rejection):
            kinds[e.stream + ":rejected"] += 1
            continue
        if dec.event_id in seen:
            continue
        seen.add(dec.event_id)
        if e.stream == "impressions":
            req = requests.setdefault(dec.request_id, {"ts": dec.ts_ms, "items": {}})
            req["ts"] = min(req["ts"], dec.ts_ms)
            for it, p, s in zip(dec.item_ids, dec.positions, dec.scores, strict=True):
                req["items"][p] = (it, s)
        else:
            feedback[dec.request_id].append(dec)
    assert kinds["impressions:rejected"] > 0 and kinds["clicks:rejected"] > 0
    assert set(truth.request_id) == set(requests)
    for rid, frame in truth.groupby("request_id"):
        req = requests[rid]
        assert frame.request_ts.iloc[0].timestamp() * 1000 == req["ts"]
        for row in frame.itertuples():
            assert req["items"][row.position] == (row.item_id, row.score)
            grades = [f.grade for f in feedback[rid] if f.item_id == row.item_id and req["ts"] <= f.ts_ms
                      and f.ts_ms <= req["ts"] + CFG.attribution_window_ms and b"-slow" not in f.event_id.encode()]
            assert row.label == max(grades, default=0)


def test_rfc3339_and_item_form_present():
    values = [json.loads(e.value) for e in generate_events(CFG) if e.value.startswith(b"{") and b"bad-" not in e.value]
    assert any(isinstance(v.get("ts"), str) and v["ts"].endswith("Z") for v in values)
    assert any(isinstance(v.get("ts"), str) and v["ts"].endswith("+02:00") for v in values)
    assert any("item_id" in v and "position" in v for v in values)


def _ndcg(frame) -> float:
    frame = frame.sort_values(["request_id", "position"])
    sizes = frame.groupby("request_id", sort=False).size().to_numpy()
    agg = RankingAggregate.from_lists(frame.label.to_numpy(float), frame.score.to_numpy(float),
                                      np.concatenate(([0], np.cumsum(sizes))), MetricOptions())
    return agg.values()["ndcg@10"]  # type: ignore[return-value]


def test_quality_and_regression_move_the_metrics():
    base = TrafficConfig(seed=1, start=START, duration_s=1200, requests_per_second=1.0,
                         segment_quality={"new_user": 0.9, "returning": 0.2}, segments=("new_user", "returning"))
    truth = ground_truth_rows(base)
    good, bad = (_ndcg(truth[truth.segment == s]) for s in ("new_user", "returning"))
    assert good > bad + 0.05
    regressed = ground_truth_rows(replace(base, regression=Regression("new_user", from_offset_s=600, drop=0.7)))
    seg = regressed[regressed.segment == "new_user"]
    cut = seg.request_ts >= START + timedelta(seconds=600)
    assert _ndcg(seg[~cut]) > _ndcg(seg[cut]) + 0.05


def test_position_bias_in_clicks():
    truth = ground_truth_rows(TrafficConfig(seed=2, start=START, duration_s=600, requests_per_second=2.0))
    ctr = truth.assign(clicked=truth.label > 0).groupby("position").clicked.mean()
    assert ctr.loc[1] > ctr.loc[10] > 0


def test_evaluation_frame():
    frame = evaluation_frame(CFG, 50)
    assert list(frame.columns) == list(ROW_COLUMNS)
    assert frame.request_id.nunique() == 50 and len(frame) == 50 * CFG.items_per_request
    assert frame.equals(evaluation_frame(CFG, 50))


def test_config_checks():
    with pytest.raises(ValueError):
        TrafficConfig(start=datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        TrafficConfig(requests_per_second=0)
