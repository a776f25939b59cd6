"""Offline baselines on Spark: the same kernel on the executors, an exact merge on the driver.

Install with ``pip install 'rankwatch[spark]'``. :func:`spark_baseline` takes a Spark DataFrame with the
offline columns (``request_id, item_id, score, label`` and optionally ``position, segment, surface,
variant, model``) and returns the :class:`~rankwatch.pipeline.offline.baseline.BaselineResult` that
:func:`~rankwatch.pipeline.offline.baseline.compute_baseline` gives on the same rows:

1. every row gets its read order (``monotonically_increasing_id``: ties of score within a request are
   broken by input order, as in the pandas path);
2. ``repartition(n, "request_id")`` puts all rows of a request on one executor and
   ``sortWithinPartitions("request_id", order)`` makes them contiguous, in input order;
3. ``mapInPandas`` runs the streaming engine's grouped scorer
   (:func:`~rankwatch.pipeline.offline.streaming.score_grouped`) over each partition's Arrow batches and
   yields one serialised :class:`~rankwatch.pipeline.offline.partial.PartialBaseline`;
4. the driver merges the partials and applies the label caps once (``finish``).

Only one small binary row per partition travels back to the driver. Invalid rows: with
``skip_invalid`` they are counted as in the pandas path; without it, the first invalid row found on an
executor fails the run with its message (its "row" is Spark's row id plus one, not a line number).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import BaselineResult
from rankwatch.pipeline.offline.batches import EVALUATION_COLUMNS, RowBatch, expand_inputs
from rankwatch.pipeline.offline.partial import PartialBaseline, merge_partials
from rankwatch.pipeline.offline.readers import InvalidEvaluationData
from rankwatch.pipeline.offline.renames import ColumnMap
from rankwatch.pipeline.offline.streaming import score_grouped
from rankwatch.pipeline.slicing import SliceSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["spark_baseline", "spark_baseline_from_files", "spark_partials"]

_ORDER = "__rankwatch_row"
_SOURCE = "<spark>"
BATCH_ROWS = 200_000  # rows scored at once on an executor (Arrow batches are re-chunked to this)


def spark_partials(
    df: DataFrame,
    *,
    options: MetricOptions,
    slice_by: tuple[str, ...],
    skip_invalid: bool = False,
    partitions: int | None = None,
) -> list[PartialBaseline]:
    """Map step on the executors: one partial baseline per partition of requests."""
    from pyspark.sql import functions as F

    columns = [c for c in EVALUATION_COLUMNS if c in df.columns]
    missing = [c for c in ("request_id", "item_id", "score", "label") if c not in df.columns]
    if missing:
        found = ", ".join(df.columns) or "none"
        raise InvalidEvaluationData(f"{_SOURCE}: missing column {missing[0]!r} (columns found: {found})")
    n = partitions or max(2, df.rdd.getNumPartitions())
    ordered = df.select(*columns).withColumn(_ORDER, F.monotonically_increasing_id())
    grouped = ordered.repartition(n, "request_id").sortWithinPartitions("request_id", _ORDER)

    def score_partition(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        try:
            partial = score_grouped(_rebatched(frames, columns), names=[_SOURCE], options=options,
                                    slice_by=slice_by, skip_invalid=skip_invalid)  # fmt: skip
        except InvalidEvaluationData as e:
            partial = PartialBaseline.empty(options, slice_by)
            partial.error = str(e)
        yield pd.DataFrame({"partial": [partial.to_bytes()]})

    rows = grouped.mapInPandas(score_partition, "partial binary").collect()
    return [PartialBaseline.from_bytes(bytes(r["partial"])) for r in rows]


def _rebatched(frames: Iterator[pd.DataFrame], columns: list[str]) -> Iterator[RowBatch]:
    """Arrow batches (10,000 rows by default) regrouped into batches of about :data:`BATCH_ROWS` rows."""
    pending: list[pd.DataFrame] = []
    size = 0
    for frame in frames:
        pending.append(frame)
        size += len(frame)
        if size >= BATCH_ROWS:
            yield _to_batch(pending, columns)
            pending, size = [], 0
    if pending:
        yield _to_batch(pending, columns)


def _to_batch(frames: list[pd.DataFrame], columns: list[str]) -> RowBatch:
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    numbers = frame[_ORDER].to_numpy(dtype=np.int64) + 1
    return RowBatch(frame[columns].reset_index(drop=True), np.zeros(len(frame), dtype=np.int64), numbers)


def spark_baseline(
    df: DataFrame,
    *,
    options: MetricOptions | None = None,
    slice_spec: SliceSpec | None = None,
    skip_invalid: bool = False,
    partitions: int | None = None,
    inputs: Sequence[str] = (),
) -> BaselineResult:
    """The baseline of a Spark DataFrame of evaluation rows (see the module docstring)."""
    options = options or MetricOptions()
    slice_spec = slice_spec or SliceSpec()
    parts = spark_partials(df, options=options, slice_by=slice_spec.by, skip_invalid=skip_invalid,
                           partitions=partitions)  # fmt: skip
    merged = merge_partials([PartialBaseline.empty(options, slice_spec.by), *parts])
    if merged.error:
        raise InvalidEvaluationData(merged.error)
    if merged.rows == 0:
        skipped = merged.skipped_rows
        raise InvalidEvaluationData(
            "no valid rows in the input" + (f" ({skipped} rows skipped as invalid)" if skipped else "")
        )
    return merged.finish(inputs=tuple(inputs), max_values_per_label=slice_spec.max_values_per_label)


def local_session(master: str = "local[2]") -> SparkSession:
    """A quiet Spark session (no UI, few shuffle partitions) for the command line and the tests."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master(master)
        .appName("rankwatch offline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.memory", os.environ.get("RANKWATCH_SPARK_DRIVER_MEMORY", "1g"))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def read_inputs(spark: SparkSession, paths: Sequence[str], columns: ColumnMap | None = None) -> DataFrame:
    """Files, directories (hive partitions become columns) and globs as one DataFrame, by column name.

    CSV values are read as text (as the pandas path does) and JSONL with Spark's type inference.
    ``columns`` renames the files' own columns (``--columns``); a mapped column no input has is an error.
    """
    files = expand_inputs(paths)  # the same errors as the local engine for missing files
    by_format: dict[str, list[str]] = {}
    for f in files:
        by_format.setdefault(f.fmt, []).append(str(f.path))
    frames: list[Any] = []
    for fmt, found in by_format.items():
        if fmt == "parquet":
            roots = [p for p in paths if os.path.isdir(p)]
            loose = [f for f in found if not any(f.startswith(os.path.join(r, "")) for r in roots)]
            frames += [spark.read.option("basePath", r).parquet(r) for r in roots]
            if loose:
                frames.append(spark.read.parquet(*loose))
        elif fmt == "csv":
            frames.append(spark.read.option("header", True).option("inferSchema", False).csv(found))
        else:
            frames.append(spark.read.json(found))
    out = frames[0]
    for other in frames[1:]:
        out = out.unionByName(other, allowMissingColumns=True)
    if columns:
        problem = columns.missing(out.columns)
        if problem:
            names = ", ".join(out.columns) or "none"
            raise InvalidEvaluationData(f"{_SOURCE}: {problem} (columns found: {names})")
        renamed = [(c, n) for c in out.columns for n in columns.names([c])]  # shadowed columns dropped
        out = out.select(*(out[f"`{c}`"].alias(n) for c, n in renamed))
    return out


def spark_baseline_from_files(
    paths: Sequence[str],
    *,
    options: MetricOptions | None = None,
    slice_spec: SliceSpec | None = None,
    skip_invalid: bool = False,
    master: str = "local[2]",
    columns: ColumnMap | None = None,
) -> BaselineResult:
    """``rankwatch offline --engine spark``: read the inputs with Spark and compute their baseline.

    Uses the active Spark session if there is one (and leaves it running), else starts one on ``master``.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    spark = active or local_session(master)
    try:
        df = read_inputs(spark, paths, columns)
        return spark_baseline(df, options=options, slice_spec=slice_spec, skip_invalid=skip_invalid,
                              inputs=tuple(paths))  # fmt: skip
    finally:
        if active is None:
            spark.stop()
