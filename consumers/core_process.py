"""The streaming core in a second process, so that consuming and computing run on two cores (issue 10).

Layout: :class:`CoreProcess` (the consuming side) starts one worker process (``spawn``) that holds every
:class:`pipeline.stream.processor.StreamProcessor` of this instance, and hands out one :class:`RemoteProcessor` per
partition pair, a stand-in with the methods the service calls (``process_batch``, ``tick``, ``snapshot``,
``stats``). :class:`InProcessCores` is the same factory for processors in the consuming process
(``[kafka] core_process = false``).

Why: kafka-python costs about 5 µs of CPU per message and the core about 10 µs; in one process they add
up (Python runs one thread at a time), so ``rankwatch run`` reached a third of raw kafka-python. In two
processes they overlap: the consuming process polls, merges and sends a poll's raw values (one pickled
message per pair and poll, about 0.4 µs per record); the worker decodes, joins and windows them.

Why it changes no guarantee (docs/kafka.md, "The core process"):

- One pipe each way, requests answered strictly in order. A ``snapshot`` is answered after every batch
  sent before it, so a checkpoint holds exactly what was fed (the fed offsets are advanced at send time).
- The windows and dead letters a request produced come back with its answer and are handed on (windows to
  ``publish``, dead letters to the service's sink) before any later answer is read, so before the snapshot
  a checkpoint is written from, and the service's "nothing committed while a dead letter is unsent" rule
  still sees them.
- Batches are asynchronous, at most ``max_in_flight`` unanswered at a time (bounded memory and lag); the
  periodic checkpoint's snapshots are asked with :meth:`CoreProcess.call_async` (an :class:`Answer` filled
  when its turn comes, after the earlier answers were handed on); every other request waits for its
  answer. The clock stays injected: ``tick`` sends the consuming side's ``clock.now()``.
- The worker ignores SIGINT and SIGTERM (the consuming side shuts down first: final feed, checkpoint,
  commit) and exits when its requests' pipe closes, so it never outlives its parent, even after a SIGKILL.
- A worker that dies or raises ends the service with one line (:class:`CoreProcessError`); the pairs resume
  from their last committed checkpoints, as after any crash.
"""

from __future__ import annotations

import copyreg
import io
import logging
import multiprocessing
import pickle
import queue
import signal
import threading
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any

from rankwatch.consumers.answer import Answer
from rankwatch.consumers.decoding import Entries, FormatSpec, SchemaCache, translator_of
from rankwatch.consumers.handoff import RequestRing, RingView, descriptor_of, widen_pipe
from rankwatch.pipeline.clock import Clock
from rankwatch.pipeline.errors import RankwatchError
from rankwatch.pipeline.events.deadletter import DeadLetterSink, ListDeadLetterSink
from rankwatch.pipeline.events.mapping import EventMapping
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor, StreamStats
from rankwatch.pipeline.stream.snapshot import ConfigChanged

log = logging.getLogger(__name__)

# Configurations hold read-only mappings, which pickle cannot take: both sides write them as dicts.
def _read_only(mapping: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(mapping)


_DISPATCH = copyreg.dispatch_table.copy()
_DISPATCH[MappingProxyType] = lambda m: (_read_only, (dict(m),))


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=5)
    pickler.dispatch_table = _DISPATCH
    pickler.dump(obj)
    return buf.getvalue()


class CoreProcessError(RankwatchError):
    """The core process died or raised: the message is the one-line reason the service ends with."""


# -- the worker ----------------------------------------------------------------------------------------
class _SentClock:
    """The worker's clock: the consuming side's ``now`` sent with each ``tick``."""

    def __init__(self) -> None:
        self.value: datetime | None = None

    def now(self) -> datetime:
        assert self.value is not None, "the worker's clock is read only inside tick"
        return self.value


# Requests whose answer carries the processor's stats: those that can change them, and "stats" itself.
_WITH_STATS = frozenset({"batch", "tick", "flush", "new", "restore", "stats"})


class _Answers:
    """The worker's answers, in order: small ones written at once by the worker's thread (the widened
    pipe takes them without waiting), large ones (windows of megabytes) by a writer thread, so the core
    never waits for the consuming side to read. Anything queued goes first, so the order holds.

    Why not always the thread: it needs the GIL to write, and the worker's busy thread hands the GIL over
    only every switch interval (5 ms), which delayed every answer by up to that much."""

    DIRECT_BYTES = 256 * 1024

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.queued = 0
        self.outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="rankwatch-core-answers", daemon=True)
        self.thread.start()

    def send(self, data: bytes) -> None:
        with self.lock:
            direct = not self.queued and len(data) < self.DIRECT_BYTES
            if not direct:
                self.queued += 1
                self.outbox.put(data)
        if direct:
            self.conn.send_bytes(data)

    def close(self) -> None:
        self.outbox.put(None)

    def _loop(self) -> None:
        while True:
            data = self.outbox.get()
            if data is None:
                return
            try:
                self.conn.send_bytes(data)
            except (EOFError, OSError):
                return  # the reader sees the end and says why
            with self.lock:
                self.queued -= 1


def _serve(conn: Any, answers: Any, config_bytes: bytes, ring_path: str | None = None) -> None:
    """The worker's loop: one answer (on ``answers``) per request (from ``conn``, or from the shared ring
    at ``ring_path`` that a descriptor on ``conn`` points to), in order, until the requests' pipe closes."""
    import gc

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    config: StreamConfig
    config, events, formats = pickle.loads(config_bytes)
    schemas = SchemaCache()  # filled by "schemas" requests (consumers/decoding.py: SchemaGate)
    translator = translator_of(events, formats, schemas.schema_of, config.max_event_bytes)
    clock, dead = _SentClock(), ListDeadLetterSink()
    processors: dict[int, StreamProcessor] = {}
    out = _Answers(answers)
    ring = None if ring_path is None else RingView(ring_path)
    gc.freeze()  # as the consuming process does: modules and config stay out of full collections
    while True:
        try:
            data = conn.recv_bytes()
            # Unpickled before the answer is sent: the ring's space is reused only after the answer.
            op, handle, payload = pickle.loads(ring.read(data) if ring is not None and descriptor_of(data) else data)
        except (EOFError, OSError):
            out.close()
            return
        windows: list[PublishedWindow] = []
        result: Any = None
        error: BaseException | None = None
        try:
            if op == "batch":
                kinds, values, offsets, partition, topics = payload
                windows = processors[handle].process_batch(kinds, values, partition=partition, offsets=offsets,
                                                           topics=topics)
            elif op == "tick":
                clock.value = payload
                windows = processors[handle].tick()
            elif op == "flush":
                windows = processors[handle].flush()
            elif op == "snapshot":
                result = processors[handle].snapshot()
            elif op == "stats":
                processors[handle]  # noqa: B018 - an unknown handle fails as in any request; the stats ride below
            elif op == "new":
                processors[handle] = StreamProcessor(config, clock=clock, dead_letters=dead, partitions=payload,
                                                     translator=translator)
            elif op == "restore":
                processors[handle] = StreamProcessor.restore(payload, config=config, clock=clock, dead_letters=dead,
                                                             translator=translator)
            elif op == "schemas":
                schemas.update(payload)
            elif op == "drop":
                for h in payload:
                    processors.pop(h, None)
            else:
                raise ValueError(f"unknown request {op!r}")
        except ConfigChanged as e:  # an expected answer: the consuming side starts the pair fresh and says so
            error = e
        except Exception as e:  # noqa: BLE001 - sent back, raised on the consuming side
            error = e
            log.error("core process: %s failed:\n%s", op, traceback.format_exc())
        # The processor's stats ride on every answer that can change them, so the consuming side's health
        # (every 0.25 s) never waits for a round trip behind the batches in flight.
        proc = processors.get(handle) if op in _WITH_STATS else None
        stats = proc.stats() if proc is not None and error is None else None
        letters, dead.letters = dead.letters, []
        try:
            answer = _dumps((windows, letters, result, error, stats))
        except Exception:  # noqa: BLE001 - an exception pickle cannot take: its text
            answer = _dumps((windows, letters, result, CoreProcessError(f"{type(error).__name__}: {error}"), stats))
        try:
            out.send(answer)
        except (EOFError, OSError):
            return


# -- the consuming side --------------------------------------------------------------------------------
class CoreProcess:
    """The worker and its connection; hands out :class:`RemoteProcessor` s (see the module docstring).

    Parameters
    ----------
    config
        The streaming core's configuration (sent once, at start).
    clock
        The consuming side's clock (read at each ``tick``).
    publish
        Called with the windows each answer carries, in order.
    max_in_flight
        Unanswered batches before a new one waits for the oldest answer.
    events
        The team's event schema (``[events.*]``, issue 22): the worker translates the values it is sent,
        so the translation runs on the core's CPU; None or the identity mapping: section 1 events.
    """

    def __init__(self, config: StreamConfig, *, clock: Clock, publish: Callable[[list[PublishedWindow]], None],
                 max_in_flight: int = 4, events: EventMapping | None = None,
                 formats: Mapping[str, FormatSpec] | None = None) -> None:
        self.config = config
        self.events = None if events is None or events.identity else events
        self.formats = dict(formats or {})
        self.clock = clock
        self.publish = publish
        self.dead_letters: DeadLetterSink | None = None  # set by the owner once its producer is open
        self.max_in_flight = max(1, max_in_flight)
        self._lock = threading.RLock()
        self._conn: Any = None
        self._process: Any = None
        self._requests: Any = None  # the write end of the requests' pipe
        # (op, handle, answer of call_async or None) of unanswered requests, oldest first
        self._expected: deque[tuple[str, int, Answer | None]] = deque()
        self._stats: dict[int, StreamStats] = {}  # handle -> stats as of its latest answered request
        self._in_flight = 0  # unanswered batches
        self._next_handle = 0
        self._dropped: list[int] = []  # handles of garbage-collected stand-ins, dropped with the next request
        self._failed: str | None = None
        self.batches_sent = 0
        self._ring: RequestRing | None = None  # shared memory for the requests (consumers/handoff.py)

    # -- factory ---------------------------------------------------------------------------------------
    def new(self, partitions: tuple[int, ...]) -> RemoteProcessor:
        return self._adopt("new", tuple(partitions))

    def restore(self, snapshot: bytes) -> RemoteProcessor:
        return self._adopt("restore", snapshot)

    def _adopt(self, op: str, payload: Any) -> RemoteProcessor:
        with self._lock:
            self._start()
            handle = self._next_handle
            self._next_handle += 1
            self.call(op, handle, payload)  # waits: a snapshot that cannot be restored fails here, as in-process
            proxy = RemoteProcessor(self, handle)
            weakref.finalize(proxy, self._dropped.append, handle)
            return proxy

    # -- requests --------------------------------------------------------------------------------------
    def send_batch(self, handle: int, payload: tuple[Any, ...]) -> None:
        """Queue a batch; waits only while ``max_in_flight`` batches are unanswered."""
        with self._lock:
            self._send("batch", handle, payload)
            self._in_flight += 1
            self.batches_sent += 1
            while self._in_flight > self.max_in_flight:
                self._receive_one()
            self.drain()

    def call(self, op: str, handle: int, payload: Any = None) -> Any:
        """Send a request and wait for its answer (every earlier one is handled first); returns its result."""
        with self._lock:
            self._send(op, handle, payload)
            while len(self._expected) > 1:
                self._receive_one()
            return self._receive_one()

    def call_async(self, op: str, handle: int, payload: Any = None) -> Answer:
        """Send a request without waiting: its :class:`Answer` is filled when :meth:`drain` (or any later
        wait) reads it, after every earlier answer was handed on; an error is raised by ``Answer.result``."""
        with self._lock:
            answer = Answer()
            self._send(op, handle, payload, answer)
            return answer

    def add_schemas(self, entries: Entries) -> None:
        """Registry answers for the worker's decoders, before any batch that needs them (the pipe is ordered)."""
        if entries:
            with self._lock:
                self._start()
                self.call("schemas", -1, entries)

    def drain(self) -> None:
        """Handle every answer already here, without waiting; a dead worker is noticed here even when no
        request is waiting (an idle service would otherwise only see it at its next batch)."""
        with self._lock:
            self._check()
            while self._expected and self._conn is not None and self._conn.poll(0):
                self._receive_one()
            if self._process is not None and not self._process.is_alive():
                self._fail("the core process ended")

    def latest_stats(self, handle: int) -> StreamStats:
        """Stats of ``handle`` from the answers already here; a round trip only if none has any yet."""
        with self._lock:
            self.drain()
            if handle not in self._stats:
                self.call("stats", handle)
            return self._stats[handle]

    def _send(self, op: str, handle: int, payload: Any, answer: Answer | None = None) -> None:
        self._check()
        if self._dropped:
            dropped, self._dropped = self._dropped, []
            self._write(_dumps(("drop", -1, dropped)))
            self._expected.append(("drop", -1, None))
            for h in dropped:
                self._stats.pop(h, None)
        self._write(_dumps((op, handle, payload)))
        self._expected.append((op, handle, answer))

    def _receive_one(self) -> Any:
        """Wait for the oldest answer, hand on what it carries and return its result."""
        op, handle, answer = self._expected[0]
        try:
            data = self._conn.recv_bytes()
        except (EOFError, OSError):
            self._fail("the core process ended")
        windows, letters, result, error, stats = pickle.loads(data)
        self._expected.popleft()
        if self._ring is not None:
            self._ring.answered()
        if stats is not None:
            self._stats[handle] = stats
        if op == "batch":
            self._in_flight -= 1
        sink = self.dead_letters
        if sink is not None:
            for letter in letters:
                sink.send(letter)
        if windows:
            self.publish(windows)
        if answer is not None:  # asked without waiting: kept for its asker (or discarded if cancelled)
            answer.fill(result, error)
            return None
        if error is not None:
            raise error  # as in-process (e.g. a SnapshotError); the worker logged its traceback
        return result

    def _check(self) -> None:
        if self._failed is not None:
            raise CoreProcessError(self._failed)

    def _fail(self, reason: str) -> None:
        process = self._process
        if process is not None and not process.is_alive() and process.exitcode is not None:
            reason += f" (exit code {process.exitcode})"
        self._failed = reason
        raise CoreProcessError(reason)

    # -- life cycle ------------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._process is not None:
            self._check()
            return
        ctx = multiprocessing.get_context("spawn")  # never fork a process that runs Kafka client threads
        # Two one-way pipes, widened to 1 MiB where Linux allows, and the requests' ring below: a poll's
        # batch of a pair (up to a few MB) goes out from the consuming thread without waiting for the core.
        # (A sender thread instead waited up to a GIL switch interval, 5 ms, per batch behind the busy
        # consuming thread: a quiet machine consumed at half its CPU rate.) The worker answers through a
        # thread of its own, so a large window never blocks it.
        req_read, req_write = ctx.Pipe(duplex=False)
        ans_read, ans_write = ctx.Pipe(duplex=False)
        for end in (req_write, ans_write):
            widen_pipe(end)
        # Batches go through a shared ring, their descriptors through the pipe (consumers/handoff.py): a 2 MB
        # batch then never waits for the worker to read it. Sized for the batches in flight, twice over.
        self._ring = RequestRing.open()
        self._process = ctx.Process(target=_serve, args=(req_read, ans_write, _dumps((self.config, self.events, self.formats)),
                                                         None if self._ring is None else self._ring.path),
                                    name="rankwatch-core", daemon=True)
        self._process.start()
        req_read.close()
        ans_write.close()
        self._conn, self._requests = ans_read, req_write
        log.info("streaming core in process %d", self._process.pid)

    def _write(self, data: bytes) -> None:
        """Write one request (every request written is answered, in order: :meth:`_receive_one` releases its
        ring space)."""
        if self._ring is not None:
            data = self._ring.place(data)
        try:
            self._requests.send_bytes(data)
        except (EOFError, OSError):
            self._fail("the core process ended")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker (its state is in the checkpoints by now) and wait for it, bounded."""
        with self._lock:
            process, conn = self._process, self._conn
            if process is None:
                return
            self._requests.close()  # the worker's end of input: it exits
            conn.close()
            process.join(timeout_s)
            if process.is_alive():
                process.terminate()
                process.join(1.0)
            self._process = self._conn = self._requests = None
            if self._ring is not None:
                self._ring.close()
                self._ring = None
            self._failed = "the core process was closed"


class RemoteProcessor:
    """The stand-in of one pair's :class:`StreamProcessor` in the core process (same methods as used by
    the service). Windows are published through :attr:`CoreProcess.publish`, so the methods that return
    windows in-process return an empty list here."""

    def __init__(self, core: CoreProcess, handle: int) -> None:
        self.core = core
        self.handle = handle
        self.config = core.config

    def process_batch(self, kinds: Sequence[bool], values: Sequence[bytes], *, partition: int | None = None,
                      offsets: Sequence[int] | None = None,
                      topics: tuple[str, str] = ("impressions", "clicks")) -> list[PublishedWindow]:
        self.core.send_batch(self.handle, (kinds, values, offsets, partition, topics))
        return []

    def tick(self) -> list[PublishedWindow]:
        self.core.call("tick", self.handle, self.core.clock.now())
        return []

    def flush(self) -> list[PublishedWindow]:
        self.core.call("flush", self.handle)
        return []

    def snapshot(self) -> bytes:
        return self.core.call("snapshot", self.handle)  # type: ignore[no-any-return]

    def snapshot_async(self) -> Answer:
        return self.core.call_async("snapshot", self.handle)

    def stats(self) -> StreamStats:
        """The stats as of the latest answered request (behind the batches in flight by at most
        ``max_in_flight`` polls; exact after a snapshot, which every checkpoint and shutdown takes)."""
        return self.core.latest_stats(self.handle)


class InProcessCores:
    """The factory of processors in the consuming process (``[kafka] core_process = false``)."""

    def __init__(self, config: StreamConfig, *, clock: Clock, events: EventMapping | None = None,
                 formats: Mapping[str, FormatSpec] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.dead_letters: DeadLetterSink | None = None
        self.schemas = SchemaCache()
        self.translator = translator_of(events, formats, self.schemas.schema_of, config.max_event_bytes)

    def add_schemas(self, entries: Entries) -> None:
        self.schemas.update(entries)

    def new(self, partitions: tuple[int, ...]) -> StreamProcessor:
        return StreamProcessor(self.config, clock=self.clock, dead_letters=self.dead_letters, partitions=partitions,
                               translator=self.translator)

    def restore(self, snapshot: bytes) -> StreamProcessor:
        return StreamProcessor.restore(snapshot, config=self.config, clock=self.clock, dead_letters=self.dead_letters,
                                       translator=self.translator)

    def drain(self) -> None:
        """Nothing is ever waiting: windows are returned by the calls themselves."""

    def close(self, timeout_s: float = 5.0) -> None:
        """Nothing to stop."""
