"""A replay's rows made as its log reader reads the lines, each line decoded once.

Layout: :class:`RowsAsRead`, whose :meth:`RowsAsRead.ts_of` is the merge's ``ts_of`` (it makes the batch path's
stateless rows of a chunk of one file as the merge reads it, and takes the chunk's event times from them) and
whose :meth:`RowsAsRead.take` hands on the rows of a merged batch's lines, packed for the pipe.

Why: the merge needs every line's event time before it can order the lines, so the reader decoded each line's
``ts`` (msgspec, the whole line parsed), and the rows were made again from the same line afterwards, by the
reader while it was ahead, by the core otherwise: every line was parsed twice, the first parse an eighth of the
reader's time. Made here, the rows carry the time of every clean line (``prepare_rows`` took it from the same
decoder's ``ts`` field, with the conditions of :func:`pipeline.events.validation.sniff_ts_ms`); only a line
left to the per-record path is read for its time alone, as before, so the merge's order is the one
:func:`pipeline.events.logs.sniff_many` gives. The core then makes no rows: it applies them.

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
from rankwatch.pipeline.events.validation import sniff_ts_ms
from rankwatch.pipeline.stream.prepare import BatchSpec, PackedRows, PreparedRows, prepare_rows

_TS_COLUMN = {True: 2, False: 3}  # the ts column of an impression row, of a feedback row
_FIELDS = {True: 7, False: 5}
_STREAMS = {"impressions": True, "clicks": False}


class RowsAsRead:
    """The rows of the lines read so far and not yet handed on: a queue of chunks per stream, each its rows as
    columns, or None where the chunk's lines were only read for their times."""

    def __init__(self, spec: BatchSpec) -> None:
        self.spec = spec
        self._user_keys: dict[str, int] = {}
        self._queued: dict[bool, deque[tuple[list[list[Any]] | None, int]]] = {True: deque(), False: deque()}
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
            self._queued[kind].append((None, len(lines)))
            return sniff_many(lines)
        rows = prepare_rows(self.spec, [kind] * len(lines), lines, self._user_keys)
        columns = rows.impressions if kind else rows.feedback
        ts = np.array(columns[_TS_COLUMN[kind]], dtype=np.int64)
        for i, event_id in enumerate(columns[0]):
            if event_id is None:  # left to the per-record path: its time read alone, as the merge always did
                ms = sniff_ts_ms(lines[i])
                ts[i] = NO_TS if ms is None else ms
        self._queued[kind].append((columns, len(lines)))
        return ts

    def take(self, kinds: list[bool], caught_up: Callable[[], bool]) -> PackedRows | None:
        """The rows of a merged batch whose lines are of ``kinds`` (the next ones of each stream), packed, a kind
        whose lines were only read for their times marked :attr:`PackedRows.missing`; None when neither kind's
        were made. ``caught_up``: whether the core has asked for every batch handed on (then it waits)."""
        self._caught_up = caught_up
        n_imp = sum(kinds)
        imp, fb = self._next(True, n_imp), self._next(False, len(kinds) - n_imp)
        if imp is None and fb is None:
            return None
        missing = (1 if imp is None else 0) | (2 if fb is None else 0)
        packed = PreparedRows(len(kinds), imp or _empty(True), fb or _empty(False)).packed()
        return packed._replace(missing=missing) if missing else packed

    def _next(self, kind: bool, n: int) -> list[list[Any]] | None:
        """The next ``n`` rows of a stream as columns; None if any of them was not made."""
        queued = self._queued[kind]
        parts: list[list[list[Any]] | None] = []
        while n:
            if not queued:
                raise RuntimeError("the merge handed on lines whose rows were not made")
            columns, size = queued[0]
            if size <= n:
                queued.popleft()
                parts.append(columns)
                n -= size
            else:
                parts.append(None if columns is None else [c[:n] for c in columns])
                queued[0] = (None if columns is None else [c[n:] for c in columns], size - n)
                n = 0
        if not parts:
            return _empty(kind)
        if any(p is None for p in parts):
            return None
        if len(parts) == 1:
            return parts[0]
        return [[x for p in parts for x in p[f]] for f in range(_FIELDS[kind])]  # type: ignore[index]


def _empty(kind: bool) -> list[list[Any]]:
    return [[] for _ in range(_FIELDS[kind])]
