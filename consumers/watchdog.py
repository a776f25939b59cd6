"""Watches of the consuming loop that end in one log line or one fatal error.

:class:`Watchdog` holds what they remember between turns: :meth:`Watchdog.watch_stalls` (every 30 s) names
a pair that holds records but fed nothing, with Kafka reachable (such a stall was once silent), and a pair
that fed nothing and holds nothing while the broker has records for it (its lag, asked of the broker: a
pair whose partitions are never fetched again, as after the lost position of consumers/rebalance.py,
"Positions", or a pause never lifted, said nothing at all);
:meth:`Watchdog.check_topics` (every 5 s) ends the service with one line when a topic is gone, or the two
topics are no longer co-partitioned, for 60 s (an admin adding partitions to both topics one after the
other passes through a moment of difference); :meth:`Watchdog.watch_empty` (every 10 s, from the
rebalancer's safety net) names what the group coordinator thinks when nothing was assigned for 30 s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rankwatch.consumers.alignment import resume_offset
from rankwatch.consumers.fetch_compat import cached_partitions, known_position, parked_partitions
from rankwatch.consumers.outage import FatalKafkaError

log = logging.getLogger("rankwatch.consumers.service")  # the service's lines, as before the split


class Watchdog:
    """The stall, empty-assignment and topic watches of ``svc`` (a :class:`consumers.service.ConsumerService`)."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        self.fed_marks: dict[int, tuple[int | None, ...]] = {}  # fed offsets at the last watch
        self.stalled: set[int] = set()  # pairs named for their buffered records
        self.behind: set[int] = set()  # pairs named for their lag with nothing buffered
        self.topics_bad_since: float | None = None
        self.empty_since: float | None = None  # monotonic time since which nothing is assigned
        self.empty_warned = False

    def watch_stalls(self) -> None:
        """One WARNING line for a pair that fed nothing for 30 s with Kafka reachable (such stalls were once
        silent): holding records, it names what the pair waits for; holding nothing, it is named when the
        broker has records for it (:meth:`watch_lag`)."""
        svc = self.svc
        idle: list[int] = []  # fed nothing since the last watch, and hold nothing
        with svc._lock:
            for p, pair in svc._pairs.items():
                mark = tuple(pair.next_offset.get(tp) for tp in pair.buffers)
                still = self.fed_marks.get(p) == mark
                if still and not any(pair.buffers.values()):
                    idle.append(p)
                stalled = any(pair.buffers.values()) and still
                if stalled and not svc._outage.active and p not in self.stalled:
                    log.warning("pair %d fed nothing for 30 s: buffered %s, paused %s, parked %s", p,
                                {tp.topic: len(b) for tp, b in pair.buffers.items()}, *self._held_back(p))
                    self.stalled.add(p)
                elif not stalled:
                    self.stalled.discard(p)
                self.fed_marks[p] = mark
        self.behind &= set(idle)  # a pair that fed, or buffered, or is gone: its next stall is named again
        if idle and not svc._outage.active:
            self.watch_lag(idle)

    def watch_lag(self, idle: list[int]) -> None:
        """One WARNING line per pair of ``idle`` (fed nothing for 30 s, nothing buffered) whose partitions
        the broker holds records past (end offsets asked now, bounded; nothing said without an answer).

        The pair's place in a partition is after its last record fed, else the consumer's fetch position
        (nothing fed yet). Its lag is the broker's end offset minus that place; an idle pair that is caught
        up has none and is not named.
        """
        svc = self.svc
        consumer = svc._consumer
        places: dict[Any, tuple[int, int]] = {}  # topic-partition -> (pair, offset the pair is at)
        with svc._lock:
            for p in idle:
                pair = svc._pairs.get(p)
                for tp in pair.buffers if pair is not None else ():
                    at = resume_offset(pair, tp)  # nothing buffered: after the last record fed
                    if at is None and consumer is not None:
                        at = known_position(consumer, tp)
                    if at is not None:
                        places[tp] = (p, at)
        ends = svc._end_offsets(list(places)) if places else None
        if ends is None:
            return  # no answer (an outage says so itself), or no place known
        lags: dict[int, dict[str, int]] = {}
        for tp, (p, at) in places.items():
            end = ends.get(tp)
            if end is not None and end > at:
                lags.setdefault(p, {})[tp.topic] = end - at
        for p in idle:
            if p not in lags:
                self.behind.discard(p)
            elif p not in self.behind:
                self.behind.add(p)
                log.warning("pair %d fed nothing for 30 s and holds nothing while the broker has records for it: "
                            "lag %s, paused %s, parked %s", p, lags[p], *self._held_back(p))

    def _held_back(self, p: int) -> tuple[list[str], list[str]]:
        """The topics of pair ``p`` the service paused, and those kafka-python parked (what a stall line names)."""
        svc = self.svc
        return (sorted(tp.topic for tp in svc._paused if tp.partition == p),
                sorted(tp.topic for tp in parked_partitions(svc._consumer) if tp.partition == p))

    def watch_empty(self, consumer: Any, coordinator: Any) -> None:
        """One WARNING line when nothing has been assigned for 30 s: a lone member should never sit there
        (more members than partitions would), and the line says what the group coordinator thinks."""
        if consumer.assignment() or self.svc._outage.active:
            self.empty_since = None
            return
        now = time.monotonic()
        if self.empty_since is None:
            self.empty_since, self.empty_warned = now, False
        elif now - self.empty_since >= 30.0 and not self.empty_warned:
            self.empty_warned = True
            log.warning("no partition assigned for 30 s: member state %s, rejoin needed %s, leader %s, "
                        "assigned from %s, metadata %s", getattr(coordinator, "state", "?"),
                        getattr(coordinator, "rejoin_needed", "?"), getattr(coordinator, "_is_leader", "?"),
                        getattr(coordinator, "_assignment_snapshot", "?"), getattr(coordinator, "_metadata_snapshot", "?"))

    def check_topics(self, now: float) -> None:
        """A topic gone, or the two topics no longer co-partitioned, for 60 s: fatal (one line)."""
        svc = self.svc
        consumer = svc._consumer
        assert consumer is not None
        k = svc.kafka
        if getattr(consumer, "_cluster", None) is None:
            return  # another kafka-python: no cache to read without I/O
        counts = [cached_partitions(consumer, t) for t in (k.impressions_topic, k.clicks_topic)]
        if all(counts) and len(counts[0] or ()) == len(counts[1] or ()):
            self.topics_bad_since = None
            return
        if svc._outage.active:
            return  # metadata of an unreachable cluster says nothing
        if self.topics_bad_since is None:
            self.topics_bad_since = now
        elif now - self.topics_bad_since >= 60.0:
            if not all(counts):
                missing = [t for t, c in zip((k.impressions_topic, k.clicks_topic), counts, strict=True) if not c]
                raise FatalKafkaError(f"topic {missing[0]} does not exist any more")
            raise FatalKafkaError(
                f"topics {k.impressions_topic} and {k.clicks_topic} are no longer co-partitioned "
                f"({len(counts[0] or ())} and {len(counts[1] or ())} partitions)")
