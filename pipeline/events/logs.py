"""Logged events in event-time order, in batches: what ``rankwatch replay`` and ``ab`` on logs feed the core.

:class:`LogFile` reads one JSONL file (gzip detected by its magic bytes and streamed) in chunks of lines;
:func:`sniff_many` reads the ``ts`` of a chunk's lines; :class:`EventLogMerge` merges the
files chunk by chunk into batches ``(kinds, values, sources)`` for the streaming core's batch path.

The order is exactly that of a k-way merge by ``(ts, stream, file, line)`` that takes, at each step, the
smallest head among the files (``heapq.merge``), also when a file is not sorted: such a merge emits a file's
line right after the largest ``ts`` seen so far in that file (its *running maximum*) once that maximum is
the smallest head, and every later line of the file below that maximum follows at once. So the merge is a
sort by ``(running max, stream, file, line)``. A line without a readable ``ts`` keeps the running maximum
of the lines before it (from the start of the file: the smallest key), so it reaches the core, which rejects
it with its reason, exactly where a per-line merge would have handed it over. A chunk's lines can be
emitted once their key is below what any other file can still produce (its running maximum at the end of
its buffered chunk): the merge holds at most one chunk a file.

Why: a Python key per event and one core call per event cost more than the core's batch path itself.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import numpy as np

from rankwatch.pipeline.errors import RankwatchError
from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.events.validation import sniff_ts_ms

# A chunk of a file: 1 MiB. A batch holds a chunk's worth of each file, and a replay's log reader runs a few batches
# ahead of the core; at the end the core still applies those while the reader is done. With 4 MiB whole replays took
# 1.06x the time on dense traffic (all of it finalized at the end) and on 30k requests, and the same on 100k
# (paired medians, ABBA order; 512 KiB was slower on 100k: more batches, each with its fixed cost).
CHUNK_BYTES = 1 << 20
# A file's first read, doubled read after read up to its chunk size: the first batch, which everything downstream
# waits for, is ready after a 256 KiB read of each file (with 4 MiB chunks it came 48 ms after the core asked, now 6).
FIRST_CHUNK_BYTES = 1 << 18
TimesOf = Callable[[str, list[bytes]], np.ndarray]
STREAM_ORDER = {"impressions": 0, "clicks": 1}
NO_TS = np.iinfo(np.int64).min


def sniff_many(lines: list[bytes]) -> np.ndarray:
    """Event times (epoch ms) of ``lines``; :data:`NO_TS` where a line has no valid ``ts``.

    :func:`pipeline.events.validation.sniff_ts_ms` line by line. Not the chunk joined as one JSON array and
    decoded at once: that took longer (the join copies every line) and could not tell which line an element
    came from (a line holding two objects next to two lines closing one object keep the count and put every
    time between them one line off).
    """
    times = [NO_TS if (ms := sniff_ts_ms(line)) is None else ms for line in lines]
    return np.array(times, dtype=np.int64) if times else np.zeros(0, dtype=np.int64)


class LogFile:
    """One JSONL log, read in chunks of whole lines; ``index`` is its place among the merged files."""

    def __init__(self, path: Path, stream: str, index: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.path, self.stream, self.index = path, stream, index
        self.order = STREAM_ORDER[stream]
        self.chunk_bytes = chunk_bytes
        self._read_size = min(chunk_bytes, FIRST_CHUNK_BYTES)
        self.size = path.stat().st_size
        self._raw = path.open("rb")
        magic = self._raw.read(2)
        self._raw.seek(0)
        self._file: IO[bytes] | gzip.GzipFile = gzip.GzipFile(fileobj=self._raw) if magic == b"\x1f\x8b" else self._raw
        self._rest = b""
        self._next_number = 1
        self.done = False

    def read_chunk(self) -> tuple[list[bytes], np.ndarray]:
        """The next chunk's non-empty lines (stripped) and their 1-based line numbers; empty at the end."""
        while not self.done:
            try:
                data = self._file.read(self._read_size)
                self._read_size = min(2 * self._read_size, self.chunk_bytes)
            except (OSError, EOFError) as e:
                raise RankwatchError(f"{self.path}: cannot read: {e}") from None
            if not data:
                self.done = True
                parts = [self._rest] if self._rest else []
                self._rest = b""
            else:
                parts = (self._rest + data).split(b"\n")
                self._rest = parts.pop()
            first = self._next_number
            self._next_number += len(parts)
            stripped = [p.strip() for p in parts]
            keep = [i for i, p in enumerate(stripped) if p]
            if keep:
                return [stripped[i] for i in keep], first + np.asarray(keep, dtype=np.int64)
        return [], np.zeros(0, dtype=np.int64)

    def position(self) -> int:
        return self._raw.tell() if not self._raw.closed else self.size

    def close(self) -> None:
        self._file.close()
        self._raw.close()


class _Buffered:
    """A file's lines read but not yet emitted, with their merge keys (running maxima of ``ts``)."""

    def __init__(self, log: LogFile, ts_of: TimesOf | None) -> None:
        self.log = log
        self.ts_of = ts_of
        self.lines: list[bytes] = []
        self.numbers = np.zeros(0, dtype=np.int64)
        self.keys = np.zeros(0, dtype=np.int64)
        self.running_max = NO_TS  # of every line read so far

    def refill(self) -> None:
        lines, numbers = self.log.read_chunk()
        if not lines:
            return
        ts = sniff_many(lines) if self.ts_of is None else self.ts_of(self.log.stream, lines)
        keys = np.maximum.accumulate(np.maximum(ts, self.running_max))
        self.running_max = int(keys[-1])
        self.lines, self.numbers, self.keys = lines, numbers, keys

    @property
    def exhausted(self) -> bool:
        return self.log.done and not self.lines

    def take(self, n: int) -> tuple[list[bytes], np.ndarray, np.ndarray]:
        lines, numbers, keys = self.lines[:n], self.numbers[:n], self.keys[:n]
        self.lines, self.numbers, self.keys = self.lines[n:], self.numbers[n:], self.keys[n:]
        return lines, numbers, keys


class EventLogMerge:
    """Batches of the files' lines in merge order (module docstring), for ``StreamProcessor.process_batch``.

    ``files`` are ``(path, stream)`` pairs; a file's index in the merge (its tie-break after ``stream``) is
    its place in the list, impressions listed before clicks. ``ts_of(stream, lines)`` gives the lines'
    event times (default :func:`sniff_many`, for section 1 events; a translator's for a team's schema).
    """

    def __init__(self, files: list[tuple[Path, str]], chunk_bytes: int = CHUNK_BYTES,
                 ts_of: TimesOf | None = None, opener: Callable[[Path, str, int, int], LogFile] | None = None) -> None:
        # ``opener``: another reader of the LogFile interface for some files (replay's .avro container files)
        open_log = opener or LogFile
        self.logs = [open_log(path, stream, i, chunk_bytes) for i, (path, stream) in enumerate(files)]
        self._buffers = [_Buffered(log, ts_of) for log in self.logs]

    @property
    def size(self) -> int:
        return sum(log.size for log in self.logs)

    def position(self) -> int:
        return sum(log.position() for log in self.logs)

    def close(self) -> None:
        for log in self.logs:
            log.close()

    def batches(self) -> Iterator[tuple[list[bool], list[bytes], BatchSources]]:
        """``(kinds, values, sources)`` a batch: ``kinds[i]`` true for an impression, ``sources(i)`` its file
        and line as a :class:`SourceRef` ``(path, file index, line number)``."""
        while True:
            for buf in self._buffers:
                while not buf.lines and not buf.log.done:
                    buf.refill()
            live = [b for b in self._buffers if not b.exhausted]
            if not live:
                return
            # What each file can still produce is at least (its running max, its stream, its index).
            limits = [(b.running_max, b.log.order, b.log.index) for b in live if not b.log.done]
            parts = []
            for b in live:
                others = [lim for lim in limits if lim[2] != b.log.index]
                if not others:
                    n = len(b.lines)
                else:
                    ts, order, index = min(others)
                    # Ties at ``ts`` go first when this file's (stream, index) comes first.
                    if (b.log.order, b.log.index) < (order, index):
                        n = int(np.searchsorted(b.keys, ts, side="right"))
                    else:
                        n = int(np.searchsorted(b.keys, ts, side="left"))
                if n:
                    parts.append((b.log, *b.take(n)))
            yield _sorted_batch(parts)


class BatchSources:
    """The source of each line of a batch, built only when asked (a dead letter needs it)."""

    def __init__(self, paths: dict[int, str], indexes: np.ndarray, numbers: np.ndarray) -> None:
        self._paths, self._indexes, self._numbers = paths, indexes, numbers

    def __call__(self, i: int) -> SourceRef:
        index = int(self._indexes[i])
        return SourceRef(self._paths[index], index, int(self._numbers[i]))

    def __len__(self) -> int:
        return len(self._numbers)

    def parts(self) -> tuple[dict[int, str], np.ndarray, np.ndarray]:
        """``(paths by file index, file index a line, line number a line)``: what rebuilds it elsewhere."""
        return self._paths, self._indexes, self._numbers


def _sorted_batch(parts: list[tuple[LogFile, list[bytes], np.ndarray, np.ndarray]]) -> tuple[
        list[bool], list[bytes], BatchSources]:
    lines = [line for _, ls, _, _ in parts for line in ls]
    keys = np.concatenate([k for _, _, _, k in parts])
    numbers = np.concatenate([n for _, _, n, _ in parts])
    orders = np.concatenate([np.full(len(ls), log.order, dtype=np.int64) for log, ls, _, _ in parts])
    indexes = np.concatenate([np.full(len(ls), log.index, dtype=np.int64) for log, ls, _, _ in parts])
    perm = np.lexsort((numbers, indexes, orders, keys))
    kinds = (orders[perm] == 0).tolist()
    values = [lines[i] for i in perm.tolist()]
    paths = {log.index: str(log.path) for log, _, _, _ in parts}
    return kinds, values, BatchSources(paths, indexes[perm], numbers[perm])
