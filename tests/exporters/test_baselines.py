"""Baseline loading and reload: change, corrupt, half-write and delete the file while the exporter runs."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from exporter_helpers import (
    grid_keys,
    one,
    parse_exposition,
    random_window,
    scrape,
    select,
    write_baseline_file,
)

from rankwatch.exporters.baselines import BaselineWatcher, load_baseline_file
from rankwatch.exporters.collector import build_registry
from rankwatch.exporters.http import MetricsServer
from rankwatch.exporters.scheduling import BASELINE_JOB, ExporterScheduler
from rankwatch.exporters.state import MetricsState

KEYS = grid_keys(("new_user", "returning"), ("home_feed",))


def _bump_mtime(path) -> None:
    # Filesystems with coarse timestamps: make sure every rewrite is seen as a change.
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def offline_values(state: MetricsState) -> dict:
    return {lbl: v.metrics["mrr"] for lbl, v in state.snapshot().offline.items()}


def test_reload_change_corrupt_halfwritten_delete(tmp_path) -> None:
    rng = np.random.default_rng(11)
    path = tmp_path / "base.json"
    first = random_window(rng, KEYS)
    write_baseline_file(str(path), first.overall, first.slices)
    state = MetricsState()
    watcher = BaselineWatcher([path], state)
    watcher.load_initial()
    assert offline_values(state)[("all", "all", "all")] == pytest.approx(first.overall.values()["mrr"])
    assert not watcher.reload()  # unchanged file: nothing to do

    second = random_window(rng, KEYS)
    write_baseline_file(str(path), second.overall, second.slices)
    _bump_mtime(path)
    assert watcher.reload()
    assert offline_values(state)[("all", "all", "all")] == pytest.approx(second.overall.values()["mrr"])
    assert state.snapshot().baseline_errors["base.json"] == 0

    # Corrupt: the old baseline stays, one error is counted, loaded flag drops to 0.
    path.write_text('{"format": "rankwatch-baseline/1", "result": {"overall": ')
    _bump_mtime(path)
    assert not watcher.reload()
    snap = state.snapshot()
    assert snap.baseline_errors["base.json"] == 1 and snap.baseline_loaded["base.json"] is False
    assert offline_values(state)[("all", "all", "all")] == pytest.approx(second.overall.values()["mrr"])
    assert not watcher.reload()  # still broken: retried and counted again, so alerts keep firing
    assert state.snapshot().baseline_errors["base.json"] == 2

    # Half written (a valid prefix of a good file), then completed.
    third = random_window(rng, KEYS)
    full = tmp_path / "full.json"
    write_baseline_file(str(full), third.overall, third.slices)
    data = full.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _bump_mtime(path)
    watcher.reload()
    assert state.snapshot().baseline_errors["base.json"] == 3
    assert offline_values(state)[("all", "all", "all")] == pytest.approx(second.overall.values()["mrr"])
    path.write_bytes(data)
    _bump_mtime(path)
    assert watcher.reload()
    assert offline_values(state)[("all", "all", "all")] == pytest.approx(third.overall.values()["mrr"])
    assert state.snapshot().baseline_loaded["base.json"] is True

    # Deleted: the last good baseline keeps serving; each failed attempt is reported.
    path.unlink()
    watcher.reload()
    watcher.reload()
    snap = state.snapshot()
    assert snap.baseline_errors["base.json"] == 5 and snap.baseline_loaded["base.json"] is False
    assert offline_values(state)[("all", "all", "all")] == pytest.approx(third.overall.values()["mrr"])
    assert "no such file" in watcher.last_errors["base.json"]


def test_reload_job_over_http(tmp_path, free_port) -> None:
    """The APScheduler job picks up a changed and a corrupted file; a scrape shows it."""
    rng = np.random.default_rng(12)
    path = tmp_path / "live.json"
    first = random_window(rng, KEYS)
    write_baseline_file(str(path), first.overall, first.slices)
    state = MetricsState()
    watcher = BaselineWatcher([path], state)
    watcher.load_initial()
    server = MetricsServer(build_registry(state), port=free_port).start()
    scheduler = ExporterScheduler(baselines=watcher, reload_interval_s=0.1).start()
    try:
        assert scheduler.job_ids == [BASELINE_JOB]
        second = random_window(rng, KEYS)
        write_baseline_file(str(path), second.overall, second.slices)
        _bump_mtime(path)
        want = second.overall.values()["ndcg@10"]
        labels = {"metric": "ndcg@10", "source": "offline", "window": "baseline"}
        labels |= {"segment": "all", "surface": "all", "variant": "all"}
        assert _wait_for(
            lambda: one(parse_exposition(scrape(server.url)), "rankwatch_ranking_quality", **labels), want
        )
        path.write_text("not json at all")
        _bump_mtime(path)
        assert _wait_for(
            lambda: min(
                1.0,
                one(
                    parse_exposition(scrape(server.url)),
                    "rankwatch_baseline_load_errors_total",
                    baseline="live.json",
                ),
            ),
            1.0,
        )
        series = parse_exposition(scrape(server.url))
        assert one(series, "rankwatch_ranking_quality", **labels) == pytest.approx(want)
        assert one(series, "rankwatch_baseline_loaded", baseline="live.json") == 0
    finally:
        scheduler.stop()
        server.stop()
    assert not scheduler.running


def _wait_for(read, want: float, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if read() == pytest.approx(want):
                return True
        except AssertionError:
            pass
        time.sleep(0.05)
    return False


def test_variant_baselines_line_up_with_variant_slices_and_first_file_wins(tmp_path) -> None:
    rng = np.random.default_rng(13)
    control = random_window(rng, KEYS)
    treatment = random_window(rng, KEYS)
    shadow = random_window(rng, KEYS)
    p1, p2, p3 = tmp_path / "control.json", tmp_path / "treatment.json", tmp_path / "shadow.json"
    write_baseline_file(str(p1), control.overall, control.slices, variant="control")
    write_baseline_file(str(p2), treatment.overall, treatment.slices, variant="treatment")
    write_baseline_file(str(p3), shadow.overall, shadow.slices, variant="control")
    state = MetricsState()
    BaselineWatcher([p1, p2, p3], state).load_initial(strict=True)
    snap = state.snapshot()
    seg = ("new_user", "home_feed")
    key = (("segment", "new_user"), ("surface", "home_feed"))
    assert snap.offline[(*seg, "control")].metrics["mrr"] == pytest.approx(
        control.slices[key].values()["mrr"]
    )
    assert snap.offline[(*seg, "treatment")].metrics["mrr"] == pytest.approx(
        treatment.slices[key].values()["mrr"]
    )
    assert snap.offline[("all", "all", "control")].requests == control.overall.requests
    assert snap.baseline_slices == {"control.json": 3, "treatment.json": 3, "shadow.json": 0}


def test_strict_initial_load_and_validation(tmp_path) -> None:
    state = MetricsState()
    with pytest.raises(ValueError, match="no such file"):
        BaselineWatcher([tmp_path / "missing.json"], state).load_initial(strict=True)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something-else/2", "result": {"overall": {"requests": 1}}}))
    with pytest.raises(ValueError, match="format"):
        load_baseline_file(bad)
    bad.write_text(json.dumps({"format": "rankwatch-baseline/1", "result": {"overall": {"mrr": 0.5}}}))
    with pytest.raises(ValueError, match="corrupt baseline"):
        load_baseline_file(bad)
    with pytest.raises(ValueError, match="distinct file names"):
        BaselineWatcher([tmp_path / "a" / "x.json", tmp_path / "b" / "x.json"], state)
    # Non-strict: reported, nothing served, nothing invented.
    state = MetricsState()
    BaselineWatcher([tmp_path / "missing.json"], state).load_initial()
    snap = state.snapshot()
    assert snap.offline == {} and snap.baseline_errors == {"missing.json": 1}
    assert not select(parse_exposition_of(state), "rankwatch_ranking_quality", source="offline")


def parse_exposition_of(state: MetricsState):
    from prometheus_client import generate_latest

    return parse_exposition(generate_latest(build_registry(state)).decode())


def test_directory_is_rescanned_and_other_options_are_refused_at_reload(tmp_path) -> None:
    from dataclasses import replace

    from exporter_helpers import OPTIONS

    from rankwatch.exporters.baselines import BaselineExpectation

    rng = np.random.default_rng(17)
    first, second = random_window(rng, KEYS), random_window(rng, KEYS)
    write_baseline_file(str(tmp_path / "a.json"), first.overall, first.slices)
    state = MetricsState()
    expect = BaselineExpectation(OPTIONS, ("segment", "surface"))
    watcher = BaselineWatcher([], state, directory=tmp_path, expect=expect)
    watcher.load_initial(strict=True)
    assert state.snapshot().baseline_slices == {"a.json": 3}
    # A file added to the directory after start serves at the next reload; a removed one stops serving.
    write_baseline_file(str(tmp_path / "b.json"), second.overall, second.slices, variant="treatment")
    assert watcher.reload()
    assert set(state.snapshot().baseline_slices) == {"a.json", "b.json"}
    (tmp_path / "a.json").unlink()
    assert watcher.reload()
    snap = state.snapshot()
    assert set(snap.baseline_slices) == {"b.json"}
    assert ("all", "all", "all") not in snap.offline and ("all", "all", "treatment") in snap.offline
    # Rewritten with other options: refused, the last good version keeps serving, the error names the option.
    expect_linear = BaselineExpectation(replace(OPTIONS, gain="linear"), ("segment", "surface"))
    strict = BaselineWatcher([tmp_path / "b.json"], MetricsState(), expect=expect_linear)
    with pytest.raises(ValueError, match="computed with other metric options: gain is 'exponential' in the baseline, "
                                         "'linear' in the service"):
        strict.load_initial(strict=True)
    by_segment = BaselineExpectation(OPTIONS, ("segment",))
    with pytest.raises(ValueError, match=r"slice_by is \['segment', 'surface'\] in the baseline, \['segment'\]"):
        BaselineWatcher([tmp_path / "b.json"], MetricsState(), expect=by_segment).load_initial(strict=True)
    # A per-variant file need not split on variant when the service does.
    with_variant = BaselineExpectation(OPTIONS, ("segment", "surface", "variant"))
    BaselineWatcher([tmp_path / "b.json"], MetricsState(), expect=with_variant).load_initial(strict=True)
    watcher.expect = expect_linear
    _bump_mtime(tmp_path / "b.json")
    assert not watcher.reload()
    assert "gain is 'exponential' in the baseline" in watcher.last_errors["b.json"]
    snap = state.snapshot()
    assert set(snap.baseline_slices) == {"b.json"} and snap.baseline_loaded["b.json"] is False
