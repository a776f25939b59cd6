"""Snapshots: stop anywhere, restore (in this process or a fresh one), continue: identical output."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor
from rankwatch.pipeline.stream.snapshot import SnapshotError
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_events

START = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
CFG = TrafficConfig(
    seed=21, start=START, duration_s=2400, requests_per_second=0.3, duplicate_rate=0.05, malformed_rate=0.03,
    out_of_order_ms=20_000, item_form_share=0.3, rfc3339_share=0.2, orphan_rate=0.05, late_rate=0.05,
)
# Small windows and attribution so a snapshot catches open windows, pending requests and early feedback.
STREAM = StreamConfig(windows=("1m", "5m"), attribution_window_ms=120_000, max_pending_requests=40)


def feed(proc: StreamProcessor, events) -> list[dict]:
    out = []
    for e in events:
        fn = proc.process_impression if e.stream == "impressions" else proc.process_feedback
        out += [w.document() for w in fn(e.value)]
    out += [w.document() for w in proc.flush()]
    return out


def stats_dict(proc: StreamProcessor) -> dict:
    s = proc.stats()
    return {**s.__dict__, "rejects": sorted(s.rejects.items())}


@pytest.fixture(scope="module")
def events():
    return list(generate_events(CFG))


@pytest.fixture(scope="module")
def reference(events):
    proc = StreamProcessor(STREAM, clock=ManualClock(START))
    return feed(proc, events), stats_dict(proc)


def run_with_restart(events, k: int) -> tuple[list[dict], dict, bytes]:
    first = StreamProcessor(STREAM, clock=ManualClock(START))
    out = []
    for e in events[:k]:
        fn = first.process_impression if e.stream == "impressions" else first.process_feedback
        out += [w.document() for w in fn(e.value)]
    data = first.snapshot()
    second = StreamProcessor.restore(data, config=STREAM, clock=ManualClock(START))
    assert second.snapshot() == data  # restore is lossless
    out += feed(second, events[k:])
    return out, stats_dict(second), data


@settings(max_examples=10, deadline=None)
@given(fraction=st.floats(0.0, 1.0))
def test_snapshot_restore_continue_is_identical(events, reference, fraction):
    k = int(fraction * len(events))
    out, stats, _ = run_with_restart(events, k)
    assert out == reference[0]
    assert stats == reference[1]


def test_snapshot_holds_pending_state(events):
    proc = StreamProcessor(STREAM, clock=ManualClock(START))
    for e in events[: len(events) // 2]:
        (proc.process_impression if e.stream == "impressions" else proc.process_feedback)(e.value)
    s = proc.stats()
    assert s.pending_requests > 0 and s.evicted_requests > 0  # the cap of 40 was hit
    restored = StreamProcessor.restore(proc.snapshot(), config=STREAM, clock=ManualClock(START))
    assert stats_dict(restored) == stats_dict(proc)


def test_restore_in_a_fresh_process(events, reference, tmp_path: Path):
    k = len(events) // 3
    first = StreamProcessor(STREAM, clock=ManualClock(START))
    before = []
    for e in events[:k]:
        fn = first.process_impression if e.stream == "impressions" else first.process_feedback
        before += [w.document() for w in fn(e.value)]
    snap = tmp_path / "state.msgpack"
    snap.write_bytes(first.snapshot())
    script = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from test_snapshot import CFG, STREAM, START, feed, stats_dict
from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.traffic.generator import generate_events
from rankwatch.pipeline.stream.processor import StreamProcessor
events = list(generate_events(CFG))
proc = StreamProcessor.restore(open({str(snap)!r}, "rb").read(), config=STREAM, clock=ManualClock(START))
out = feed(proc, events[{k}:])
print(json.dumps({{"windows": out, "stats": stats_dict(proc)}}, default=str))
"""
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # a different string hash than this process
    root = Path(__file__).resolve().parents[3]
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=root, check=True)
    child = json.loads(res.stdout)
    assert before + child["windows"] == json.loads(json.dumps(reference[0]))
    assert child["stats"] == json.loads(json.dumps(reference[1], default=str))


def test_restore_refuses_other_windows_and_garbage():
    proc = StreamProcessor(STREAM, clock=ManualClock(START))
    data = proc.snapshot()
    with pytest.raises(SnapshotError, match="windows"):
        StreamProcessor.restore(data, config=StreamConfig(), clock=ManualClock(START))
    with pytest.raises(SnapshotError):
        StreamProcessor.restore(b"\x00garbage", config=STREAM, clock=ManualClock(START))
    # caps may change between runs
    bigger = StreamConfig(windows=("1m", "5m"), attribution_window_ms=120_000, max_pending_requests=10_000)
    assert StreamProcessor.restore(data, config=bigger, clock=ManualClock(START)).stats().pending_requests == 0


@pytest.mark.parametrize(
    ("changed", "names"),
    [
        ({"windows": ("1m", "10m")}, ["windows"]),
        ({"attribution_window_ms": 60_000}, ["attribution_window_ms"]),
        ({"slice_spec": SliceSpec(by=("segment", "surface", "variant"))}, ["slice_by"]),
        ({"metric_options": MetricOptions(gain="linear")}, ["metric_options"]),
        ({"windows": ("5m",), "slice_spec": SliceSpec(by=("segment",))}, ["windows", "slice_by"]),
    ],
)
def test_a_changed_config_is_named_change_by_change(changed, names):
    """What the service needs to start a pair fresh with one warning: every changed setting, by name, and
    an exception that survives the core process boundary (pickle)."""
    import pickle

    from rankwatch.pipeline.stream.snapshot import ConfigChanged

    data = StreamProcessor(STREAM, clock=ManualClock(START)).snapshot()
    with pytest.raises(ConfigChanged) as info:
        StreamProcessor.restore(data, config=dataclasses.replace(STREAM, **changed), clock=ManualClock(START))
    assert [c.split("=")[0] for c in info.value.changes] == names
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, ConfigChanged) and again.changes == info.value.changes and str(again) == str(info.value)


def test_a_snapshot_of_another_format_version_is_a_config_change_not_a_crash() -> None:
    import msgspec

    from rankwatch.pipeline.stream.snapshot import FORMAT, ConfigChanged, decode_snapshot

    other = msgspec.msgpack.encode({"format": FORMAT, "version": 99, "config": {}, "state": {}})
    with pytest.raises(ConfigChanged) as caught:
        decode_snapshot(other, {})
    assert "version=99" in str(caught.value)
