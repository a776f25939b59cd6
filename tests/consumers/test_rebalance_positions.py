"""A pair kept across an eager rebalance resumes where its state does, without a broker.

kafka-python 3 keeps a partition's ``TopicPartitionState`` (its fetch position) when a rebalance gives the
partition back to the same member, while the service drops the pair's buffered records on revocation.
Here the rebalance listener (consumers/rebalance.py) is driven through kafka-python's own eager sequence
(revoke everything, ``assign_from_subscribed`` of what is kept, assign, restore on the loop) on a
``KafkaConsumer`` whose subscription state is kafka-python's and whose other calls are the test's: a
pair that buffered records of one topic before anything of it was fed (so nothing was checkpointed, or
the checkpoint holds offsets its state does not) must be fetched again from its first buffered record.
Before the fix the position stayed after the dropped records: the fleet test's pair 1 never published.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import SubscriptionState
from kafka.structs import OffsetAndMetadata

from rankwatch.consumers.checkpoints import CheckpointRef
from rankwatch.consumers.fetch_compat import known_position
from rankwatch.pipeline.stream.processor import StreamConfig

IMP, CLK = "imp", "clk"


def _consumer() -> Any:
    """A KafkaConsumer with no client: kafka-python's subscription state (positions, pauses, seek,
    assignment, highwater), committed offsets kept by the test, commits recorded by the coordinator."""
    consumer: Any = object.__new__(KafkaConsumer)
    consumer._subscription = SubscriptionState("earliest")
    consumer._subscription.subscribe(topics=[IMP, CLK])
    consumer._iterator = None
    consumer.commits = {}

    async def commit(offsets: dict[Any, OffsetAndMetadata]) -> None:
        consumer.commits.update(offsets)

    consumer._coordinator = SimpleNamespace(_commit_offsets_sync_async=commit)
    consumer.committed = lambda tp, metadata=False, timeout_ms=None: consumer.commits.get(tp)
    return consumer


class _Store:
    """Checkpoints kept in memory, acknowledged at once."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] = {}

    def send(self, p: int, snapshot: bytes, *, impressions_offset: int, clicks_offset: int, previous: Any) -> Any:
        ref = CheckpointRef(f"c{len(self.saved)}", len(self.saved), 1)
        self.saved[ref.checkpoint_id] = SimpleNamespace(snapshot=snapshot, impressions_offset=impressions_offset,
                                                        clicks_offset=clicks_offset, previous=previous)
        return ref

    def acknowledged(self, out: Any, **_: Any) -> Any:
        return out

    def read(self, p: int, ref: CheckpointRef) -> Any:
        return self.saved[ref.checkpoint_id], []

    def delete(self, p: int, ref: Any) -> None:
        pass


def _service(consumer: Any) -> Any:
    from rankwatch.consumers.service import ConsumerService
    from rankwatch.consumers.settings import KafkaSettings

    svc = ConsumerService(KafkaSettings(impressions_topic=IMP, clicks_topic=CLK, core_process=False),
                          StreamConfig(windows=("1m",)), on_window=lambda w: None, clock=None)  # type: ignore[arg-type]
    svc._consumer, svc._store, svc._producer = consumer, _Store(), object()
    return svc


def _tps(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition(t, p) for p in partitions for t in (IMP, CLK)]


def _fetch(consumer: Any, tp: TopicPartition, start: int, end: int, highwater: int) -> list[Any]:
    """What a poll hands over: records ``start..end-1`` of ``tp``, the position moved past them."""
    state = consumer._subscription.assignment[tp]
    state.highwater = highwater
    state.position = OffsetAndMetadata(end, "", -1)
    return [SimpleNamespace(offset=o, value=b"", timestamp=1_000 + o) for o in range(start, end)]


def _assign(svc: Any, consumer: Any, tps: list[TopicPartition]) -> None:
    """kafka-python's eager assignment: kept partitions keep their state, new ones start at the reset
    position (earliest: 0); then the listener, then the loop's restore."""
    consumer._subscription.assign_from_subscribed(tps)
    for tp in tps:
        state = consumer._subscription.assignment[tp]
        if not state.has_valid_position:
            state.seek(0)
    asyncio.run(svc._rebalancer.on_partitions_assigned(set(tps)))
    svc._rebalancer.restore_pending()


def _rebalance(svc: Any, consumer: Any, kept: list[TopicPartition]) -> None:
    """kafka-python's eager rebalance: revoke every partition (still assigned meanwhile), assign ``kept``."""
    owned = set(consumer.assignment())
    consumer._subscription.mark_pending_revocation(owned)
    asyncio.run(svc._rebalancer.on_partitions_revoked(owned))
    _assign(svc, consumer, kept)


def test_a_kept_pair_with_one_topic_never_fed_fetches_its_dropped_records_again() -> None:
    consumer = _consumer()
    svc = _service(consumer)
    _assign(svc, consumer, _tps(0, 1))
    assert sorted(svc._pairs) == [0, 1]
    pair = svc._pairs[0]
    # Impressions 0..9 fetched and buffered; no fetch answer for the clicks yet (highwater unknown), so
    # nothing is fed (the clicks are not caught up) and the pair cannot be checkpointed.
    pair.add(pair.impressions_tp, _fetch(consumer, pair.impressions_tp, 0, 10, highwater=10))
    with svc._lock:
        svc._feed_all()
    assert pair.buffered(pair.impressions_tp) == 10 and pair.next_offset[pair.impressions_tp] is None
    _rebalance(svc, consumer, _tps(0))  # a second member joins and takes pair 1
    assert sorted(svc._pairs) == [0] and not consumer.paused()
    assert consumer.commits == {}  # nothing was saved: the pair starts afresh
    # The impressions are fetched again from the first one the pair dropped (before: from 10, never again).
    assert known_position(consumer, TopicPartition(IMP, 0)) == 0
    assert known_position(consumer, TopicPartition(CLK, 0)) == 0


def test_a_kept_pair_restored_from_its_own_checkpoint_resumes_at_the_checkpoint() -> None:
    consumer = _consumer()
    svc = _service(consumer)
    _assign(svc, consumer, _tps(0))
    pair = svc._pairs[0]
    # Impressions 3..9 buffered (none fed), the clicks' highwater known with nothing fetched: the listener
    # checkpoints the pair at (3, 0) and reuses the same pair, whose own offsets are still unknown.
    consumer._subscription.assignment[pair.impressions_tp].seek(3)
    pair.add(pair.impressions_tp, _fetch(consumer, pair.impressions_tp, 3, 10, highwater=10))
    consumer._subscription.assignment[pair.clicks_tp].highwater = 5
    _rebalance(svc, consumer, _tps(0))
    assert {tp.topic: m.offset for tp, m in consumer.commits.items()} == {IMP: 3, CLK: 0}
    assert svc._pairs[0] is pair  # the parked pair came back (its checkpoint is the committed one)
    assert known_position(consumer, pair.impressions_tp) == 3 and known_position(consumer, pair.clicks_tp) == 0

