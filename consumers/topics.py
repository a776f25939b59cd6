"""Topic checks and creation: co-partitioning of the input topics, the checkpoint and dead-letter topics.

Co-partitioning is what makes one consumer see every event of a request: producers key impressions and
feedback by ``request_id`` with the same partitioner, so with the same partition count a request's events
land in partition ``p`` of both topics, and the range assignor gives partition ``p`` of both topics to the
same group member. A different partition count would silently split requests, so start-up refuses it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from kafka import KafkaAdminClient
from kafka import errors as kerr
from kafka.admin import NewPartitions, NewTopic
from kafka.errors import TopicAlreadyExistsError

from rankwatch.consumers.connect import ClientSet, fatal
from rankwatch.pipeline.errors import RankwatchError

# A checkpoint chunk is at most this big (see consumers.checkpoints); the topic allows a little more.
CHECKPOINT_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "max.message.bytes": str(2 * 1024 * 1024),
    "segment.ms": str(10 * 60 * 1000),  # roll often so tombstoned chunks become cleanable
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": str(60 * 60 * 1000),
}


class TopicError(RankwatchError):
    """A topic is missing or laid out so that the service cannot be correct."""


def partition_counts(client_kwargs: dict[str, Any], topics: Iterable[str], *, timeout_s: float = 30.0,
                     clients: ClientSet | None = None) -> dict[str, int]:
    """Number of partitions of each topic (0 when it does not exist).

    Bounded: each metadata request waits at most ``clients.timeout_s`` (and is abandoned when its stop
    event is set). A topic this client may not describe is a one-line :class:`FatalKafkaError` naming it
    (the broker answers TOPIC_AUTHORIZATION_FAILED, which is not "does not exist").
    """
    own = clients is None
    clients = clients or ClientSet(timeout_s=min(timeout_s, 30.0) + 5.0)
    admin = clients.open(KafkaAdminClient, "admin client", **client_kwargs)
    try:
        deadline = time.monotonic() + timeout_s
        wanted = list(dict.fromkeys(topics))
        while True:
            counts = {t: 0 for t in wanted}
            for info in clients.call("describing topics", admin.describe_topics, wanted):
                code, name = info.get("error_code", 0), info.get("name")
                if code == kerr.TopicAuthorizationFailedError.errno:
                    raise fatal(kerr.TopicAuthorizationFailedError(), client_kwargs, resource=f"topic {name!r} (Describe)")
                if code == 0 and name in counts:
                    counts[name] = len(info.get("partitions") or ())
            if all(counts.values()) or time.monotonic() > deadline:
                return counts
            time.sleep(0.5)  # metadata of a just-created topic can take a moment
    finally:
        if own:
            clients.close()
        else:
            clients.discard(admin)


def check_copartitioned(client_kwargs: dict[str, Any], impressions: str, clicks: str, *,
                        clients: ClientSet | None = None) -> int:
    """The common partition count of the two input topics; a one-line :class:`TopicError` otherwise."""
    counts = partition_counts(client_kwargs, (impressions, clicks), timeout_s=5.0, clients=clients)
    for topic in (impressions, clicks):
        if counts[topic] == 0:
            raise TopicError(f"topic {topic!r} does not exist (create it, e.g. rankwatch simulate --create-topics)")
    if counts[impressions] != counts[clicks]:
        raise TopicError(
            f"topics are not co-partitioned: {impressions!r} has {counts[impressions]} partitions, "
            f"{clicks!r} has {counts[clicks]}; both must have the same count, and producers must key both by request_id (or both by user_id)"
        )
    return counts[impressions]


def ensure_topic(
    client_kwargs: dict[str, Any], name: str, *, partitions: int, config: dict[str, str] | None = None,
    grow: bool = False, clients: ClientSet | None = None,
) -> int:
    """Create ``name`` when missing (replication factor 1 on a single broker, else the broker default).

    With ``grow`` a topic with fewer than ``partitions`` partitions gets more. Returns the partition count.
    Bounded like :func:`partition_counts`; a refused creation names the topic (one line).
    """
    own = clients is None
    clients = clients or ClientSet(timeout_s=35.0)
    resource = f"topic {name!r} (Create)"
    try:
        have = partition_counts(client_kwargs, (name,), timeout_s=0.0, clients=clients)[name]
        if have == 0:
            admin = clients.open(KafkaAdminClient, "admin client", **client_kwargs)
            try:
                n_brokers = max(1, len(clients.call("describing the cluster", admin.describe_cluster).get("brokers", [])))
                replication = 1 if n_brokers == 1 else -1  # -1: the broker's default.replication.factor
                try:
                    clients.call(f"creating topic {name!r}", admin.create_topics,
                                 [NewTopic(name, partitions, replication, topic_configs=config or {})])
                except TopicAlreadyExistsError:
                    pass
                except kerr.AuthorizationError as e:
                    raise fatal(e, client_kwargs, resource=resource) from None
            finally:
                clients.discard(admin)
            have = partition_counts(client_kwargs, (name,), clients=clients)[name]
        if grow and 0 < have < partitions:
            admin = clients.open(KafkaAdminClient, "admin client", **client_kwargs)
            try:
                clients.call(f"adding partitions to {name!r}", admin.create_partitions, {name: NewPartitions(partitions)})
            except kerr.AuthorizationError as e:
                raise fatal(e, client_kwargs, resource=f"topic {name!r} (Alter)") from None
            finally:
                clients.discard(admin)
            have = partition_counts(client_kwargs, (name,), clients=clients)[name]
            while have < partitions:
                time.sleep(0.2)
                have = partition_counts(client_kwargs, (name,), clients=clients)[name]
        return have
    finally:
        if own:
            clients.close()
