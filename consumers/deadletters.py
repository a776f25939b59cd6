"""Dead letters to Kafka: the rejected event's raw bytes, its origin and the reason in record headers.

Headers (all values UTF-8 text):

==========================  ===================================================
``rankwatch.topic``         topic the event was read from
``rankwatch.partition``     its partition
``rankwatch.offset``        its offset
``rankwatch.reason``        reason code (``pipeline.validation.RejectReason``)
``rankwatch.detail``        one-line detail of the rejection
``rankwatch.stream``        ``impressions`` or ``clicks``
==========================  ===================================================

The record value is the event's bytes exactly as read; the key is the original record's origin
``topic/partition/offset``, so a re-delivery after a crash (see docs/kafka.md) is recognisable.
Sends are asynchronous; the service flushes the producer before it commits a checkpoint, so every dead
letter of a committed offset range is durable (at least once).
"""

from __future__ import annotations

import threading
from typing import Any

from rankwatch.pipeline.deadletter import DeadLetter

HEADER_PREFIX = "rankwatch."


def dead_letter_headers(letter: DeadLetter) -> list[tuple[str, bytes]]:
    src = letter.source
    headers = [
        (HEADER_PREFIX + "reason", str(letter.reason).encode()),
        (HEADER_PREFIX + "detail", " ".join(letter.detail.split())[:1000].encode()),
        (HEADER_PREFIX + "stream", letter.stream.encode()),
    ]
    if src is not None:
        headers[:0] = [
            (HEADER_PREFIX + "topic", src.topic.encode()),
            (HEADER_PREFIX + "partition", str(src.partition).encode()),
            (HEADER_PREFIX + "offset", str(src.offset).encode()),
        ]
    return headers


class KafkaDeadLetterSink:
    """A :class:`pipeline.deadletter.DeadLetterSink` writing to ``topic`` through a shared producer.

    ``counts`` holds the letters sent per ``(stream, reason)``; ``failures`` the sends the broker refused
    (reported by the producer callback, e.g. a record above the topic's size limit).
    """

    def __init__(self, producer: Any, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.counts: dict[tuple[str, str], int] = {}
        self.failures = 0
        self._lock = threading.Lock()

    def send(self, letter: DeadLetter) -> None:
        src = letter.source
        key = None if src is None else f"{src.topic}/{src.partition}/{src.offset}".encode()
        future = self.producer.send(self.topic, key=key, value=letter.raw, headers=dead_letter_headers(letter))
        future.add_errback(self._failed)
        k = (letter.stream, str(letter.reason))
        with self._lock:
            self.counts[k] = self.counts.get(k, 0) + 1

    def _failed(self, _exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
