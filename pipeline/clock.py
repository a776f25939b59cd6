"""Injected clocks. The pipeline never reads the wall clock itself; callers hand it a :class:`Clock`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Current time, timezone-aware."""
        ...


class ManualClock:
    """A clock that only moves when told to; for tests, replay and the demo's accelerated time."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(1970, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start time")
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> None:
        if delta < timedelta(0):
            raise ValueError("a clock does not go backwards")
        self._now += delta

    def set(self, when: datetime) -> None:
        if when.tzinfo is None:
            raise ValueError("times must be timezone-aware")
        self._now = when


def ms_to_datetime(ms: int) -> datetime:
    """Epoch milliseconds to an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def datetime_to_ms(when: datetime) -> int:
    if when.tzinfo is None:
        raise ValueError("times must be timezone-aware")
    return int(round(when.timestamp() * 1000))
