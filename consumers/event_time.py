"""The event time of a raw Kafka value, for merging the two topics by event time (``[kafka] timestamps``).

Layout: :func:`event_time_of` returns one function ``(is_impression, value) -> epoch ms`` for the service's
event mapping: section 1 events are sniffed for their ``ts`` alone
(:func:`pipeline.events.validation.sniff_ts_ms`); mapped events are decoded by the translator's decoder and
read through the mapping's compiled ``ts`` rule (path, unit, default), the rule the core's translation
applies, without translating the rest of the event.

Why 0 for a value without a readable time: it is bad input the core will reject and dead-letter, so it
flows straight through the merge instead of holding back the records behind it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from rankwatch.pipeline.events.mapping import EventMapping
from rankwatch.pipeline.events.translate import translator_for
from rankwatch.pipeline.events.validation import MAX_TS_MS, sniff_ts_ms

log = logging.getLogger(__name__)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

EventTime = Callable[[bool, bytes], int]


class TimedRecord:
    """A buffered record with its event time as ``timestamp``: the three fields the merge reads (a namedtuple
    ``_replace`` of kafka-python's ConsumerRecord cost three times as much per record)."""

    __slots__ = ("offset", "timestamp", "value")

    def __init__(self, offset: int, timestamp: int, value: bytes | None) -> None:
        self.offset, self.timestamp, self.value = offset, timestamp, value


def merge_time(timestamps: str, events: EventMapping | None, formats: Mapping[str, Any] | None,
               max_event_bytes: int) -> EventTime | None:
    """What the two topics are merged by: None for Kafka record timestamps, else :func:`event_time_of`.

    Avro / Protobuf values (``formats``) need their schemas to be read, which are resolved only before
    feeding: those streams are merged by record timestamps, said once (docs/kafka.md, "Ordering the two
    topics").
    """
    if timestamps != "event":
        return None
    if formats:
        log.warning("[kafka] timestamps = \"event\" reads JSON events only: the %s stream(s) are %s, so the "
                    "topics are ordered by record timestamps (set them to event time in the producers)",
                    "/".join(sorted(formats)), "/".join(sorted({f.format for f in formats.values()})))
        return None
    return event_time_of(events, max_event_bytes)


def event_time_of(events: EventMapping | None, max_event_bytes: int) -> EventTime:
    """``(is_impression, value) -> event time in epoch ms`` (0 when it cannot be read)."""
    translator = None if events is None else translator_for(events, max_event_bytes=max_event_bytes)
    if translator is None:
        def native(is_impression: bool, value: bytes) -> int:
            ts = sniff_ts_ms(value)
            return 0 if ts is None else ts

        return native
    # Only the ts path is read (decode, then the compiled ts rule with its unit): not the whole translation.
    imp_decode, clk_decode = translator.decoders["impressions"], translator.decoders["clicks"]
    imp_ts = events.stream("impressions").field("ts")  # type: ignore[union-attr]
    clk_ts = events.stream("clicks").field("ts")  # type: ignore[union-attr]
    assert imp_ts is not None and clk_ts is not None  # every stream mapping has a ts field
    imp_get, clk_get = imp_ts.get, clk_ts.get

    def mapped(is_impression: bool, value: bytes) -> int:
        decode = imp_decode if is_impression else clk_decode
        if decode is None:  # this stream reads section 1 events unchanged
            ts = sniff_ts_ms(value)
            return 0 if ts is None else ts
        tree = decode(value)
        if type(tree) is not dict:
            return 0
        return _as_ms((imp_get if is_impression else clk_get)(tree))

    return mapped


def _as_ms(v: Any) -> int:
    """Section 1's ``ts`` forms (epoch ms, RFC 3339 with a zone) as epoch ms; 0 for anything else."""
    if type(v) is int:
        return v if 0 <= v <= MAX_TS_MS else 0
    if type(v) is str:
        try:
            when = msgspec.convert(v, datetime)
        except msgspec.ValidationError:
            return 0
        if when.tzinfo is None:
            return 0
        ms = (when - _EPOCH) // _MS
        return ms if 0 <= ms <= MAX_TS_MS else 0
    return 0
