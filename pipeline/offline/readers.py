"""Reading and validating offline evaluation sets (SPEC section 4, ``rankwatch offline``).

An evaluation set has one row per shown item with the columns ``request_id, item_id, score, label`` and
optionally ``position, segment, surface, variant, model, user_id``; it comes from CSV, JSONL (one JSON object per
line) or Parquet files, optionally several. :func:`read_evaluation_files` reads them into one DataFrame
and :func:`validate_evaluation_frame` checks every row, vectorised. A bad row fails the whole run with
its file and 1-based data row number (the line number for JSONL), unless ``skip_invalid`` is set, in
which case it is dropped and counted per reason: a baseline is never silently partial.

Rejected rows, in the order the checks run (a row gets the first reason that applies):

- ``bad_json`` / ``not_object`` (JSONL), ``bad_csv_line`` (a CSV line with the wrong number of fields);
- ``missing_request_id``, ``missing_item_id``;
- ``bad_score`` (missing, not a number, or not finite), ``bad_label`` (missing, not a number, not
  finite or negative), ``bad_position`` (missing where the column exists, not an integer, or < 1);
- ``duplicate_position``: a second row of one request at an already used position (the first is kept);
- ``inconsistent_label``: a ``segment``/``surface``/``variant``/``model`` value different from the one on
  the request's first row (a request belongs to exactly one slice).
"""

from __future__ import annotations

import gzip
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pandas as pd

from rankwatch.pipeline.offline.columns import (
    as_numbers,
    id_codes,
    label_codes,
    missing_text,
    number_problem,
    user_codes,
)
from rankwatch.pipeline.offline.grouping import (
    duplicate_positions,
    first_rows,
    renumber,
    uniform_within_runs,
)
from rankwatch.pipeline.offline.renames import ColumnMap
from rankwatch.pipeline.slicing import SLICE_LABELS

IntArray = npt.NDArray[np.int64]
REQUIRED_COLUMNS: tuple[str, ...] = ("request_id", "item_id", "score", "label")
USER_COLUMN = "user_id"  # issue 13: optional, the GAUC group; a request has one user, like one slice
OPTIONAL_COLUMNS: tuple[str, ...] = ("position", *SLICE_LABELS, USER_COLUMN)
FORMATS: dict[str, str] = {
    ".csv": "csv", ".csv.gz": "csv", ".jsonl": "jsonl", ".jsonl.gz": "jsonl", ".ndjson": "jsonl",
    ".ndjson.gz": "jsonl", ".parquet": "parquet", ".pq": "parquet",
}  # fmt: skip


class InvalidEvaluationData(ValueError):
    """An evaluation set cannot be used; the message names the file, the row and the reason."""


@dataclass(frozen=True)
class RequestLabels:
    """One slice label of every request: ``values[codes[j]]`` is the value of request ``j``."""

    codes: IntArray
    values: tuple[str, ...]


@dataclass
class EvaluationSet:
    """A validated evaluation set, ready for :func:`pipeline.offline.baseline.compute_baseline`.

    ``frame`` holds the valid rows as read; ``scores``, ``relevance`` (the labels) and ``positions``
    (None without a position column) are their parsed values; ``request_codes[i]`` numbers the request of
    row ``i`` in order of first appearance; ``labels`` has the slice label of every request, ``"unknown"``
    where absent.
    """

    frame: pd.DataFrame
    scores: npt.NDArray[np.float64]
    relevance: npt.NDArray[np.float64]
    positions: IntArray | None
    request_codes: IntArray
    n_requests: int
    labels: dict[str, RequestLabels]
    inputs: tuple[str, ...] = ()
    skipped_rows: int = 0
    skipped_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        """Rows that go into the baseline (skipped rows excluded)."""
        return int(self.scores.size)

    @property
    def has_position(self) -> bool:
        return self.positions is not None


@dataclass
class _RowSources:
    """Where each row of a concatenated frame came from, to name it in an error."""

    names: list[str]
    bounds: IntArray  # row i of the frame belongs to file f when bounds[f] <= i < bounds[f + 1]
    numbers: IntArray  # 1-based data row (CSV, Parquet) or line number (JSONL) of row i in its file

    def describe(self, row: int) -> str:
        f = int(np.searchsorted(self.bounds, row, side="right")) - 1
        return f"{self.names[f]}: row {int(self.numbers[row])}"


@dataclass
class _Rejections:
    """Rows found invalid so far, with the first reason for each."""

    sources: _RowSources
    skip_invalid: bool
    counts: dict[str, int] = field(default_factory=dict)
    pre_read: int = 0  # rows lost while parsing (bad JSON, bad CSV lines): never reach the frame

    def reject(self, bad: npt.NDArray[np.bool_], reason: str, explain: Any) -> None:
        """Record rows ``bad`` (global positions); raise for the first one unless skipping."""
        n_bad = int(np.count_nonzero(bad))
        if n_bad == 0:
            return
        if not self.skip_invalid:
            first = int(np.argmax(bad))
            raise InvalidEvaluationData(f"{self.sources.describe(first)}: {explain(first)}")
        self.counts[reason] = self.counts.get(reason, 0) + n_bad


def detect_format(path: str | os.PathLike[str]) -> str:
    """``csv``, ``jsonl`` or ``parquet`` from the file name; ``InvalidEvaluationData`` otherwise."""
    name = str(path).lower()
    for suffix in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(suffix):
            return FORMATS[suffix]
    raise InvalidEvaluationData(
        f"{path}: cannot tell the format from the file name; use .csv, .jsonl (.ndjson) or .parquet"
    )


def read_evaluation_files(
    paths: Sequence[str | os.PathLike[str]], *, skip_invalid: bool = False, key_by_model: bool = False,
    columns: ColumnMap | None = None,
) -> EvaluationSet:
    """Read and validate CSV / JSONL / Parquet evaluation files into one :class:`EvaluationSet`.

    ``key_by_model``: a request is a (model, request_id) pair (request ids become ``model + "\\x1f" +
    request_id``, :func:`model_key`; issue 21, paired offline differences), so several models may score one request.
    ``columns``: the files' own column names (:mod:`pipeline.offline.renames`, ``--columns``).

    Raises ``FileNotFoundError`` for a missing file and :class:`InvalidEvaluationData` for a file that
    cannot be used (missing column, unknown format) or, unless ``skip_invalid``, for the first bad row.
    """
    if not paths:
        raise InvalidEvaluationData("no input files given")
    frames: list[pd.DataFrame] = []
    numbers: list[IntArray] = []
    names: list[str] = []
    lost: dict[str, int] = {}
    for path in paths:
        name = str(path)
        if not Path(path).is_file():
            raise FileNotFoundError(f"{name}: no such file")
        fmt = detect_format(path)
        if fmt == "csv":
            frame, rows, bad = _read_csv(Path(path), name, skip_invalid)
        elif fmt == "jsonl":
            frame, rows, bad = _read_jsonl(Path(path), name, skip_invalid)
        else:
            frame, rows, bad = _read_parquet(Path(path), name), None, {}
        for reason, n in bad.items():
            lost[reason] = lost.get(reason, 0) + n
        if columns:
            problem = columns.missing(map(str, frame.columns))
            if problem:
                found = ", ".join(map(str, frame.columns)) or "none"
                raise InvalidEvaluationData(f"{name}: {problem} (columns found: {found})")
            frame = columns.frame(frame)
        missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
        if missing:
            found = ", ".join(map(str, frame.columns)) or "none"
            raise InvalidEvaluationData(f"{name}: missing column {missing[0]!r} (columns found: {found})")
        frames.append(frame[[c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in frame.columns]])
        numbers.append(np.arange(1, len(frame) + 1, dtype=np.int64) if rows is None else rows)
        names.append(name)
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    bounds = np.cumsum([0, *(len(f) for f in frames)]).astype(np.int64)
    sources = _RowSources(names, bounds, np.concatenate(numbers) if numbers else np.empty(0, np.int64))
    if key_by_model and "model" in frame.columns:
        frame = frame.assign(request_id=model_key(frame["request_id"], frame["model"]))
    result = _validate(frame.reset_index(drop=True), sources, skip_invalid)
    result.inputs = tuple(names)
    for reason, n in lost.items():
        result.skipped_by_reason[reason] = result.skipped_by_reason.get(reason, 0) + n
        result.skipped_rows += n
    return result


def validate_evaluation_frame(
    frame: pd.DataFrame, *, skip_invalid: bool = False, source: str = "<frame>"
) -> EvaluationSet:
    """Validate an in-memory evaluation DataFrame (rows are numbered 1.. in frame order)."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise InvalidEvaluationData(f"{source}: missing column {missing[0]!r}")
    cols = [c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in frame.columns]
    n = len(frame)
    sources = _RowSources([source], np.array([0, n], dtype=np.int64), np.arange(1, n + 1, dtype=np.int64))
    result = _validate(frame[cols].reset_index(drop=True), sources, skip_invalid)
    result.inputs = (source,)
    return result


KEY_SEPARATOR = "\x1f"


def model_key(request_id: pd.Series, model: pd.Series) -> pd.Series:
    """``model + "\\x1f" + request_id`` (a missing request id stays missing, so it is still rejected)."""
    missing = request_id.isna() | (request_id.astype(str).str.strip() == "")
    keyed = model.fillna("").astype(str) + KEY_SEPARATOR + request_id.astype(str)
    return keyed.where(~missing, request_id)


def split_model_key(keys: pd.Series) -> pd.Series:
    """The request ids of :func:`model_key` keys (keys without a separator are returned as they are)."""
    text = keys.astype(str)
    parts = text.str.partition(KEY_SEPARATOR)
    return parts[2].where(parts[1] == KEY_SEPARATOR, text)


# -- readers --------------------------------------------------------------------------------------------
def _read_csv(path: Path, name: str, skip_invalid: bool) -> tuple[pd.DataFrame, IntArray | None, dict[str, int]]:
    # Everything as text first: numbers are converted (and their failures located) in _validate.
    options: dict[str, Any] = {"dtype": str, "keep_default_na": False, "na_values": [], "encoding": "utf-8-sig"}
    try:
        if not skip_invalid:
            return pd.read_csv(path, **options), None, {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            frame = pd.read_csv(path, on_bad_lines="warn", **options)
    except pd.errors.EmptyDataError:
        raise InvalidEvaluationData(f"{name}: empty file (no header)") from None
    except pd.errors.ParserError as e:
        raise InvalidEvaluationData(f"{name}: {_csv_error(str(e))}") from None
    # "Skipping line 7: expected 5 fields, saw 6": line 1 is the header, so that is data row 6.
    skipped = sorted(
        int(part.split()[2].rstrip(":")) - 1
        for w in caught
        for part in str(w.message).splitlines()
        if part.startswith("Skipping line ")
    )
    rows = np.arange(1, len(frame) + 1, dtype=np.int64)
    for r in skipped:  # later rows move down by one per skipped line before them
        rows[rows >= r] += 1
    return frame, rows, ({"bad_csv_line": len(skipped)} if skipped else {})


def _csv_error(message: str) -> str:
    # "Error tokenizing data. C error: Expected 3 fields in line 3, saw 4" -> data row 2.
    words = message.replace(",", " ").split()
    if "line" in words:
        line = int(words[words.index("line") + 1])
        return f"row {line - 1}: {message.split('C error: ')[-1].strip()}"
    return message.strip()


def jsonl_records(path: Path, name: str, *, skip_invalid: bool) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """``(line number, object)`` of every JSON object line of a JSONL file (also ``.gz``); blank lines are
    not rows. A bad line raises :class:`InvalidEvaluationData` naming it, or with ``skip_invalid`` yields
    ``(line number, reason)`` (``bad_json``, ``not_object``) for the caller to count. One reader for the
    whole-file and the batched paths, so both name and count bad lines alike."""
    decoder = msgspec.json.Decoder()
    opener: Any = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = decoder.decode(line)
            except msgspec.DecodeError as e:
                if not skip_invalid:
                    raise InvalidEvaluationData(f"{name}: row {number}: bad JSON: {e}") from None
                yield number, "bad_json"
                continue
            if not isinstance(obj, dict):
                if not skip_invalid:
                    raise InvalidEvaluationData(f"{name}: row {number}: not a JSON object") from None
                yield number, "not_object"
                continue
            yield number, obj


def _read_jsonl(path: Path, name: str, skip_invalid: bool) -> tuple[pd.DataFrame, IntArray, dict[str, int]]:
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    lost: dict[str, int] = {}
    for number, obj in jsonl_records(path, name, skip_invalid=skip_invalid):
        if isinstance(obj, str):
            lost[obj] = lost.get(obj, 0) + 1
            continue
        records.append(obj)
        lines.append(number)
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=list(REQUIRED_COLUMNS))
    return frame, np.asarray(lines, dtype=np.int64), lost


def _read_parquet(path: Path, name: str) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise InvalidEvaluationData(f"{name}: cannot read Parquet: {' '.join(str(e).split())}") from None


# -- validation -----------------------------------------------------------------------------------------
def validate_rows(
    frame: pd.DataFrame, names: Sequence[str], file_index: IntArray, numbers: IntArray, *, skip_invalid: bool
) -> EvaluationSet:
    """Validate a batch of complete requests from several files (streaming, :mod:`pipeline.offline.batches`).

    Row ``i`` comes from file ``names[file_index[i]]`` (non-decreasing), row or line ``numbers[i]`` there.
    A batch without valid rows is not an error here (the whole input may still have some): it returns
    an empty set with its skipped rows counted.
    """
    bounds = np.searchsorted(file_index, np.arange(len(names) + 1), side="left").astype(np.int64)
    sources = _RowSources(list(names), bounds, np.asarray(numbers, dtype=np.int64))
    cols = [c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in frame.columns]
    return _validate(frame[cols].reset_index(drop=True), sources, skip_invalid, allow_empty=True)


def _validate(
    frame: pd.DataFrame, sources: _RowSources, skip_invalid: bool, *, allow_empty: bool = False
) -> EvaluationSet:
    rej = _Rejections(sources, skip_invalid)
    n = len(frame)
    valid = np.ones(n, dtype=bool)

    req_codes, req_ok = id_codes(frame["request_id"])
    _check(rej, valid, ~req_ok, "missing_request_id", lambda i: "request_id is missing")
    _check(rej, valid, missing_text(frame["item_id"]), "missing_item_id", lambda i: "item_id is missing")

    score = as_numbers(frame["score"])
    _check(rej, valid, ~np.isfinite(score), "bad_score", lambda i: number_problem("score", frame["score"], i))
    label = as_numbers(frame["label"])
    with np.errstate(invalid="ignore"):
        bad_label = ~((label >= 0) & (label < np.inf))  # NaN fails both comparisons
    _check(rej, valid, bad_label, "bad_label", lambda i: number_problem("label", frame["label"], i, ">= 0"))
    position: npt.NDArray[np.float64] | None = None
    if "position" in frame.columns:
        position = as_numbers(frame["position"])
        pos_ok = np.isfinite(position) & (np.nan_to_num(position, nan=0.0) >= 1)
        pos_ok &= np.nan_to_num(position, nan=0.0) == np.floor(np.nan_to_num(position, nan=0.0))
        _check(
            rej, valid, ~pos_ok, "bad_position",
            lambda i: number_problem("position", frame["position"], i, "an integer >= 1"),
        )  # fmt: skip

    # Requests are renumbered over the rows still valid so that codes follow first appearance. ``keep``
    # selects those rows (a slice, i.e. no copy, in the usual case where all are valid).
    all_valid = bool(valid.all())
    keep: Any = slice(None) if all_valid else np.flatnonzero(valid)
    codes = req_codes if all_valid else renumber(req_codes[keep])
    if position is not None:
        dup = duplicate_positions(codes, position[keep].astype(np.int64))
        _check_subset(
            rej, valid, keep, dup, "duplicate_position",
            lambda i: f"position {int(position[i])} appears twice in request {frame['request_id'].iloc[i]!r}",
        )  # fmt: skip
    labels: dict[str, RequestLabels] = {}
    first = first_rows(codes)
    same_request = codes[1:] == codes[:-1]
    grouped = first.size == codes.size - int(np.count_nonzero(same_request))  # one run per request
    for label_name in (*SLICE_LABELS, USER_COLUMN):
        if label_name not in frame.columns:
            continue
        column = frame[label_name].iloc[keep]
        if grouped and uniform_within_runs(column, same_request):
            # Rows arrive grouped by request and every request is uniform: read the first rows only.
            first_codes, values = (user_codes if label_name == USER_COLUMN else label_codes)(column.iloc[first])
            labels[label_name] = RequestLabels(first_codes, values)
            continue
        value_codes, values = (user_codes if label_name == USER_COLUMN else label_codes)(frame[label_name])
        per_row = value_codes[keep]
        differs = per_row != per_row[first][codes]
        _check_subset(
            rej, valid, keep, differs, "inconsistent_label",
            lambda i, lbl=label_name: (
                f"{lbl} {frame[lbl].iloc[i]!r} differs from an earlier row of request "
                f"{frame['request_id'].iloc[i]!r}; a request belongs to one slice"
            ),
        )  # fmt: skip
        labels[label_name] = RequestLabels(per_row[first], values)

    n_valid = int(np.count_nonzero(valid))
    if n_valid != codes.size:  # cross-row checks dropped rows; requests keep their first row, so
        codes = codes[valid[keep]]  # codes stay dense and first-appearance ordered
    final: Any = slice(None) if n_valid == n else np.flatnonzero(valid)
    skipped = int(sum(rej.counts.values()))
    if n_valid == 0 and allow_empty:
        return _empty_set(frame, position is not None, skipped, rej.counts)
    if n_valid == 0:
        raise InvalidEvaluationData(
            "no valid rows in the input" + (f" ({skipped} rows skipped as invalid)" if skipped else "")
        )
    # A shallow copy when every row is valid: the caller's frame is never modified (copy on write).
    out = frame.copy(deep=False) if n_valid == n else frame.iloc[final].reset_index(drop=True)
    n_requests = int(codes.max()) + 1
    return EvaluationSet(
        frame=out,
        scores=score[final],
        relevance=label[final],
        positions=None if position is None else position[final].astype(np.int64),
        request_codes=codes,
        n_requests=n_requests,
        labels={name: RequestLabels(lab.codes[:n_requests], lab.values) for name, lab in labels.items()},
        skipped_rows=skipped,
        skipped_by_reason=dict(rej.counts),
    )


def _empty_set(frame: pd.DataFrame, has_position: bool, skipped: int, counts: dict[str, int]) -> EvaluationSet:
    none = np.empty(0, dtype=np.int64)
    return EvaluationSet(
        frame=frame.iloc[:0], scores=np.empty(0), relevance=np.empty(0), positions=none if has_position else None,
        request_codes=none, n_requests=0, labels={}, skipped_rows=skipped, skipped_by_reason=dict(counts),
    )  # fmt: skip


def _check(rej: _Rejections, valid: npt.NDArray[np.bool_], bad: Any, reason: str, explain: Any) -> None:
    """Reject rows that are ``bad`` and still valid (a row gets the first reason only)."""
    bad = np.asarray(bad, dtype=bool) & valid
    rej.reject(bad, reason, explain)
    valid &= ~bad


def _check_subset(
    rej: _Rejections, valid: npt.NDArray[np.bool_], rows: Any, bad_sub: Any, reason: str, explain: Any
) -> None:
    if isinstance(rows, slice):  # every row: the subset is the whole frame
        _check(rej, valid, bad_sub, reason, explain)
        return
    bad = np.zeros(valid.size, dtype=bool)
    bad[rows[np.asarray(bad_sub, dtype=bool)]] = True
    _check(rej, valid, bad, reason, explain)
