"""Online ``unit = "user"`` experiments (pipeline/experiments/users.py): the per-user sums a processor keeps give
``rankwatch ab --unit user``'s report on the ground truth, survive a snapshot, add up over partition pairs,
and stay bounded."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest

from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.experiments.data import experiment_cells, request_extras
from rankwatch.pipeline.experiments.report import experiment_report
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.experiments.users import UserUnitAccumulator, UserUnitSums
from rankwatch.pipeline.metrics.kernel import PerRequestMetrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.readers import validate_evaluation_frame
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor
from rankwatch.pipeline.traffic.generator import ExperimentTraffic, TrafficConfig, generate_with_truth

BY = ("segment", "surface", "variant")
SPEC = ExperimentSpec(name="u", unit="user", min_requests=100)


def _traffic(seed: int = 31) -> tuple[list[Any], Any]:
    exp = ExperimentTraffic(effects=(("treatment", "new_user", -0.3),), users=250, user_effect_sd=0.1)
    cfg = TrafficConfig(seed=seed, duration_s=600, requests_per_second=10, experiment=exp, duplicate_rate=0.02)
    return generate_with_truth(cfg)


def _processor(spec: ExperimentSpec = SPEC) -> StreamProcessor:
    config = StreamConfig(windows=("5m",), slice_spec=SliceSpec(by=BY), experiments=(spec,))
    return StreamProcessor(config, clock=ManualClock())


def _feed(proc: StreamProcessor, events: list[Any]) -> None:
    for e in events:
        (proc.process_impression if e.stream == "impressions" else proc.process_feedback)(e.value)


def _offline(truth: Any, spec: ExperimentSpec = SPEC) -> dict[str, Any]:
    evalset = validate_evaluation_frame(truth)
    users, ts = request_extras(evalset, truth[["request_id", "user_id", "request_ts"]])
    return experiment_report(experiment_cells(evalset, spec, slice_spec=SliceSpec(by=("segment", "surface")),
                                              users=users, request_ts_ms=ts))


def _assert_same(online: dict[str, Any], offline: dict[str, Any]) -> None:
    assert online["srm"]["observed"] == offline["srm"]["observed"]
    assert online["srm"]["p_value"] == pytest.approx(offline["srm"]["p_value"], rel=1e-12)
    exp_on, exp_off = online["experiment"], offline["experiment"]
    for key in ("requests", "users", "crossover_users", "other_arm_requests"):
        assert exp_on[key] == exp_off[key], key
    pairs = {(c["metric"], c["segment"], c["surface"]): c for c in offline["comparisons"]}
    compared = 0
    for c in online["comparisons"]:
        o = pairs[(c["metric"], c["segment"], c["surface"])]
        if c["metric"].startswith("auc_"):
            continue  # no score histograms online (docs/experiments.md)
        for key, value in o.items():
            if isinstance(value, float | list):
                assert c[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (c["metric"], key)
            elif key != "verdict_detail":
                assert c[key] == value, (c["metric"], key)
        compared += 1
    assert compared >= 30


def test_a_processor_gives_rankwatch_abs_user_unit_report_on_the_truth() -> None:
    events, truth = _traffic()
    proc = _processor()
    _feed(proc, events)
    proc.flush()
    online, offline = experiment_report(proc.experiment_data("u")), _offline(truth)
    _assert_same(online, offline)
    assert any(c["unit"] == "user" and c["n"] < c["requests"] for c in online["comparisons"])
    assert any(c["verdict"] == "worse" for c in online["comparisons"] if c["segment"] == "new_user")


def test_a_restored_snapshot_continues_to_the_same_report() -> None:
    events, truth = _traffic(seed=32)
    first = _processor()
    half = len(events) // 2
    _feed(first, events[:half])
    second = StreamProcessor.restore(first.snapshot(), config=first.config, clock=ManualClock())
    _feed(second, events[half:])
    second.flush()
    _assert_same(experiment_report(second.experiment_data("u")), _offline(truth))


def test_pairs_keyed_by_user_add_up_to_the_whole() -> None:
    events, truth = _traffic(seed=33)
    user_of = dict(zip(truth["request_id"], truth["user_id"], strict=True))
    whole, parts = _processor(), [_processor(), _processor()]
    _feed(whole, events)
    for e in events:  # events of one user reach one pair (producers keyed by user_id)
        pair = parts[zlib.crc32(str(user_of.get(e.key.decode(), "")).encode()) % 2]
        (pair.process_impression if e.stream == "impressions" else pair.process_feedback)(e.value)
    for p in (whole, *parts):
        p.flush()
    total, users = UserUnitSums.total([p.stats().experiments["u"] for p in parts])
    ref_cells, ref_users = UserUnitSums.total([whole.stats().experiments["u"]])
    assert users == ref_users and total.keys() == ref_cells.keys()
    for key, (requests, n_users, metrics) in ref_cells.items():
        assert total[key][:2] == (requests, n_users)
        for m, sums in metrics.items():
            assert total[key][2][m] == pytest.approx(sums, rel=1e-12), (key, m)


def test_against_a_naive_per_user_loop_with_ties_empty_lists_and_the_cap() -> None:
    rng = np.random.default_rng(5)
    options = MetricOptions()
    names = list(options.rank_metric_names)
    spec = ExperimentSpec(name="c", unit="user", max_users=5, user_buckets=3)
    acc = UserUnitAccumulator(spec, options, slice_by=("segment", "variant"))
    naive: dict[tuple[str, tuple[Any, ...]], dict[int, np.ndarray]] = {}
    for _batch in range(6):
        n = int(rng.integers(0, 30))
        no_relevant = rng.random(n) < 0.2  # R = 0: every metric NaN (values tie often: halves)
        vals = {m: np.where(no_relevant, np.nan, rng.integers(0, 3, n) / 2.0) for m in names}
        n_rel = np.where(no_relevant, 0, 1).astype(np.int64)
        metrics = PerRequestMetrics(vals, n_rel, rng.integers(1, 5, n).astype(np.int64))
        keys = [(("segment", str(rng.choice(["a", "b"]))), ("variant", str(rng.choice(["control", "treatment", "x"]))))
                for _ in range(n)]
        users = rng.integers(0, 12, n).astype(np.int64)
        before_codes = dict(acc.codes)
        table = list(dict.fromkeys(keys))  # the processor's combo table: request j has table[combo[j]]
        combo = np.array([table.index(k) for k in keys], dtype=np.int64)
        acc.add(metrics, combo, table, users, np.zeros(n, dtype=np.int64))
        for j in range(n):
            arm = dict(keys[j])["variant"]
            if arm == "x":
                continue
            u = int(users[j])
            code = before_codes.get(u, acc.codes.get(u, spec.max_users + u % spec.user_buckets))
            row = np.concatenate([[0.0 if n_rel[j] == 0 else vals[m][j] for m in names], [float(n_rel[j] > 0)] * len(names)])
            for cell in ((arm, (("segment", dict(keys[j])["segment"]),)), (arm, ())):
                naive.setdefault(cell, {}).setdefault(code, np.zeros(2 * len(names)))
                naive[cell][code] += row
    data = acc.data()
    assert len(acc.codes) <= spec.max_users
    for cell, per_user in naive.items():
        units = data.cells[cell].units
        rows = np.array(list(per_user.values()))
        for i, m in enumerate(names):
            y, c = rows[:, i], rows[:, len(names) + i]
            u = units[m]
            assert u.n == int(np.count_nonzero(c > 0))
            assert (u.sum_y, u.sum_n, u.sum_yy, u.sum_nn, u.sum_yn) == pytest.approx(
                (y.sum(), c.sum(), (y * y).sum(), (c * c).sum(), (y * c).sum()), rel=1e-12, abs=1e-12)
    assert data.users_folded > 0
    restored = UserUnitAccumulator(spec, options, slice_by=("segment", "variant"))
    restored.restore(acc.to_state())
    assert experiment_report(restored.data()) == experiment_report(data)
