"""End-offset look-ups on a Kafka client of their own.

The broker answers the requests of one connection in order, and the fetch of a consumer that is caught up
on every partition it fetches is held for up to ``fetch_max_wait_ms`` (500 ms) waiting for data. On the
consumer's own connection every look-up queued behind that fetch: about 500 ms each, against 1 ms on a
second client (docs/kafka.md, "End-offset look-ups"). The service asks for end offsets to confirm
alignment, to tick idle pairs and to probe an outage, all on its loop thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kafka import KafkaConsumer


class EndOffsets:
    """``end_offsets`` through a group-less client, falling back to ``consumer`` where that client cannot
    answer (kafka-python 3.0.12 raises ``KeyError`` when it lacks a topic's metadata)."""

    def __init__(self, client_kwargs: dict[str, Any], topics: Iterable[str], consumer: Any, *, clients: Any = None) -> None:
        # ``clients`` (consumers.connect.ClientSet): the construction is bounded and closed on a failed start
        kwargs = {**client_kwargs, "group_id": None, "enable_auto_commit": False}
        self.client = clients.open(KafkaConsumer, "end-offset client", **kwargs) if clients else KafkaConsumer(**kwargs)
        self.consumer = consumer
        self._track(topics)

    def _track(self, topics: Iterable[str]) -> None:
        # Tracked in the client's metadata from now on; no I/O here (partitions_for_topic would wait
        # unbounded for an answer, and the broker may go at any moment).
        for topic in set(topics):
            self.client._client.cluster.add_topic(topic)

    def __call__(self, tps: list[Any], timeout_ms: int = 2000) -> dict[Any, int]:
        try:
            return self.client.end_offsets(tps, timeout_ms=timeout_ms)  # type: ignore[no-any-return]
        except KeyError:
            self._track(tp.topic for tp in tps)  # known by the client's next metadata refresh
        return self.consumer.end_offsets(tps, timeout_ms=timeout_ms)  # type: ignore[no-any-return]
