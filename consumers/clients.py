"""Closing kafka-python clients within a bound, also when the broker is unreachable (SIGTERM mid-outage)."""

from __future__ import annotations

import logging
from typing import Any

from kafka.errors import KafkaError

from rankwatch.consumers.outage import is_fatal, is_retriable, one_line

log = logging.getLogger("rankwatch.consumers.service")


def close_clients(consumer: Any, store: Any, producer: Any, timeout_s: float, *, offsets: Any = None) -> None:
    """Close the consumer, the end-offset client, the checkpoint reader and the producer (any may be
    None), each bounded.

    Best effort: the state is committed or it is not; a Kafka error while closing is one warning line.
    """
    closers: list[tuple[str, Any]] = [
        ("consumer", consumer and (lambda: consumer.close(autocommit=False, timeout_ms=int(timeout_s * 1000)))),
        ("end-offset client", offsets and (lambda: offsets.close(autocommit=False, timeout_ms=int(timeout_s * 1000)))),
        ("checkpoint reader", store and store.close),
        ("producer", producer and (lambda: close_producer(producer, timeout_s))),
    ]
    for what, close in closers:
        if not close:
            continue
        try:
            close()
        except Exception as e:
            if is_fatal(e) or not (is_retriable(e) or isinstance(e, KafkaError)):
                raise
            log.warning("closing the %s: %s", what, one_line(e))


def close_producer(producer: Any, timeout_s: float) -> None:
    """``producer.close`` bounded by ``timeout_s`` even when the broker is away.

    kafka-python's ``close(timeout)`` raises from its flush before force-closing, and leaves the producer
    open (its ``__del__`` then tries again at exit, with a traceback). Unsent records at exit are only
    dead letters and tombstones of uncommitted work (the next owner produces them again).
    """
    try:
        producer.flush(timeout=timeout_s)
    except KafkaError as e:
        log.warning("closing the producer: %s; unsent records dropped", one_line(e))
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()
            sender.join(2.0)
    try:
        producer.close(timeout=1.0)
    except KafkaError:
        producer._closed = True  # type: ignore[attr-defined]  # nothing left to send; no retry in __del__

