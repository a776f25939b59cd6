"""Logged events read and merged in a child process, a few batches ahead of the streaming core.

Layout: :func:`open_merge` (what ``rankwatch replay`` reads its logs through), :class:`PrefetchedMerge` (the
batches of :class:`pipeline.events.logs.EventLogMerge`, produced by a forked child and handed over through
shared memory, or a pipe),
:func:`batches_with_rows` (the batches with what the child prepared of them), :class:`Lines` (a batch's lines
as one blob) and :func:`_produce` with its writer :class:`_Sender` (the child's side).

Why: reading the files, decoding every line's event time and merging the files cost about an eighth of a
replay, on the same core as the streaming core, which is the bottleneck. In a child they run on another core
while the core works. The child may also *prepare* each batch (for ``rankwatch replay``: the batch path's
stateless rows, :mod:`pipeline.stream.prepare`, about 40 % of the core's work) while it is ahead: while a
batch it handed over waits for the parent (a shared counter of the batches the parent asked for tells the
child). Once the parent has caught up, the child hands the batch over as it is and reads on, and the parent
makes the rows the child did not. So the work goes where there is time: when the parent is the slower one
(finalizing) the child prepares whole batches ahead; when the child is (early in a replay, or translating a
team's schema) it only reads. With one file a stream, ``rankwatch replay`` makes the same decision a chunk of a
file at a time, as the chunk is read, and the rows give the merge its times (``child_ts_of``;
rankwatch/commands/rows_as_read.py): a line is then decoded once, not once for its time and again for its row.
A writer thread and a queue of two batches let the child work while the parent reads. Where the parent needs none of a batch's lines besides the rows (``lines_needed``: clean rows of every
line), only their number goes (:class:`Unsent`): the lines were a third of what was copied. A batch travels
through a ring of shared memory (:class:`rankwatch.consumers.handoff.RequestRing`, 32 MiB,
the one ``rankwatch run``'s core process reads its requests from) and the pipe carries its 17-byte descriptor:
no copies through the kernel, and one unpickling in the parent (the pipe's way cost the parent about a tenth of a
replay in reads and copies). The child reuses a batch's space once the parent asked for the batch after it; a
batch that finds no room goes through the pipe itself, where a write waits for the parent. So the ring, the
queue and the pipe bound how far ahead the child is: memory stays at a few chunks a file plus the ring, however
large the logs. The batches, their order and their sources are those of the in-process merge (the
child runs the same :class:`EventLogMerge`); where ``fork`` is unavailable, or with
``RANKWATCH_LOG_READER=inline``, the merge runs in-process and the core prepares every batch itself.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import traceback
from array import array
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate, chain
from pathlib import Path
from typing import Any, overload

from rankwatch.consumers.handoff import RequestRing, descriptor_of, widen_pipe
from rankwatch.errors import RankwatchError
from rankwatch.pipeline.events.logs import CHUNK_BYTES, BatchSources, EventLogMerge, TimesOf

_JOIN_TIMEOUT_S = 5.0
_AHEAD = 2  # batches the child may have ready beyond the one the parent reads

# What the child makes of a batch besides reading it: (kinds, values, caught_up) -> e.g. the batch path's
# stateless rows of the batch's first records (pipeline.stream.prepare.prepare_rows), so that work runs on the
# reader's core. It stops once caught_up() is true (the parent has asked for every batch handed over: the
# child is no batch ahead), and the parent makes the rest itself (module docstring).
Prepare = Callable[[list[bool], list[bytes], Callable[[], bool]], Any]
# Whether the parent needs a batch's lines besides what ``prepare`` made of them: (made, number of lines) -> bool.
# Where it does not (replay: clean rows for every line), the lines are not sent (module docstring).
LinesNeeded = Callable[[Any, int], bool]


def open_merge(files: list[tuple[Path, str]], *, ts_of: TimesOf | None = None,
               opener: Callable[..., Any] | None = None, chunk_bytes: int = CHUNK_BYTES,
               prepare: Prepare | None = None, lines_needed: LinesNeeded | None = None,
               child_ts_of: TimesOf | None = None) -> EventLogMerge | PrefetchedMerge:
    """The files' batches in merge order: read by a child process where possible (module docstring).
    ``prepare``: what the child also makes of each batch (:func:`batches_with_rows`); ``lines_needed``: whether
    the parent reads a batch's lines too (by default it may): where not, they stay in the child. ``child_ts_of``:
    the child's ``ts_of`` instead of ``ts_of``, where ``prepare`` hands on what it made as it read the lines
    (rankwatch/commands/rows_as_read.py); an in-process merge uses ``ts_of``."""
    if os.environ.get("RANKWATCH_LOG_READER", "child") == "inline" or "fork" not in multiprocessing.get_all_start_methods():
        return EventLogMerge(files, chunk_bytes=chunk_bytes, ts_of=ts_of, opener=opener)
    return PrefetchedMerge(files, ts_of=child_ts_of or ts_of, opener=opener, chunk_bytes=chunk_bytes,
                           prepare=prepare, lines_needed=lines_needed)


def batches_with_rows(merge: EventLogMerge | PrefetchedMerge) -> Iterator[tuple[list[bool], Sequence[bytes],
                                                                              BatchSources, Any]]:
    """``merge``'s batches, each with the rows its reader made of it (None where the merge runs in-process or
    was given no ``prepare``: the caller makes them)."""
    if isinstance(merge, PrefetchedMerge):
        yield from merge.prepared_batches()
    else:
        for kinds, values, sources in merge.batches():
            yield kinds, values, sources, None


class PrefetchedMerge:
    """:class:`EventLogMerge`'s interface (``size``, ``position()``, ``batches()``, ``close()``), its merge
    running in a forked child. The files are opened here first, so a missing or unreadable file fails at once."""

    def __init__(self, files: list[tuple[Path, str]], *, ts_of: TimesOf | None = None,
                 opener: Callable[..., Any] | None = None, chunk_bytes: int = CHUNK_BYTES,
                 prepare: Prepare | None = None, lines_needed: LinesNeeded | None = None) -> None:
        merge = EventLogMerge(files, chunk_bytes=chunk_bytes, ts_of=ts_of, opener=opener)  # opens (and sizes) every file here
        self.size = merge.size
        self._position = 0
        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)
        self._asked = ctx.RawValue("q", 0)  # batches the parent has asked for (shared memory; one writer)
        widen_pipe(send)  # a 4 MiB batch in 1 MiB reads, not 64 KiB ones (a quarter of the reading's cost)
        # The batches themselves go through shared memory where there is some (the pipe carries a descriptor):
        # no copies through the kernel, and the core's process reads a batch with one unpickling.
        self._ring = RequestRing.open()
        self.shared_batches = 0  # batches read from the ring (the others came through the pipe)
        # The child inherits the open files, the translator and the ring's mapping (fork): nothing is pickled.
        self._child = ctx.Process(target=_produce, args=(merge, send, self._recv, prepare, self._asked, self._ring,
                                                               lines_needed),
                                  name="rankwatch-log-reader",
                                  daemon=True)
        try:
            self._child.start()
        finally:
            if self._ring is not None:
                self._ring.unlink()  # both processes have it mapped (or the start failed): nothing is left behind
        send.close()
        merge.close()  # the child holds its own descriptors now

    def position(self) -> int:
        return self._position

    def batches(self) -> Iterator[tuple[list[bool], Sequence[bytes], BatchSources]]:
        for kinds, values, sources, _ in self.prepared_batches():
            yield kinds, values, sources

    def prepared_batches(self) -> Iterator[tuple[list[bool], Sequence[bytes], BatchSources, Any]]:
        """Each batch with the rows ``prepare`` made of it in the child (None without ``prepare``)."""
        while True:
            self._asked.value += 1  # the child may reuse the ring's space of every batch before this one
            try:
                data = self._recv.recv_bytes()
                if self._ring is not None and descriptor_of(data):
                    with self._ring.read(data) as view:
                        message = pickle.loads(view)
                    self.shared_batches += 1
                else:
                    message = pickle.loads(data)
            except EOFError:
                self._child.join(_JOIN_TIMEOUT_S)
                raise RankwatchError(f"the log reader process ended unexpectedly "
                                     f"(exit status {self._child.exitcode})") from None
            tag = message[0]
            if tag == "batch":
                _, kinds, values, paths, indexes, numbers, self._position, rows = message
                if type(values) is int:  # the parent needs none of the lines (lines_needed)
                    values = Unsent(values)
                elif rows is not None:  # the lines came as one blob: sliced only where the core needs one
                    values = Lines(*values)
                yield kinds, values, BatchSources(paths, indexes, numbers), rows
            elif tag == "end":
                self._position = message[1]
                return
            elif tag == "error":
                raise RankwatchError(message[1])
            else:  # "crash": a bug in the reader; its traceback, as an in-process merge would have shown it
                raise RuntimeError(f"the log reader process failed:\n{message[1]}")

    def close(self) -> None:
        """Stop reading: the child's next write fails (it holds no read end) and it exits; bounded, then
        SIGTERM, then SIGKILL."""
        self._recv.close()
        child = self._child
        for stop in (None, child.terminate, child.kill):
            if stop is not None:
                stop()
            child.join(_JOIN_TIMEOUT_S)
            if not child.is_alive():
                break
        if self._ring is not None:
            self._ring.close()
            self._ring = None


class Lines(Sequence[bytes]):
    """A batch's lines as one blob and their lengths; ``lines[i]`` slices line ``i`` out when asked."""

    def __init__(self, blob: bytes, lengths: bytes) -> None:
        ends = array("q", accumulate(array("i", lengths)))
        self._blob, self._ends = blob, ends

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...
    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1 or start >= stop:
                return [self[j] for j in range(start, stop, step)]
            # The core prepares a run of lines the reader did not: one comprehension, no call a line.
            blob, ends = self._blob, self._ends
            return [blob[a:b] for a, b in zip(chain((ends[start - 1] if start else 0,), ends[start:stop - 1]),
                                              ends[start:stop], strict=True)]
        if i < 0:
            i += len(self)
        end = self._ends[i]  # IndexError past the end, as a list's
        return self._blob[self._ends[i - 1] if i else 0:end]


class Unsent(Sequence[bytes]):
    """A batch's lines that the child did not send, because the parent needs none (``lines_needed``): only their
    number. Reading one is a bug, named as such."""

    def __init__(self, n: int) -> None:
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        raise RuntimeError(f"line {i} of this batch was not sent: lines_needed said the parent reads none")


def _produce(merge: EventLogMerge, send: Any, parents_end: Any, prepare: Prepare | None, asked: Any,
             ring: RequestRing | None = None, lines_needed: LinesNeeded | None = None) -> None:
    """The child: every batch of ``merge`` (with ``prepare`` of it), then ``("end", position)``; an error as
    one message. A batch goes through ``ring`` when it fits (the pipe carries its descriptor); the space of a
    batch is reused once the parent asked for the batch after it (it unpickled this one on receipt)."""
    # The fork copied the parent's read end: closed here, the parent's close() alone leaves the pipe without a
    # reader, so a write blocked on it fails at once. The parent's Python signal handlers were copied too (a
    # test process that ran `rankwatch run` has a SIGTERM handler that only sets a flag): back to the defaults.
    parents_end.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which stops this child
    sender = _Sender(send)
    produced = 0  # batches handed to the sender: the child is ahead while the parent has asked for fewer
    released = 0  # batches whose ring space is free again
    try:
        for kinds, values, sources in merge.batches():
            paths, indexes, numbers = sources.parts()
            rows = None
            if prepare is not None:
                # With the rows made here, the core's process reads a line only where the per-record path takes
                # it (a rejection, say): the lines go as one blob and their lengths, not one object a line.
                rows = prepare(kinds, values, functools.partial(_caught_up, asked, produced))
                if lines_needed is not None and not lines_needed(rows, len(values)):
                    values = len(values)  # type: ignore[assignment]
                else:
                    values = (b"".join(values), array("i", map(len, values)).tobytes())  # type: ignore[assignment]
            data = pickle.dumps(("batch", kinds, values, paths, indexes, numbers, merge.position(), rows),
                                protocol=pickle.HIGHEST_PROTOCOL)
            if ring is not None:
                while released < asked.value - 1:  # the parent asked for batch `asked - 1`: it read the ones before
                    ring.answered()
                    released += 1
                data = ring.place(data)  # a descriptor, or the batch itself when the ring has no room
            sender.put(data)
            produced += 1
        message: tuple[Any, ...] = ("end", merge.size)
    except RankwatchError as e:
        message = ("error", str(e))
    except BrokenPipeError:
        return  # the parent stopped reading (it failed or was stopped): nothing to tell
    except BaseException:  # noqa: BLE001 - handed to the parent, which raises it
        message = ("crash", traceback.format_exc())
    try:
        sender.put(pickle.dumps(message))
        sender.finish()
    except (BrokenPipeError, OSError):
        pass
    finally:
        merge.close()
        send.close()


def _caught_up(asked: Any, produced: int) -> bool:
    """Whether the parent has asked for every one of the ``produced`` batches: the child is no batch ahead."""
    return bool(asked.value >= produced)


class _Sender:
    """The child's messages, written to the pipe by a thread from a queue of :data:`_AHEAD` messages: the
    child reads and prepares the next batches while the parent reads one (a blocked write releases the GIL)."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=_AHEAD)
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="rankwatch-log-reader-send", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            try:
                self._send.send_bytes(message)
            except OSError:  # BrokenPipeError: the parent stopped reading
                self._failed = True
                return

    def put(self, message: bytes | None) -> None:
        """Queue ``message``; BrokenPipeError once the parent stopped reading."""
        while True:
            if self._failed:
                raise BrokenPipeError("the parent stopped reading")
            try:
                self._queue.put(message, timeout=0.1)
                return
            except queue.Full:
                continue

    def finish(self) -> None:
        """Write what is queued, then stop the thread (bounded by the parent's reading or its close)."""
        self.put(None)
        while self._thread.is_alive():
            self._thread.join(0.1)
        if self._failed:
            raise BrokenPipeError("the parent stopped reading")
