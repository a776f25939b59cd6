"""kafka-python 3.0.12 compatibility: the parked-records repair, and reads of its state without I/O.

The repair concerns paused partitions' parsed records ("parked" records).

kafka-python's port of KAFKA-7548 moves the parsed records of a partition that is paused while they sit
in the fetcher's in-line slot (``Fetcher._next_partition_records``) into ``_paused_partition_records``.
On the next ``fetched_records`` call it gives them back only when the in-line slot ``is None``. But once a
slot's records are all handed out, the fetcher keeps the drained (falsy) ``PartitionRecords`` object in the
slot instead of resetting it to None, so the parked records are never given back. Parked partitions are
also left out of every fetch request (``_fetchable_partitions``): a partition paused at that moment is
never returned nor fetched again, for good, with no log line.

rankwatch's flow control (pause a topic-partition at ``max_buffered_records``, resume at half) hits this
on every backlog: the clicks buffer fills first, is paused, and its records never come back; the pair
then waits for clicks forever.

:func:`release_parked`, called before every ``poll()``, empties a drained slot (sets it to None), which is
exactly the state the fetcher's own code expects; kafka-python then returns the parked records itself.
Nothing is lost nor fetched twice: the parked object keeps its records and its fetch offset, and the
fetcher still checks that offset against the partition's position before returning anything. It touches
two private attributes and does nothing when they are absent (another kafka-python version).

:func:`known_position` and :func:`cached_partitions` read the consumer's own state where kafka-python's
public calls would do network I/O without a time limit (which hung the loop, and SIGTERM, in an outage).

:func:`keep_join_awaited`, also called before every poll, repairs kafka-python 3.0.12's orphaned group
join (the CI failures of the fleet test: a lone instance logged ``consuming partition pairs []`` and sat
in member state REBALANCING for good, with no log line). ``join_group_async`` loops
``while self.need_rejoin()`` and, when the poll's timeout expires, leaves the JoinGroup -> SyncGroup task
in flight for the next poll to await. A rejoin triggered by a metadata change has ``rejoin_needed``
False: ``need_rejoin()`` is True only because ``assignment_snapshot != metadata_snapshot``. When the
leader's task runs the assignment (which makes the snapshots equal) and the poll's timeout expires
before the SyncGroup answer, the next poll sees ``need_rejoin()`` False and never awaits the task
again. Its assignment is dropped, the member stays REBALANCING with heartbeats disabled, and the
broker expels it after the session timeout without the member ever learning it. Every start of a lone
instance takes that path (it joins before its first metadata response, gets nothing, and rejoins when
the topics' metadata arrives), and with 100 ms polls the window is hit in a few starts in a hundred.
``tests/consumers/test_fetch_compat.py`` plays it back with 5 ms polls, where plain kafka-python is
stuck every time. The repair sets ``rejoin_needed`` while a join task is in flight, so the loop keeps
awaiting it, and kafka-python clears the flag itself when the join completes.

:func:`stale_leader_assignment` (asked every 10 s) is the older safety net for a leader whose last
assignment was computed from other partitions than those now in its metadata cache: it requests a
rejoin.
"""

from __future__ import annotations

from typing import Any

# The kafka-python release these repairs were read against and verified on (pyproject pins it). Another
# release may have renamed what they touch: :func:`missing_internals` says so at start, loudly, and
# tests/consumers/test_fetch_compat.py fails on it, so an upgrade is a conscious act.
VERIFIED_KAFKA_PYTHON = "3.0.12"

# Every private attribute the repairs and the I/O-free reads use, as (owner, attribute) where owner is
# an attribute of the KafkaConsumer ("" for the consumer itself).
PRIVATE_INTERNALS: tuple[tuple[str, str], ...] = (
    ("", "_fetcher"), ("", "_coordinator"), ("", "_subscription"), ("", "_cluster"),
    ("_fetcher", "_next_partition_records"), ("_fetcher", "_paused_partition_records"),
    ("_coordinator", "_join_task"), ("_coordinator", "rejoin_needed"), ("_coordinator", "request_rejoin"),
    ("_coordinator", "_is_leader"), ("_coordinator", "_assignment_snapshot"),
    ("_coordinator", "_subscription"), ("_coordinator", "_cluster"),
    ("_subscription", "assignment"), ("_cluster", "partitions_for_topic"),
)


def missing_internals(consumer: Any) -> list[str]:
    """The private attributes of :data:`PRIVATE_INTERNALS` that ``consumer`` lacks (empty: all there).

    The repairs do nothing, silently, without them; the service logs the list at start as an error.
    """
    missing = []
    for owner, attribute in PRIVATE_INTERNALS:
        holder = getattr(consumer, owner, None) if owner else consumer
        if holder is None or not hasattr(holder, attribute):
            missing.append(f"{owner}.{attribute}" if owner else attribute)
    return missing


def release_parked(consumer: Any) -> bool:
    """Reset the fetcher's drained in-line slot to None when parked records wait behind it.

    Returns True when a slot was reset (for tests); False when nothing was to do or the private
    attributes are not there.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    parked = getattr(fetcher, "_paused_partition_records", None)
    if fetcher is None or not parked or not hasattr(fetcher, "_next_partition_records"):
        return False
    slot = fetcher._next_partition_records
    if slot is not None and not slot:
        fetcher._next_partition_records = None
        return True
    return False


def keep_join_awaited(consumer: Any) -> bool:
    """Set the coordinator's ``rejoin_needed`` while a group-join task is in flight (module docstring).

    Returns True when it set the flag (an orphaned join was about to happen); False otherwise, or when
    the private attributes (``_coordinator._join_task``, ``rejoin_needed``) are not there.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None or getattr(coordinator, "_join_task", None) is None:
        return False
    if getattr(coordinator, "rejoin_needed", True):
        return False
    coordinator.request_rejoin()
    return True


def parked_partitions(consumer: Any) -> set[Any]:
    """Topic-partitions whose parsed records the fetcher holds back (empty when not applicable)."""
    fetcher = getattr(consumer, "_fetcher", None)
    return set(getattr(fetcher, "_paused_partition_records", None) or ())


def known_position(consumer: Any, tp: Any) -> int | None:
    """The fetch position of ``tp`` as the consumer knows it, without any I/O (None if unknown).

    kafka-python 3.0.12's ``position()`` refreshes committed offsets and validates positions over the
    network with no time limit by default: with the broker away it blocked the loop for good (and SIGTERM
    with it). This reads the subscription state instead; where that is not available it asks
    ``position()`` with a short bound.
    """
    subscription = getattr(consumer, "_subscription", None)
    assignment = getattr(subscription, "assignment", None)
    if isinstance(assignment, dict):
        state = assignment.get(tp)
        if state is None:
            return None
        position = getattr(state, "position", None)
        offset = getattr(position, "offset", position)
        return None if offset is None else int(offset)
    try:
        offset = consumer.position(tp, timeout_ms=100)
    except Exception:  # noqa: BLE001 - not assigned, or not known within the bound
        return None
    return None if offset is None else int(offset)


def cached_partitions(consumer: Any, topic: str) -> set[int] | None:
    """Partitions of ``topic`` in the consumer's metadata cache, without I/O (None: not in the cache).

    ``partitions_for_topic()`` fetches all topics' metadata, unbounded, when the topic is not cached.
    kafka-python refreshes the cache itself (``metadata_max_age_ms``, and on errors).
    """
    cluster = getattr(consumer, "_cluster", None)
    if cluster is None or not hasattr(cluster, "partitions_for_topic"):
        return None
    partitions = cluster.partitions_for_topic(topic)
    return None if partitions is None else set(partitions)


def stale_leader_assignment(consumer: Any) -> bool:
    """True when this member led the group's last assignment and the partitions of the subscribed topics
    in the metadata cache differ from those that assignment was computed from (a rejoin is due).

    Reads kafka-python's coordinator (``_is_leader``, ``_assignment_snapshot``, ``_subscription``,
    ``_cluster``) without I/O; False when those are absent (another kafka-python) or nothing is cached.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None or not getattr(coordinator, "_is_leader", False):
        return False
    used = getattr(coordinator, "_assignment_snapshot", None)
    subscription = getattr(coordinator, "_subscription", None)
    cluster = getattr(coordinator, "_cluster", None)
    if used is None or subscription is None or cluster is None or not hasattr(subscription, "group_subscription"):
        return False
    now: dict[str, set[int]] = {}
    for topic in subscription.group_subscription():
        partitions = cluster.partitions_for_topic(topic)
        if partitions is None:
            return False  # not cached (yet): nothing to compare with
        now[topic] = set(partitions)
    return now != {t: set(ps or ()) for t, ps in used.items()}
