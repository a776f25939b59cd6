"""Rebalances: the listener only pauses what it is given; the loop restores the pairs on its own thread.

kafka-python runs the rebalance listener on its I/O thread, the one that also sends heartbeats. Restoring a
checkpoint there (reading it back and rebuilding the state: linear in pending requests, about 12 s for
a million, bench/checkpoint_restore.py) stopped the heartbeats long enough for the member to be expelled.
So :meth:`Rebalancer.on_assigned` does no I/O: it pauses both partitions of every new pair and
queues it. :meth:`Rebalancer.restore_pending`, called by the loop after each poll, looks up the committed
offset, reads the checkpoint it points to, rebuilds the processor, seeks both partitions to the
checkpoint's offsets and only then resumes them: nothing of a pair is fetched (or fed) before its state is
in place, and the I/O thread keeps heartbeating all along. A step that fails in an outage leaves the pair
queued and is retried (consumers/outage.py).

Revocation still checkpoints in the listener: the state must be saved before the pairs are given up, and
a revocation happens inside a join, whose deadline is the rebalance timeout (``max_poll_interval_ms``),
not the session timeout.

Positions: a revoked pair's buffered records are dropped (:meth:`PartitionPair.release`), and each of its
partitions is sought back to where the pair's state resumes (after the last record fed, else the first
record buffered). kafka-python 3 keeps a partition's fetch position across an eager rebalance that gives
it back, and the restore seeks only to offsets a checkpoint or a commit holds; a pair revoked before
anything of one topic was fed (no fetch answer yet for the other topic, so nothing checkpointed: the
start of the fleet test, where a second instance joins within a second) came back with that topic's
position after its dropped records, which were never fetched again. The pair then waited silently, with
nothing buffered, for records it had skipped (pair 1 of the fleet test never published a window).
"""

from __future__ import annotations

import logging
from typing import Any

from kafka import TopicPartition
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.errors import IllegalStateError, KafkaError

from rankwatch.consumers.alignment import PartitionPair
from rankwatch.consumers.checkpoints import CheckpointError, CheckpointRef
from rankwatch.consumers.fetch_compat import known_position, stale_leader_assignment
from rankwatch.consumers.outage import FatalKafkaError, is_fatal, is_retriable, one_line
from rankwatch.pipeline.stream.snapshot import ConfigChanged

log = logging.getLogger("rankwatch.consumers.service")

CONSUMING = "consuming partition pairs %s"


class Rebalancer(AsyncConsumerRebalanceListener):
    """The service's rebalance listener and the loop-side restore of the pairs it queued."""

    def __init__(self, service: Any) -> None:
        self.svc = service  # the ConsumerService (not imported: service imports this module)
        self.restoring: dict[int, tuple[Any, Any]] = {}  # pair -> (impressions tp, clicks tp), paused
        self.fatal: BaseException | None = None  # raised by the loop (an exception here would be swallowed)
        self.config_changes_logged: set[str] = set()  # one warning per change, not per pair

    # -- listener (kafka-python's I/O thread, while the loop is inside poll) ----------------------------
    async def on_partitions_revoked(self, revoked: Any) -> None:
        svc = self.svc
        svc.committer.cancel()  # a periodic checkpoint asked for: the pairs change (this one waits)
        parts = {tp.partition for tp in revoked}
        with svc._lock:
            owned = [p for p in parts if p in svc._pairs]
            for p in parts:
                self.restoring.pop(p, None)
        if owned:
            offsets = svc.checkpoint(owned, in_listener=True)
            if offsets:
                assert svc._consumer is not None
                try:
                    await svc._consumer._coordinator._commit_offsets_sync_async(offsets)
                    svc.committer.committed(svc.committer.pending)
                    svc._outage.succeeded()
                except Exception as e:  # noqa: BLE001 - the next owner restores the last good commit
                    svc.committer.failures += 1
                    if is_retriable(e):
                        svc._outage.failed("commit on revocation", e)
                    else:
                        log.warning("commit on revocation failed: %s", one_line(e))
        with svc._lock:
            for p in owned:
                pair = svc._pairs.pop(p)
                for tp, offset in pair.release().items():
                    self._rewind(tp, offset)
                svc._parked[p] = pair
            svc._paused = {tp for tp in svc._paused if tp.partition not in parts}

    def _rewind(self, tp: Any, offset: int) -> None:
        """Seek a revoked partition back to where its pair's state resumes (module docstring, "Positions")."""
        consumer = self.svc._consumer
        assert consumer is not None
        try:
            if known_position(consumer, tp) != offset:
                consumer.seek(tp, offset)
        except (IllegalStateError, ValueError, KeyError):
            pass  # not assigned any more: the position goes with the partition

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.svc.committer.cancel()
        self.queue(assigned)

    async def on_partitions_lost(self, lost: Any) -> None:
        # Evicted: our commits would be refused. Drop the state; the next owner restores the last commit.
        svc = self.svc
        svc.committer.cancel()
        with svc._lock:
            for tp in lost:
                svc._pairs.pop(tp.partition, None)
                svc._parked.pop(tp.partition, None)
                self.restoring.pop(tp.partition, None)

    def queue(self, assigned: Any) -> None:
        """Pause every new pair of ``assigned`` and queue it for :meth:`restore_pending` (no I/O)."""
        svc = self.svc
        k = svc.kafka
        consumer = svc._consumer
        assert consumer is not None
        by_partition: dict[int, set[str]] = {}
        for tp in assigned:
            by_partition.setdefault(tp.partition, set()).add(tp.topic)
        with svc._lock:
            for p, topics in sorted(by_partition.items()):
                tps = [TopicPartition(t, p) for t in sorted(topics)]
                if topics != {k.impressions_topic, k.clicks_topic}:
                    # Only the range assignor co-locates pairs; anything else would split requests.
                    log.error("partition %d assigned without its pair (%s); not consuming it", p, sorted(topics))
                    consumer.pause(*tps)
                    continue
                if p in svc._pairs or p in self.restoring:
                    continue
                consumer.pause(*tps)
                self.restoring[p] = (TopicPartition(k.impressions_topic, p), TopicPartition(k.clicks_topic, p))
            if not self.restoring:
                log.info(CONSUMING, sorted(svc._pairs))

    # -- loop thread ------------------------------------------------------------------------------------
    def adopt_unqueued(self) -> None:
        """Safety net: an assigned pair the listener never set up (not owned, not queued) is queued now."""
        consumer = self.svc._consumer
        assert consumer is not None
        coordinator = getattr(consumer, "_coordinator", None)
        self.svc._watchdog.watch_empty(consumer, coordinator)
        stable = getattr(coordinator, "stable", None)
        if self.svc._outage.active or (callable(stable) and not stable()) or getattr(coordinator, "rejoin_needed", False):
            return  # mid-rebalance the old assignment is still listed: only a settled group says anything
        if coordinator is not None and stale_leader_assignment(consumer):
            log.warning("the group's last assignment predates the topics' partitions in the metadata; rejoining")
            coordinator.request_rejoin()
            return
        with self.svc._lock:
            known = set(self.svc._pairs) | set(self.restoring)
        assigned = [tp for tp in consumer.assignment() if tp.partition not in known]
        if assigned:
            log.warning("partitions %s assigned but never set up; restoring them now", sorted(assigned))
            self.queue(assigned)

    def restore_pending(self) -> None:
        """Restore every queued pair (see the module docstring); a failing step leaves the pair queued."""
        if not self.restoring:
            return
        svc = self.svc
        restored = False
        consumer = svc._consumer
        assert consumer is not None
        for p, (imp_tp, clk_tp) in sorted(self.restoring.items()):
            pair = self._restore(p, imp_tp, clk_tp)
            if pair is None:
                return  # an outage: retried on a later turn (the loop backs off)
            with svc._lock:
                if self.restoring.pop(p, None) is None:
                    continue
                try:
                    for tp in (imp_tp, clk_tp):
                        off = pair.next_offset.get(tp)
                        if off is not None:
                            consumer.seek(tp, off)
                    consumer.resume(imp_tp, clk_tp)
                except IllegalStateError:
                    continue  # no longer assigned: a newer rebalance took it
                svc._pairs[p] = pair
                restored = True
        if restored and not self.restoring:
            svc._parked.clear()
            log.info(CONSUMING, sorted(svc._pairs))

    def _restore(self, p: int, imp_tp: Any, clk_tp: Any) -> PartitionPair | None:
        svc = self.svc
        consumer, store = svc._consumer, svc._store
        assert consumer is not None and store is not None
        committed: dict[Any, Any] = {}
        for tp in (imp_tp, clk_tp):
            ok, meta = svc._outage.attempt("committed-offset look-up", consumer.committed, tp, metadata=True,
                                           timeout_ms=5000)
            if not ok:
                return None
            committed[tp] = meta
        svc._outage.succeeded()
        meta = committed[imp_tp]
        ref = CheckpointRef.from_metadata(meta.metadata if meta is not None else None)
        parked = svc._parked.get(p)
        if parked is not None and ref is not None and parked.checkpoint == ref and parked.fed_since_checkpoint == 0:
            return parked  # our own state, and nobody committed since: no need to read it back
        skew = svc.stream.allowed_disorder_ms // 2
        if ref is None:
            processor = svc._cores.new((p,))
            start = {tp: (committed[tp].offset if committed[tp] is not None and committed[tp].offset >= 0 else None)
                     for tp in (imp_tp, clk_tp)}
            return PartitionPair(p, imp_tp, clk_tp, processor, start, max_skew_ms=skew, event_time=svc.event_time)
        try:
            ok, got = svc._outage.attempt("checkpoint read", store.read, p, ref)
        except CheckpointError as e:
            raise FatalKafkaError(f"the committed checkpoint of pair {p} cannot be read: {e}") from None
        if not ok or got is None:
            return None
        checkpoint, orphans = got
        try:
            processor = svc._cores.restore(checkpoint.snapshot)
        except ConfigChanged as e:
            # windows, attribution, slices or metric options changed since the checkpoint: its windows and
            # join state mean something else now. Start the pair fresh from the checkpoint's offsets, as a
            # new group would (docs/config-changes.md); the next checkpoint replaces this one.
            what = "; ".join(e.changes)
            level = logging.DEBUG if what in self.config_changes_logged else logging.WARNING
            self.config_changes_logged.add(what)
            log.log(level, "the configuration changed since the checkpoint of pair %d (%s): its pairs start fresh "
                    "from their checkpoints' offsets, without their open windows and pending requests", p, what)
            processor = svc._cores.new((p,))
        pair = PartitionPair(p, imp_tp, clk_tp, processor,
                             {imp_tp: checkpoint.impressions_offset, clk_tp: checkpoint.clicks_offset}, ref,
                             max_skew_ms=skew, event_time=svc.event_time)
        for stale in [*orphans, *([checkpoint.previous] if checkpoint.previous else [])]:
            try:
                store.delete(p, stale)
            except KafkaError as e:  # tombstones are housekeeping: compaction of a later one will do
                if is_fatal(e):
                    raise
        svc._restores += 1
        return pair
