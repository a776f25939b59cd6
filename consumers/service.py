"""The consuming service: one consumer group over the impressions and clicks topics, effectively once.

:class:`ConsumerService` owns a kafka-python consumer (range assignor, auto-commit off), a producer for
checkpoints and dead letters, and one :class:`consumers.alignment.PartitionPair` per assigned partition
pair. Its loop: poll, feed each pair in timestamp order, hand every published window to ``on_window``,
let idle pairs tick, checkpoint every ``checkpoint_interval_s``. A checkpoint of a pair is written (and
acknowledged) before the offsets are committed with a pointer to it; on assignment a pair is restored from
the checkpoint its committed offset points to and both partitions are seeked to the checkpoint's offsets.
On revocation and on shutdown the owned pairs are checkpointed and committed before they are given up.
docs/kafka.md gives the correctness argument.

Threads: kafka-python 3 runs the rebalance listener on its I/O thread, but only while this loop is inside
``consumer.poll()`` (group joins are driven from poll), so the listener's checkpoint + commit never
interleaves with the loop's own. The pair lock guards the state anyway, and nothing that waits for the
I/O thread is called while holding it. Restores run on the loop thread (consumers/rebalance.py).

Robustness (issue 15): every Kafka step of the loop goes through one handler
(:class:`consumers.outage.KafkaOutage`): an outage is logged once, retried with a capped backoff, shown in
the health (``/readyz`` not ready, ``rankwatch_kafka_outage``); fatal errors end the loop with one line.
Before every poll :func:`consumers.fetch_compat.release_parked` repairs kafka-python 3.0.12's parked
records, which stalled every backlog, and :func:`consumers.fetch_compat.keep_join_awaited` its orphaned
group join, which left a lone instance with nothing assigned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka import __version__ as kafka_version
from kafka import errors as kerr
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from rankwatch.consumers.alignment import OvertakeGrace, PartitionPair
from rankwatch.consumers.checkpoints import CheckpointStore
from rankwatch.consumers.clients import close_clients
from rankwatch.consumers.committer import Committer
from rankwatch.consumers.connect import ClientSet, Stopped, check_connection, explain, fatal
from rankwatch.consumers.core_process import CoreProcess, CoreProcessError, InProcessCores
from rankwatch.consumers.deadletters import KafkaDeadLetterSink
from rankwatch.consumers.decoding import FormatSpec, schema_gate
from rankwatch.consumers.end_offsets import EndOffsets
from rankwatch.consumers.event_time import merge_time
from rankwatch.consumers.fetch_compat import (
    VERIFIED_KAFKA_PYTHON,
    keep_join_awaited,
    known_position,
    missing_internals,
    release_parked,
)
from rankwatch.consumers.outage import FatalKafkaError, KafkaOutage, is_fatal, is_retriable, one_line
from rankwatch.consumers.rebalance import Rebalancer
from rankwatch.consumers.settings import KafkaSettings
from rankwatch.consumers.stats import ServiceHealth, service_health
from rankwatch.consumers.topics import CHECKPOINT_TOPIC_CONFIG, TopicError, check_copartitioned, ensure_topic
from rankwatch.consumers.watchdog import Watchdog
from rankwatch.pipeline.clock import Clock
from rankwatch.pipeline.events.mapping import EventMapping
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.stream.processor import StreamConfig

log = logging.getLogger(__name__)

# How often the health (stats, lag, counters) goes to ``on_health``: the exporter's event counters move
# this often, so an outside measurement of the consume rate is precise to about this much.
HEALTH_INTERVAL_S = 0.25


class ConsumerService:
    """Consume, compute, publish; see the module docstring.

    Parameters
    ----------
    kafka, stream
        Kafka settings and the streaming core's configuration.
    on_window
        Called (on the consuming thread) with every published window. A window may be handed over again
        after a crash or a rebalance away from a crashed member, with the same identity and content
        (``PublishedWindow.identity``); consumers of this hook dedupe by identity.
    clock
        The clock of idle ticks (wall clock in production).
    on_health
        Called every ``HEALTH_INTERVAL_S`` (0.25 s) with a fresh :class:`ServiceHealth` (e.g. to update the exporter).
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        stream: StreamConfig,
        *,
        on_window: Callable[[PublishedWindow], None],
        clock: Clock,
        on_health: Callable[[ServiceHealth], None] | None = None,
        events: EventMapping | None = None,
        formats: Mapping[str, FormatSpec] | None = None,
        registry: Any = None,
    ) -> None:
        self.kafka = kafka
        self.stream = stream
        self.on_window = on_window
        self.clock = clock
        self.on_health = on_health
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._pairs: dict[int, PartitionPair] = {}
        self._parked: dict[int, PartitionPair] = {}  # revoked pairs kept in case they come straight back
        self._health = ServiceHealth()
        self._restores = 0
        self._published = 0
        self._consumer: KafkaConsumer | None = None
        self._offsets: EndOffsets | None = None
        self._producer: KafkaProducer | None = None
        self._store: CheckpointStore | None = None
        self._dead: KafkaDeadLetterSink | None = None
        self._paused: set[Any] = set()
        self._outage = KafkaOutage(backoff_max_s=kafka.retry_backoff_max_s)
        self._rebalancer = Rebalancer(self)
        self.committer = Committer(self)
        # Where the pairs' processors live: a second process (windows come back through _publish) or here.
        self._cores: CoreProcess | InProcessCores = (
            CoreProcess(stream, clock=clock, publish=self._publish, events=events, formats=formats)
            if kafka.core_process else InProcessCores(stream, clock=clock, events=events, formats=formats))
        self._gate = schema_gate(kafka, formats, registry)  # Confluent schema ids resolved before feeding
        self._watchdog = Watchdog(self)
        # [kafka] timestamps = "event": buffered records carry their event's time (consumers/alignment.py).
        self.event_time = merge_time(kafka.timestamps, events, formats, stream.max_event_bytes)
        self._overtake = OvertakeGrace(kafka.overtake_grace_s, time.monotonic)
        self._last: dict[str, float] = {}  # when the loop last ticked, checkpointed, ... (monotonic)
        self._fatal = False  # the loop ended with a FatalKafkaError: no final feed nor checkpoint
        self.partitions = 0

    # -- public API ------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to finish its batch, checkpoint, commit and close (safe from a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def health(self) -> ServiceHealth:
        """The latest health snapshot (refreshed every 0.25 s by the loop)."""
        return self._health

    def ready(self) -> bool:
        """``/readyz``: consuming owned pairs, and Kafka reachable (not ready during an outage)."""
        h = self._health
        return h.running and bool(h.assigned) and not self._outage.active and not (
            self._gate is not None and self._gate.outage.active)

    @property
    def outage(self) -> KafkaOutage:
        return self._outage

    def start(self) -> None:
        """Check the topics and open the clients (errors here are one-line ``RankwatchError`` s).

        A broker unreachable at start is an outage like any other: logged once, retried with the backoff
        until it answers or :meth:`stop` is called (then :meth:`run` returns at once). Every wait of an
        attempt is bounded and abandoned on :meth:`stop`, and a failed attempt closes every client it made
        (consumers/connect.py). Bad topics (``TopicError``) and fatal errors (authentication, TLS,
        authorization: one line naming the cause and the resource) end it.
        """
        k = self.kafka
        while not self._stop.is_set():
            clients = ClientSet(self._stop, timeout_s=max(5.0, k.session_timeout_s))
            try:
                self._open(clients)
                clients.release()
                self._outage.succeeded()
                return
            except Stopped:
                self._forget_clients(clients)
                return
            except TopicError:
                self._forget_clients(clients)
                raise
            except Exception as e:
                self._forget_clients(clients)
                named = fatal(e, k.client_kwargs())
                if is_fatal(named):
                    raise named if isinstance(named, FatalKafkaError) else FatalKafkaError(
                        f"Kafka refused start: {one_line(named)}") from None
                if not (is_retriable(e) or isinstance(e, KafkaError)):
                    raise  # a bug; any Kafka refusal at start is retried (e.g. a broker shutting down
                    # refuses CreateTopics with InvalidReplicationFactor: "all brokers are fenced")
                self._outage.failed("start", e)
                log.debug("start attempt failed; %d threads alive", threading.active_count())
                self._stop.wait(self._outage.backoff())

    def _resource_of(self, exc: BaseException) -> str:
        """What an authorization error was about, as docs/security.md names it."""
        k = self.kafka
        if isinstance(exc, kerr.GroupAuthorizationFailedError):
            return f"group {k.group_id!r} (Read)"
        if isinstance(exc, kerr.TopicAuthorizationFailedError):
            topics = [t for t in (k.impressions_topic, k.clicks_topic, k.checkpoints, k.dead_letters) if t in str(exc)]
            return f"topic {topics[0]!r}" if topics else "a topic"
        return ""

    def _forget_clients(self, clients: ClientSet) -> None:
        """A failed start attempt: every client it made is closed (bounded), none is kept."""
        clients.close(1.0)
        self._consumer = self._offsets = self._producer = None
        self._store = None

    def _open(self, clients: ClientSet) -> None:
        k = self.kafka
        client = k.client_kwargs()
        # One connection first: a wrong password or an untrusted certificate is named at once (one line)
        # instead of surfacing as a bootstrap timeout of every client.
        check_connection(client, clients.timeout_s, clients)
        self.partitions = check_copartitioned(client, k.impressions_topic, k.clicks_topic, clients=clients)
        ensure_topic(client, k.checkpoints, partitions=self.partitions, config=CHECKPOINT_TOPIC_CONFIG, grow=True,
                     clients=clients)
        ensure_topic(client, k.dead_letters, partitions=1, clients=clients)
        # max_block_ms bounds a send() that waits for metadata or buffer space (an outage): the dead letter
        # is then kept and sent again, instead of the loop hanging for kafka-python's default 60 s.
        self._producer = clients.open(KafkaProducer, "checkpoint and dead-letter producer", **client, acks="all",
                                      linger_ms=5, max_request_size=2 * 1024 * 1024, max_block_ms=2000)
        for topic in (k.checkpoints, k.dead_letters):
            try:  # metadata now, while the broker is known to answer
                clients.call(f"metadata of {topic!r}", self._producer.partitions_for, topic)
            except KafkaError as e:
                raise fatal(e, client, resource=f"topic {topic!r} (Describe, Write)") from None
        self._store = CheckpointStore(self._producer, k.checkpoints, client)
        self._dead = KafkaDeadLetterSink(self._producer, k.dead_letters)
        self._cores.dead_letters = self._dead
        self._consumer = clients.open(
            KafkaConsumer, "consumer", **client, group_id=k.group_id, enable_auto_commit=False,
            auto_offset_reset=k.auto_offset_reset,
            partition_assignment_strategy=[RangePartitionAssignor], max_poll_records=k.max_poll_records,
            max_partition_fetch_bytes=k.max_partition_fetch_bytes,
            session_timeout_ms=int(k.session_timeout_s * 1000),
            heartbeat_interval_ms=max(100, int(k.session_timeout_s * 1000) // 4),
            group_instance_id=k.instance_id,
        )
        self._consumer.subscribe([k.impressions_topic, k.clicks_topic], listener=self._rebalancer)
        if missing := missing_internals(self._consumer):
            log.error("kafka-python %s lacks %s: the fetch and group-join repairs verified on %s do nothing "
                      "(consumers/fetch_compat.py)", kafka_version, ", ".join(missing), VERIFIED_KAFKA_PYTHON)
        self._offsets = EndOffsets(client, (k.impressions_topic, k.clicks_topic), self._consumer, clients=clients)

    def run(self) -> None:
        """Consume until :meth:`stop`; then checkpoint and commit every owned pair and close the clients.

        Raises :class:`consumers.outage.FatalKafkaError` (one line) on an error no retry can cure.
        """
        if self._consumer is None:
            self.start()
        if self._consumer is None:
            return  # stopped before Kafka ever answered
        now = time.monotonic()
        self._last = {"checkpoint": now, "tick": now, "health": now, "adopt": now, "topics": now, "watch": now}
        try:
            while not self._stop.is_set():
                self._turn()
                delay = self._outage.backoff()  # > 0 only after a failed step
                if self._gate is not None:  # or while the schema registry is unreachable
                    delay = max(delay, self._gate.outage.backoff())
                if delay:
                    self._refresh_health(running=True)
                    self._stop.wait(delay)
        except FatalKafkaError as e:
            # Refused (credentials or an ACL revoked...): nothing more is fed, published nor checkpointed;
            # the pairs resume from their last committed checkpoint at the next start.
            self._fatal = True
            line = explain(e.cause, self.kafka.client_kwargs(), resource=self._resource_of(e.cause)) if e.cause else None
            if line is not None:
                raise FatalKafkaError(line) from None
            raise
        finally:
            self._shutdown()

    def _turn(self) -> None:
        """One turn of the loop: every Kafka step goes through the outage handler (module docstring)."""
        consumer = self._consumer
        assert consumer is not None
        k, out, last = self.kafka, self._outage, self._last
        release_parked(consumer)
        if keep_join_awaited(consumer):
            log.info("keeping the group join after a metadata change awaited (consumers/fetch_compat.py)")
        ok, batch = self._step("poll", consumer.poll, timeout_ms=100)
        if self._rebalancer.fatal is not None:
            raise self._rebalancer.fatal
        if batch:
            out.succeeded()
        self._rebalancer.restore_pending()
        with self._lock:
            for tp, records in (batch or {}).items():
                pair = self._pairs.get(tp.partition)
                if pair is not None and tp in pair.buffers:
                    pair.add(tp, records)
                    self._overtake.arrived(tp)
                    if self._gate is not None:
                        self._gate.note(tp.topic, records)
            self._feed_all()
            self._cores.drain()  # windows and dead letters of batches the core process has finished
            unconfirmed = self._overtake.due(tp for pair in self._pairs.values() for tp in pair.unconfirmed)
        if unconfirmed:
            self._confirm_and_feed(unconfirmed)
        self._flow_control()
        dead = self._dead
        if dead is not None and dead.unsent and not out.active:
            dead.resend()
        now = time.monotonic()
        if now - last["tick"] >= k.tick_interval_s:
            self._tick_idle()
            last["tick"] = now
        # Asked now, written once answered (committer.py); a write waits <= max(10 s, session timeout).
        if self.committer.periodic(lambda: [p for p, pair in self._pairs.items() if pair.fed_since_checkpoint],
                                   due=now - last["checkpoint"] >= k.checkpoint_interval_s and not out.active,
                                   timeout_s=max(10.0, k.session_timeout_s)):
            last["checkpoint"] = time.monotonic()
        if out.active or now - out.last_contact >= 2 * k.tick_interval_s + 1.0:
            self._probe()
        if now - last["topics"] >= 5.0:
            self._check_topics(now)
            last["topics"] = now
        if now - last["adopt"] >= 10.0:
            self._rebalancer.adopt_unqueued()
            last["adopt"] = now
        if now - last["health"] >= HEALTH_INTERVAL_S:
            self._refresh_health(running=True)
            last["health"] = now
        if now - last["watch"] >= 30.0:
            self._watchdog.watch_stalls()
            last["watch"] = now

    def _step(self, step: str, fn: Any, *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """:meth:`KafkaOutage.attempt`, with group events (a commit refused by a rebalance...) logged."""
        try:
            return self._outage.attempt(step, fn, *args, **kwargs)
        except KafkaError as e:
            log.warning("%s failed: %s", step, one_line(e))
            self._outage.group_event()  # a repeated refusal must not spin the loop
            return False, None

    def _probe(self) -> None:
        """Ask the broker something cheap (end offsets): ends an outage, or shows one nothing else would."""
        with self._lock:
            tps = [tp for pair in self._pairs.values() for tp in pair.buffers]
        tps = tps or [TopicPartition(self.kafka.impressions_topic, 0)]
        self._end_offsets(tps)

    def _end_offsets(self, tps: list[Any]) -> dict[Any, int] | None:
        """A fresh answer from the broker (consumers/end_offsets.py), or None after a failed step."""
        assert self._offsets is not None
        ok, ends = self._step("end-offset look-up", self._offsets, tps)
        if not ok:
            return None
        self._outage.succeeded()
        return ends  # type: ignore[no-any-return]

    def _check_topics(self, now: float) -> None:
        self._watchdog.check_topics(now)

    # -- feeding ---------------------------------------------------------------------------------------
    def _caught_up(self, tp: Any) -> bool:
        consumer = self._consumer
        assert consumer is not None
        try:
            hw = consumer.highwater(tp)
            return hw is not None and (known_position(consumer, tp) or 0) >= hw
        except KafkaError:
            return False

    def _feed_all(self, confirmed: dict[Any, int] | None = None) -> None:
        if self._gate is not None and not self._gate.ready(self._cores):
            return  # the registry is down: everything stays buffered (consumers/decoding.py)
        ends = confirmed or {}

        def is_confirmed(tp: Any) -> bool:
            consumer = self._consumer
            assert consumer is not None
            return tp in ends and consumer.highwater(tp) is not None and (known_position(consumer, tp) or 0) >= ends[tp]

        for pair in list(self._pairs.values()):
            pair.unconfirmed.clear()
            windows, _ = pair.feed(self._caught_up, is_confirmed)
            self._publish(windows)

    def _confirm_and_feed(self, tps: list[Any]) -> None:
        """Ask the broker for the end offsets of ``tps`` (made after every buffered record was fetched) and
        feed again: records far ahead of a topic that truly has nothing more may now go (alignment docs)."""
        assert self._consumer is not None
        ends = self._end_offsets(tps)
        if ends is None:
            return  # no confirmation: wait for a later turn
        with self._lock:
            self._feed_all(ends)

    def _publish(self, windows: Iterable[PublishedWindow]) -> None:
        for w in windows:
            self._published += 1
            self.on_window(w)

    def _flow_control(self) -> None:
        """Pause a topic-partition whose buffer is full; resume it once the pair drained half of it."""
        consumer = self._consumer
        assert consumer is not None
        cap = self.kafka.max_buffered_records
        with self._lock:
            for pair in self._pairs.values():
                pause, resume = pair.flow(cap, self._paused)
                if pause:
                    consumer.pause(*pause)
                    self._paused.update(pause)
                if resume:
                    consumer.resume(*resume)
                    self._paused.difference_update(resume)

    def _tick_idle(self) -> None:
        """Idle pairs (nothing buffered, nothing left to fetch, confirmed by the broker) let the clock in."""
        consumer = self._consumer
        assert consumer is not None
        with self._lock:
            idle = [p for p in self._pairs.values()
                    if not any(p.buffers.values()) and all(self._caught_up(tp) for tp in p.buffers)]
        if not idle:
            return
        tps = [tp for p in idle for tp in p.buffers]
        # A fresh answer from the broker: during an outage the cached high watermarks would claim
        # "caught up" and the clock would close windows whose events are merely unreachable.
        ends = self._end_offsets(tps)
        if ends is None:
            return  # no confirmation, no tick
        with self._lock:
            for pair in idle:
                if self._pairs.get(pair.partition) is not pair:
                    continue
                if all(tp in ends and (pair.next_offset.get(tp) or known_position(consumer, tp) or 0) >= ends[tp]
                       for tp in pair.buffers):
                    self._publish(pair.processor.tick())

    # -- checkpoints (consumers/committer.py) ----------------------------------------------------------
    def checkpoint(self, partitions: Iterable[int], *, in_listener: bool = False,
                   timeout_s: float = 20.0) -> dict[Any, OffsetAndMetadata]:
        """Write checkpoints of ``partitions`` and (outside the rebalance listener) commit them."""
        return self.committer.checkpoint(partitions, in_listener=in_listener, timeout_s=timeout_s)

    # -- health and shutdown ---------------------------------------------------------------------------
    def _refresh_health(self, *, running: bool) -> None:
        self._health = service_health(self, running=running)
        if self.on_health is not None:
            self.on_health(self._health)

    def _shutdown(self) -> None:
        """Final checkpoint and commit, then close; bounded by ``shutdown_timeout_s`` even in an outage."""
        consumer = self._consumer
        deadline = time.monotonic() + self.kafka.shutdown_timeout_s

        def left() -> float:
            return max(0.5, deadline - time.monotonic())

        try:
            if self._fatal:
                log.warning("no final checkpoint after a fatal Kafka error (pairs %s resume from their last "
                            "committed checkpoint)", sorted(self._pairs))
            elif consumer is not None and self._pairs and self._outage.active:
                log.warning("Kafka unreachable at shutdown: no final checkpoint (pairs %s resume from their last "
                            "committed checkpoint)", sorted(self._pairs))
            elif consumer is not None and self._pairs:
                with self._lock:
                    self._feed_all()  # finish the batch in hand (what is caught up can be fed)
                self.checkpoint(list(self._pairs), timeout_s=left() / 2)
        except CoreProcessError as e:  # the state is gone with the core: the last committed checkpoint holds
            log.error("no final checkpoint: %s", e)
        finally:
            try:
                self._refresh_health(running=False)
            except CoreProcessError:
                pass  # said above, or the error the loop ends with
            with self._lock:
                self._pairs.clear()  # close() revokes: nothing left to checkpoint twice
                self._rebalancer.restoring.clear()
            self._close_clients(1.0 if self._outage.active else left())
            self._cores.close()

    def _close_clients(self, timeout_s: float) -> None:
        close_clients(self._consumer, self._store, self._producer, timeout_s,
                      offsets=self._offsets.client if self._offsets is not None else None)
        self._consumer = self._offsets = self._producer = None
        self._store = None
