"""Streaming offline baselines in bounded memory: inputs of any size, results equal to the in-memory path.

:func:`stream_baseline` reads the inputs in batches (:mod:`pipeline.offline.batches`), validates and scores only
*complete* requests, and merges their :class:`~pipeline.offline.partial.PartialBaseline` (label caps are applied
once at the end, so they equal :func:`pipeline.offline.baseline.compute_baseline`'s). Two layouts:

- **grouped** (rows of a request are contiguous, the usual export): each batch is scored except its last
  request, which is carried into the next batch. A request that comes back later would be scored twice,
  so the 64-bit hashes of finished request ids are kept (8 bytes a request, sorted arrays) and every new
  batch is checked against them.
- **scattered**: rows are hashed by request id into ``P`` spill files (:mod:`pipeline.offline.spill`), then each
  partition, which holds complete requests in input order, is scored on its own. ``P`` is chosen so that
  a partition fits the budget; a partition that still comes out too big is split again with another hash.

``layout="auto"`` (the default) starts grouped and restarts scattered at the first request that comes
back. The memory budget sets the batch size: about :data:`BYTES_PER_ROW` bytes per row in flight on top
of :data:`BASE_BYTES` for the interpreter and libraries. Outside the budget: the aggregates themselves
(one per slice), the per-label value counts, the finished-request hashes, and a single request bigger
than a batch (it is carried whole).

Errors name the file and row as the in-memory path does; with several bad rows, the first one *found*
is reported (batch by batch, partition by partition), which need not be the first in the file.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import pandas as pd

from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import BaselineResult
from rankwatch.pipeline.offline.batches import (
    InputFile,
    RowBatch,
    estimated_rows,
    expand_inputs,
    iter_batches,
)
from rankwatch.pipeline.offline.grouping import differs_from_previous
from rankwatch.pipeline.offline.partial import PartialBaseline, partial_baseline
from rankwatch.pipeline.offline.readers import USER_COLUMN, InvalidEvaluationData, validate_rows
from rankwatch.pipeline.offline.renames import ColumnMap
from rankwatch.pipeline.offline.spill import SpillPartitions, request_hashes
from rankwatch.pipeline.slicing import SliceSpec

__all__ = ["BASE_BYTES", "BYTES_PER_ROW", "DEFAULT_MEMORY_LIMIT", "MIN_MEMORY_LIMIT", "Layout", "RequestsNotGrouped", "StreamStats",
           "batch_rows_for", "score_grouped", "stream_baseline"]  # fmt: skip

Layout = Literal["auto", "grouped", "scattered"]
DEFAULT_MEMORY_LIMIT = 1 << 30
# Calibrated on 10 M Parquet rows (bench/offline_scale.py, docs/benchmarks.md): the peak resident memory of
# ``rankwatch offline`` was about 310 MiB (interpreter, libraries, Arrow's pool, aggregates) plus 440 bytes
# per row of a batch (the frame, validation, rank order, kernel and AUC arrays alive at once). The budget
# keeps 15 % in reserve for the allocator's fragmentation and for requests shorter than the 20 rows measured.
BASE_BYTES = 300 << 20
BYTES_PER_ROW = 500
BUDGET_SHARE = 0.85
MIN_MEMORY_LIMIT = 384 << 20
MIN_BATCH_ROWS = 10_000
REQUESTS_PER_ROW_SHARE = 8  # at most len(batch) / 8 requests scored at once
ProgressFn = Callable[[str, int, int], None]  # (phase, rows read, requests done)


@dataclass
class StreamStats:
    """What a streaming run did (for the command's notes and the benchmarks)."""

    layout: str = "grouped"
    batch_rows: int = 0
    batches: int = 0
    partitions: int = 0
    spilled_bytes: int = 0
    finished_hashes: int = 0


class RequestsNotGrouped(InvalidEvaluationData):
    """A request's rows are not contiguous (raised by ``layout="grouped"``)."""


class UsersNeedPartitions(Exception):
    """GAUC by user needs every row of a user in one partition: the input has a ``user_id`` column, and a
    user's requests need not be contiguous, so the grouped layout cannot close a user's GAUC group."""


def batch_rows_for(memory_limit: int) -> int:
    """Rows per batch that keep the peak resident memory under ``memory_limit`` bytes.

    ``rows = (BUDGET_SHARE * memory_limit - BASE_BYTES) / BYTES_PER_ROW``, at least ``MIN_BATCH_ROWS``;
    a budget below :data:`MIN_MEMORY_LIMIT` cannot be honoured (``ValueError``).
    """
    if memory_limit < MIN_MEMORY_LIMIT:
        raise ValueError(f"a memory limit below {MIN_MEMORY_LIMIT >> 20}M cannot be honoured")
    return max(MIN_BATCH_ROWS, int(BUDGET_SHARE * memory_limit - BASE_BYTES) // BYTES_PER_ROW)


def stream_baseline(
    paths: Sequence[str | os.PathLike[str]],
    *,
    options: MetricOptions | None = None,
    slice_spec: SliceSpec | None = None,
    skip_invalid: bool = False,
    memory_limit: int = DEFAULT_MEMORY_LIMIT,
    layout: Layout = "auto",
    spill_dir: str | os.PathLike[str] | None = None,
    batch_rows: int | None = None,
    progress: ProgressFn | None = None,
    stats: StreamStats | None = None,
    partition_by: str = "request_id",
    columns: ColumnMap | None = None,
) -> BaselineResult:
    """The baseline of the inputs (files, directories, globs) in bounded memory; see the module docstring.

    ``batch_rows`` overrides the size the budget gives (tests use tiny batches). ``partition_by`` names
    the column the scattered layout hashes: another column that is constant within a request (a user id,
    for metrics that need all requests of a user together) makes every partition hold complete groups of
    that column; it implies the scattered layout. ``columns`` reads the files' own column names
    (``--columns``, :mod:`pipeline.offline.renames`). Raises
    ``FileNotFoundError`` and :class:`~pipeline.offline.readers.InvalidEvaluationData` like
    :func:`pipeline.offline.readers.read_evaluation_files`.
    """
    options = options or MetricOptions()
    slice_spec = slice_spec or SliceSpec()
    stats = stats if stats is not None else StreamStats()
    files = expand_inputs(paths)
    rows_per_batch = batch_rows or batch_rows_for(memory_limit)
    stats.batch_rows = rows_per_batch
    run = _Run(files, options, slice_spec.by, skip_invalid, rows_per_batch, progress, stats)
    run.partition_by = partition_by
    run.renames = columns or ColumnMap()
    if layout == "scattered" or partition_by != "request_id":
        partial = run.scattered(spill_dir)
    else:
        try:
            found: PartialBaseline | None = run.grouped()
        except RequestsNotGrouped:
            if layout == "grouped":
                raise
            found = None  # restart outside the handler: its traceback holds the first reader's buffers
        except UsersNeedPartitions:
            run.partition_by = USER_COLUMN  # exact GAUC by user: all of a user's rows in one partition
            found = None
        partial = found if found is not None else run.scattered(spill_dir)
    if partial.rows == 0:
        skipped = partial.skipped_rows
        raise InvalidEvaluationData(
            "no valid rows in the input" + (f" ({skipped} rows skipped as invalid)" if skipped else "")
        )
    return partial.finish(inputs=tuple(map(str, paths)), max_values_per_label=slice_spec.max_values_per_label)


class _HashSet:
    """Set of 64-bit hashes as a few sorted arrays (merged when there are too many): 8 bytes an entry."""

    def __init__(self) -> None:
        self._arrays: list[npt.NDArray[np.uint64]] = []
        self.size = 0

    def contains_any(self, h: npt.NDArray[np.uint64]) -> bool:
        for arr in self._arrays:
            idx = np.minimum(np.searchsorted(arr, h), arr.size - 1)
            if np.any(arr[idx] == h):
                return True
        return False

    def add(self, h: npt.NDArray[np.uint64]) -> None:
        if h.size:
            self._arrays.append(np.sort(h))
            self.size += int(h.size)
        if len(self._arrays) > 12:
            self._arrays = [np.sort(np.concatenate(self._arrays))]


def score_grouped(
    batches: Iterable[RowBatch],
    *,
    names: Sequence[str],
    options: MetricOptions,
    slice_by: tuple[str, ...],
    skip_invalid: bool = False,
    stats: StreamStats | None = None,
    on_batch: Callable[[PartialBaseline], None] | None = None,
) -> PartialBaseline:
    """Partial baseline of batches whose requests are contiguous (the last one of a batch may go on).

    Each batch is validated and scored but for its last request, which is carried into the next batch.
    Raises :class:`RequestsNotGrouped` at the first request that comes back after it was finished (found
    with 64-bit hashes of the finished requests' ids; a hash collision, about ``n^2 / 2^65`` for ``n``
    requests, only costs a needless restart in the scattered layout).
    """
    partial = PartialBaseline.empty(options, slice_by)
    finished = _HashSet()
    carry: RowBatch | None = None
    for batch in batches:  # no look-ahead: a batch read ahead would be one more batch in memory
        partial.count_skipped(batch.lost)
        if carry is not None:
            batch = RowBatch.concat([carry, batch])
        carry = None
        if len(batch) == 0:
            continue
        starts = _run_starts(batch)
        tail = int(starts[-1])  # the last request may continue in the next batch
        carry = batch.take(slice(tail, None))
        if tail:
            done = batch.take(slice(0, tail))
            del batch
            _score_finished(partial, done, starts[:-1], finished, names, options, slice_by, skip_invalid)
        if stats is not None:
            stats.finished_hashes = finished.size
        if on_batch is not None:
            on_batch(partial)
    if carry is not None:
        _score_finished(partial, carry, _run_starts(carry), finished, names, options, slice_by, skip_invalid)
    return partial


def _run_starts(batch: RowBatch) -> npt.NDArray[np.int64]:
    """First row of every run of equal request ids; rows without an id (rejected later) break no run."""
    ids = batch.frame["request_id"]
    missing = ids.isna().to_numpy(dtype=bool, copy=True)
    if pd.api.types.is_string_dtype(ids.dtype):
        missing |= (ids == "").to_numpy(dtype=bool, na_value=True)
    if missing.all():
        return np.zeros(1, dtype=np.int64)
    present = np.flatnonzero(~missing)
    if present.size < len(ids):
        ids = ids.iloc[present]
    run_start = np.empty(len(ids), dtype=bool)
    run_start[0] = True
    run_start[1:] = differs_from_previous(ids)
    starts = present[run_start]
    starts[0] = 0  # rows before the first id go with the first request
    return starts


def _score_finished(
    partial: PartialBaseline, done: RowBatch, starts: npt.NDArray[np.int64], finished: _HashSet,
    names: Sequence[str], options: MetricOptions, slice_by: tuple[str, ...], skip_invalid: bool,
) -> None:  # fmt: skip
    """Check that no request of ``done`` came back, then validate and score it."""
    first_ids = done.frame["request_id"].iloc[starts]
    known = first_ids.notna().to_numpy(dtype=bool, copy=True)  # the first row may lack an id (rejected later)
    if pd.api.types.is_string_dtype(first_ids.dtype):
        known &= (first_ids != "").to_numpy(dtype=bool, na_value=False)
    h = request_hashes(first_ids[known])
    if np.unique(h).size < h.size or finished.contains_any(h):
        raise RequestsNotGrouped(
            f"{_came_back(done, names, starts[known], h, finished)}: the rows of a request are not "
            "contiguous; use --layout scattered (or auto)"
        )
    finished.add(h)
    # The budget assumes requests of several rows; per-request arrays cost more when requests are tiny
    # (a shuffled file read as grouped, before a request comes back): score at most one request per
    # REQUESTS_PER_ROW_SHARE rows of the batch at a time, cut at request boundaries.
    most = max(MIN_BATCH_ROWS // 8, len(done) // REQUESTS_PER_ROW_SHARE)
    cuts = [*map(int, starts[::most]), len(done)] if starts.size > most else [0, len(done)]
    cuts[0] = 0
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        part = done if (lo, hi) == (0, len(done)) else done.take(slice(lo, hi))
        evalset = validate_rows(part.frame, names, part.file_index, part.numbers, skip_invalid=skip_invalid)
        partial.merge(partial_baseline(evalset, options, slice_by))


def _came_back(
    done: RowBatch, names: Sequence[str], rows: npt.NDArray[np.int64], h: npt.NDArray[np.uint64], finished: _HashSet
) -> str:
    """File and row of the first request that comes back (for the error message)."""
    _, first_index = np.unique(h, return_index=True)
    repeated = np.ones(h.size, dtype=bool)
    repeated[first_index] = False
    for i in range(h.size):
        if repeated[i] or finished.contains_any(h[i : i + 1]):
            r = int(rows[i])
            return f"{names[int(done.file_index[r])]}: row {int(done.numbers[r])}"
    return names[0]


class _Run:
    def __init__(
        self, files: list[InputFile], options: MetricOptions, slice_by: tuple[str, ...], skip_invalid: bool,
        batch_rows: int, progress: ProgressFn | None, stats: StreamStats,
    ) -> None:  # fmt: skip
        self.files, self.options, self.slice_by = files, options, slice_by
        self.skip_invalid, self.batch_rows, self.stats = skip_invalid, batch_rows, stats
        self.progress = progress
        self.partition_by = "request_id"
        self.renames = ColumnMap()
        self.names = [f.name for f in files]
        self.rows_read = 0

    def _score(self, partial: PartialBaseline, batch: RowBatch) -> None:
        if len(batch) == 0:
            return
        evalset = validate_rows(batch.frame, self.names, batch.file_index, batch.numbers,
                                skip_invalid=self.skip_invalid)  # fmt: skip
        partial.merge(partial_baseline(evalset, self.options, self.slice_by))

    def _report(self, phase: str, partial: PartialBaseline) -> None:
        if self.progress is not None:
            self.progress(phase, self.rows_read, partial.requests)

    def grouped(self) -> PartialBaseline:
        """Contiguous requests: score batch by batch, carrying the last request over."""
        self.stats.layout = "grouped"
        self.rows_read = 0

        user_gauc = self.options.gauc_group == "user"

        def counted() -> Iterator[RowBatch]:
            for batch in iter_batches(self.files, self.batch_rows, skip_invalid=self.skip_invalid,
                                      renames=self.renames):
                if user_gauc and USER_COLUMN in batch.frame.columns:
                    raise UsersNeedPartitions()
                self.rows_read += len(batch)
                self.stats.batches += 1
                yield batch

        return score_grouped(counted(), names=self.names, options=self.options, slice_by=self.slice_by,
                             skip_invalid=self.skip_invalid, stats=self.stats,
                             on_batch=lambda partial: self._report("grouped", partial))  # fmt: skip

    def scattered(self, spill_dir: str | os.PathLike[str] | None) -> PartialBaseline:
        """Any row order: hash rows into spill files, then score one partition at a time."""
        self.stats.layout = "scattered"
        self.stats.batches = 0  # a restart after the grouped attempt counts again
        partial = PartialBaseline.empty(self.options, self.slice_by)
        target = max(MIN_BATCH_ROWS, self.batch_rows // 2)  # a partition is read as pieces plus their concat
        n_parts = int(min(4096, max(1, math.ceil(1.3 * estimated_rows(self.files) / target))))
        self.stats.partitions = n_parts
        self.rows_read = 0
        with tempfile.TemporaryDirectory(prefix="rankwatch-spill-", dir=spill_dir) as tmp:
            spill = SpillPartitions(Path(tmp), n_parts, column=self.partition_by)
            try:
                # Half batches while spilling: its hashes, sort and pieces cost more per row than scoring.
                for batch in iter_batches(self.files, max(MIN_BATCH_ROWS, self.batch_rows // 2),
                                          skip_invalid=self.skip_invalid, renames=self.renames):  # fmt: skip
                    self.rows_read += len(batch)
                    self.stats.batches += 1
                    partial.count_skipped(batch.lost)
                    spill.write(batch)
                    self._report("spilling", partial)
            finally:
                spill.close()
            self.stats.spilled_bytes = spill.bytes_written
            self._score_partitions(partial, spill, target, depth=0)
        return partial

    def _score_partitions(self, partial: PartialBaseline, spill: SpillPartitions, target: int, depth: int) -> None:
        for p in range(spill.n):
            if spill.rows[p] > target and depth < 3:  # unlucky hash or a skewed input: split it again
                sub = SpillPartitions(spill.folder / f"split-{p}", int(math.ceil(1.3 * spill.rows[p] / target)),
                                      seed=depth + 1, column=spill.column)  # fmt: skip
                try:
                    for piece in spill.pieces(p):
                        sub.write(piece)
                finally:
                    sub.close()
                spill.remove(p)
                self.stats.spilled_bytes += sub.bytes_written
                self._score_partitions(partial, sub, target, depth + 1)
                continue
            batch = spill.read(p)
            spill.remove(p)
            if batch is not None:
                self._score(partial, batch)
            self._report("scoring", partial)
