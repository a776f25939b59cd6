"""The event-time watermark: how far event time has surely progressed.

``watermark = min over source partitions p of (max event ts seen on p) - allowed_disorder``, never going
backwards. Without partitions there is one implicit partition. An event with a ts below the watermark is
*behind*: the core treats its request or feedback as late once the stepped watermark passed its deadline.

Idle handling uses the injected clock only in :meth:`Watermark.tick` (never per event): a partition that
received no event for ``idle_timeout_ms`` of clock time stops holding the watermark back; when every
partition is idle the watermark follows the clock (``now - allowed_disorder``), so windows still close
when traffic stops.
"""

from __future__ import annotations

from typing import Any

_ANY = -1  # the implicit partition when none are given


class Watermark:
    def __init__(self, *, partitions: tuple[int, ...], allowed_disorder_ms: int, idle_timeout_ms: int) -> None:
        self.partitions = tuple(partitions) or (_ANY,)
        self.partitioned = bool(partitions)
        self.allowed_disorder_ms = allowed_disorder_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.max_ts: dict[int, int | None] = {p: None for p in self.partitions}
        self.last_active_ms: dict[int, int | None] = {p: None for p in self.partitions}
        self.idle: set[int] = set()
        self.seen_since_tick: set[int] = set()
        self.value: int | None = None

    def observe(self, partition: int | None, ts_ms: int) -> int | None:
        """Account for an event of ``partition`` at ``ts_ms``; returns the (possibly new) watermark."""
        if not self.partitioned:  # the hot path: one implicit partition
            current = self.max_ts[_ANY]
            if current is None or ts_ms > current:
                self.max_ts[_ANY] = ts_ms
                wm = ts_ms - self.allowed_disorder_ms
                if self.value is None or wm > self.value:
                    self.value = wm
            self.seen_since_tick.add(_ANY)
            self.idle.discard(_ANY)
            return self.value
        p = _ANY if partition is None else partition
        current = self.max_ts.get(p, 0)
        if current is None or ts_ms > current:
            if p not in self.max_ts:  # a partition we were not told about does not move the watermark
                return self.value
            self.max_ts[p] = ts_ms
            self.seen_since_tick.add(p)
            if p in self.idle:
                self.idle.discard(p)
            self._recompute(None)
        else:
            self.seen_since_tick.add(p)
            self.idle.discard(p)
        return self.value

    def tick(self, now_ms: int) -> int | None:
        """Idle detection against the clock; returns the (possibly advanced) watermark."""
        for p in self.partitions:
            if p in self.seen_since_tick or self.last_active_ms[p] is None:
                self.last_active_ms[p] = now_ms
            elif now_ms - self.last_active_ms[p] >= self.idle_timeout_ms:  # type: ignore[operator]
                self.idle.add(p)
        self.seen_since_tick.clear()
        self._recompute(now_ms)
        return self.value

    def _recompute(self, now_ms: int | None) -> None:
        active = [self.max_ts[p] for p in self.partitions if p not in self.idle]
        if not active:
            candidate = None if now_ms is None else now_ms - self.allowed_disorder_ms
        elif any(ts is None for ts in active):
            candidate = None  # a live partition with no event yet holds the watermark
        else:
            candidate = min(active) - self.allowed_disorder_ms  # type: ignore[type-var,operator]
        if candidate is not None and (self.value is None or candidate > self.value):
            self.value = candidate

    def to_state(self) -> dict[str, Any]:
        return {
            "partitions": list(self.partitions),
            "max_ts": [self.max_ts[p] for p in self.partitions],
            "last_active": [self.last_active_ms[p] for p in self.partitions],
            "idle": sorted(self.idle),
            "seen": sorted(self.seen_since_tick),
            "value": self.value,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        parts = [int(p) for p in state["partitions"]]
        if tuple(parts) != self.partitions:
            raise ValueError(f"snapshot is for partitions {parts}, not {list(self.partitions)}")
        self.max_ts = dict(zip(parts, state["max_ts"], strict=True))
        self.last_active_ms = dict(zip(parts, state["last_active"], strict=True))
        self.idle = set(state["idle"])
        self.seen_since_tick = set(state["seen"])
        self.value = state["value"]
