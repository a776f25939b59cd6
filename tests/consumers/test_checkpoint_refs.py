"""Checkpoint references in commit metadata, stats merging, dead-letter headers, the partitioner."""

from __future__ import annotations

from typing import Any

from kafka.partitioner.default import DefaultPartitioner

from rankwatch.consumers.checkpoints import CheckpointRef
from rankwatch.consumers.deadletters import KafkaDeadLetterSink
from rankwatch.consumers.producer import partition_of, window_closers
from rankwatch.consumers.stats import merge_stats
from rankwatch.pipeline.events.deadletter import DeadLetter
from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.events.validation import RejectReason
from rankwatch.pipeline.stream.processor import StreamStats


def test_reference_round_trips_through_commit_metadata_and_foreign_metadata_is_none() -> None:
    ref = CheckpointRef("abc123", 42, 3)
    meta = ref.to_metadata()
    assert len(meta) < 4096  # the broker's default offset.metadata.max.bytes
    assert CheckpointRef.from_metadata(meta) == ref
    for other in (None, "", "some other tool", "rankwatch-ckpt:{not json", 'rankwatch-ckpt:{"id": 1}'):
        assert CheckpointRef.from_metadata(other) is None


def _stats(**kw: Any) -> StreamStats:
    base: dict[str, Any] = dict(
        outcomes={"impressions": {"accepted": 1}, "clicks": {"late": 2}}, rejects={("clicks", "bad_grade"): 1},
        pending_requests=3, pending_items=30, pending_feedback=1, watermark_ms=100, evicted_requests=0,
        finalized_requests=5, feedback_detached=0, label_values={"segment": 2}, label_overflow={"segment": 0},
        windows_published={"1m": 1}, dedupe_ids=7, dedupe_forgotten_at_capacity=0,
    )
    base.update(kw)
    return StreamStats(**base)


def test_merged_stats_sum_counters_and_take_the_slowest_watermark() -> None:
    a = _stats()
    b = _stats(watermark_ms=50, label_values={"segment": 3}, rejects={("clicks", "bad_grade"): 4})
    m = merge_stats([a, b])
    assert m.outcomes == {"impressions": {"accepted": 2}, "clicks": {"late": 4}}
    assert m.rejects == {("clicks", "bad_grade"): 5}
    assert (m.pending_requests, m.pending_items, m.finalized_requests, m.dedupe_ids) == (6, 60, 10, 14)
    assert m.watermark_ms == 50 and m.label_values == {"segment": 3} and m.windows_published == {"1m": 2}
    assert merge_stats([a, _stats(watermark_ms=None)]).watermark_ms is None


class _FakeFuture:
    def add_errback(self, fn: Any) -> None:
        self.errback = fn


class _FakeProducer:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, topic: str, **kw: Any) -> _FakeFuture:
        self.sent.append({"topic": topic, **kw})
        return _FakeFuture()


def test_dead_letters_carry_origin_and_reason_headers_and_are_counted() -> None:
    producer = _FakeProducer()
    sink = KafkaDeadLetterSink(producer, "dlq")
    sink.send(DeadLetter("clicks", b"{bad", RejectReason.invalid_json, "line 1\ncol 2", SourceRef("clk", 3, 99)))
    sink.send(DeadLetter("clicks", b"{}", RejectReason.missing_field, "event_id", None))
    first = producer.sent[0]
    assert first["topic"] == "dlq" and first["value"] == b"{bad" and first["key"] == b"clk/3/99"
    headers = dict(first["headers"])
    assert headers == {"rankwatch.topic": b"clk", "rankwatch.partition": b"3", "rankwatch.offset": b"99",
                       "rankwatch.reason": b"invalid_json", "rankwatch.detail": b"line 1 col 2",
                       "rankwatch.stream": b"clicks"}
    assert sink.counts == {("clicks", "invalid_json"): 1, ("clicks", "missing_field"): 1}


class _Cluster:
    def __init__(self, n: int) -> None:
        self.n = n

    def topics(self) -> set[str]:
        return {"t"}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self.n))

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self.n))


def test_partition_of_is_the_producers_partitioner_and_closers_cover_every_partition() -> None:
    for n in (1, 2, 4, 7):
        cluster = _Cluster(n)
        for i in range(200):
            key = f"r-{i}".encode()
            assert partition_of(key, n) == DefaultPartitioner().partition("t", key, key, None, None, cluster)
        closers = window_closers(n, 10_000, record_ts_ms=5)
        assert sorted(partition_of(c.key, n) for c in closers) == list(range(n))
        assert all(c.ts_ms == 5 for c in closers)
