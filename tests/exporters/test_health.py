"""Health families fed from the real streaming core: outcomes, reject reasons, label overflow, watermark."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from exporter_helpers import T0, one, parse_exposition, select
from prometheus_client import generate_latest

from rankwatch.exporters.collector import build_registry
from rankwatch.exporters.health import health_from_stats
from rankwatch.exporters.state import MetricsState
from rankwatch.pipeline.clock import ManualClock, datetime_to_ms
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.processor import OUTCOMES, StreamConfig, StreamProcessor


def _impression(i: int, ts: int, segment: str) -> bytes:
    items = [{"item_id": f"i{j}", "position": j + 1, "score": 1.0 - j / 10} for j in range(3)]
    doc = {"event_id": f"imp-{i}", "request_id": f"r-{i}", "ts": ts, "segment": segment, "surface": "home_feed",
           "items": items}  # fmt: skip
    return json.dumps(doc).encode()


def _click(i: int, ts: int) -> bytes:
    return json.dumps(
        {"event_id": f"clk-{i}", "request_id": f"r-{i}", "item_id": "i1", "ts": ts, "action": "click"}
    ).encode()


def test_stream_health_and_label_overflow_through_the_exporter() -> None:
    cap = 20
    config = StreamConfig(
        windows=("5m",), attribution_window_ms=60_000, allowed_disorder_ms=0,
        slice_spec=SliceSpec(by=("segment", "surface"), max_values_per_label=cap),
    )  # fmt: skip
    clock = ManualClock(T0)
    processor = StreamProcessor(config, clock=clock)
    state = MetricsState.for_stream(config)
    t0 = datetime_to_ms(T0)
    n = 2_000  # distinct segment values: the stream folds all but `cap` of them
    for i in range(n):
        for pw in processor.process_impression(_impression(i, t0 + i * 10, f"seg-{i}")):
            state.publish_window(pw)
        for pw in processor.process_feedback(_click(i, t0 + i * 10 + 5)):
            state.publish_window(pw)
    processor.process_impression(_impression(0, t0, "seg-0"))  # duplicate event_id
    processor.process_impression(b"{not json")
    processor.process_feedback(_click(n + 5, t0 + 1))  # a request never seen
    clock.set(T0 + timedelta(minutes=10))
    for pw in processor.flush():
        state.publish_window(pw)
    stats = processor.stats()
    state.set_stream_stats(stats)
    text = generate_latest(build_registry(state, event_clock=clock)).decode()
    series = parse_exposition(text)

    for stream in ("impressions", "clicks"):
        for outcome in OUTCOMES:
            assert (
                one(series, "rankwatch_events_total", stream=stream, outcome=outcome)
                == stats.outcomes[stream][outcome]
            )
    assert one(series, "rankwatch_events_total", stream="impressions", outcome="duplicate") == 1
    rejects = select(series, "rankwatch_rejected_events_total", stream="impressions")
    assert sum(rejects.values()) == 1
    assert one(series, "rankwatch_label_values", label="segment") == cap
    assert one(series, "rankwatch_label_values_limit") == cap
    assert (
        one(series, "rankwatch_label_overflow_total", label="segment") == stats.label_overflow["segment"] > 0
    )
    segments = {dict(k)["segment"] for k in select(series, "rankwatch_ranking_requests", source="online")}
    assert len(segments) <= cap + 2  # admitted values, __other__ and the roll-up "all"
    assert sum(select(series, "rankwatch_finalized_requests_total", segment="all").values()) == n
    assert one(series, "rankwatch_pending_requests") == stats.pending_requests == 0
    wm = stats.watermark_ms
    assert wm is not None
    delay = (datetime_to_ms(clock.now()) - wm) / 1000
    assert one(series, "rankwatch_watermark_delay_seconds") == max(delay, 0.0)


def test_health_copy_fills_every_outcome() -> None:
    config = StreamConfig()
    processor = StreamProcessor(config, clock=ManualClock(datetime(2026, 1, 1, tzinfo=UTC)))
    figures = health_from_stats(processor.stats())
    assert set(figures.events) == {(s, o) for s in ("impressions", "clicks") for o in OUTCOMES}
    assert set(figures.events.values()) == {0}
    assert figures.watermark_ms is None
