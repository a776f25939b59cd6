"""rankwatch[spark]: the kernel on Spark local mode equals the pandas path (one session, local[2])."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
from offline_data import _close, assert_same_result, random_frame  # noqa: E402

# No skip: pyspark is in the test extra, and a broken rankwatch.spark must fail here, not skip.
import rankwatch.spark as spark_module  # noqa: E402
from rankwatch.pipeline.metrics.options import MetricOptions  # noqa: E402
from rankwatch.pipeline.offline.baseline import compute_baseline  # noqa: E402
from rankwatch.pipeline.offline.readers import InvalidEvaluationData, read_evaluation_files  # noqa: E402
from rankwatch.pipeline.slicing import SliceSpec  # noqa: E402


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    session = spark_module.local_session("local[2]")
    yield session
    session.stop()


def test_random_data_with_ties_one_item_lists_and_single_class_slices(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(21)
    for trial, (position, cap) in enumerate([(False, 50), (True, 2)]):
        frame = random_frame(rng, 300, position=position, model=True)
        assert (frame.groupby("request_id").size() == 1).any()  # one-item lists
        assert (frame[frame["segment"] == "cold"]["label"] == 0).all()  # a slice with one class only
        path = tmp_path / f"t{trial}.parquet"
        frame.to_parquet(path, index=False)
        options = MetricOptions(ndcg_cutoffs=(1, 5), map_cutoffs=(3,), no_relevant="zero" if trial else "skip")
        spec = SliceSpec(by=("segment", "surface"), max_values_per_label=cap)
        expected = compute_baseline(read_evaluation_files([path]), options=options, slice_spec=spec)
        got = spark_module.spark_baseline(spark.read.parquet(str(path)), options=options, slice_spec=spec,
                                          partitions=3, inputs=(str(path),))  # fmt: skip
        assert_same_result(got, expected)


def test_hive_partitioned_directory_csv_and_the_command(spark, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    frame = random_frame(np.random.default_rng(22), 200)
    frame.to_parquet(tmp_path / "hive", partition_cols=["segment", "surface"], index=False)
    expected = compute_baseline(pd.read_parquet(tmp_path / "hive"))
    got = spark_module.spark_baseline_from_files([str(tmp_path / "hive")])
    _close(got.document(), expected.document(), "result")
    assert got.rows == expected.rows
    frame.to_csv(tmp_path / "e.csv", index=False)
    from rankwatch.cli import main

    assert main(["offline", str(tmp_path / "e.csv"), "--engine", "spark", "--format", "json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    _close(doc, compute_baseline(read_evaluation_files([tmp_path / "e.csv"])).document(), "result")


def test_invalid_rows_are_counted_or_fail(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    frame = random_frame(np.random.default_rng(23), 100, bad_share=0.05)
    path = tmp_path / "bad.parquet"
    frame.to_parquet(path, index=False)
    expected = compute_baseline(read_evaluation_files([path], skip_invalid=True))
    got = spark_module.spark_baseline(spark.read.parquet(str(path)), skip_invalid=True)
    assert got.skipped_by_reason == expected.skipped_by_reason and got.rows == expected.rows
    _close(got.document(), expected.document(), "result")
    with pytest.raises(InvalidEvaluationData, match="<spark>: row \\d+: "):
        spark_module.spark_baseline(spark.read.parquet(str(path)))
