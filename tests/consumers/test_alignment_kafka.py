"""The two topics' merge against a real broker: one topic's burst written a moment before the other's.

One producer writing a burst of both topics lands each topic's batch in its own produce request; a service
that is caught up can fetch the clicks of the burst while their impressions are not on the broker yet, and
the broker then truthfully answers that the impressions topic has nothing more. Fed at once, the clicks
would move the watermark minutes ahead, and the impressions landing a moment later would be late
(consumers/alignment.py, "Overtaking waits"). The gap is stretched here to a second, within the grace the
test configures, so that the service surely fetches the clicks alone.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka_helpers import (
    past_first_close,
    produce_to,
    start_run,
    stop_run,
    wait_consuming,
    wait_for,
    write_config,
)
from kafka_oracle import expected_windows
from test_service_kafka import WINDOWS, _assert_matches, _create, _traffic, _windows_by_identity

from rankwatch.consumers.producer import window_closers
from rankwatch.pipeline.traffic.generator import generate_with_truth

pytestmark = pytest.mark.kafka


def test_clicks_written_a_moment_before_their_impressions_wait_for_them(kafka_broker: Any, unique: str,
                                                                       tmp_path: Path) -> None:
    events, rows = generate_with_truth(_traffic(21, minutes=3, rate=6))
    _create(kafka_broker.bootstrap, unique, 2)
    want = expected_windows(rows, windows=WINDOWS, partitions=2)
    config = write_config(tmp_path / "run.toml", bootstrap=kafka_broker.bootstrap, prefix=unique,
                          kafka_extra='overtake_grace = "10s"')
    half = past_first_close(events)
    rest = events[half:]
    last = max(e.ts_ms for e in events)
    out, log = tmp_path / "w.jsonl", tmp_path / "run.log"
    proc = start_run(config, out, log)
    try:
        wait_consuming(log, 0, procs=(proc,))
        produce_to(kafka_broker.bootstrap, unique, events[:half])
        wait_for(lambda: out.exists() and out.read_text().strip(), timeout=240, what="first windows", procs=(proc,),
                 log=log)
        produce_to(kafka_broker.bootstrap, unique, [e for e in rest if e.stream == "clicks"])
        time.sleep(1.0)  # a stimulus (the gap between the two topics' writes), not a wait for a condition
        produce_to(kafka_broker.bootstrap, unique, [e for e in rest if e.stream == "impressions"]
                 + window_closers(2, last + 2 * 3_600_000, record_ts_ms=last + 1))
        wait_for(lambda: set(want) <= set(_windows_by_identity(out)), timeout=300, what="all windows", procs=(proc,),
                 log=log)
    finally:
        assert stop_run(proc) == 0, log.read_text()[-3000:]
    _assert_matches(_windows_by_identity(out), want)
