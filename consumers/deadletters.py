"""Dead letters to Kafka: the rejected event's raw bytes, its origin and the reason in record headers.

Headers (all values UTF-8 text):

==========================  ===================================================
``rankwatch.topic``         topic the event was read from
``rankwatch.partition``     its partition
``rankwatch.offset``        its offset
``rankwatch.reason``        reason code (``pipeline.events.validation.RejectReason``)
``rankwatch.detail``        one-line detail of the rejection
``rankwatch.stream``        ``impressions`` or ``clicks``
==========================  ===================================================

The record value is the event's bytes exactly as read; the key is the original record's origin
``topic/partition/offset``, so a re-delivery after a crash (see docs/kafka.md) is recognisable.
Sends are asynchronous; the service flushes the producer before it commits a checkpoint, so every dead
letter of a committed offset range is durable (at least once). A send that fails with a retriable error
(the broker is away: no metadata in time, delivery timed out) is kept in :attr:`KafkaDeadLetterSink.unsent`
and sent again by :meth:`KafkaDeadLetterSink.resend`; while any letter is unsent the service commits no
checkpoint, so nothing is lost in an outage. The streaming core never sees an error from this sink.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from rankwatch.consumers.outage import is_retriable
from rankwatch.pipeline.events.deadletter import DeadLetter

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
    """A :class:`pipeline.events.deadletter.DeadLetterSink` writing to ``topic`` through a shared producer.

    ``counts`` holds the letters handed over per ``(stream, reason)``; ``failures`` the sends the broker
    refused for good (e.g. a record above the topic's size limit); ``unsent`` the letters waiting to be sent
    again after a retriable failure (at most ``max_unsent``; beyond that the oldest are dropped and counted
    in ``failures``, so an endless outage cannot exhaust memory).
    """

    def __init__(self, producer: Any, topic: str, *, max_unsent: int = 100_000) -> None:
        self.producer = producer
        self.topic = topic
        self.counts: dict[tuple[str, str], int] = {}
        self.failures = 0
        self.max_unsent = max_unsent
        self.unsent: deque[DeadLetter] = deque()
        self._lock = threading.Lock()

    def send(self, letter: DeadLetter) -> None:
        k = (letter.stream, str(letter.reason))
        with self._lock:
            self.counts[k] = self.counts.get(k, 0) + 1
        self._send(letter)

    def _send(self, letter: DeadLetter) -> None:
        src = letter.source
        key = None if src is None else f"{src.topic}/{src.partition}/{src.offset}".encode()
        try:
            future = self.producer.send(self.topic, key=key, value=letter.raw, headers=dead_letter_headers(letter))
        except Exception as e:  # noqa: BLE001 - the core must never see a Kafka error
            self._failed(letter, e)
            return
        future.add_errback(lambda exc: self._failed(letter, exc))

    def _failed(self, letter: DeadLetter, exc: BaseException) -> None:
        with self._lock:
            if not is_retriable(exc):
                self.failures += 1
                return
            self.unsent.append(letter)
            while len(self.unsent) > self.max_unsent:
                self.unsent.popleft()
                self.failures += 1

    def resend(self) -> int:
        """Send the unsent letters again (each failing one comes back to ``unsent``); how many were sent."""
        with self._lock:
            letters, self.unsent = list(self.unsent), deque()
        for letter in letters:
            self._send(letter)
        return len(letters)
