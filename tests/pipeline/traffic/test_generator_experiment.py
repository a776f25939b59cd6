"""The simulator's experiment: arms per user, per-arm per-segment effects, user effects, a broken split;
and the default traffic unchanged."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from rankwatch.pipeline.offline.baseline import compute_baseline
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.traffic.generator import (
    ExperimentTraffic,
    TrafficConfig,
    evaluation_frame,
    generate_events,
    generate_with_truth,
    ground_truth_rows,
)


def test_default_traffic_is_byte_identical_to_before_experiments() -> None:
    # sha256 of the default traffic (same script): a pin, not a metric value. First measured on main before
    # ExperimentTraffic existed; re-pinned when item-form impressions and the ground-truth rows gained
    # a user_id (list-form impressions keep their bytes: user_id stays right after ts), and when integer
    # ids became valid (the bad_type malformed event now carries "request_id": true, not 17).
    h = hashlib.sha256()
    for cfg in [TrafficConfig(), TrafficConfig(seed=3, duplicate_rate=0.1, malformed_rate=0.05, out_of_order_ms=5000,
                item_form_share=0.2, rfc3339_share=0.3, orphan_rate=0.05, late_rate=0.05, duration_s=900)]:
        for e in generate_events(cfg):
            h.update(e.stream.encode() + e.key + e.value + str(e.ts_ms).encode())
        h.update(ground_truth_rows(cfg).to_csv().encode())
    h.update(evaluation_frame(TrafficConfig(seed=2), 500).to_csv().encode())
    assert h.hexdigest() == "ef5205c85a3729296a9c940ec11364475e1ab40c69ebe8606695bf1ba3063ea0"


def test_arms_belong_to_users_and_effects_hit_their_segment() -> None:
    exp = ExperimentTraffic(effects=(("treatment", "new_user", -0.3),), users=300)
    rows = evaluation_frame(TrafficConfig(seed=1, experiment=exp), 8_000)
    per_user = rows.drop_duplicates("request_id").groupby("user_id")["variant"].nunique()
    assert per_user.max() == 1 and per_user.size > 250
    result = compute_baseline(rows, slice_spec=SliceSpec(by=("segment", "variant")))
    ndcg = {dict(k)["segment"] + "/" + dict(k)["variant"]: a.values()["ndcg@10"] for k, a in result.slices.items()}
    assert ndcg["new_user/treatment"] < ndcg["new_user/control"] - 0.05
    for seg in ("returning", "power_user"):
        assert ndcg[f"{seg}/treatment"] == pytest.approx(ndcg[f"{seg}/control"], abs=0.03)


def test_broken_split_loses_treatment_requests_and_their_events() -> None:
    exp = ExperimentTraffic(broken_split=0.2, unit="request")
    events, truth = generate_with_truth(TrafficConfig(seed=2, duration_s=300, experiment=exp))
    firsts = truth.drop_duplicates("request_id")
    share = (firsts["variant"] == "treatment").mean()
    assert share == pytest.approx(0.8 / 1.8, abs=0.03)
    served = {e.key.decode() for e in events if e.stream == "impressions"}
    assert served == set(firsts["request_id"])


def test_experiment_checks_its_options() -> None:
    with pytest.raises(ValueError):
        ExperimentTraffic(arms=("a",))
    with pytest.raises(ValueError):
        ExperimentTraffic(effects=(("nope", "*", 0.1),))
    with pytest.raises(ValueError):
        replace(ExperimentTraffic(), broken_split=1.0)
