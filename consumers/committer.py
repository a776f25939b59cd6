"""The checkpoint-then-commit protocol of the consuming service (docs/kafka.md, "Effectively once").

:class:`Committer` writes a pair's checkpoint (and waits for its acknowledgement) before the offsets are
committed with a pointer to it; after a successful commit the checkpoints it replaces are deleted. The
rebalance listener uses the same object: it commits through the coordinator itself, then calls
:meth:`Committer.committed` with :attr:`Committer.pending`. The loop's periodic checkpoint
(:meth:`Committer.periodic`) asks for its snapshots without waiting and writes them on a later turn, once
they are all answered; the listener's and the final checkpoint (:meth:`Committer.checkpoint`) wait.

Why apart from the service: this is the one place whose order decides whether a crash loses or doubles
anything; the service's loop only decides when to call it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kafka.structs import OffsetAndMetadata

from rankwatch.consumers.alignment import PartitionPair, resume_offset
from rankwatch.consumers.answer import Answer, ask_snapshot
from rankwatch.consumers.checkpoints import CheckpointAborted, CheckpointRef
from rankwatch.consumers.fetch_compat import known_position

log = logging.getLogger("rankwatch.consumers")

# A pair's checkpoint in the making: (pair, impressions offset, clicks offset, fed, its snapshot's answer)
_Asked = tuple[PartitionPair, int, int, int, Answer]


class Committer:
    """Checkpoints and commits of the pairs a :class:`consumers.service.ConsumerService` owns."""

    def __init__(self, service: Any) -> None:
        self.svc = service  # the ConsumerService (not imported: service imports this module)
        self.written = 0  # checkpoints made current by a commit
        self.failures = 0  # checkpoint writes or commits that failed
        self.pending: list[tuple[PartitionPair, CheckpointRef]] = []  # written in the listener, to commit
        self.asked: list[_Asked] | None = None  # the periodic checkpoint's snapshots, asked for

    def resolved_offset(self, pair: PartitionPair, tp: Any) -> int | None:
        """Next offset to read of ``tp`` as of the state: after the last record fed, else where reading starts.

        None when that is not known without asking the broker (nothing fetched yet): never block here, this
        runs under the pair lock and in the rebalance listener on the consumer's I/O thread.
        """
        off = resume_offset(pair, tp)
        if off is not None:
            return off
        consumer = self.svc._consumer
        assert consumer is not None
        try:
            if consumer.highwater(tp) is None:
                return None  # no fetch response yet, so the position may still be being reset
            position = known_position(consumer, tp)
        except Exception:  # noqa: BLE001 - not assigned any more, or would block
            return None
        return None if position is None else int(position)

    def checkpoint(self, partitions: Iterable[int], *, in_listener: bool = False,
                   timeout_s: float = 20.0) -> dict[Any, OffsetAndMetadata]:
        """Write checkpoints of ``partitions`` and (outside the rebalance listener) commit them, waiting for
        each snapshot; a periodic checkpoint still asked for is cancelled (this one replaces it).

        Returns the offsets to commit; the listener commits them itself through the coordinator. Nothing is
        committed while a dead letter is unsent (it would be lost with the offsets that produced it).
        """
        self.cancel()
        return self._write(self._ask(partitions, wait=True), in_listener=in_listener, timeout_s=timeout_s)

    def periodic(self, partitions: Callable[[], Iterable[int]], *, due: bool, timeout_s: float) -> bool:
        """The loop's checkpoint, in two turns or more: when ``due``, ask the snapshots of ``partitions()``
        without waiting; on a later turn, once every answer is here, write and commit as :meth:`checkpoint`.

        Returns True when a periodic checkpoint ended (written, failed, or nothing to save). The offsets and
        ``fed`` are taken when asking, under the lock: the snapshot request sits behind exactly the batches
        already sent, so it holds exactly what those offsets say. A rebalance or a stop in between cancels it
        (:meth:`cancel`; the listener's or the final checkpoint then waits as always); an outage counts as a
        failed checkpoint, tried again next interval.
        """
        if self.asked is None:
            if not due:
                return False
            self.asked = list(self._ask(partitions(), wait=False))
        if not all(entry[4].done for entry in self.asked):
            return False
        asked = self.asked
        self.asked = None
        if self.svc._stop.is_set():
            return True  # the final checkpoint saves them
        if self.svc._outage.active:
            self.failures += 1
            return True
        with self.svc._lock:  # a pair dropped or replaced since (a restore): its snapshot is stale
            current = [entry for entry in asked if self.svc._pairs.get(entry[0].partition) is entry[0]]
        self._write(iter(current), in_listener=False, timeout_s=timeout_s)
        return True

    def cancel(self) -> None:
        """Forget a periodic checkpoint still asked for: its answers are discarded when they come."""
        asked, self.asked = self.asked, None
        for entry in asked or ():
            entry[4].cancel()

    def _ask(self, partitions: Iterable[int], *, wait: bool) -> Iterator[_Asked]:
        """Per pair, under the lock: the offsets the state holds, ``fed`` and its snapshot (asked for)."""
        for p in sorted(set(partitions)):
            with self.svc._lock:
                pair = self.svc._pairs.get(p)
                if pair is None:
                    continue
                imp_off = self.resolved_offset(pair, pair.impressions_tp)
                clk_off = self.resolved_offset(pair, pair.clicks_tp)
                if imp_off is None or clk_off is None:
                    continue  # nothing fed yet from a partition whose start is unknown: nothing to save
                answer = Answer.of(pair.processor.snapshot()) if wait else ask_snapshot(pair.processor)
                fed = pair.fed_since_checkpoint
            yield pair, imp_off, clk_off, fed, answer

    def _write(self, asked: Iterator[_Asked], *, in_listener: bool, timeout_s: float) -> dict[Any, OffsetAndMetadata]:
        store = self.svc._store
        assert store is not None and self.svc._producer is not None
        offsets: dict[Any, OffsetAndMetadata] = {}
        written: list[tuple[PartitionPair, CheckpointRef]] = []
        # Every pair's snapshot and chunks first, then one wait for all acknowledgements: on a backlog the
        # loop stalled for one snapshot round trip and one flush per pair (docs/kafka.md, "Throughput").
        sent: list[tuple[PartitionPair, int, int, int, Any]] = []
        for pair, imp_off, clk_off, fed, answer in asked:
            ok, out = self.svc._step("checkpoint write", store.send, pair.partition, answer.result(),
                                     impressions_offset=imp_off, clicks_offset=clk_off, previous=pair.checkpoint)
            if not ok or out is None:
                self.failures += 1
                break
            sent.append((pair, imp_off, clk_off, fed, out))
        for pair, imp_off, clk_off, fed, out in sent:
            try:
                ok, ref = self.svc._step("checkpoint write", store.acknowledged, out, timeout_s=timeout_s,
                                         abort=self.svc._stop.is_set if not in_listener else (lambda: False))
            except CheckpointAborted:  # SIGTERM mid-write: the final checkpoint tries again, bounded
                ok, ref = False, None
            if not ok or ref is None:  # keep running, try again next interval
                self.failures += 1
                break
            self.svc._outage.succeeded()
            meta = ref.to_metadata()
            offsets[pair.impressions_tp] = OffsetAndMetadata(imp_off, meta, -1)
            offsets[pair.clicks_tp] = OffsetAndMetadata(clk_off, meta, -1)
            written.append((pair, ref))
            pair.fed_since_checkpoint -= fed
        if self.svc._dead is not None and self.svc._dead.unsent:
            log.debug("%d dead letters unsent: not committing", len(self.svc._dead.unsent))
            return {}
        if in_listener or not offsets:
            self.pending = written
            return offsets
        assert self.svc._consumer is not None
        # A refusal (e.g. a rebalance) is a warning: the new owner restores the last commit.
        ok, _ = self.svc._step("commit", self.svc._consumer.commit, offsets, timeout_ms=int(timeout_s * 1000))
        if not ok:
            self.failures += 1
            return offsets
        self.svc._outage.succeeded()
        self.committed(written)
        return offsets

    def committed(self, written: list[tuple[PartitionPair, CheckpointRef]]) -> None:
        """After a successful commit: the new checkpoints are current, the ones they replace are deleted."""
        store = self.svc._store
        assert store is not None
        for pair, ref in written:
            old, pair.checkpoint = pair.checkpoint, ref
            self.written += 1
            if old is not None and old != ref:
                store.delete(pair.partition, old)
