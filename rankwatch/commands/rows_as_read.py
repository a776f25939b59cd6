"""A replay's rows made as its log reader reads the lines, each line decoded once.

Layout: :class:`RepeatGuard` (whether the core may read a batch's lines though its rows are clean), then
:class:`RowsAsRead`, whose :meth:`RowsAsRead.ts_of` is the merge's ``ts_of`` (it makes the batch path's stateless
rows of a chunk of one file as the merge reads it, and takes the chunk's event times from them) and whose
:meth:`RowsAsRead.take` hands on the rows of a merged batch's lines, packed for the pipe.

Why: the merge needs every line's event time before it can order the lines, so the reader decoded each line's
``ts`` (msgspec, the whole line parsed), and the rows were made again from the same line afterwards, by the
reader while it was ahead, by the core otherwise: every line was parsed twice, the first parse an eighth of the
reader's time. Made here, the rows carry the time of every clean line (``prepare_rows`` took it from the same
decoder's ``ts`` field, with the conditions of :func:`pipeline.events.validation.sniff_ts_ms`); only a line
left to the per-record path is read for its time alone, as before, so the merge's order is the one
:func:`pipeline.events.logs.sniff_many` gives. The rows are made so while the reader is ahead of the core; once the
core waits for it, a chunk is only read for its times and the core makes its rows (a batch's kind marked missing),
so the work still goes to whichever process has time (rankwatch/commands/log_reader.py). Making every chunk's rows
in the reader left the CPU idle early in a replay, when nothing is finalized yet and the core waited
(docs/benchmarks.md).

Exactness: the merge emits a file's lines in the order they were read (its key, the file's running maximum of
``ts``, never falls), so the rows of a batch's impressions are the next rows of the impressions file, and those of
its clicks the next of the clicks file. This holds with one file a stream, which is when ``rankwatch replay``
uses it (:meth:`RowsAsRead.applies`); with several the reader makes the rows of each merged batch, as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from rankwatch.pipeline.events.logs import NO_TS, sniff_many
from rankwatch.pipeline.events.validation import sniff_ts_and_request, sniff_ts_ms
from rankwatch.pipeline.stream.prepare import BatchSpec, PackedRows, PreparedRows, prepare_rows

_TS_COLUMN = {True: 2, False: 3}  # the ts column of an impression row, of a feedback row
_FIELDS = {True: 7, False: 5}
_STREAMS = {"impressions": True, "clicks": False}


class RepeatGuard:
    """Which clean impression rows the core may still take through its per-record path, which reads the line: one
    whose request id came before (the core may hold that request pending: a second impression extends it, or is
    rejected, with its line dead-lettered), or any while the core may be at its pending cap.

    Every id read is kept with the last chunk it came in, so that the ids kept cover every request the core may hold:
    whichever line made the request pending (not necessarily the first: the core may have rejected that one), it came
    no later than that chunk. A chunk's ids are forgotten once the core has finalized whatever they could have made
    pending: ``core_step()`` is the core's stepped watermark as the core last told it
    (:attr:`StreamProcessor.watermark_step`; it only grows, and the core applies a row the guard reads now later). A
    request is finalized once its deadline bucket (time plus attribution window, a step wide) ends by that step; the
    chunk's newest time bounds the times of its lines, and a later impression only moves a request earlier.

    Bounded: at the pending cap's worth of ids the guard stops keeping them and vouches for nothing until the core
    has finalized everything read by then (*blind*); an id read meanwhile is new again afterwards, which is right: any
    request it made is finalized by then. Kept longer, an id costs a batch's lines sent, never an error. The usual
    chunk (no id twice, none seen before) costs a few set operations in C, not a step a line.
    """

    def __init__(self, config: Any, core_step: Callable[[], int | None]) -> None:
        self._step = config.finalize_step_ms
        self._attr = config.attribution_window_ms
        self._cap = config.max_pending_requests
        self._core_step = core_step
        self._ids: set[str] = set()
        self._chunks: deque[tuple[int, int, set[str]]] = deque()  # (chunk number, newest time, its ids), in order
        self._moved: dict[str, int] = {}  # ids read again: the number of the last chunk they came in
        self._number = 0
        self._blind_until: int | None = None  # the newest time read while blind

    def flagged(self, rids: list[str | None], newest: int) -> list[int]:
        """Record a chunk's impressions (their request ids in file order, None where the core rejects the line;
        ``newest`` at least the latest of their times); the indexes of those whose line the core may need."""
        self._forget()
        self._number += 1
        if self._blind_until is not None:
            self._blind_until = max(self._blind_until, newest)
            return [i for i, rid in enumerate(rids) if rid is not None]
        ids = self._ids
        here: set[Any] = set(rids)
        here.discard(None)
        if len(here) == len(rids) - rids.count(None) and ids.isdisjoint(here) and len(ids) + len(here) < self._cap:
            ids |= here  # the usual chunk: no id twice, none seen before, below the cap
            self._chunks.append((self._number, newest, here))
            return []
        out: list[int] = []
        here = set()
        for i, rid in enumerate(rids):
            if rid is None:
                continue
            if len(ids) >= self._cap:  # blind from here: the rest of the chunk flagged, nothing more kept
                self._blind_until = max([newest, *(chunk[1] for chunk in self._chunks)])
                out.extend(j for j in range(i, len(rids)) if rids[j] is not None)
                break
            if rid in ids or rid in here:
                out.append(i)
                self._moved[rid] = self._number
            ids.add(rid)
            here.add(rid)
        self._chunks.append((self._number, newest, here))
        return out

    def _finalized(self, ws: int, newest: int) -> bool:
        """Whether every request a line at ``newest`` or before could have made pending is finalized by step ``ws``
        (its bucket ends by ws, a step of margin)."""
        return ((newest + self._attr) // self._step + 2) * self._step <= ws

    def _forget(self) -> None:
        ws = self._core_step()
        if ws is None:
            return
        if self._blind_until is not None and self._finalized(ws, self._blind_until):
            self._blind_until = None  # everything read so far is finalized: start afresh
            self._ids.clear()
            self._chunks.clear()
            self._moved.clear()
            return
        chunks, moved = self._chunks, self._moved
        while chunks and self._finalized(ws, chunks[0][1]):
            number, _, ids = chunks.popleft()
            if moved:  # ids read again in a later chunk stay until that one goes
                later = {rid for rid, last in moved.items() if last > number}
                for rid in [rid for rid, last in moved.items() if last == number]:
                    del moved[rid]
                ids = ids - later
            self._ids -= ids


class RowsAsRead:
    """The rows of the lines read so far and not yet handed on: a queue of chunks per stream, each its rows as
    columns (or None where the chunk's lines were only read for their times), its size, and the indexes of its
    impressions whose line the core may need (:class:`RepeatGuard`)."""

    def __init__(self, spec: BatchSpec, config: Any, core_step: Callable[[], int | None]) -> None:
        self.spec = spec
        self._guard = RepeatGuard(config, core_step)
        self._user_keys: dict[str, int] = {}
        self._queued: dict[bool, deque[tuple[list[list[Any]] | None, int, list[int]]]] = {True: deque(),
                                                                                        False: deque()}
        self._caught_up: Callable[[], bool] = lambda: True  # before the first batch the core waits for it

    @staticmethod
    def applies(streams: list[str]) -> bool:
        """Whether the rows can follow the lines: one file a stream (module docstring)."""
        return all(streams.count(s) <= 1 for s in _STREAMS)

    def ts_of(self, stream: str, lines: list[bytes]) -> np.ndarray:
        """The merge's ``ts_of``: the event time of each of a chunk's ``lines`` (:data:`NO_TS` where none is
        readable). While the reader is ahead of the core, the chunk's rows are made now and give the times;
        once the core has caught up (it waits), only the times are read, and the core makes the rows."""
        kind = _STREAMS[stream]
        if self._caught_up():
            if not kind:
                self._queued[kind].append((None, len(lines), []))
                return sniff_many(lines)
            sniffed = [sniff_ts_and_request(line) for line in lines]
            ts = np.array([NO_TS if t is None else t for t, _ in sniffed], dtype=np.int64)
            self._queued[kind].append((None, len(lines), self._guard.flagged([r for _, r in sniffed], int(ts.max()))))
            return ts
        rows = prepare_rows(self.spec, [kind] * len(lines), lines, self._user_keys)
        columns = rows.impressions if kind else rows.feedback
        ts = np.array(columns[_TS_COLUMN[kind]], dtype=np.int64)
        rids: list[str | None] | None = list(columns[1]) if kind else None
        for i, event_id in enumerate(columns[0]):
            if event_id is None:  # left to the per-record path: its time read alone, as the merge always did
                if rids is None:
                    ms = sniff_ts_ms(lines[i])
                else:
                    ms, rids[i] = sniff_ts_and_request(lines[i])
                ts[i] = NO_TS if ms is None else ms
        self._queued[kind].append((columns, len(lines), [] if rids is None else self._guard.flagged(rids, int(ts.max()))))
        return ts

    def take(self, kinds: list[bool], caught_up: Callable[[], bool]) -> PackedRows | None:
        """The rows of a merged batch whose lines are of ``kinds`` (the next ones of each stream), packed, a kind
        whose lines were only read for their times marked :attr:`PackedRows.missing`; None when neither kind's
        were made. ``caught_up``: whether the core has asked for every batch handed on (then it waits)."""
        self._caught_up = caught_up
        n_imp = sum(kinds)
        (imp, flagged), (fb, _) = self._next(True, n_imp), self._next(False, len(kinds) - n_imp)
        if imp is None and fb is None:
            return None
        missing = (1 if imp is None else 0) | (2 if fb is None else 0)
        packed = PreparedRows(len(kinds), imp or _empty(True), fb or _empty(False)).packed()
        # Vouched: the core applies each of these clean rows without its line (none a repeat, below the cap).
        return packed._replace(missing=missing, vouched=not flagged)

    def _next(self, kind: bool, n: int) -> tuple[list[list[Any]] | None, bool]:
        """The next ``n`` rows of a stream as columns (None if any of them was not made), and whether any of them
        is flagged."""
        queued = self._queued[kind]
        parts: list[list[list[Any]] | None] = []
        flagged = False
        while n:
            if not queued:
                raise RuntimeError("the merge handed on lines whose rows were not made")
            columns, size, marks = queued[0]
            if size <= n:
                queued.popleft()
                parts.append(columns)
                flagged = flagged or bool(marks)
                n -= size
            else:
                parts.append(None if columns is None else [c[:n] for c in columns])
                flagged = flagged or any(i < n for i in marks)
                queued[0] = (None if columns is None else [c[n:] for c in columns], size - n,
                             [i - n for i in marks if i >= n])
                n = 0
        if not parts:
            return _empty(kind), False
        if any(p is None for p in parts):
            return None, flagged
        if len(parts) == 1:
            return parts[0], flagged
        return [[x for p in parts for x in p[f]] for f in range(_FIELDS[kind])], flagged  # type: ignore[index]


def _empty(kind: bool) -> list[list[Any]]:
    return [[] for _ in range(_FIELDS[kind])]
