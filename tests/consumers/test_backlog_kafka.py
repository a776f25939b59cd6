"""A backlog of 300,000+ messages is consumed to the end (the stall), windows equal to the truth.

Before the fix the service counted about half of such a backlog and then nothing more, for good: the
clicks buffer filled first, was paused, and kafka-python 3.0.12 never handed its parked records back
(consumers/fetch_compat.py). The backlog is produced before the service starts, with a fresh group and the
default buffer cap (20,000 records per topic-partition), so flow control pauses and resumes many times.
CI produces it with confluent-kafka's batching producer (``murmur2_random``, ``linger.ms`` 20, as in the
issue). ``rankwatch simulate --fast`` (the issue's own reproduction, and its pandas ground truth) runs in CI
on 20,000 requests with a buffer cap of 2,000 records, so the buffers still fill and pause many times;
``RANKWATCH_SLOW=1`` runs it on the issue's 100,000 requests with the default cap.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kafka_helpers import start_run, stop_run, wait_for, write_config
from kafka_oracle import expected_windows, read_truth
from test_service_kafka import WINDOWS, _assert_matches, _create, _windows_by_identity

from rankwatch.cli import main
from rankwatch.consumers.producer import window_closers
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_with_truth

pytestmark = pytest.mark.kafka

PARTITIONS = 4


def _produce_confluent(bootstrap: str, prefix: str, events: list[Any]) -> int:
    import confluent_kafka  # the test extra installs it: a missing one is an error, not a skip
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": "murmur2_random", "acks": "all",
        "queue.buffering.max.messages": 1_000_000, "batch.num.messages": 10_000,
    })
    topics = {"impressions": f"{prefix}-imp", "clicks": f"{prefix}-clk"}
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    last = max(e.ts_ms for e in events)
    closers = window_closers(PARTITIONS, last + 2 * 3_600_000, record_ts_ms=last + 1)
    for i, e in enumerate([*events, *closers]):
        producer.produce(topics[e.stream], key=e.key, value=e.value, timestamp=e.ts_ms if i < len(events) else last + 1,
                         on_delivery=report)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0 and not failed, failed[:3]
    return len(events)


def _consume_all(bootstrap: str, prefix: str, tmp: Path, want: dict[Any, Any], *, kafka_extra: str = "") -> None:
    config = write_config(tmp / "run.toml", bootstrap=bootstrap, prefix=prefix, checkpoint_interval="2s",
                          kafka_extra=kafka_extra)
    config.write_text(config.read_text().replace("max_poll_records = 500", "max_poll_records = 2000"))
    out, log = tmp / "windows.jsonl", tmp / "run.log"
    proc = start_run(config, out, log)
    try:
        wait_for(lambda: set(want) <= set(_windows_by_identity(out)), timeout=240, what="every window of the backlog",
                 procs=(proc,))
    finally:
        assert stop_run(proc) == 0, log.read_text()[-3000:]
    _assert_matches(_windows_by_identity(out), want)


def test_confluent_batched_backlog_is_consumed_to_the_end(kafka_broker: Any, unique: str, tmp_path: Path) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=11)
    cfg = TrafficConfig(seed=15, start=start, requests_per_second=240, duration_s=600, items_per_request=10,
                        duplicate_rate=0.01, out_of_order_ms=3000, attribution_window_ms=60_000)
    events, rows = generate_with_truth(cfg)
    assert len(events) >= 300_000
    _create(kafka_broker.bootstrap, unique, PARTITIONS)
    _produce_confluent(kafka_broker.bootstrap, unique, events)
    want = expected_windows(rows, windows=WINDOWS, partitions=PARTITIONS)
    _consume_all(kafka_broker.bootstrap, unique, tmp_path, want)


def test_simulate_fast_backlog_is_consumed_to_the_end(kafka_broker: Any, unique: str, tmp_path: Path) -> None:
    full = os.environ.get("RANKWATCH_SLOW") == "1"
    truth = tmp_path / "truth.jsonl"
    rc = main(["simulate", "--bootstrap-servers", kafka_broker.bootstrap, "--impressions-topic", f"{unique}-imp",
               "--clicks-topic", f"{unique}-clk", "--create-topics", "--partitions", str(PARTITIONS), "--fast",
               "--rate", "1000", "--duration", "100s" if full else "20s", "--seed", "3", "--attribution-window", "1m",
               "--ground-truth", str(truth), "--close-windows", "2h"])
    assert rc == 0
    want = expected_windows(read_truth(truth), windows=WINDOWS, partitions=PARTITIONS)
    # The cap (records per topic-partition buffer) well below the backlog: flow control pauses and resumes.
    _consume_all(kafka_broker.bootstrap, unique, tmp_path, want,
                 kafka_extra="" if full else "max_buffered_records = 2000")
