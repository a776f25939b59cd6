"""Reading evaluation sets in batches of rows, whatever their size (streaming ``rankwatch offline``).

Inputs are files, directories (every CSV / JSONL / Parquet file below, in name order; ``key=value``
folders of a hive-partitioned dataset become columns) or globs. Each file is read in batches of at most
``batch_rows`` rows, and every row keeps its file and its 1-based row (CSV, Parquet) or line (JSONL)
number, so errors name the same row as the in-memory reader (:mod:`pipeline.offline.readers`):

- Parquet with ``ParquetFile.iter_batches`` without ``pre_buffer`` (the ``pyarrow.dataset`` scanner
  decodes whole row groups ahead and doubled the reader's memory; ``pre_buffer`` kept every coalesced
  read in Arrow's pool);
- CSV (also gzip) in ``pandas.read_csv`` chunks, all values as text; a bad line skipped with
  ``--skip-invalid`` shifts the numbers of the rows after it, as in the in-memory reader;
- JSONL (also gzip) line by line.

A batch holds only the evaluation columns (:data:`EVALUATION_COLUMNS`, so a column added to the readers
comes along), and every batch carries the columns that any Parquet or CSV input has, or that a JSONL line
before it had: like the in-memory reader's concatenation, a file without ``position`` among files with
one has missing positions. (Only JSONL lines *before* the first line naming a column are not known to lack
it; the in-memory reader would call their position missing.)
"""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow.parquet as pq

from rankwatch.pipeline.offline.readers import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    InvalidEvaluationData,
    _csv_error,
    detect_format,
    jsonl_records,
)
from rankwatch.pipeline.offline.renames import ColumnMap

IntArray = npt.NDArray[np.int64]
EVALUATION_COLUMNS: tuple[str, ...] = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)
_CSV_OPTIONS: dict[str, Any] = {"dtype": str, "keep_default_na": False, "na_values": [], "encoding": "utf-8-sig"}
_GLOB_CHARS = set("*?[")
_NO_MAP = ColumnMap()


def _check_mapped(f: InputFile, cols: Sequence[str], columns: ColumnMap) -> None:
    problem = columns.missing(cols)
    if problem:
        found = ", ".join(map(str, cols)) or "none"
        raise InvalidEvaluationData(f"{f.name}: {problem} (columns found: {found})")


@dataclass(frozen=True)
class InputFile:
    """One file to read: its name in messages, format, and hive partition values found in its path."""

    name: str
    path: Path
    fmt: str
    partition: tuple[tuple[str, str], ...] = ()


@dataclass
class RowBatch:
    """Rows read together: ``frame`` (evaluation columns as read), file index and number of every row.

    ``lost`` counts rows dropped while parsing this batch (``bad_json``, ``bad_csv_line``, ...).
    """

    frame: pd.DataFrame
    file_index: IntArray
    numbers: IntArray
    lost: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.frame)

    def take(self, rows: Any) -> RowBatch:
        """Rows ``rows`` (a slice or positions), without the ``lost`` counts."""
        frame = self.frame.iloc[rows].reset_index(drop=True)
        return RowBatch(frame, self.file_index[rows], self.numbers[rows])

    @staticmethod
    def concat(batches: Sequence[RowBatch]) -> RowBatch:
        if len(batches) == 1:
            return batches[0]
        frame = pd.concat([b.frame for b in batches], ignore_index=True)
        lost: dict[str, int] = {}
        for b in batches:
            for reason, n in b.lost.items():
                lost[reason] = lost.get(reason, 0) + n
        return RowBatch(
            frame,
            np.concatenate([b.file_index for b in batches]),
            np.concatenate([b.numbers for b in batches]),
            lost,
        )


def expand_inputs(paths: Sequence[str | os.PathLike[str]]) -> list[InputFile]:
    """The files behind files, directories and globs; ``FileNotFoundError`` / ``InvalidEvaluationData``."""
    if not paths:
        raise InvalidEvaluationData("no input files given")
    out: list[InputFile] = []
    for raw in paths:
        name = str(raw)
        path = Path(raw)
        if path.is_file():
            out.append(InputFile(name, path, detect_format(path)))
        elif path.is_dir():
            found = list(_files_below(path))
            if not found:
                raise InvalidEvaluationData(f"{name}: no .csv, .jsonl or .parquet files in the directory")
            out.extend(found)
        elif _GLOB_CHARS & set(name):
            matches = sorted(m for m in glob.glob(name, recursive=True) if Path(m).is_file())
            if not matches:
                raise FileNotFoundError(f"{name}: no file matches")
            out.extend(InputFile(m, Path(m), detect_format(m)) for m in matches)
        else:
            raise FileNotFoundError(f"{name}: no such file")
    return out


def _files_below(root: Path) -> Iterator[InputFile]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        for fname in sorted(filenames):
            if fname.startswith((".", "_")):
                continue  # _SUCCESS, .crc files of Spark and Hadoop
            try:
                fmt = detect_format(fname)
            except InvalidEvaluationData:
                continue
            full = Path(dirpath) / fname
            parts = full.relative_to(root).parts[:-1]
            partition = tuple(tuple(p.split("=", 1)) for p in parts if "=" in p)
            yield InputFile(str(full), full, fmt, partition)  # type: ignore[arg-type]


def estimated_rows(files: Sequence[InputFile]) -> int:
    """Rows of the inputs: exact for Parquet (footer), a guess from the size for text files."""
    total = 0
    for f in files:
        if f.fmt == "parquet":
            try:
                total += pq.ParquetFile(f.path).metadata.num_rows
            except Exception:  # reported with its name when read
                pass
        else:
            size = f.path.stat().st_size
            total += size * (5 if f.path.name.lower().endswith(".gz") else 1) // 40
    return total


def file_columns(files: Sequence[InputFile], columns: ColumnMap = _NO_MAP) -> list[str]:
    """Evaluation columns found in any Parquet or CSV input, by rankwatch's names (checks the mapped and
    the required columns per file)."""
    seen: dict[str, None] = {}
    for f in files:
        cols = _header(f)
        if cols is None:
            continue
        _check_mapped(f, cols, columns)
        cols = columns.names(cols)
        missing = [c for c in REQUIRED_COLUMNS if c not in cols]
        if missing:
            found = ", ".join(map(str, cols)) or "none"
            raise InvalidEvaluationData(f"{f.name}: missing column {missing[0]!r} (columns found: {found})")
        seen.update((c, None) for c in cols if c in EVALUATION_COLUMNS)
    return [c for c in EVALUATION_COLUMNS if c in seen]


def _header(f: InputFile) -> list[str] | None:
    if f.fmt == "parquet":
        try:
            names = list(pq.ParquetFile(f.path).schema_arrow.names)
        except Exception as e:  # pyarrow raises several types for a corrupt file
            raise InvalidEvaluationData(f"{f.name}: cannot read Parquet: {' '.join(str(e).split())}") from None
        return names + [k for k, _ in f.partition if k not in names]
    if f.fmt == "csv":
        try:
            return [str(c) for c in pd.read_csv(f.path, nrows=0, **_CSV_OPTIONS).columns]
        except pd.errors.EmptyDataError:
            raise InvalidEvaluationData(f"{f.name}: empty file (no header)") from None
        except pd.errors.ParserError as e:
            raise InvalidEvaluationData(f"{f.name}: {_csv_error(str(e))}") from None
    return None  # JSONL: known only after reading


def iter_batches(
    files: Sequence[InputFile], batch_rows: int, *, skip_invalid: bool = False, renames: ColumnMap = _NO_MAP
) -> Iterator[RowBatch]:
    """Batches of at most ``batch_rows`` rows of every file in turn (see the module docstring); ``renames``
    reads the files' own column names (``--columns``, :mod:`pipeline.offline.renames`)."""
    columns = file_columns(files, renames)
    for index, f in enumerate(files):
        if f.fmt == "parquet":
            chunks = _parquet_chunks(f, batch_rows, renames)
        elif f.fmt == "csv":
            chunks = _csv_chunks(f, batch_rows, skip_invalid)
        else:
            chunks = _jsonl_chunks(f, max(1, batch_rows // 4), skip_invalid, renames)  # dicts cost ~1 kB a row
        for frame, numbers, lost in chunks:
            if f.fmt == "csv":
                frame = renames.frame(frame)
            columns += [c for c in frame.columns if c not in columns]  # JSONL: columns seen so far
            for c in EVALUATION_COLUMNS:
                if c not in frame.columns and (c in columns or c in REQUIRED_COLUMNS):
                    frame[c] = pd.Series([None] * len(frame), dtype=object)
            frame = frame[[c for c in EVALUATION_COLUMNS if c in frame.columns]]
            yield RowBatch(frame, np.full(len(frame), index, dtype=np.int64), numbers, lost)


def _parquet_chunks(
    f: InputFile, batch_rows: int, renames: ColumnMap
) -> Iterator[tuple[pd.DataFrame, IntArray, dict[str, int]]]:
    try:
        # pre_buffer (the default) keeps the coalesced reads of every row group read so far in Arrow's
        # pool: +250 MB over a 300 MB file. Without it, the reader holds one row group's pages at a time.
        pf = pq.ParquetFile(f.path, pre_buffer=False)
        cols = [c for c in pf.schema_arrow.names if any(n in EVALUATION_COLUMNS for n in renames.names([c]))]
        start = 1
        for rb in pf.iter_batches(batch_size=batch_rows, columns=cols):
            frame = renames.frame(rb.to_pandas())
            for key, value in ((n, v) for k, v in f.partition for n in renames.names([k])):
                if key in EVALUATION_COLUMNS and key not in frame.columns:
                    frame[key] = value
            yield frame, np.arange(start, start + len(frame), dtype=np.int64), {}
            start += len(frame)
    except InvalidEvaluationData:
        raise
    except (OSError, ValueError) as e:  # pyarrow's errors derive from these
        raise InvalidEvaluationData(f"{f.name}: cannot read Parquet: {' '.join(str(e).split())}") from None


def _csv_chunks(
    f: InputFile, batch_rows: int, skip_invalid: bool
) -> Iterator[tuple[pd.DataFrame, IntArray, dict[str, int]]]:
    next_row = 1
    skipped: list[int] = []  # data rows of bad lines not yet passed
    try:
        reader = pd.read_csv(f.path, chunksize=batch_rows, on_bad_lines="warn" if skip_invalid else "error",
                             **_CSV_OPTIONS)  # fmt: skip
        with reader:
            while True:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        frame = next(reader)
                    except StopIteration:
                        return
                # "Skipping line 7: expected 5 fields, saw 6": line 1 is the header, so that is data row 6.
                bad = [
                    int(part.split()[2].rstrip(":")) - 1
                    for w in caught
                    for part in str(w.message).splitlines()
                    if part.startswith("Skipping line ")
                ]
                skipped.extend(bad)
                candidates = np.arange(next_row, next_row + len(frame) + len(skipped), dtype=np.int64)
                numbers = candidates[~np.isin(candidates, skipped)][: len(frame)]
                if numbers.size:
                    next_row = int(numbers[-1]) + 1
                skipped = [r for r in skipped if r >= next_row]
                yield frame, numbers, ({"bad_csv_line": len(bad)} if bad else {})
    except pd.errors.EmptyDataError:
        raise InvalidEvaluationData(f"{f.name}: empty file (no header)") from None
    except pd.errors.ParserError as e:
        raise InvalidEvaluationData(f"{f.name}: {_csv_error(str(e))}") from None


def _jsonl_chunks(
    f: InputFile, batch_rows: int, skip_invalid: bool, renames: ColumnMap
) -> Iterator[tuple[pd.DataFrame, IntArray, dict[str, int]]]:
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    lost: dict[str, int] = {}
    seen: dict[str, None] = {}  # columns in order of appearance, as the in-memory frame has them
    for number, obj in jsonl_records(f.path, f.name, skip_invalid=skip_invalid):
        if isinstance(obj, str):  # a skipped line's reason
            lost[obj] = lost.get(obj, 0) + 1
            continue
        records.append(obj)
        lines.append(number)
        if len(records) >= batch_rows:
            yield _records_frame(records, seen, renames), np.asarray(lines, dtype=np.int64), lost
            records, lines, lost = [], [], {}
    if records or lost:
        yield _records_frame(records, seen, renames), np.asarray(lines, dtype=np.int64), lost
    _check_mapped(f, list(seen), renames)  # the in-memory reader checks the whole file's columns; so do we
    named = renames.names(seen)
    missing = [c for c in REQUIRED_COLUMNS if c not in named]
    if missing:  # at its end
        found = ", ".join(seen) or "none"
        raise InvalidEvaluationData(f"{f.name}: missing column {missing[0]!r} (columns found: {found})")


def _records_frame(records: list[dict[str, Any]], seen: dict[str, None], renames: ColumnMap) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=list(REQUIRED_COLUMNS))
    if records:
        seen.update((str(c), None) for c in frame.columns)
        frame = renames.frame(frame)
    return frame[[c for c in frame.columns if c in EVALUATION_COLUMNS]]
