"""Random evaluation sets for the streaming, partial and Spark tests, and an exact result comparison."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rankwatch.pipeline.offline.baseline import BaselineResult

TOL = 1e-12


def random_frame(
    rng: np.random.Generator,
    n_requests: int,
    *,
    position: bool = False,
    int_ids: bool = False,
    max_len: int = 6,
    bad_share: float = 0.0,
    model: bool = False,
) -> pd.DataFrame:
    """Grouped rows with ties (scores on a coarse grid), one-item lists, graded labels and slices where
    every label is 0 (segment ``cold``); ``bad_share`` of the rows get a bad score or a missing id."""
    lengths = rng.integers(1, max_len + 1, n_requests)
    lengths[rng.random(n_requests) < 0.2] = 1
    req = np.repeat(np.arange(n_requests), lengths)
    n = int(req.size)
    segment = np.array(["a", "b", "c", "cold", "d"], dtype=object)[rng.integers(0, 5, n_requests)][req]
    label = rng.integers(0, 4, n) * (rng.random(n) < 0.45)
    label = np.where(segment == "cold", 0, label)
    frame = pd.DataFrame({
        "request_id": req if int_ids else np.array([f"r{r}" for r in req], dtype=object),
        "item_id": np.array([f"i{rng.integers(0, 50)}" for _ in range(n)], dtype=object),
        "score": rng.integers(0, 8, n) / 4.0,
        "label": label.astype(np.int64),
        "segment": segment,
        "surface": np.array(["home", "search"], dtype=object)[rng.integers(0, 2, n_requests)][req],
    })  # fmt: skip
    if position:
        offsets = np.cumsum(lengths) - lengths
        frame["position"] = (np.arange(n) - offsets[req] + 1) * rng.integers(1, 3)  # gaps are allowed
        frame["position"] = frame.groupby("request_id", sort=False)["position"].transform(
            lambda s: s.sample(frac=1, random_state=int(rng.integers(1 << 30))).to_numpy()
        )
    if model:
        frame["model"] = "m1"
    if bad_share:
        bad = rng.random(n) < bad_share
        kind = rng.integers(0, 2, n)
        frame["score"] = frame["score"].where(~(bad & (kind == 0)), np.nan)
        ids = frame["request_id"].astype(object)
        ids[bad & (kind == 1)] = None
        frame["request_id"] = ids
    return frame


def scatter(frame: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """Rows of every request spread over the frame, each request's rows kept in their relative order."""
    ids = np.array([str(x) for x in frame["request_id"]])
    perm = rng.permutation(len(frame))
    slots_by_request = np.argsort(ids[perm], kind="stable")  # shuffled slots, grouped by request
    rows_by_request = np.argsort(ids, kind="stable")  # original rows, grouped by request, in order
    order = np.empty(len(frame), dtype=np.int64)
    order[slots_by_request] = rows_by_request
    return frame.iloc[order].reset_index(drop=True)


def write(frame: pd.DataFrame, path: Path) -> Path:
    name = path.name
    if name.endswith(".parquet"):
        frame.to_parquet(path, index=False)
    elif ".csv" in name:
        frame.to_csv(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True, compression="gzip" if name.endswith(".gz") else None)
    return path


def _close(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=TOL, abs_tol=TOL), (where, a, b)
    else:
        assert a == b, (where, a, b)


def assert_same_result(got: BaselineResult, expected: BaselineResult) -> None:
    """Equal documents (floats to 1e-12), row counts, skipped rows by reason, caps, model and variant."""
    _close(got.document(), expected.document(), "result")
    assert (got.rows, got.skipped_rows, got.skipped_by_reason) == (
        expected.rows, expected.skipped_rows, expected.skipped_by_reason,
    )  # fmt: skip
    assert (got.label_overflow, got.model, got.variant) == (expected.label_overflow, expected.model, expected.variant)
    assert set(got.slices) == set(expected.slices)
