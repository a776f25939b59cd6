"""The cumulative experiment state from published windows equals ``rankwatch ab`` on the ground truth."""

from __future__ import annotations

import pytest

from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.experiments.data import experiment_cells
from rankwatch.pipeline.experiments.online import ExperimentAccumulator
from rankwatch.pipeline.experiments.report import experiment_report
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.metrics.clusters import MAX_BINS
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
    def items(arm: str, segment: str, surface: str) -> int:
        rows = truth[truth.variant == arm]
        rows = rows if segment == "all" else rows[rows.segment == segment]
        return len(rows if surface == "all" else rows[rows.surface == surface])

    checked = {"exact": 0, "folded": 0}
    for a, b in zip(online["comparisons"], offline["comparisons"], strict=True):
        # AUC standard errors are request-clustered; a cell within the 16,384-bin bound is exact, a cell past
        # it folds its buckets, and the fold depends on the merge order (windows vs rows; docs/metrics.md 4a):
        # measured up to 7 % apart in CI width (AUC-PR of the whole population), so 5 % of the CI's ends.
        folded = b["metric"] in ("auc_roc", "auc_pr") and max(
            items(b["treatment"], b["segment"], b["surface"]), items(b["control"], b["segment"], b["surface"])
        ) > MAX_BINS
        if b["metric"] in ("auc_roc", "auc_pr"):
            checked["folded" if folded else "exact"] += 1
        for key, value in b.items():
            if isinstance(value, float | list) and folded and key not in ("mean", "mean_control", "diff", "lift"):
                assert a[key] == pytest.approx(value, rel=0.05, abs=1e-3), key
            elif isinstance(value, float | list) and b["metric"] in ("auc_roc", "auc_pr"):
                assert a[key] == pytest.approx(value, rel=1e-12, abs=1e-15), (b["segment"], b["surface"], b["metric"], key)
            elif isinstance(value, float | list):  # means: sums added in another order
                assert a[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
            else:
                assert a[key] == value, key
    assert checked["exact"] >= 4 and checked["folded"] >= 2, checked
    assert any(c["verdict"] == "worse" for c in online["comparisons"] if c["segment"] == "new_user")
