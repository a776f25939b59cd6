"""``rankwatch offline --columns``: rows in a team's own column names equal the plain result on every engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankwatch.cli import main
from rankwatch.pipeline.offline.baseline import compute_baseline
from rankwatch.pipeline.offline.readers import read_evaluation_files
from rankwatch.pipeline.offline.renames import parse_columns

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
from offline_data import _close, random_frame  # noqa: E402

RENAMES = {"request_id": "qid", "item_id": "doc", "score": "s", "label": "rel", "position": "pos",
           "segment": "seg", "user_id": "uid"}  # fmt: skip
OPTION = ",".join(f"{k}={v}" for k, v in RENAMES.items())


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    plain = random_frame(np.random.default_rng(5), 150, position=True, model=True)
    plain["user_id"] = [f"u{int(r[1:]) % 17}" for r in plain["request_id"]]
    foreign = plain.rename(columns={k: v for k, v in RENAMES.items() if k in plain.columns})
    foreign["label"] = 99  # a column named like a mapped field is not that field: dropped
    return plain, foreign


def _write(frame: pd.DataFrame, folder: Path, fmt: str) -> str:
    folder.mkdir(exist_ok=True)
    path = folder / f"eval.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
    elif fmt == "jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_parquet(path, index=False)
    return str(path)


def _doc(capsys, *args: str) -> dict:  # type: ignore[no-untyped-def]
    assert main(["offline", *args, "--format", "json", "--no-progress"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_renamed_columns_equal_the_plain_result(capsys, tmp_path: Path, fmt: str) -> None:  # type: ignore[no-untyped-def]
    plain, foreign = _frames()
    a, b = _write(plain, tmp_path / "plain", fmt), _write(foreign, tmp_path / "foreign", fmt)
    for layout in ("auto", "scattered"):
        expected = _doc(capsys, a, "--layout", layout)
        assert _doc(capsys, b, "--columns", OPTION, "--layout", layout) == expected, layout
    in_memory = compute_baseline(read_evaluation_files([b], columns=parse_columns(OPTION))).document()
    _close(in_memory, compute_baseline(read_evaluation_files([a])).document(), "in-memory")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("qid=request_id", "unknown rankwatch field 'qid'"),
        ("request_id=qid,item_id=qid", "column 'qid' is the target of two fields"),
        ("request_id=qid,request_id=q2", "field 'request_id' is mapped twice"),
        ("request_id", "takes rankwatch_field=column pairs"),
        ("request_id=nope", "no column 'nope' for request_id"),
    ],
)
def test_bad_columns_are_one_line(capsys, tmp_path: Path, option: str, message: str) -> None:  # type: ignore[no-untyped-def]
    _, foreign = _frames()
    for fmt in ("csv", "jsonl", "parquet"):
        path = _write(foreign, tmp_path, fmt)
        assert main(["offline", path, "--columns", option, "--no-progress"]) != 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def test_spark_engine_reads_renamed_columns(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("pyspark")
    plain, foreign = _frames()
    # GAUC by user: the Spark engine partitions by request (a user's requests may fall in two partitions).
    plain, foreign = plain.drop(columns="user_id"), foreign.drop(columns="uid")
    option = OPTION.replace(",user_id=uid", "")
    expected = compute_baseline(read_evaluation_files([_write(plain, tmp_path / "plain", "parquet")])).document()
    paths = [_write(foreign, tmp_path / "foreign", fmt) for fmt in ("csv", "parquet")]
    for path in paths:
        got = _doc(capsys, path, "--columns", option, "--engine", "spark")
        _close(got, expected, path)
    assert main(["offline", paths[1], "--columns", "request_id=nope", "--engine", "spark"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no column 'nope' for request_id" in err, err
