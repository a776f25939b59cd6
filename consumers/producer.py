"""The simulator's producer: generated traffic to the impressions and clicks topics, keyed by ``request_id``.

Both topics are written with the same key (``request_id``) and kafka-python's default partitioner (murmur2,
as the Java client), which is what co-partitioning relies on. The record timestamp is the event time, so
the consumer's timestamp merge of the two topics follows event time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
from kafka.partitioner.default import murmur2

from rankwatch.pipeline.traffic.generator import GeneratedEvent


def partition_of(key: bytes, partitions: int) -> int:
    """The partition kafka-python's (and Java's) default partitioner picks for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class ProduceError(RuntimeError):
    """The broker refused some records (e.g. a timestamp beyond its ``log.message.timestamp.after.max.ms``)."""


@dataclass
class ProduceReport:
    sent: dict[str, int]
    first_ts_ms: int | None = None
    last_ts_ms: int | None = None
    failed: int = 0
    first_error: str | None = None


def produce_events(
    producer: Any,
    events: Iterable[GeneratedEvent],
    *,
    topics: dict[str, str],
    pace_from_ms: int | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_event: Callable[[GeneratedEvent], None] | None = None,
    record_timestamps: bool = True,
) -> ProduceReport:
    """Send ``events`` in order; with ``pace_from_ms`` each is sent when its event time is due in real time.

    ``topics`` maps the generator's stream names (``impressions``, ``clicks``) to topic names. With
    ``record_timestamps`` the record timestamp is the event time, else the broker's send time. Raises
    :class:`ProduceError` when the broker refused any record.
    """
    report = ProduceReport(sent={s: 0 for s in topics})
    started = monotonic()

    def failed(exc: BaseException) -> None:
        report.failed += 1
        if report.first_error is None:
            report.first_error = f"{type(exc).__name__}: {exc}"

    for event in events:
        if pace_from_ms is not None:
            due = started + (event.ts_ms - pace_from_ms) / 1000
            delay = due - monotonic()
            if delay > 0:
                sleep(delay)
        future = producer.send(topics[event.stream], key=event.key, value=event.value,
                               timestamp_ms=event.ts_ms if record_timestamps else None)
        future.add_errback(failed)
        report.sent[event.stream] += 1
        if report.first_ts_ms is None:
            report.first_ts_ms = event.ts_ms
        report.last_ts_ms = event.ts_ms if report.last_ts_ms is None else max(report.last_ts_ms, event.ts_ms)
        if on_event is not None:
            on_event(event)
    producer.flush()
    if report.failed:
        raise ProduceError(f"the broker refused {report.failed} records ({report.first_error})")
    return report


def window_closers(
    partitions: int, ts_ms: int, *, record_ts_ms: int, prefix: str = "rankwatch-close"
) -> list[GeneratedEvent]:
    """One valid impression per partition at ``ts_ms``, keyed so the default partitioner puts it there.

    Sent after a finite burst of traffic they move every partition's watermark past its windows, so the
    service publishes them without waiting for idle timeouts (their own requests sit in a later window).
    Their record timestamp is ``record_ts_ms`` (give the traffic's largest, plus one): the consumer merges
    the two topics by record timestamp, so the markers must sort after every real event, yet brokers
    refuse record timestamps far in the future (``log.message.timestamp.after.max.ms``, 1 h).
    """
    out: dict[int, GeneratedEvent] = {}
    i = 0
    while len(out) < partitions:
        rid = f"{prefix}-{ts_ms}-{i}"
        p = partition_of(rid.encode(), partitions)
        if p not in out:
            doc = {"event_id": f"imp-{rid}", "request_id": rid, "ts": ts_ms, "segment": "__close__",
                   "surface": "__close__", "items": [{"item_id": "i-close", "position": 1, "score": 0.0}]}
            out[p] = GeneratedEvent("impressions", rid.encode(), msgspec.json.encode(doc), record_ts_ms)
        i += 1
    return [out[p] for p in sorted(out)]
