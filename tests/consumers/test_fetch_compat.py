"""kafka-python 3.0.12's parked-records bug (the backlog stall), reproduced with kafka-python alone.

A partition paused while its parsed records sit in the fetcher's in-line slot is "parked"; once another
partition's records were all handed out, the slot holds a drained object instead of None and the parked
records are never handed back nor fetched again (consumers/fetch_compat.py). The first test shows the
bug with plain kafka-python; the second shows that ``release_parked`` before each poll returns every
record of the parked partition exactly once, in order.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from rankwatch.consumers.fetch_compat import (
    PRIVATE_INTERNALS,
    VERIFIED_KAFKA_PYTHON,
    keep_join_awaited,
    missing_internals,
    parked_partitions,
    release_parked,
    stale_leader_assignment,
)
from rankwatch.consumers.topics import ensure_topic

pytestmark = pytest.mark.kafka

BIG, SMALL = 2000, 40


def _setup(bootstrap: str, topic: str) -> None:
    ensure_topic({"bootstrap_servers": [bootstrap]}, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for i in range(BIG):
        producer.send(topic, value=b"a%d" % i, partition=0)
    for i in range(SMALL):
        producer.send(topic, value=b"b%d" % i, partition=1)
    producer.flush()
    producer.close()


def _park_then_resume(bootstrap: str, topic: str, *, repair: bool) -> tuple[list[int], KafkaConsumer]:
    """Pause partition 0 while its records are in line, drain partition 1, resume 0; offsets of 0 returned."""
    a, b = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                             max_partition_fetch_bytes=1024 * 1024)
    consumer.assign([a, b])
    consumer.seek_to_beginning(a, b)
    got: dict[Any, list[int]] = {a: [], b: []}

    def poll() -> None:
        if repair:
            release_parked(consumer)
        for tp, records in consumer.poll(timeout_ms=200, max_records=5).items():
            got[tp].extend(r.offset for r in records)

    for _ in range(200):  # until partition 0's records are in line (a fetch returned many, 5 handed out)
        poll()
        if got[a] and len(got[a]) < BIG:
            break
    consumer.pause(a)
    for _ in range(200):  # partition 1 to its end: its records are handed out and its slot is drained
        poll()
        if len(got[b]) == SMALL:
            break
    assert len(got[b]) == SMALL
    consumer.resume(a)
    idle = 0
    while len(got[a]) < BIG and idle < 15:  # 5 records a poll; without the repair nothing ever comes
        before = len(got[a])
        poll()
        idle = 0 if len(got[a]) > before else idle + 1
    return got[a], consumer


def test_plain_kafka_python_never_returns_a_parked_partition(kafka_broker: Any, unique: str) -> None:
    topic = f"{unique}-fc"
    _setup(kafka_broker.bootstrap, topic)
    offsets, consumer = _park_then_resume(kafka_broker.bootstrap, topic, repair=False)
    try:
        parked = parked_partitions(consumer)
        if len(offsets) == BIG:
            pytest.skip("this kafka-python returns parked records: fetch_compat.release_parked may go")
        # The bug: 15 polls in a row after resume return nothing and partition 0 is still parked behind a drained slot.
        assert TopicPartition(topic, 0) in parked
        assert consumer._fetcher._next_partition_records is not None
        assert len(offsets) < BIG
    finally:
        consumer.close()


def test_release_parked_returns_every_record_once_in_order(kafka_broker: Any, unique: str) -> None:
    topic = f"{unique}-fc"
    _setup(kafka_broker.bootstrap, topic)
    offsets, consumer = _park_then_resume(kafka_broker.bootstrap, topic, repair=True)
    consumer.close()
    assert offsets == list(range(BIG))


def test_a_leader_that_missed_the_topics_metadata_is_told_to_rejoin(kafka_broker: Any, unique: str) -> None:
    """The empty assignment of the fleet test's CI failure: the leader assigned from metadata without the
    topics and kafka-python's own snapshot never changed. Emptied snapshots play that state back."""
    topics = [f"{unique}-imp", f"{unique}-clk"]
    for t in topics:
        ensure_topic({"bootstrap_servers": [kafka_broker.bootstrap]}, t, partitions=2)
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=f"{unique}-g",
                             enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=1500)
    try:
        consumer.subscribe(topics)
        for _ in range(100):
            consumer.poll(timeout_ms=100)
            if len(consumer.assignment()) == 4 and not stale_leader_assignment(consumer):
                break
        assert len(consumer.assignment()) == 4
        assert not stale_leader_assignment(consumer)  # a settled group with every partition assigned
        coordinator = consumer._coordinator
        generation = coordinator._generation.generation_id
        coordinator._assignment_snapshot = {t: set() for t in topics}  # as if assigned before the metadata
        coordinator._metadata_snapshot = coordinator._assignment_snapshot
        assert not coordinator.need_rejoin()  # kafka-python alone would stay where it is
        assert stale_leader_assignment(consumer)
        coordinator.request_rejoin()
        for _ in range(100):
            consumer.poll(timeout_ms=100)
            if coordinator._generation.generation_id > generation and not stale_leader_assignment(consumer):
                break
        assert coordinator._generation.generation_id > generation and len(consumer.assignment()) == 4
        assert not stale_leader_assignment(consumer)
    finally:
        consumer.close()


def _rejoin_after_a_metadata_change(bootstrap: str, unique: str, *, repair: bool) -> tuple[KafkaConsumer, int]:
    """A settled lone member whose metadata changed since it assigned, then 5 ms polls for up to 8 s.

    A metadata change is played back by an assignment snapshot that differs from the metadata snapshot:
    ``need_rejoin()`` is then True with ``rejoin_needed`` False, the state of every lone start once the
    topics' metadata arrives. 5 ms polls expire between JoinGroup and SyncGroup nearly every time.
    """
    topics = [f"{unique}-imp", f"{unique}-clk"]
    for t in topics:
        ensure_topic({"bootstrap_servers": [bootstrap]}, t, partitions=2)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=f"{unique}-g", enable_auto_commit=False,
                             session_timeout_ms=6000, heartbeat_interval_ms=1500)
    consumer.subscribe(topics)
    for _ in range(100):
        consumer.poll(timeout_ms=100)
        if len(consumer.assignment()) == 4 and consumer._coordinator.stable():
            break
    coordinator = consumer._coordinator
    generation = coordinator._generation.generation_id
    coordinator._assignment_snapshot = {t: set() for t in topics}
    assert coordinator.need_rejoin() and not coordinator.rejoin_needed
    deadline = time.monotonic() + 8.0
    while time.monotonic() < deadline:
        if repair:
            keep_join_awaited(consumer)
        consumer.poll(timeout_ms=5)
        if coordinator._generation.generation_id > generation and coordinator.stable() and not coordinator.need_rejoin():
            break
    return consumer, generation


def test_plain_kafka_python_orphans_a_join_after_a_metadata_change(kafka_broker: Any, unique: str) -> None:
    """The member took part in a new generation but never completed it: REBALANCING, nothing awaited."""
    consumer, generation = _rejoin_after_a_metadata_change(kafka_broker.bootstrap, unique, repair=False)
    try:
        coordinator = consumer._coordinator
        if coordinator.stable():
            pytest.skip("this kafka-python completed the join: fetch_compat.keep_join_awaited may go")
        assert coordinator.rebalance_in_progress() and not coordinator.need_rejoin()
        assert coordinator._join_task is not None  # the orphan: done or not, nobody awaits it any more
    finally:
        consumer.close()


def test_keep_join_awaited_completes_the_join(kafka_broker: Any, unique: str) -> None:
    consumer, generation = _rejoin_after_a_metadata_change(kafka_broker.bootstrap, unique, repair=True)
    try:
        coordinator = consumer._coordinator
        assert coordinator.stable() and coordinator._generation.generation_id > generation
        assert len(consumer.assignment()) == 4 and coordinator._join_task is None
        assert not keep_join_awaited(consumer)  # settled: nothing to do
    finally:
        consumer.close()


def test_keep_join_awaited_is_false_without_kafka_pythons_coordinator() -> None:
    assert not keep_join_awaited(object())


def test_stale_leader_assignment_is_false_without_kafka_pythons_coordinator() -> None:
    assert not stale_leader_assignment(object())


def test_the_installed_kafka_python_is_the_one_the_repairs_were_verified_on() -> None:
    # An upgrade is a conscious act: read the repairs against the new release, then move the pin and this.
    import kafka

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"kafka-python=={VERIFIED_KAFKA_PYTHON}"' in pyproject
    assert kafka.__version__ == VERIFIED_KAFKA_PYTHON, (
        f"kafka-python {kafka.__version__} installed; the repairs of consumers/fetch_compat.py were verified "
        f"on {VERIFIED_KAFKA_PYTHON}")


def test_every_private_attribute_the_repairs_touch_is_on_a_live_consumer(kafka_broker: Any, unique: str) -> None:
    topic = f"internals-{unique}"
    ensure_topic({"bootstrap_servers": [kafka_broker.bootstrap]}, topic, partitions=1)
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=f"g-{unique}",
                             enable_auto_commit=False)
    try:
        consumer.subscribe([topic])
        consumer.poll(timeout_ms=200)
        assert missing_internals(consumer) == []
    finally:
        consumer.close(timeout_ms=2000)


def test_missing_internals_names_each_absent_attribute() -> None:
    class Bare:
        pass

    assert missing_internals(Bare()) == [
        f"{owner}.{name}" if owner else name for owner, name in PRIVATE_INTERNALS]


def test_the_recv_repair_replaces_the_method_it_was_verified_on() -> None:
    from rankwatch.consumers.connect import RECV_FIX_VERIFIED_DIGEST, install_recv_fix, recv_source_digest

    assert recv_source_digest() == RECV_FIX_VERIFIED_DIGEST, (
        "kafka-python's KafkaTCPTransport._read_from_sock changed: re-read consumers/connect.install_recv_fix")
    install_recv_fix()
    from kafka.net import transport

    assert getattr(transport.KafkaTCPTransport, "_rankwatch_recv_fix", False)
    assert recv_source_digest() == RECV_FIX_VERIFIED_DIGEST  # the original's, also once installed
