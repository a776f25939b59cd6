"""Logged events read and merged in a child process, a batch ahead of the streaming core.

Layout: :func:`open_merge` (what ``rankwatch replay`` reads its logs through), :class:`PrefetchedMerge` (the
batches of :class:`pipeline.events.logs.EventLogMerge`, produced by a forked child and sent over a pipe) and
:func:`_produce` (the child's loop).

Why: reading the files, decoding every line's event time and merging the files cost about an eighth of a
replay, on the same core as the streaming core, which is the bottleneck. In a child they run on another core
while the core works. The pipe holds less than one batch and the child blocks on it, so the child is at most
one batch ahead: memory stays at a few chunks a file, however large the logs. The batches, their order and
their sources are those of the in-process merge (the child runs the same :class:`EventLogMerge`); where
``fork`` is unavailable, or with ``RANKWATCH_LOG_READER=inline``, the merge runs in-process.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rankwatch.consumers.handoff import widen_pipe
from rankwatch.errors import RankwatchError
from rankwatch.pipeline.events.logs import CHUNK_BYTES, BatchSources, EventLogMerge, TimesOf

_JOIN_TIMEOUT_S = 5.0


def open_merge(files: list[tuple[Path, str]], *, ts_of: TimesOf | None = None,
               opener: Callable[..., Any] | None = None,
               chunk_bytes: int = CHUNK_BYTES) -> EventLogMerge | PrefetchedMerge:
    """The files' batches in merge order: read by a child process where possible (module docstring)."""
    if os.environ.get("RANKWATCH_LOG_READER", "child") == "inline" or "fork" not in multiprocessing.get_all_start_methods():
        return EventLogMerge(files, chunk_bytes=chunk_bytes, ts_of=ts_of, opener=opener)
    return PrefetchedMerge(files, ts_of=ts_of, opener=opener, chunk_bytes=chunk_bytes)


class PrefetchedMerge:
    """:class:`EventLogMerge`'s interface (``size``, ``position()``, ``batches()``, ``close()``), its merge
    running in a forked child. The files are opened here first, so a missing or unreadable file fails at once."""

    def __init__(self, files: list[tuple[Path, str]], *, ts_of: TimesOf | None = None,
                 opener: Callable[..., Any] | None = None, chunk_bytes: int = CHUNK_BYTES) -> None:
        merge = EventLogMerge(files, chunk_bytes=chunk_bytes, ts_of=ts_of, opener=opener)  # opens (and sizes) every file here
        self.size = merge.size
        self._position = 0
        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)
        widen_pipe(send)  # a 4 MiB batch in 1 MiB reads, not 64 KiB ones (a quarter of the reading's cost)
        # The child inherits the open files and the translator (fork): nothing of them is pickled.
        self._child = ctx.Process(target=_produce, args=(merge, send, self._recv), name="rankwatch-log-reader",
                                  daemon=True)
        self._child.start()
        send.close()
        merge.close()  # the child holds its own descriptors now

    def position(self) -> int:
        return self._position

    def batches(self) -> Iterator[tuple[list[bool], list[bytes], BatchSources]]:
        while True:
            try:
                message = pickle.loads(self._recv.recv_bytes())
            except EOFError:
                self._child.join(_JOIN_TIMEOUT_S)
                raise RankwatchError(f"the log reader process ended unexpectedly "
                                     f"(exit status {self._child.exitcode})") from None
            tag = message[0]
            if tag == "batch":
                _, kinds, values, paths, indexes, numbers, self._position = message
                yield kinds, values, BatchSources(paths, indexes, numbers)
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
                return


def _produce(merge: EventLogMerge, send: Any, parents_end: Any) -> None:
    """The child: every batch of ``merge``, then ``("end", position)``; an error as one message."""
    # The fork copied the parent's read end: closed here, the parent's close() alone leaves the pipe without a
    # reader, so a write blocked on it fails at once. The parent's Python signal handlers were copied too (a
    # test process that ran `rankwatch run` has a SIGTERM handler that only sets a flag): back to the defaults.
    parents_end.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which stops this child
    try:
        for kinds, values, sources in merge.batches():
            paths, indexes, numbers = sources.parts()
            send.send_bytes(pickle.dumps(("batch", kinds, values, paths, indexes, numbers, merge.position()),
                                         protocol=pickle.HIGHEST_PROTOCOL))
        message: tuple[Any, ...] = ("end", merge.size)
    except RankwatchError as e:
        message = ("error", str(e))
    except BrokenPipeError:
        return  # the parent stopped reading (it failed or was stopped): nothing to tell
    except BaseException:  # noqa: BLE001 - handed to the parent, which raises it
        message = ("crash", traceback.format_exc())
    try:
        send.send_bytes(pickle.dumps(message))
    except (BrokenPipeError, OSError):
        pass
    finally:
        merge.close()
        send.close()
