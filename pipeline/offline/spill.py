"""Out-of-core grouping: rows hashed by request id into spill files, read back one partition at a time.

Rows of one request may be scattered over the whole input (a shuffled file). :class:`SpillPartitions`
appends every batch's rows to ``n`` partition files by ``hash(request_id) mod n``; all rows of a request
land in one partition, in input order (batches are written in order and a batch keeps its row order), so
a partition holds complete requests and the first-row rules of validation (duplicate positions, label
consistency) and the input-order tie break of rank order see the same rows as the in-memory path.

A piece is a pickled ``(frame, file_index, numbers)``: pandas and pyarrow columns of any type round trip
exactly. The files are private to one run, in a temporary folder deleted at the end.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from rankwatch.pipeline.offline.batches import RowBatch

__all__ = ["SpillPartitions", "request_hashes"]


def request_hashes(ids: pd.Series, seed: int = 0) -> npt.NDArray[np.uint64]:
    """64-bit hash of every request id compared as text (``7`` and ``"7"`` are one id, as in the readers).

    ``seed`` picks another hash function (to split a partition that came out too big).
    """
    text = ids if (pd.api.types.is_string_dtype(ids.dtype) and ids.dtype != object) else ids.map(str)
    key = f"rankwatch{seed:07d}"[:16]
    hashed = np.asarray(pd.util.hash_pandas_object(text, index=False, hash_key=key), dtype=np.uint64)
    return hashed


class SpillPartitions:
    """``n`` append-only partition files under ``folder``, rows routed by :func:`request_hashes`."""

    def __init__(self, folder: Path, n: int, seed: int = 0, column: str = "request_id") -> None:
        self.folder = folder
        self.column = column  # rows with equal values land together (a column constant per request)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.n = n
        self.seed = seed
        self.rows = np.zeros(n, dtype=np.int64)
        self.bytes_written = 0
        self._files: list[IO[bytes] | None] = [None] * n

    def path(self, p: int) -> Path:
        return self.folder / f"part-{p:05d}.pkl"

    def write(self, batch: RowBatch) -> None:
        """Append the batch's rows to their partitions (input order kept within each)."""
        if len(batch) == 0:
            return
        frame = batch.frame
        if self.column == "request_id" or self.column not in frame.columns:
            keys = frame["request_id"]
        else:  # rows without a value of the column (a request without a user) go by their request
            keys = frame[self.column].where(frame[self.column].notna(), frame["request_id"])
        part = (request_hashes(keys, self.seed) % np.uint64(self.n)).astype(np.int64)
        order = np.argsort(part, kind="stable")
        counts = np.bincount(part, minlength=self.n)
        ends = np.cumsum(counts)
        for p in map(int, np.flatnonzero(counts)):
            rows = order[ends[p] - counts[p] : ends[p]]
            piece = batch.take(rows)
            fh = self._files[p]
            if fh is None:
                fh = self._files[p] = open(self.path(p), "ab")  # noqa: SIM115 (closed in close())
            data = pickle.dumps((piece.frame, piece.file_index, piece.numbers), protocol=5)
            fh.write(data)
            self.bytes_written += len(data)
            self.rows[p] += len(piece)

    def close(self) -> None:
        for i, fh in enumerate(self._files):
            if fh is not None:
                fh.close()
                self._files[i] = None

    def pieces(self, p: int) -> Iterator[RowBatch]:
        """The pieces of partition ``p`` in the order written."""
        path = self.path(p)
        if not path.exists():
            return
        with open(path, "rb") as fh:
            while True:
                try:
                    frame, file_index, numbers = pickle.load(fh)  # our own file of this run
                except EOFError:
                    return
                yield RowBatch(frame, file_index, numbers)

    def read(self, p: int) -> RowBatch | None:
        """All rows of partition ``p`` as one batch (None when empty)."""
        parts: list[Any] = list(self.pieces(p))
        return RowBatch.concat(parts) if parts else None

    def remove(self, p: int) -> None:
        self.path(p).unlink(missing_ok=True)
