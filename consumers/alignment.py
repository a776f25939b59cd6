"""One partition pair: the impressions and clicks partitions ``p``, their buffers and their stream processor.

Why buffers: a consumer fetches each topic-partition separately, so one poll can hand over a megabyte of
clicks spanning an hour of event time next to a megabyte of impressions spanning ten minutes. Fed as they
come, the clicks would push the pair's watermark ahead and the impressions behind it would be counted as
late. :meth:`PartitionPair.feed` therefore merges the two buffers by record timestamp and feeds a record
only while the other topic has a later record buffered or has nothing more to read (caught up with its
high watermark). The interleaving the processor sees is then the producers' own, whatever the fetch sizes,
and the streaming core's result does not depend on the order within its allowed disorder.

"Caught up" comes from the high watermark of the last fetch response, which can be stale: the other
topic may have received records since. Within ``max_skew_ms`` of the other topic's last fed timestamp that
does not matter (the core tolerates that much disorder); a record further ahead is fed only once the
broker confirmed, by a request made after the record was fetched, that the other topic has nothing more
(``confirmed``; the service asks with ``end_offsets`` for the partitions in :attr:`PartitionPair.unconfirmed`).
Without this, a burst on one topic followed by a far-ahead record could overtake the other topic's
unfetched records and make them late.

Overtaking waits ``overtake_grace`` (:class:`OvertakeGrace`): one producer writing a burst of both topics
lands each topic's batch in its own produce request, and the service, caught up, can fetch the clicks of
the burst a few milliseconds before their impressions are on the broker. The broker then truthfully
confirms that the impressions topic has nothing more, the clicks move the watermark minutes ahead, and the
impressions that land a moment later are late. So the confirmation counts only once the other topic has
stayed empty (no record arrived) for the grace; in steady traffic, where records stay within
``max_skew_ms`` of each other, nothing waits.

Event time (``[kafka] timestamps = "event"``, the default): most producers leave a record's timestamp at its
send time, so a backfill (every impression of an hour produced before its clicks) would be merged with
every impression first and each click late. With ``event_time`` set, :meth:`PartitionPair.add` replaces
each buffered record's timestamp with its event's own time (consumers/event_time.py) and the merge and
overtake rules below order by that, unchanged.

``next_offset`` of each topic is the offset after the last record *fed*; a checkpoint stores those, never
the fetch position, so buffered records are fetched again after a restore.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rankwatch.consumers.batch_feed import feed_pair
from rankwatch.consumers.checkpoints import CheckpointRef
from rankwatch.consumers.core_process import RemoteProcessor
from rankwatch.consumers.event_time import TimedRecord
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.stream.processor import StreamProcessor


class OvertakeGrace:
    """When a topic-partition that holds back the other topic's records has been empty long enough.

    Parameters
    ----------
    grace_s
        How long a topic-partition must stay without new records, once it holds back a record far ahead
        on the other topic, before the broker is asked to confirm that it has nothing more (module
        docstring, "Overtaking waits"). 0: asked at once.
    monotonic
        The clock (``time.monotonic`` in the service).
    """

    def __init__(self, grace_s: float, monotonic: Callable[[], float]) -> None:
        self.grace_s = grace_s
        self._monotonic = monotonic
        self._since: dict[Any, float] = {}  # topic-partition -> when it was first seen holding back

    def arrived(self, tp: Any) -> None:
        """Records of ``tp`` were fetched: its wait starts again."""
        self._since.pop(tp, None)

    def due(self, holding_back: Iterable[Any]) -> list[Any]:
        """Of the topic-partitions holding back a record now, those empty for the whole grace."""
        now = self._monotonic()
        holding = set(holding_back)
        for tp in [tp for tp in self._since if tp not in holding]:
            del self._since[tp]  # no longer holding anything back: a later wait starts afresh
        return [tp for tp in holding if now - self._since.setdefault(tp, now) >= self.grace_s]


def resume_offset(pair: Any, tp: Any) -> int | None:
    """The offset of ``tp`` a pair's state resumes from: after the last record fed, else the first record
    buffered (none fed yet); None when neither is known (nothing fetched: the position is where reading
    starts). ``pair`` is a :class:`PartitionPair` (or anything with its ``next_offset`` and ``buffers``)."""
    off = pair.next_offset.get(tp)
    if off is None:
        buf = pair.buffers[tp]
        if buf:
            return int(buf[0].offset)
    return off


@dataclass
class PartitionPair:
    """State of pair ``partition``: processor, fed offsets, buffers and the current checkpoint."""

    partition: int
    impressions_tp: Any  # kafka TopicPartition
    clicks_tp: Any
    processor: StreamProcessor | RemoteProcessor
    next_offset: dict[Any, int | None]
    checkpoint: CheckpointRef | None = None
    fed_since_checkpoint: int = 0
    max_skew_ms: int = 0
    buffers: dict[Any, deque[Any]] = field(default_factory=dict)
    last_ts: dict[Any, int | None] = field(default_factory=dict)
    unconfirmed: set[Any] = field(default_factory=set)
    event_time: Callable[[bool, bytes], int] | None = None  # (is_impression, value) -> ms; None: record time

    def __post_init__(self) -> None:
        self.buffers = {self.impressions_tp: deque(), self.clicks_tp: deque()}
        self.last_ts = {self.impressions_tp: None, self.clicks_tp: None}

    def add(self, tp: Any, records: list[Any]) -> None:
        """Buffer fetched records, skipping any the pair already fed (a fetch racing a seek)."""
        floor = self.next_offset.get(tp)
        buf = self.buffers[tp]
        if self.event_time is not None:
            of, imp = self.event_time, tp == self.impressions_tp
            records = [TimedRecord(r.offset, of(imp, r.value or b""), r.value) for r in records]
        if floor is None or (records and records[0].offset >= floor):
            buf.extend(records)  # the usual case (offsets ascend within a fetch): one C call
            return
        for record in records:
            if record.offset >= floor:
                buf.append(record)

    def buffered(self, tp: Any) -> int:
        return len(self.buffers[tp])

    def flow(self, cap: int, paused: set[Any]) -> tuple[list[Any], list[Any]]:
        """Flow control: the topic-partitions to pause (buffer at ``cap``) and to resume (at most ``cap // 2``).

        Resuming at ``n <= cap // 2`` (not ``n < cap // 2``) matters for ``cap = 1``: a paused partition
        resumes once its buffer is empty. Liveness (tests/consumers/test_alignment_progress.py): a partition
        is paused only with ``cap >= 1`` records buffered, so when both are paused both buffers hold records
        and :meth:`feed` takes one; when one is paused and the other is empty, the empty one is fetched.
        """
        pause, resume = [], []
        for tp in self.buffers:
            n = len(self.buffers[tp])
            if n >= cap and tp not in paused:
                pause.append(tp)
            elif n <= cap // 2 and tp in paused:
                resume.append(tp)
        return pause, resume

    def _may_overtake(self, ts: int, other: Any, caught_up: Callable[[Any], bool],
                      confirmed: Callable[[Any], bool]) -> bool:
        if not caught_up(other):
            return False
        last = self.last_ts[other]
        if last is not None and ts <= last + self.max_skew_ms:
            return True
        if confirmed(other):
            return True
        self.unconfirmed.add(other)
        return False

    def feed(self, caught_up: Callable[[Any], bool], confirmed: Callable[[Any], bool] = lambda tp: False,
             *, limit: int = 1_000_000) -> tuple[list[PublishedWindow], int]:
        """Feed buffered records in timestamp order (see module docstring); returns windows and records fed.

        The records go to the core in one :meth:`StreamProcessor.process_batch` call (consumers/batch_feed.py).
        """
        return feed_pair(self, caught_up, confirmed, limit)

    def release(self) -> dict[Any, int]:
        """The pair is revoked: drop its buffered records and return, per topic-partition, its
        :func:`resume_offset` (where known).

        The consumer must be sought back there: the records dropped here were fetched, and a partition the
        group gives back keeps its fetch position (consumers/rebalance.py, "Positions").
        """
        resume = {tp: off for tp in self.buffers if (off := resume_offset(self, tp)) is not None}
        for buf in self.buffers.values():
            buf.clear()
        return resume
