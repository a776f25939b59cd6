"""rankwatch_position_ctr and rankwatch_score_drift(_items) against values computed from the aggregates."""

from __future__ import annotations

import numpy as np
import pytest
from exporter_helpers import grid_keys, parse_exposition, random_window, select, write_baseline_file
from prometheus_client import generate_latest

from rankwatch.exporters.baselines import BaselineWatcher
from rankwatch.exporters.collector import build_registry
from rankwatch.exporters.state import MetricsState
from rankwatch.pipeline.metrics.drift import ScoreDistribution, score_drift

KEYS = grid_keys(["a", "b"], ["x", "y"])


def labels_of(key: tuple) -> dict[str, str]:
    found = dict(key)
    return {"segment": found.get("segment", "all"), "surface": found.get("surface", "all"), "variant": "all"}


def test_position_ctr_and_score_drift_families(tmp_path) -> None:
    rng = np.random.default_rng(13)
    base = random_window(rng, KEYS, requests_per_slice=60)
    path = tmp_path / "base.json"
    doc = write_baseline_file(str(path), base.overall, base.slices)
    state = MetricsState()
    BaselineWatcher([path], state).load_initial()
    online = random_window(rng, KEYS[:3], requests_per_slice=40)  # slice (b, y) has no online side
    state.publish_window(online)
    series = parse_exposition(generate_latest(build_registry(state)).decode())

    entries = {(): doc["result"]["overall"]}  # type: ignore[index]
    entries.update({tuple((k, s[k]) for k in ("segment", "surface")): s for s in doc["result"]["slices"]})  # type: ignore[index]
    for key, agg in [((), online.overall), *online.slices.items()]:
        lbl = labels_of(key)
        for rank, value in enumerate(agg.position_ctr(), start=1):
            got = select(series, "rankwatch_position_ctr", source="online", window="5m", rank=str(rank), **lbl)
            if value is None:
                assert not got
            else:
                assert list(got.values()) == [pytest.approx(value, abs=1e-12)]
                shown = agg.ctr_shown[rank - 1]
                assert value == pytest.approx(agg.ctr_positive[rank - 1] / shown, abs=1e-12)
        expected = score_drift(ScoreDistribution.from_dict(entries[key]["score_distribution"]), agg.histogram)
        for statistic, value in (("psi", expected.psi), ("ks", expected.ks)):
            got = select(series, "rankwatch_score_drift", statistic=statistic, window="5m", **lbl)
            assert list(got.values()) == [pytest.approx(value, abs=1e-12)]
        assert select(series, "rankwatch_score_drift_items", window="5m", **lbl) == {
            frozenset({"window": "5m", **lbl}.items()): float(agg.items)
        }
    # The baseline's own curve, and no drift for a slice without an online side.
    for key, entry in entries.items():
        for rank, value in enumerate(entry["position_ctr"], start=1):
            got = select(series, "rankwatch_position_ctr", source="offline", rank=str(rank), **labels_of(key))
            assert list(got.values()) == ([] if value is None else [pytest.approx(value, abs=1e-12)])
    assert not select(series, "rankwatch_score_drift", segment="b", surface="y")
    # Bounded: at most ctr_ranks curve points per (source, window, label set); two statistics per label set.
    label_sets = len(select(series, "rankwatch_ranking_requests"))
    assert len(select(series, "rankwatch_position_ctr")) <= 10 * label_sets
    assert len(select(series, "rankwatch_score_drift")) <= 2 * len(select(series, "rankwatch_score_drift_items"))


def test_gauc_cap_hit_is_exported() -> None:
    """Online GAUC keeps at most gauc_max_items items per window slice; the dropped ones are a gauge."""
    from datetime import timedelta

    from exporter_helpers import T0

    from rankwatch.pipeline.metrics.aggregates import aggregate_lists
    from rankwatch.pipeline.metrics.options import MetricOptions
    from rankwatch.pipeline.published import PublishedWindow

    options = MetricOptions(gauc_max_items=30)
    rng = np.random.default_rng(2)
    lengths = np.full(10, 5)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    labels = (rng.random(50) < 0.4).astype(float)
    parts = aggregate_lists(labels, rng.normal(size=50), offsets, np.zeros(10, np.int64), 1, options,
                            gauc_keys=np.arange(10) % 3, gauc_open=True)  # fmt: skip
    agg = parts[0]
    assert agg.gauc.n_open == 30 and agg.values()["gauc_items_dropped"] == 20
    state = MetricsState()
    key = (("segment", "a"), ("surface", "x"))
    state.publish_window(PublishedWindow("5m", T0, T0 + timedelta(minutes=5), agg, {key: agg}))
    series = parse_exposition(generate_latest(build_registry(state)).decode())
    assert select(series, "rankwatch_gauc_items_dropped", window="5m", segment="a", surface="x") == {
        frozenset({"window": "5m", "segment": "a", "surface": "x", "variant": "all"}.items()): 20.0
    }
