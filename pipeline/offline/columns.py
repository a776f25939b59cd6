"""Column codecs of offline validation: ids, text labels and numbers of an evaluation frame as arrays.

Split out of :mod:`pipeline.offline.readers` (which reads files and applies the row checks) so that each stays
small. Every function takes one pandas column and answers with numpy arrays; pandas' Arrow-backed string
columns are read in pyarrow where that avoids a conversion to Python objects.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from rankwatch.pipeline.offline.grouping import differs_from_previous, strictly_increasing
from rankwatch.pipeline.slicing import UNKNOWN_VALUE

IntArray = npt.NDArray[np.int64]


def id_codes(column: pd.Series) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """Codes of an id column with ids compared as text (``7`` and ``"7"`` are one id); blank is missing.

    Codes number the ids by first appearance. Evaluation sets are usually grouped by request: then the
    runs of equal adjacent ids are the requests, and only the first id of each run needs hashing (to
    prove that no id comes back later), a tenth of the work of factorising every row.
    """
    typed = column.dtype != object and (
        pd.api.types.is_string_dtype(column.dtype) or pd.api.types.is_integer_dtype(column.dtype)
    )
    if typed and len(column) > 1 and not column.hasnans:
        run_start = np.empty(len(column), dtype=bool)
        run_start[0] = True
        run_start[1:] = differs_from_previous(column)
        starts = np.flatnonzero(run_start)
        run_values = column.iloc[starts].reset_index(drop=True)
        # Ids sorted within the file are distinct when strictly increasing: no hashing needed.
        run_ids = run_values if strictly_increasing(run_values) else pd.factorize(run_values)[1]
        if len(run_ids) == starts.size:  # every id is one contiguous run
            codes = np.repeat(np.arange(starts.size, dtype=np.int64), np.diff(starts, append=len(column)))
            blank_runs = blank_ids(run_ids)
            return codes, (~np.isin(codes, blank_runs) if blank_runs.size else np.ones(codes.size, dtype=bool))
    codes, uniques = pd.factorize(column)
    codes = codes.astype(np.int64, copy=False)
    if uniques.dtype == object:
        # Mixed types (JSONL): compare as text, so renumber the distinct values after str().
        text = pd.Series([str(u) for u in uniques], dtype=object)
        norm_codes, norm_uniques = pd.factorize(text)
        codes = np.append(norm_codes, -1).astype(np.int64)[codes]  # index -1 (missing) stays -1
        uniques = pd.Index(norm_uniques)
    ok = codes >= 0
    blank = blank_ids(uniques)
    if blank.size:
        ok &= ~np.isin(codes, blank)
    return codes, ok


def blank_ids(uniques: Any) -> IntArray:
    """Indices of empty or whitespace-only ids among distinct ids."""
    if not pd.api.types.is_string_dtype(uniques.dtype):
        return np.empty(0, dtype=np.int64)
    blank = (pd.Series(uniques).str.strip() == "").to_numpy(dtype=bool, na_value=True)
    return np.flatnonzero(blank).astype(np.int64)


def missing_text(column: pd.Series) -> npt.NDArray[np.bool_]:
    """Missing or empty values of a text column (without factorising millions of distinct ids).

    An Arrow-backed column without nulls whose value offsets strictly increase (no value is empty) has
    neither: answered from the offsets buffer, without comparing every value with ``""`` and converting
    the result, or building a full-size array of lengths.
    """
    chunked = getattr(column.array, "_pa_array", None)
    if chunked is not None and chunked.null_count == 0 and len(column) and _no_empty_values(chunked):
        return np.zeros(len(column), dtype=bool)
    missing = column.isna().to_numpy(dtype=bool, copy=True)
    if pd.api.types.is_string_dtype(column.dtype) and column.dtype != object:
        missing |= (column == "").to_numpy(dtype=bool, na_value=True)
    elif column.dtype == object:
        missing |= column.map(lambda v: isinstance(v, str) and not v).to_numpy(dtype=bool)
    return missing


def _no_empty_values(chunked: Any) -> bool:
    """Whether every value of an Arrow string or binary chunked array is non-empty (False for other types)."""
    import pyarrow as pa

    for chunk in chunked.chunks:
        kind = chunk.type
        if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
            width: Any = np.int64
        elif pa.types.is_string(kind) or pa.types.is_binary(kind):
            width = np.int32
        else:
            return False
        offsets = np.frombuffer(chunk.buffers()[1], dtype=width)[chunk.offset : chunk.offset + len(chunk) + 1]
        if not np.all(offsets[1:] > offsets[:-1]):
            return False
    return True


def label_codes(column: pd.Series) -> tuple[IntArray, tuple[str, ...]]:
    """Codes of a slice label column; missing and empty values are ``"unknown"``."""
    codes, uniques = pd.factorize(column)
    text = [str(u).strip() or UNKNOWN_VALUE for u in uniques] + [UNKNOWN_VALUE]
    norm_codes, norm_uniques = pd.factorize(pd.Series(text, dtype=object))
    return norm_codes.astype(np.int64)[codes], tuple(str(u) for u in norm_uniques)


def user_codes(column: pd.Series) -> tuple[IntArray, tuple[str, ...]]:
    """Codes of the ``user_id`` column (issue 13), without the label path's per-value normalisation;
    ``-1`` where the user is missing (``pipeline.offline.baseline`` makes each such request a GAUC group of its own)."""
    chunked = getattr(column.array, "_pa_array", None)
    if chunked is not None:  # Arrow's dictionary encoding: the same first-appearance codes, faster
        import pyarrow as pa
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(chunked)
        encoded = encoded.combine_chunks() if isinstance(encoded, pa.ChunkedArray) else encoded
        codes = encoded.indices.to_numpy(zero_copy_only=False) if encoded.null_count == 0 else (
            encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        )
        # numpy's str conversion (the general path) drops trailing NULs: so does rstrip, for equal names.
        return codes.astype(np.int64), tuple(v.rstrip("\x00") for v in encoded.dictionary.to_pylist())
    codes, uniques = pd.factorize(column)
    return codes.astype(np.int64), tuple(np.asarray(uniques, dtype=object).astype(str).tolist())


def as_numbers(column: pd.Series) -> npt.NDArray[np.float64]:
    """Column as float64, NaN where missing or not a number (booleans are not numbers)."""
    if pd.api.types.is_bool_dtype(column.dtype):
        return np.full(len(column), np.nan)
    if pd.api.types.is_numeric_dtype(column.dtype):
        return column.to_numpy(dtype=np.float64, na_value=np.nan)
    if column.dtype == object:  # JSONL values, or files of different column types concatenated
        return np.fromiter((to_float(v) for v in column), dtype=np.float64, count=len(column))
    if not pd.api.types.is_string_dtype(column.dtype):
        return np.full(len(column), np.nan)  # dates, categories of non-numbers, ...: not numbers
    return pd.to_numeric(column.str.strip(), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def to_float(value: Any) -> float:
    """A JSON number or numeric text as float; NaN for anything else (booleans, objects, lists, null)."""
    if isinstance(value, bool):
        return np.nan
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return np.nan
    return np.nan


def number_problem(name: str, column: pd.Series, row: int, must_be: str = "") -> str:
    raw = column.iloc[row]
    if raw is None or (isinstance(raw, float) and np.isnan(raw)) or (isinstance(raw, str) and not raw.strip()):
        return f"{name} is missing"
    value = as_numbers(column.iloc[row : row + 1])[0]
    if np.isnan(value):
        return f"{name} is not a number: {raw!r}"
    if not np.isfinite(value):
        return f"{name} is not finite: {raw!r}"
    return f"{name} must be {must_be}, got {raw!r}"
