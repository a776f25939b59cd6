"""``rankwatch run`` against a real broker: end to end, crashes, a broker restart, a rebalance.

The oracle is the generator's joined ground truth pushed through the offline path per (partition, window)
(tests/consumers/oracle.py); ``rankwatch replay`` on the same raw events is the second reference. Windows
are closed by marker impressions far ahead in event time (``--close-windows``), never by the wall clock, so
every outcome is deterministic.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka_helpers import (
    consuming_count,
    past_first_close,
    produce_to,
    start_run,
    stop_run,
    wait_consuming,
    wait_for,
    write_config,
)
from kafka_oracle import assert_documents_equal, expected_windows, read_truth

from rankwatch.cli import main
from rankwatch.consumers.producer import partition_of, window_closers
from rankwatch.consumers.topics import ensure_topic
from rankwatch.consumers.windows_out import document_identity, read_windows
from rankwatch.pipeline.events.validation import (
    DEFAULT_ACTION_GRADES,
    Rejection,
    decode_feedback,
    decode_impression,
)
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_with_truth

pytestmark = pytest.mark.kafka

WINDOWS = ("1m", "5m")


def _windows_by_identity(*paths: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Union of windows files; an identity seen twice must carry the same values (a republication)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for path in paths:
        if not path.exists():
            continue
        for doc in read_windows(path):
            ident = document_identity(doc)
            if ident in out:
                assert_documents_equal(doc, out[ident], context=f"republished {ident}")
            out[ident] = doc
    return out


def _assert_matches(got: dict[tuple[Any, ...], dict[str, Any]], want: dict[tuple[Any, ...], dict[str, Any]]) -> None:
    traffic = {k: v for k, v in got.items() if k in want}
    assert set(want) <= set(got), f"missing windows: {sorted(set(want) - set(got))[:5]}"
    for ident, doc in want.items():
        assert_documents_equal(traffic[ident], doc, context=str(ident))


def _traffic(seed: int, *, minutes: float, rate: float) -> TrafficConfig:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=minutes + 1)
    return TrafficConfig(seed=seed, start=start, requests_per_second=rate, duration_s=minutes * 60,
                         items_per_request=10, duplicate_rate=0.02, out_of_order_ms=3000,
                         attribution_window_ms=60_000)


def _produce(bootstrap: str, prefix: str, events: list[Any], *, close: bool, partitions: int) -> None:
    if close:
        last = max(e.ts_ms for e in events)
        events = [*events, *window_closers(partitions, last + 2 * 3_600_000, record_ts_ms=last + 1)]
    produce_to(bootstrap, prefix, events)


def _create(bootstrap: str, prefix: str, partitions: int) -> None:
    for t in ("imp", "clk"):
        ensure_topic({"bootstrap_servers": [bootstrap]}, f"{prefix}-{t}", partitions=partitions)


@pytest.mark.parametrize("core_process", [True, False], ids=["core-process", "one-process"])
def test_end_to_end_run_equals_replay_and_offline(kafka_broker: Any, unique: str, tmp_path: Path,
                                                  core_process: bool) -> None:
    b = kafka_broker.bootstrap
    truth, events = tmp_path / "truth.jsonl", tmp_path / "events"
    rc = main(["simulate", "--bootstrap-servers", b, "--impressions-topic", f"{unique}-imp",
               "--clicks-topic", f"{unique}-clk", "--create-topics", "--partitions", "2", "--fast",
               "--rate", "8", "--duration", "3m", "--seed", "11", "--items-per-request", "10",
               "--attribution-window", "1m", "--malformed-rate", "0.03", "--duplicate-rate", "0.03",
               "--out-of-order", "3s", "--ground-truth", str(truth), "--events-out", str(events),
               "--close-windows", "2h"])
    assert rc == 0
    want = expected_windows(read_truth(truth), windows=WINDOWS, partitions=2)
    config = write_config(tmp_path / "run.toml", bootstrap=b, prefix=unique,
                          kafka_extra=f"core_process = {str(core_process).lower()}")
    out = tmp_path / "windows.jsonl"
    proc = start_run(config, out, tmp_path / "run.log")
    try:
        wait_for(lambda: set(want) <= set(_windows_by_identity(out)), timeout=90, what="all windows", procs=(proc,))
    finally:
        assert stop_run(proc) == 0, (tmp_path / "run.log").read_text()[-3000:]
    got = _windows_by_identity(out)
    _assert_matches(got, want)

    # rankwatch replay on each partition's raw events gives the same windows.
    for p in range(2):
        files = {}
        for stream in ("impressions", "clicks"):
            lines = (events / f"{stream}.jsonl").read_bytes().splitlines()
            mine = [ln for ln in lines if _partition_of_line(ln, 2) == p]
            files[stream] = tmp_path / f"{stream}-{p}.jsonl"
            files[stream].write_bytes(b"\n".join(mine) + b"\n")
        replay_out = tmp_path / f"replay-{p}.jsonl"
        rc = main(["replay", "--impressions", str(files["impressions"]), "--clicks", str(files["clicks"]),
                   "--window", "1m", "--window", "5m", "--attribution-window", "1m", "--allowed-disorder", "5s",
                   "--format", "json", "--windows-out", str(replay_out)])
        assert rc == 0
        replayed = {(d["window"], d["start"]): d for d in read_windows(replay_out)}
        mine_run = {(w, s): d for (w, s, parts), d in got.items() if parts == (p,) and (w, s, parts) in want}
        assert set(mine_run) == set(replayed)
        for key, doc in replayed.items():
            assert_documents_equal(mine_run[key], doc, context=f"replay p{p} {key}")

    # Every rejected event is in the dead-letter topic with its origin; nothing else is.
    _check_dead_letters(b, unique, events)


def _partition_of_line(line: bytes, partitions: int) -> int:
    try:
        rid = json.loads(line)["request_id"]
        return partition_of(str(rid).encode(), partitions) if isinstance(rid, str) else 0
    except (ValueError, KeyError, TypeError):
        return 0  # malformed: goes to the dead letters whatever the partition


def _check_dead_letters(bootstrap: str, prefix: str, events: Path) -> None:
    expected: Counter[tuple[str, bytes, str]] = Counter()
    for stream in ("impressions", "clicks"):
        for line in (events / f"{stream}.jsonl").read_bytes().splitlines():
            decoded = (decode_impression(line, max_event_bytes=1_000_000, max_items=200) if stream == "impressions"
                       else decode_feedback(line, action_grades=DEFAULT_ACTION_GRADES, max_event_bytes=1_000_000))
            if isinstance(decoded, Rejection):
                expected[(stream, line, str(decoded.reason))] += 1
    assert expected, "the traffic should contain malformed events"
    consumer = KafkaConsumer(f"{prefix}-group.dead-letters", bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=5000)
    letters = list(consumer)
    consumer.close()
    got: Counter[tuple[str, bytes, str]] = Counter()
    origin = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    for rec in letters:
        h = {k: v.decode() for k, v in rec.headers}
        got[(h["rankwatch.stream"], rec.value, h["rankwatch.reason"])] += 1
        assert h["rankwatch.topic"] == f"{prefix}-{'imp' if h['rankwatch.stream'] == 'impressions' else 'clk'}"
        tp = TopicPartition(h["rankwatch.topic"], int(h["rankwatch.partition"]))
        origin.assign([tp])
        origin.seek(tp, int(h["rankwatch.offset"]))
        original = origin.poll(timeout_ms=5000, max_records=1)[tp][0]
        assert original.value == rec.value
    origin.close()
    # Raw lines of events-out are the values; newlines inside a malformed value would split it, so compare
    # the multiset of (stream, reason) and every value that survived the line split.
    assert Counter((s, r) for s, _, r in got.elements()) == Counter((s, r) for s, _, r in expected.elements())
    assert +(expected - got) == Counter() or all(b"\n" in v for _, v, _ in (expected - got))


def _sigkill_scenario(broker: Any, prefix: str, tmp_path: Path, *, kills: int, seed: int) -> None:
    """Traffic arrives in ``kills + 1`` bursts; each incarnation but the last is SIGKILLed at a random
    moment while it consumes its burst; the last one finishes. Every window must equal the truth."""
    cfg = _traffic(seed, minutes=4, rate=15)
    events, rows = generate_with_truth(cfg)
    _create(broker.bootstrap, prefix, 2)
    want = expected_windows(rows, windows=WINDOWS, partitions=2)
    config = write_config(tmp_path / "run.toml", bootstrap=broker.bootstrap, prefix=prefix,
                          checkpoint_interval="300ms", kafka_extra=f'instance_id = "{prefix}-a"')
    rng = random.Random(seed)
    bursts = [events[i * len(events) // (kills + 1):(i + 1) * len(events) // (kills + 1)] for i in range(kills + 1)]
    log = tmp_path / "run.log"
    outs = []
    for i in range(kills + 1):
        out = tmp_path / f"windows-{i}.jsonl"
        outs.append(out)
        before = consuming_count(log)
        proc = start_run(config, out, log)
        last = i == kills
        try:
            wait_consuming(log, before, procs=(proc,))
            _produce(broker.bootstrap, prefix, bursts[i], close=last, partitions=2)
            if not last:
                time.sleep(rng.uniform(0.0, 1.0))  # somewhere while the burst is being consumed
        finally:
            if not last:
                stop_run(proc, kill=True)
    try:
        wait_for(lambda: set(want) <= set(_windows_by_identity(*outs)), timeout=90, what="all windows", procs=(proc,))
    finally:
        assert stop_run(proc) == 0, log.read_text()[-3000:]
    _assert_matches(_windows_by_identity(*outs), want)


def test_sigkill_at_random_points_then_restart_gives_the_truth(kafka_broker: Any, unique: str, tmp_path: Path) -> None:
    _sigkill_scenario(kafka_broker, unique, tmp_path, kills=3, seed=5)


def test_broker_stop_start_mid_stream(kafka_broker: Any, unique: str, tmp_path: Path) -> None:
    if kafka_broker.port is None:
        pytest.skip("an external broker cannot be restarted by the test")
    cfg = _traffic(21, minutes=4, rate=10)
    events, rows = generate_with_truth(cfg)
    half = past_first_close(events)
    _create(kafka_broker.bootstrap, unique, 2)
    _produce(kafka_broker.bootstrap, unique, events[:half], close=False, partitions=2)
    want = expected_windows(rows, windows=WINDOWS, partitions=2)
    config = write_config(tmp_path / "run.toml", bootstrap=kafka_broker.bootstrap, prefix=unique,
                          checkpoint_interval="500ms")
    out = tmp_path / "windows.jsonl"
    proc = start_run(config, out, tmp_path / "run.log")
    try:
        wait_for(lambda: out.exists() and out.stat().st_size > 0, timeout=180, what="first window", procs=(proc,),
                 log=tmp_path / "run.log")
        kafka_broker.stop()
        time.sleep(1.0)
        kafka_broker.start()
        _produce(kafka_broker.bootstrap, unique, events[half:], close=True, partitions=2)
        wait_for(lambda: set(want) <= set(_windows_by_identity(out)), timeout=120, what="all windows", procs=(proc,))
    finally:
        assert stop_run(proc) == 0, (tmp_path / "run.log").read_text()[-3000:]
    _assert_matches(_windows_by_identity(out), want)


def test_second_instance_joining_mid_stream_gives_the_same_windows(kafka_broker: Any, unique: str, tmp_path: Path) -> None:
    cfg = _traffic(33, minutes=4, rate=12)
    events, rows = generate_with_truth(cfg)
    half = past_first_close(events)
    _create(kafka_broker.bootstrap, unique, 4)
    _produce(kafka_broker.bootstrap, unique, events[:half], close=False, partitions=4)
    want = expected_windows(rows, windows=WINDOWS, partitions=4)
    config = write_config(tmp_path / "run.toml", bootstrap=kafka_broker.bootstrap, prefix=unique,
                          checkpoint_interval="500ms")
    out_a, out_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a = start_run(config, out_a, tmp_path / "a.log")
    b = None
    try:
        wait_for(lambda: out_a.exists() and out_a.stat().st_size > 0, timeout=180, what="A's first window",
                 procs=(a,), log=tmp_path / "a.log")
        b = start_run(config, out_b, tmp_path / "b.log")
        # B joins: the group rebalances, A checkpoints and hands over half of the pairs.
        wait_consuming(tmp_path / "b.log", 0, procs=(a, b))
        _produce(kafka_broker.bootstrap, unique, events[half:], close=True, partitions=4)
        wait_for(lambda: set(want) <= set(_windows_by_identity(out_a, out_b)), timeout=120, what="all windows",
                 procs=(a, b))
    finally:
        assert stop_run(a) == 0, (tmp_path / "a.log").read_text()[-3000:]
        if b is not None:
            assert stop_run(b) == 0, (tmp_path / "b.log").read_text()[-3000:]
    merged = _windows_by_identity(out_a, out_b)
    _assert_matches(merged, want)
    # Both instances did publish: the second one really took over partitions mid-stream.
    assert read_windows(out_b), "the second instance published nothing"
