"""The cumulative experiment state from published windows equals ``rankwatch ab`` on the ground truth."""

from __future__ import annotations

import pytest

from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.experiments.data import experiment_cells
from rankwatch.pipeline.experiments.online import ExperimentAccumulator
from rankwatch.pipeline.experiments.report import experiment_report
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.offline.readers import validate_evaluation_frame
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor
from rankwatch.pipeline.traffic.generator import ExperimentTraffic, TrafficConfig, generate_with_truth


def test_windows_fold_into_the_same_report_as_the_rows() -> None:
    exp = ExperimentTraffic(effects=(("treatment", "new_user", -0.3),), users=400)
    cfg = TrafficConfig(seed=21, duration_s=900, requests_per_second=10, experiment=exp, duplicate_rate=0.02)
    events, truth = generate_with_truth(cfg)
    config = StreamConfig(windows=("5m", "1h"), slice_spec=SliceSpec(by=("segment", "surface", "variant")))
    proc = StreamProcessor(config, clock=ManualClock())
    spec = ExperimentSpec(name="x", min_requests=100, min_positives=20, min_negatives=20)
    acc = ExperimentAccumulator(spec, config.metric_options, slice_by=config.slice_spec.by, window="5m")
    state_check = ExperimentAccumulator(spec, config.metric_options, slice_by=config.slice_spec.by, window="5m")
    for e in events:
        fn = proc.process_impression if e.stream == "impressions" else proc.process_feedback
        for pw in fn(e.value):
            acc.add(pw)
    for pw in proc.flush():
        acc.add(pw)
    state_check.restore(acc.to_state())
    online = experiment_report(acc.data())
    restored = experiment_report(state_check.data())
    offline = experiment_report(experiment_cells(validate_evaluation_frame(truth), spec))
    assert online["srm"] == offline["srm"] and restored == online
    assert len(online["comparisons"]) == len(offline["comparisons"])
    for a, b in zip(online["comparisons"], offline["comparisons"], strict=True):
        for key, value in b.items():
            if isinstance(value, float | list) and b["metric"] in ("auc_roc", "auc_pr") and key not in (
                    "mean", "mean_control", "diff", "lift"):
                # AUC standard errors are request-clustered; past the cluster state's bin cap the buckets are
                # folded, and the fold depends on the merge order (windows vs rows): within ~1 % (docs/metrics.md 4a).
                assert a[key] == pytest.approx(value, rel=0.05, abs=1e-3), key
            elif isinstance(value, float | list):
                assert a[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
            else:
                assert a[key] == value, key
    assert any(c["verdict"] == "worse" for c in online["comparisons"] if c["segment"] == "new_user")
