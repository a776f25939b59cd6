"""The checkpoint-then-commit protocol of the consuming service (docs/kafka.md, "Effectively once").

:class:`Committer` writes a pair's checkpoint (and waits for its acknowledgement) before the offsets are
committed with a pointer to it; after a successful commit the checkpoints it replaces are deleted. The
rebalance listener uses the same object: it commits through the coordinator itself, then calls
:meth:`Committer.committed` with :attr:`Committer.pending`.

Why apart from the service: this is the one place whose order decides whether a crash loses or doubles
anything; the service's loop only decides when to call it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kafka.structs import OffsetAndMetadata

from rankwatch.consumers.alignment import PartitionPair
from rankwatch.consumers.checkpoints import CheckpointAborted, CheckpointRef
from rankwatch.consumers.fetch_compat import known_position

log = logging.getLogger("rankwatch.consumers")


class Committer:
    """Checkpoints and commits of the pairs a :class:`consumers.service.ConsumerService` owns."""

    def __init__(self, service: Any) -> None:
        self.svc = service  # the ConsumerService (not imported: service imports this module)
        self.written = 0  # checkpoints made current by a commit
        self.failures = 0  # checkpoint writes or commits that failed
        self.pending: list[tuple[PartitionPair, CheckpointRef]] = []  # written in the listener, to commit

    def resolved_offset(self, pair: PartitionPair, tp: Any) -> int | None:
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
        """Write checkpoints of ``partitions`` and (outside the rebalance listener) commit them.

        Returns the offsets to commit; the listener commits them itself through the coordinator. Nothing is
        committed while a dead letter is unsent (it would be lost with the offsets that produced it).
        """
        store = self.svc._store
        assert store is not None and self.svc._producer is not None
        offsets: dict[Any, OffsetAndMetadata] = {}
        written: list[tuple[PartitionPair, CheckpointRef]] = []
        # Every pair's snapshot and chunks first, then one wait for all acknowledgements: on a backlog the
        # loop stalled for one snapshot round trip and one flush per pair (docs/kafka.md, "Throughput").
        sent: list[tuple[PartitionPair, int, int, int, Any]] = []
        for p in sorted(set(partitions)):
            with self.svc._lock:
                pair = self.svc._pairs.get(p)
                if pair is None:
                    continue
                imp_off = self.resolved_offset(pair, pair.impressions_tp)
                clk_off = self.resolved_offset(pair, pair.clicks_tp)
                if imp_off is None or clk_off is None:
                    continue  # nothing fed yet from a partition whose start is unknown: nothing to save
                snapshot = pair.processor.snapshot()
                fed = pair.fed_since_checkpoint
            ok, out = self.svc._step("checkpoint write", store.send, p, snapshot, impressions_offset=imp_off,
                                     clicks_offset=clk_off, previous=pair.checkpoint)
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
