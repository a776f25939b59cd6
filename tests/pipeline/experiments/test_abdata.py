"""Experiment cells: per-user state cap (hashed buckets of whole users), counts, the arm label."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.pipeline.experiments.data import experiment_cells, request_extras
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.offline.readers import validate_evaluation_frame
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.traffic.generator import TrafficConfig, evaluation_frame


def _data(max_users: int, buckets: int = 3):
    frame = evaluation_frame(TrafficConfig(seed=4), 2_000)
    frame["user_id"] = "u" + (frame.groupby("request_id", sort=False).ngroup() % 97).astype(str)
    evalset = validate_evaluation_frame(frame)
    users, ts = request_extras(evalset, frame[["request_id", "user_id", "request_ts"]])
    spec = ExperimentSpec(name="x", unit="user", max_users=max_users, user_buckets=buckets)
    return experiment_cells(evalset, spec, slice_spec=SliceSpec(by=("segment",)), users=users, request_ts_ms=ts)


def test_user_cap_folds_whole_users_into_buckets_and_counts_them() -> None:
    full, capped = _data(10**6), _data(10)
    assert full.users_folded == 0 and capped.users_folded == 97 - 10
    for key, cell in full.cells.items():
        small = capped.cells[key]
        for metric, sums in cell.units.items():
            folded = small.units[metric]
            assert folded.n <= 10 + 3 < sums.n
            # sums over units are unchanged: buckets only regroup whole users
            assert folded.sum_y == pytest.approx(sums.sum_y) and folded.sum_n == sums.sum_n
            assert cell.aggregate.sums[metric].count == sums.sum_n


def test_cells_cover_every_request_once() -> None:
    data = _data(10**6)
    total = sum(cell.aggregate.requests for (arm, key), cell in data.cells.items() if key)
    assert total == sum(data.requests.values()) == 2_000
    assert data.slice_keys()[0] == ()
    assert all(np.isfinite(c.aggregate.sums["mrr"].total) for c in data.cells.values())


def test_arm_label_cannot_be_a_slice_label() -> None:
    frame = evaluation_frame(TrafficConfig(seed=4), 50)
    with pytest.raises(ValueError, match="cannot also be a slice label"):
        experiment_cells(validate_evaluation_frame(frame), ExperimentSpec(name="x"),
                         slice_spec=SliceSpec(by=("segment", "variant")))
