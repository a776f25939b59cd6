"""The event time of a raw Kafka value, for merging the two topics by event time (``[kafka] timestamps``).

Layout: :func:`event_time_of` returns one function ``(is_impression, value) -> epoch ms`` for the service's
event mapping: section 1 events are sniffed for their ``ts`` alone
(:func:`pipeline.events.validation.sniff_ts_ms`); mapped events go through the translator
(:meth:`pipeline.events.translate.Translator.event_ts_ms`), the same mapping the core applies.

Why 0 for a value without a readable time: it is bad input the core will reject and dead-letter, so it
flows straight through the merge instead of holding back the records behind it.
"""

from __future__ import annotations

from collections.abc import Callable

from rankwatch.pipeline.events.mapping import EventMapping
from rankwatch.pipeline.events.translate import translator_for
from rankwatch.pipeline.events.validation import sniff_ts_ms

EventTime = Callable[[bool, bytes], int]


class TimedRecord:
    """A buffered record with its event time as ``timestamp``: the three fields the merge reads (a namedtuple
    ``_replace`` of kafka-python's ConsumerRecord cost three times as much per record)."""

    __slots__ = ("offset", "timestamp", "value")

    def __init__(self, offset: int, timestamp: int, value: bytes | None) -> None:
        self.offset, self.timestamp, self.value = offset, timestamp, value


def event_time_of(events: EventMapping | None, max_event_bytes: int) -> EventTime:
    """``(is_impression, value) -> event time in epoch ms`` (0 when it cannot be read)."""
    translator = None if events is None else translator_for(events, max_event_bytes=max_event_bytes)
    if translator is None:
        def native(is_impression: bool, value: bytes) -> int:
            ts = sniff_ts_ms(value)
            return 0 if ts is None else ts

        return native
    of = translator.event_ts_ms

    def mapped(is_impression: bool, value: bytes) -> int:
        ts = of("impressions" if is_impression else "clicks", value)
        return 0 if ts is None else ts

    return mapped
