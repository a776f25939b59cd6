"""The consuming service: one consumer group over the impressions and clicks topics, effectively once.

:class:`ConsumerService` owns a kafka-python consumer (range assignor, auto-commit off), a producer for
checkpoints and dead letters, and one :class:`consumers.alignment.PartitionPair` per assigned partition
pair. Its loop: poll, feed each pair in timestamp order, hand every published window to ``on_window``,
let idle pairs tick, checkpoint every ``checkpoint_interval_s``. A checkpoint of a pair is written (and
acknowledged) before the offsets are committed with a pointer to it; on assignment a pair is restored from
the checkpoint its committed offset points to and both partitions are seeked to the checkpoint's offsets.
On revocation and on shutdown the owned pairs are checkpointed and committed before they are given up.
docs/kafka.md gives the correctness argument.

Threads: kafka-python 3 runs the rebalance listener on its I/O thread, but only while this loop is inside
``consumer.poll()`` (group joins are driven from poll), so the listener's checkpoint + commit never
interleaves with the loop's own. The pair lock guards the state anyway, and nothing that waits for the
I/O thread is called while holding it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from rankwatch.consumers.alignment import PartitionPair
from rankwatch.consumers.checkpoints import CheckpointRef, CheckpointStore
from rankwatch.consumers.deadletters import KafkaDeadLetterSink
from rankwatch.consumers.settings import KafkaSettings
from rankwatch.consumers.stats import merge_stats
from rankwatch.consumers.topics import CHECKPOINT_TOPIC_CONFIG, check_copartitioned, ensure_topic
from rankwatch.pipeline.clock import Clock
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.stream import StreamConfig, StreamProcessor, StreamStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceHealth:
    """What the exporter shows about the service at one moment.

    ``stats`` holds the streaming core's statistics per owned partition pair, ``merged`` their sum (the
    watermark is the minimum), ``lag`` the messages behind the high watermark per ``(topic, partition)``
    counted from the last record *fed* to the core.
    """

    stats: dict[int, StreamStats] = field(default_factory=dict)
    merged: StreamStats | None = None
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)
    checkpoints_written: int = 0
    checkpoint_failures: int = 0
    restores: int = 0
    windows_published: int = 0
    assigned: tuple[int, ...] = ()
    running: bool = False


class ConsumerService:
    """Consume, compute, publish; see the module docstring.

    Parameters
    ----------
    kafka, stream
        Kafka settings and the streaming core's configuration.
    on_window
        Called (on the consuming thread) with every published window. A window may be handed over again
        after a crash or a rebalance away from a crashed member, with the same identity and content
        (``PublishedWindow.identity``); consumers of this hook dedupe by identity.
    clock
        The clock of idle ticks (wall clock in production).
    on_health
        Called about once a second with a fresh :class:`ServiceHealth` (e.g. to update the exporter).
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        stream: StreamConfig,
        *,
        on_window: Callable[[PublishedWindow], None],
        clock: Clock,
        on_health: Callable[[ServiceHealth], None] | None = None,
    ) -> None:
        self.kafka = kafka
        self.stream = stream
        self.on_window = on_window
        self.clock = clock
        self.on_health = on_health
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._pairs: dict[int, PartitionPair] = {}
        self._parked: dict[int, PartitionPair] = {}  # revoked pairs kept in case they come straight back
        self._health = ServiceHealth()
        self._checkpoints = 0
        self._checkpoint_failures = 0
        self._restores = 0
        self._published = 0
        self._consumer: KafkaConsumer | None = None
        self._producer: KafkaProducer | None = None
        self._store: CheckpointStore | None = None
        self._dead: KafkaDeadLetterSink | None = None
        self._paused: set[Any] = set()
        self._pending_commit: list[tuple[PartitionPair, CheckpointRef]] = []
        self.partitions = 0

    # -- public API ------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to finish its batch, checkpoint, commit and close (safe from a signal handler)."""
        self._stop.set()

    def health(self) -> ServiceHealth:
        """The latest health snapshot (refreshed about once a second by the loop)."""
        return self._health

    def ready(self) -> bool:
        return self._health.running and bool(self._health.assigned)

    def start(self) -> None:
        """Check the topics and open the clients (errors here are one-line ``RankwatchError`` s)."""
        k = self.kafka
        client = k.client_kwargs()
        self.partitions = check_copartitioned(client, k.impressions_topic, k.clicks_topic)
        ensure_topic(client, k.checkpoints, partitions=self.partitions, config=CHECKPOINT_TOPIC_CONFIG, grow=True)
        ensure_topic(client, k.dead_letters, partitions=1)
        self._producer = KafkaProducer(**client, acks="all", linger_ms=5, max_request_size=2 * 1024 * 1024)
        self._store = CheckpointStore(self._producer, k.checkpoints, client)
        self._dead = KafkaDeadLetterSink(self._producer, k.dead_letters)
        self._consumer = KafkaConsumer(
            **client, group_id=k.group_id, enable_auto_commit=False, auto_offset_reset=k.auto_offset_reset,
            partition_assignment_strategy=[RangePartitionAssignor], max_poll_records=k.max_poll_records,
            session_timeout_ms=int(k.session_timeout_s * 1000),
            heartbeat_interval_ms=max(100, int(k.session_timeout_s * 1000) // 4),
            group_instance_id=k.instance_id,
        )
        self._consumer.subscribe([k.impressions_topic, k.clicks_topic], listener=_Listener(self))

    def run(self) -> None:
        """Consume until :meth:`stop`; then checkpoint and commit every owned pair and close the clients."""
        if self._consumer is None:
            self.start()
        consumer = self._consumer
        assert consumer is not None
        k = self.kafka
        last_checkpoint = last_tick = last_health = time.monotonic()
        try:
            while not self._stop.is_set():
                batch = consumer.poll(timeout_ms=100)
                with self._lock:
                    for tp, records in batch.items():
                        pair = self._pairs.get(tp.partition)
                        if pair is not None and tp in pair.buffers:
                            pair.add(tp, records)
                    self._feed_all()
                    unconfirmed = [tp for pair in self._pairs.values() for tp in pair.unconfirmed]
                if unconfirmed:
                    self._confirm_and_feed(unconfirmed)
                self._flow_control()
                now = time.monotonic()
                if now - last_tick >= k.tick_interval_s:
                    self._tick_idle()
                    last_tick = now
                if now - last_checkpoint >= k.checkpoint_interval_s:
                    self.checkpoint(p for p, pair in list(self._pairs.items()) if pair.fed_since_checkpoint)
                    last_checkpoint = time.monotonic()
                if now - last_health >= 1.0:
                    self._refresh_health(running=True)
                    last_health = now
        finally:
            self._shutdown()

    # -- feeding ---------------------------------------------------------------------------------------
    def _caught_up(self, tp: Any) -> bool:
        consumer = self._consumer
        assert consumer is not None
        try:
            hw = consumer.highwater(tp)
            return hw is not None and (consumer.position(tp) or 0) >= hw
        except KafkaError:
            return False

    def _feed_all(self, confirmed: dict[Any, int] | None = None) -> None:
        ends = confirmed or {}

        def is_confirmed(tp: Any) -> bool:
            consumer = self._consumer
            assert consumer is not None
            # highwater first: once a fetch answered, position() is known and does not block
            return tp in ends and consumer.highwater(tp) is not None and (consumer.position(tp) or 0) >= ends[tp]

        for pair in list(self._pairs.values()):
            pair.unconfirmed.clear()
            windows, _ = pair.feed(self._caught_up, is_confirmed)
            self._publish(windows)

    def _confirm_and_feed(self, tps: list[Any]) -> None:
        """Ask the broker for the end offsets of ``tps`` (made after every buffered record was fetched) and
        feed again: records far ahead of a topic that truly has nothing more may now go (alignment docs)."""
        assert self._consumer is not None
        try:
            ends = self._consumer.end_offsets(tps, timeout_ms=2000)
        except Exception:  # noqa: BLE001 - no confirmation: wait for the next poll
            return
        with self._lock:
            self._feed_all(ends)

    def _publish(self, windows: Iterable[PublishedWindow]) -> None:
        for w in windows:
            self._published += 1
            self.on_window(w)

    def _flow_control(self) -> None:
        """Pause a topic-partition whose buffer is full; resume it once the pair drained half of it."""
        consumer = self._consumer
        assert consumer is not None
        cap = self.kafka.max_buffered_records
        with self._lock:
            for pair in self._pairs.values():
                for tp in pair.buffers:
                    n = pair.buffered(tp)
                    if n >= cap and tp not in self._paused:
                        consumer.pause(tp)
                        self._paused.add(tp)
                    elif n < cap // 2 and tp in self._paused:
                        consumer.resume(tp)
                        self._paused.discard(tp)

    def _tick_idle(self) -> None:
        """Idle pairs (nothing buffered, nothing left to fetch, confirmed by the broker) let the clock in."""
        consumer = self._consumer
        assert consumer is not None
        with self._lock:
            idle = [p for p in self._pairs.values()
                    if not any(p.buffers.values()) and all(self._caught_up(tp) for tp in p.buffers)]
        if not idle:
            return
        tps = [tp for p in idle for tp in p.buffers]
        try:
            # A fresh answer from the broker: during an outage the cached high watermarks would claim
            # "caught up" and the clock would close windows whose events are merely unreachable.
            ends = consumer.end_offsets(tps, timeout_ms=2000)
        except Exception:  # noqa: BLE001 - no confirmation, no tick
            return
        with self._lock:
            for pair in idle:
                if self._pairs.get(pair.partition) is not pair:
                    continue
                if all((pair.next_offset.get(tp) or consumer.position(tp) or 0) >= ends.get(tp, 0) for tp in pair.buffers):
                    self._publish(pair.processor.tick())

    # -- checkpoints -----------------------------------------------------------------------------------
    def _resolved_offset(self, pair: PartitionPair, tp: Any) -> int | None:
        """Next offset to read of ``tp`` as of the state: after the last record fed, else where reading starts.

        None when that is not known without asking the broker (nothing fetched yet): never block here, this
        runs under the pair lock and in the rebalance listener on the consumer's I/O thread.
        """
        off = pair.next_offset.get(tp)
        if off is not None:
            return off
        buf = pair.buffers[tp]
        if buf:
            return int(buf[0].offset)
        consumer = self._consumer
        assert consumer is not None
        try:
            if consumer.highwater(tp) is None:
                return None  # no fetch response yet, so the position may still be being reset
            position = consumer.position(tp)
        except Exception:  # noqa: BLE001 - not assigned any more, or would block
            return None
        return None if position is None else int(position)

    def checkpoint(self, partitions: Iterable[int], *, in_listener: bool = False) -> dict[Any, OffsetAndMetadata]:
        """Write checkpoints of ``partitions`` and (outside the rebalance listener) commit them.

        Returns the offsets to commit; the listener commits them itself through the coordinator.
        """
        store = self._store
        assert store is not None and self._producer is not None
        offsets: dict[Any, OffsetAndMetadata] = {}
        written: list[tuple[PartitionPair, CheckpointRef]] = []
        for p in sorted(set(partitions)):
            with self._lock:
                pair = self._pairs.get(p)
                if pair is None:
                    continue
                imp_off = self._resolved_offset(pair, pair.impressions_tp)
                clk_off = self._resolved_offset(pair, pair.clicks_tp)
                if imp_off is None or clk_off is None:
                    continue  # nothing fed yet from a partition whose start is unknown: nothing to save
                snapshot = pair.processor.snapshot()
                fed = pair.fed_since_checkpoint
            try:
                ref = store.write(p, snapshot, impressions_offset=imp_off, clicks_offset=clk_off, previous=pair.checkpoint)
            except Exception as e:  # noqa: BLE001 - broker trouble: keep running, try again next interval
                self._checkpoint_failures += 1
                log.warning("checkpoint of pair %d failed: %s", p, e)
                continue
            meta = ref.to_metadata()
            offsets[pair.impressions_tp] = OffsetAndMetadata(imp_off, meta, -1)
            offsets[pair.clicks_tp] = OffsetAndMetadata(clk_off, meta, -1)
            written.append((pair, ref))
            pair.fed_since_checkpoint -= fed
        if in_listener or not offsets:
            self._pending_commit = written
            return offsets
        assert self._consumer is not None
        try:
            self._consumer.commit(offsets)
        except Exception as e:  # noqa: BLE001 - e.g. a rebalance: the new owner restores the last commit
            self._checkpoint_failures += 1
            log.warning("commit of checkpoints failed: %s", e)
            return offsets
        self._committed(written)
        return offsets

    def _committed(self, written: list[tuple[PartitionPair, CheckpointRef]]) -> None:
        """After a successful commit: the new checkpoints are current, the ones they replace are deleted."""
        store = self._store
        assert store is not None
        for pair, ref in written:
            old, pair.checkpoint = pair.checkpoint, ref
            self._checkpoints += 1
            if old is not None and old != ref:
                store.delete(pair.partition, old)

    # -- rebalance (called by _Listener on the consumer's IO thread) ------------------------------------
    async def _revoked(self, revoked: Iterable[Any]) -> None:
        parts = {tp.partition for tp in revoked}
        with self._lock:
            owned = [p for p in parts if p in self._pairs]
        if owned:
            offsets = self.checkpoint(owned, in_listener=True)
            if offsets:
                assert self._consumer is not None
                try:
                    await self._consumer._coordinator._commit_offsets_sync_async(offsets)
                    self._committed(self._pending_commit)
                except Exception as e:  # noqa: BLE001 - the next owner restores the last good commit
                    self._checkpoint_failures += 1
                    log.warning("commit on revocation failed: %s", e)
        with self._lock:
            for p in owned:
                pair = self._pairs.pop(p)
                pair.clear_buffers()
                self._parked[p] = pair
            for tp in list(self._paused):
                if tp.partition in parts:
                    self._paused.discard(tp)

    async def _assigned(self, assigned: Iterable[Any]) -> None:
        k = self.kafka
        by_partition: dict[int, set[str]] = {}
        for tp in assigned:
            by_partition.setdefault(tp.partition, set()).add(tp.topic)
        consumer = self._consumer
        assert consumer is not None and self._store is not None
        wanted = [p for p, topics in by_partition.items() if p not in self._pairs]
        for p, topics in by_partition.items():
            if topics != {k.impressions_topic, k.clicks_topic}:
                # Only the range assignor co-locates pairs; anything else would split requests.
                log.error("partition %d assigned without its pair (%s); not consuming it", p, sorted(topics))
                consumer.pause(*[TopicPartition(t, p) for t in topics])
                wanted = [q for q in wanted if q != p]
        tps = [TopicPartition(t, p) for p in wanted for t in (k.impressions_topic, k.clicks_topic)]
        committed = await consumer._coordinator.fetch_committed_offsets_async(tps) if tps else {}
        for p in wanted:
            imp_tp, clk_tp = TopicPartition(k.impressions_topic, p), TopicPartition(k.clicks_topic, p)
            meta = committed.get(imp_tp)
            ref = CheckpointRef.from_metadata(meta.metadata if meta is not None else None)
            parked = self._parked.pop(p, None)
            if parked is not None and ref is not None and parked.checkpoint == ref and parked.fed_since_checkpoint == 0:
                pair = parked  # our own state, and nobody committed since: no need to read it back
            elif ref is not None:
                checkpoint, orphans = self._store.read(p, ref)
                processor = StreamProcessor.restore(checkpoint.snapshot, config=self.stream, clock=self.clock,
                                                    dead_letters=self._dead)
                pair = PartitionPair(p, imp_tp, clk_tp, processor,
                                     {imp_tp: checkpoint.impressions_offset, clk_tp: checkpoint.clicks_offset}, ref,
                                     max_skew_ms=self.stream.allowed_disorder_ms // 2)
                for stale in [*orphans, *([checkpoint.previous] if checkpoint.previous else [])]:
                    self._store.delete(p, stale)
                self._restores += 1
            else:
                processor = StreamProcessor(self.stream, clock=self.clock, dead_letters=self._dead, partitions=(p,))
                start = {tp: (committed[tp].offset if tp in committed and committed[tp].offset >= 0 else None)
                         for tp in (imp_tp, clk_tp)}
                pair = PartitionPair(p, imp_tp, clk_tp, processor, start, max_skew_ms=self.stream.allowed_disorder_ms // 2)
            for tp in (imp_tp, clk_tp):
                off = pair.next_offset.get(tp)
                if off is not None:
                    consumer.seek(tp, off)
            with self._lock:
                self._pairs[p] = pair
        self._parked.clear()
        log.info("consuming partition pairs %s", sorted(self._pairs))

    # -- health and shutdown ---------------------------------------------------------------------------
    def _refresh_health(self, *, running: bool) -> None:
        consumer = self._consumer
        with self._lock:
            stats = {p: pair.processor.stats() for p, pair in self._pairs.items()}
            lag: dict[tuple[str, int], int] = {}
            for pair in self._pairs.values():
                for tp in pair.buffers:
                    try:
                        hw = consumer.highwater(tp) if consumer is not None else None
                    except KafkaError:
                        hw = None
                    if hw is not None:
                        lag[(tp.topic, tp.partition)] = max(0, hw - self._resolved_offset_cached(pair, tp))
            assigned = tuple(sorted(self._pairs))
        self._health = ServiceHealth(
            stats=stats, merged=merge_stats(list(stats.values())) if stats else None, lag=lag,
            dead_letters=dict(self._dead.counts) if self._dead else {}, checkpoints_written=self._checkpoints,
            checkpoint_failures=self._checkpoint_failures, restores=self._restores,
            windows_published=self._published, assigned=assigned, running=running,
        )
        if self.on_health is not None:
            self.on_health(self._health)

    @staticmethod
    def _resolved_offset_cached(pair: PartitionPair, tp: Any) -> int:
        off = pair.next_offset.get(tp)
        if off is not None:
            return off
        return int(pair.buffers[tp][0].offset) if pair.buffers[tp] else 0

    def _shutdown(self) -> None:
        consumer, producer = self._consumer, self._producer
        try:
            if consumer is not None and self._pairs:
                with self._lock:
                    self._feed_all()  # finish the batch in hand (what is caught up can be fed)
                self.checkpoint(list(self._pairs))
        finally:
            self._refresh_health(running=False)
            with self._lock:
                self._pairs.clear()  # close() revokes: nothing left to checkpoint twice
            if consumer is not None:
                consumer.close(autocommit=False)
            if self._store is not None:
                self._store.close()
            if producer is not None:
                producer.flush(timeout=30)
                producer.close(timeout=30)
            self._consumer = self._producer = None


class _Listener(AsyncConsumerRebalanceListener):
    """Checkpoint and commit before giving pairs up; restore on assignment (see ConsumerService)."""

    def __init__(self, service: ConsumerService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.service._revoked(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.service._assigned(assigned)

    async def on_partitions_lost(self, lost: Any) -> None:
        # Evicted: our commits would be refused. Drop the state; the next owner restores the last commit.
        svc = self.service
        with svc._lock:
            for tp in lost:
                svc._pairs.pop(tp.partition, None)
                svc._parked.pop(tp.partition, None)
