"""The broker stopped at the moments that used to kill or stall ``rankwatch run``.

Each scenario stops the real broker (deploy/kafka/local.sh) while an instance joins the group, while the
group rebalances (one of two instances SIGKILLed and restarted, the broker stopped 2.5-4 s later, while
the group still waits for the dead member), while checkpoints are written under traffic, and sends
SIGTERM in the middle of an outage. The oracle is the one of test_service_kafka.py: the windows equal the
offline truth, every instance exits 0 on SIGTERM, and each outage is logged once. CI runs joining,
checkpointing and SIGTERM in one run (three broker stops) and one round of each scenario alone;
``RANKWATCH_SLOW=1`` runs 5 rounds of each, which stop at the first failure.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from kafka_helpers import Broker, consuming_count, start_run, stop_run, wait_consuming, wait_for, write_config
from kafka_oracle import expected_windows
from test_service_kafka import WINDOWS, _assert_matches, _create, _produce, _traffic, _windows_by_identity

from rankwatch.pipeline.traffic.generator import generate_with_truth

pytestmark = pytest.mark.kafka

ROUNDS = 5 if os.environ.get("RANKWATCH_SLOW") == "1" else 1
UNREACHABLE, BACK = "Kafka unreachable (", "Kafka reachable again after"


def _need_own_broker(broker: Broker) -> None:
    if broker.port is None:
        pytest.skip("an external broker cannot be restarted by the test")


def _assert_one_line_per_outage(*logs: Path) -> int:
    """Every outage is logged once: an 'unreachable' line is never followed by another before 'again'."""
    outages = 0
    for log in logs:
        state = "up"
        for line in log.read_text(errors="replace").splitlines():
            if UNREACHABLE in line:
                assert state == "up", f"outage logged twice in {log.name}: {line}"
                state, outages = "down", outages + 1
            elif BACK in line:
                state = "up"
            assert "Traceback" not in line, log.read_text()[-3000:]
    return outages


def _scenario(broker: Broker, prefix: str, tmp: Path, *, seed: int, when: str) -> None:
    rng = random.Random(seed)
    events, rows = generate_with_truth(_traffic(seed, minutes=4, rate=12))
    half = len(events) // 2
    partitions = 4 if when == "rebalance" else 2
    _create(broker.bootstrap, prefix, partitions)
    want = expected_windows(rows, windows=WINDOWS, partitions=partitions)
    config = write_config(tmp / "run.toml", bootstrap=broker.bootstrap, prefix=prefix, checkpoint_interval="300ms",
                          kafka_extra='shutdown_timeout = "10s"')
    logs, outs, procs = [tmp / "a.log", tmp / "b.log"], [tmp / "a.jsonl", tmp / "b.jsonl"], []
    try:
        if when == "join":
            _produce(broker.bootstrap, prefix, events[:half], close=False, partitions=partitions)
            procs.append(start_run(config, outs[0], logs[0]))
            time.sleep(rng.uniform(0.3, 2.0))  # start-up done, the group join under way
            broker.stop()
            time.sleep(rng.uniform(1.0, 3.0))
            broker.start()
            _produce(broker.bootstrap, prefix, events[half:], close=True, partitions=partitions)
        elif when == "rebalance":
            _produce(broker.bootstrap, prefix, events[:half], close=False, partitions=partitions)
            procs += [start_run(config, outs[0], logs[0]), start_run(config, outs[1], logs[1])]
            wait_for(lambda: consuming_count(logs[0]) and consuming_count(logs[1]), timeout=90,
                     what="both instances consuming", procs=tuple(procs))
            before = consuming_count(logs[1])
            stop_run(procs[1], kill=True)
            procs[1] = start_run(config, outs[1], logs[1])
            time.sleep(rng.uniform(2.5, 4.0))  # the group waits for the dead member's session to expire
            broker.stop()
            time.sleep(rng.uniform(1.0, 3.0))
            broker.start()
            wait_consuming(logs[1], before, procs=tuple(procs), timeout=120)
            _produce(broker.bootstrap, prefix, events[half:], close=True, partitions=partitions)
        else:  # "checkpoint": the broker goes while traffic flows and checkpoints are written every 300 ms
            procs.append(start_run(config, outs[0], logs[0]))
            wait_consuming(logs[0], 0, procs=tuple(procs))
            cut = rng.randrange(half // 2, half)
            _produce(broker.bootstrap, prefix, events[:cut], close=False, partitions=partitions)
            time.sleep(rng.uniform(0.0, 1.0))
            broker.stop()
            time.sleep(rng.uniform(1.0, 3.0))
            broker.start()
            _produce(broker.bootstrap, prefix, events[cut:], close=True, partitions=partitions)
        wait_for(lambda: set(want) <= set(_windows_by_identity(*outs)), timeout=150, what="all windows",
                 procs=tuple(procs))
    finally:
        codes = [stop_run(p, timeout=60) for p in procs]
        tails = "\n".join(log.read_text(errors="replace")[-2500:] for log in logs if log.exists())
        assert codes == [0] * len(procs), tails
    _assert_matches(_windows_by_identity(*outs), want)
    _assert_one_line_per_outage(*[log for log in logs if log.exists()])


def _sigterm_mid_outage(broker: Broker, prefix: str, tmp: Path, *, seed: int) -> None:
    """SIGTERM while the broker is away: exit 0 within the bound; a new instance then finishes the job."""
    events, rows = generate_with_truth(_traffic(seed, minutes=4, rate=10))
    half = len(events) // 2
    _create(broker.bootstrap, prefix, 2)
    want = expected_windows(rows, windows=WINDOWS, partitions=2)
    config = write_config(tmp / "run.toml", bootstrap=broker.bootstrap, prefix=prefix, checkpoint_interval="300ms",
                          kafka_extra='shutdown_timeout = "10s"')
    log, outs = tmp / "run.log", [tmp / "a.jsonl", tmp / "b.jsonl"]
    _produce(broker.bootstrap, prefix, events[:half], close=False, partitions=2)
    proc = start_run(config, outs[0], log)
    wait_consuming(log, 0, procs=(proc,))
    broker.stop()
    try:
        wait_for(lambda: UNREACHABLE in log.read_text(errors="replace"), timeout=30, what="the outage logged",
                 procs=(proc,))
        # Bound: shutdown_timeout (10 s) plus the backstop's 10 s; a hang fails here.
        assert stop_run(proc, timeout=25) == 0, log.read_text()[-3000:]
    finally:
        broker.start()
    before = consuming_count(log)
    proc = start_run(config, outs[1], log)
    wait_consuming(log, before, procs=(proc,))
    _produce(broker.bootstrap, prefix, events[half:], close=True, partitions=2)
    try:
        wait_for(lambda: set(want) <= set(_windows_by_identity(*outs)), timeout=120, what="all windows", procs=(proc,))
    finally:
        assert stop_run(proc) == 0, log.read_text()[-3000:]
    _assert_matches(_windows_by_identity(*outs), want)
    assert _assert_one_line_per_outage(log) >= 1


def _join_checkpoint_sigterm(broker: Broker, prefix: str, tmp: Path, *, seed: int) -> None:
    """CI's round: the broker stopped while the instance joins, again while it checkpoints under traffic,
    and a third time followed by SIGTERM mid-outage; a new instance finishes. Windows equal the truth."""
    rng = random.Random(seed)
    events, rows = generate_with_truth(_traffic(seed, minutes=4, rate=12))
    cuts = [len(events) // 3, 2 * len(events) // 3]
    _create(broker.bootstrap, prefix, 2)
    want = expected_windows(rows, windows=WINDOWS, partitions=2)
    config = write_config(tmp / "run.toml", bootstrap=broker.bootstrap, prefix=prefix, checkpoint_interval="300ms",
                          kafka_extra='shutdown_timeout = "10s"')
    log, outs = tmp / "run.log", [tmp / "a.jsonl", tmp / "b.jsonl"]
    _produce(broker.bootstrap, prefix, events[:cuts[0]], close=False, partitions=2)
    proc = start_run(config, outs[0], log)
    try:
        time.sleep(rng.uniform(0.3, 2.0))  # 1: while joining
        broker.stop()
        time.sleep(rng.uniform(0.5, 2.0))
        broker.start()
        wait_consuming(log, 0, procs=(proc,), timeout=90)
        _produce(broker.bootstrap, prefix, events[cuts[0]:cuts[1]], close=False, partitions=2)
        time.sleep(rng.uniform(0.0, 1.0))  # 2: while it consumes and checkpoints every 300 ms
        broker.stop()
        time.sleep(rng.uniform(0.5, 2.0))
        broker.start()

        def count(text: str) -> int:
            return log.read_text(errors="replace").count(text)

        # A short stop may go unnoticed (kafka-python reconnects silently); one that was noticed must end.
        wait_for(lambda: count(UNREACHABLE) == count(BACK), timeout=90, what="the outages over", procs=(proc,))
        seen = count(UNREACHABLE)
        broker.stop()  # 3: SIGTERM mid-outage; an owning instance notices within a probe (about 3 s)
        wait_for(lambda: count(UNREACHABLE) > seen, timeout=30, what="the third outage logged", procs=(proc,))
        # Bound: shutdown_timeout (10 s) plus the backstop's 10 s; a hang fails here.
        assert stop_run(proc, timeout=25) == 0, log.read_text()[-3000:]
    finally:
        if broker.port is not None:
            broker.start()
    before = consuming_count(log)
    proc = start_run(config, outs[1], log)
    try:
        wait_consuming(log, before, procs=(proc,))
        _produce(broker.bootstrap, prefix, events[cuts[1]:], close=True, partitions=2)
        wait_for(lambda: set(want) <= set(_windows_by_identity(*outs)), timeout=120, what="all windows", procs=(proc,))
    finally:
        assert stop_run(proc) == 0, log.read_text()[-3000:]
    _assert_matches(_windows_by_identity(*outs), want)
    assert _assert_one_line_per_outage(log) >= 1


def test_broker_stopped_while_joining_while_checkpointing_and_at_sigterm(
    kafka_broker: Broker, unique: str, tmp_path: Path,
) -> None:
    _need_own_broker(kafka_broker)
    _join_checkpoint_sigterm(kafka_broker, unique, tmp_path, seed=101)


@pytest.mark.parametrize("when", ["join", "rebalance", "checkpoint", "sigterm"])
def test_broker_stopped_in_rounds(when: str, kafka_broker: Broker, unique: str, tmp_path: Path) -> None:
    """Each scenario alone: one round in CI, 5 with ``RANKWATCH_SLOW=1`` (the rebalance round is also the
    CI's only test of an outage while the group waits for a dead member)."""
    _need_own_broker(kafka_broker)
    for i in range(ROUNDS):
        d = tmp_path / f"round{i}"
        d.mkdir()
        if when == "sigterm":
            _sigterm_mid_outage(kafka_broker, f"{unique}r{i}", d, seed=300 + i)
        else:
            _scenario(kafka_broker, f"{unique}r{i}", d, seed=200 + i, when=when)
