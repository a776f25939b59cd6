"""APScheduler jobs: idle ticks close windows, lag polling reaches the scrape, failing jobs retry, clean stop."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from exporter_helpers import T0

from rankwatch.exporters.scheduling import BASELINE_JOB, LAG_JOB, TICK_JOB, ExporterScheduler
from rankwatch.exporters.state import MetricsState
from rankwatch.pipeline.clock import ManualClock, datetime_to_ms
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor


def _wait(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_idle_tick_job_publishes_windows_when_traffic_stops() -> None:
    config = StreamConfig(
        windows=("5m",), attribution_window_ms=60_000, allowed_disorder_ms=0, idle_timeout_ms=1_000
    )
    clock = ManualClock(T0)
    processor = StreamProcessor(config, clock=clock)
    state = MetricsState.for_stream(config)
    lock = threading.Lock()
    doc = {"event_id": "e1", "request_id": "r1", "ts": datetime_to_ms(T0), "segment": "a", "surface": "b",
           "items": [{"item_id": "i1", "position": 1, "score": 0.5}, {"item_id": "i2", "position": 2, "score": 0.1}]}  # fmt: skip
    processor.process_impression(json.dumps(doc).encode())
    click = {
        "event_id": "c1",
        "request_id": "r1",
        "item_id": "i1",
        "ts": datetime_to_ms(T0) + 1,
        "action": "click",
    }
    processor.process_feedback(json.dumps(click).encode())

    def tick() -> None:
        with lock:
            for pw in processor.tick():
                state.publish_window(pw)
            state.set_stream_stats(processor.stats())

    scheduler = ExporterScheduler(tick=tick, tick_interval_s=0.05)
    with scheduler:
        assert scheduler.job_ids == [TICK_JOB]
        time.sleep(0.2)
        assert state.snapshot().windows_published == {}  # the clock has not moved: nothing closes
        with lock:
            clock.advance(timedelta(minutes=10))  # traffic stopped; time goes on
        assert _wait(lambda: state.snapshot().windows_published.get("5m") == 1)
    assert not scheduler.running
    online = state.snapshot().online["5m"]
    assert online.start == T0 and online.series[("all", "all", "all")].metrics["mrr"] == 1.0


def test_lag_polling_failures_and_clean_stop() -> None:
    state = MetricsState()
    calls = {"lag": 0, "boom": 0}
    finished = threading.Event()

    def lag() -> dict[tuple[str, int], int]:
        calls["lag"] += 1
        return {("impressions", 0): calls["lag"], ("clicks", 3): 0}

    def boom() -> None:
        calls["boom"] += 1
        time.sleep(0.05)
        finished.set()
        raise RuntimeError("a failing job must not stop the scheduler")

    scheduler = ExporterScheduler(state=state, lag=lag, lag_interval_s=0.05, tick=boom, tick_interval_s=0.05)
    assert scheduler.job_ids == sorted([LAG_JOB, TICK_JOB])
    scheduler.start()
    try:
        assert _wait(
            lambda: calls["boom"] >= 3 and state.snapshot().consumer_lag.get(("impressions", 0), 0) >= 3
        )
    finally:
        scheduler.stop()
    assert not scheduler.running
    after = dict(calls)
    time.sleep(0.2)
    assert calls == after  # nothing runs after stop
    assert state.snapshot().consumer_lag[("clicks", 3)] == 0
    scheduler.stop()  # idempotent


def test_scheduler_validates_arguments(tmp_path) -> None:
    with pytest.raises(ValueError, match="state"):
        ExporterScheduler(lag=dict)
    with pytest.raises(ValueError, match="positive"):
        ExporterScheduler(tick=lambda: None, tick_interval_s=0)
    from rankwatch.exporters.baselines import BaselineWatcher

    scheduler = ExporterScheduler(baselines=BaselineWatcher([tmp_path / "b.json"], MetricsState()))
    assert scheduler.job_ids == [BASELINE_JOB]
