"""Bounded memories of the streaming core: ids it has seen, and feedback waiting for its impression.

Both forget in two ways, and both are documented in docs/streaming.md:

- by watermark time: an entry is tagged with the finalization step it arrived in and dropped once the
  watermark has moved ``retention_ms`` past that (after which the entry could not change a metric anyway),
- by count: past ``capacity`` the oldest whole tag group is dropped first (FIFO).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from rankwatch.pipeline.stream.join import FeedbackEntry


class ExpiringIds:
    """A set of string ids that forgets old ones (see module docstring)."""

    def __init__(self, *, capacity: int, retention_ms: int) -> None:
        self.capacity = capacity
        self.retention_ms = retention_ms
        self.ids: set[str] = set()
        self.groups: deque[tuple[int, list[str]]] = deque()
        self.forgotten_at_capacity = 0
        # The newest group, for callers' inlined fast path: a new id with tag ``tail_tag`` while
        # ``len(ids) < capacity`` goes to ``ids`` and ``tail`` (exactly what :meth:`add` would do).
        self.tail_tag: int | None = None
        self.tail: list[str] = []

    def __contains__(self, key: str) -> bool:
        return key in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, key: str, tag_ms: int) -> None:
        """Remember ``key``; ``tag_ms`` is the (stepped) watermark at arrival."""
        self.ids.add(key)
        groups = self.groups
        if groups and groups[-1][0] == tag_ms:
            groups[-1][1].append(key)
        else:
            groups.append((tag_ms, [key]))
            self._retail()
        if len(self.ids) > self.capacity:
            while len(self.ids) > self.capacity and groups:
                _, keys = groups.popleft()
                self.forgotten_at_capacity += len(keys)
                self.ids.difference_update(keys)
            self._retail()

    def _retail(self) -> None:
        if self.groups:
            self.tail_tag, self.tail = self.groups[-1]
        else:
            self.tail_tag, self.tail = None, []

    def add_many(self, keys: list[str], tag_ms: int) -> None:
        """``add`` of every key in order (one set update when no eviction can happen meanwhile)."""
        if len(self.ids) + len(keys) > self.capacity:
            for key in keys:
                self.add(key, tag_ms)
            return
        self.ids.update(keys)
        groups = self.groups
        if groups and groups[-1][0] == tag_ms:
            groups[-1][1].extend(keys)
        elif keys:
            groups.append((tag_ms, list(keys)))
            self._retail()

    def expire(self, watermark_ms: int) -> None:
        groups = self.groups
        while groups and groups[0][0] + self.retention_ms < watermark_ms:
            self.ids.difference_update(groups.popleft()[1])
        if not groups:
            self._retail()

    def to_state(self) -> dict[str, Any]:
        return {"groups": [[t, [k for k in keys if k in self.ids]] for t, keys in self.groups],
                "forgotten": self.forgotten_at_capacity}

    @classmethod
    def from_state(cls, state: dict[str, Any], *, capacity: int, retention_ms: int) -> ExpiringIds:
        out = cls(capacity=capacity, retention_ms=retention_ms)
        for t, keys in state["groups"]:
            out.groups.append((int(t), list(keys)))
            out.ids.update(keys)
        out.forgotten_at_capacity = int(state["forgotten"])
        out._retail()
        return out


class EarlyFeedback:
    """Feedback whose request has not been seen yet, waiting until no impression could still claim it.

    Feedback at ``ts`` can only be attributed to a request with ``request_ts <= ts``, whose deadline is at
    most ``ts + attribution_window``; once the (stepped) watermark passes that, the feedback is an orphan.
    Entries are bucketed by that expiry like pending requests are.
    """

    def __init__(self, *, attribution_window_ms: int, step_ms: int, capacity: int) -> None:
        self.attribution_window_ms = attribution_window_ms
        self.step_ms = step_ms
        self.capacity = capacity
        self.by_request: dict[str, list[FeedbackEntry]] = {}
        self.buckets: dict[int, list[str]] = {}
        self.heap: list[int] = []
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def _bucket(self, ts_ms: int) -> int:
        return (ts_ms + self.attribution_window_ms) // self.step_ms

    def add(self, request_id: str, entry: FeedbackEntry) -> None:
        self.by_request.setdefault(request_id, []).append(entry)
        b = self._bucket(entry[2])
        lst = self.buckets.get(b)
        if lst is None:
            self.buckets[b] = [request_id]
            heapq.heappush(self.heap, b)
        else:
            lst.append(request_id)
        self.count += 1

    def pop(self, request_id: str) -> list[FeedbackEntry]:
        """All waiting feedback of a request (now seen)."""
        entries = self.by_request.pop(request_id, [])
        self.count -= len(entries)
        return entries

    def expire(self, watermark_ms: int) -> int:
        """Drop feedback whose expiry bucket ended at or before ``watermark_ms``; returns how many (orphans)."""
        dropped = 0
        while self.heap and (self.heap[0] + 1) * self.step_ms <= watermark_ms:
            dropped += self._drop_bucket()
        return dropped

    def evict_oldest(self) -> int:
        """Drop the earliest bucket that still holds entries (at capacity); returns how many were dropped.

        Buckets whose entries all left (their request came: :meth:`pop`) stay on the heap until reached;
        dropping only such a stale bucket freed nothing, so the memory grew past its capacity, and a
        processor restored from a snapshot (whose heap has no stale buckets) then behaved differently.
        """
        while self.heap:
            dropped = self._drop_bucket()
            if dropped:
                return dropped
        return 0

    def _drop_bucket(self) -> int:
        b = heapq.heappop(self.heap)
        dropped = 0
        for rid in set(self.buckets.pop(b)):
            entries = self.by_request.get(rid)
            if not entries:
                continue
            keep = [e for e in entries if self._bucket(e[2]) > b]
            dropped += len(entries) - len(keep)
            if keep:
                self.by_request[rid] = keep
            else:
                del self.by_request[rid]
        self.count -= dropped
        return dropped

    def to_state(self) -> list[Any]:
        return [[rid, [list(e) for e in entries]] for rid, entries in self.by_request.items()]

    @classmethod
    def from_state(cls, state: list[Any], *, attribution_window_ms: int, step_ms: int, capacity: int) -> EarlyFeedback:
        out = cls(attribution_window_ms=attribution_window_ms, step_ms=step_ms, capacity=capacity)
        for rid, entries in state:
            for a, b, c, d in entries:
                out.add(rid, (str(a), int(b), int(c), bool(d)))
        return out
