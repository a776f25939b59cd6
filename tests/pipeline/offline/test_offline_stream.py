"""Streaming offline baselines equal the in-memory path, whatever the batch size, row order and format."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offline_data import _close, assert_same_result, random_frame, scatter, write
from test_offline import assert_matches_naive

from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline import streaming as offline_stream
from rankwatch.pipeline.offline.baseline import compute_baseline
from rankwatch.pipeline.offline.readers import InvalidEvaluationData, read_evaluation_files
from rankwatch.pipeline.offline.streaming import (
    RequestsNotGrouped,
    StreamStats,
    batch_rows_for,
    stream_baseline,
)
from rankwatch.pipeline.slicing import SliceSpec

ROOT = Path(__file__).resolve().parents[3]
FORMATS = ("data.csv", "data.csv.gz", "data.jsonl", "data.jsonl.gz", "data.parquet")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n_requests=st.integers(1, 40),
    fmt=st.sampled_from(FORMATS),
    batch_rows=st.integers(1, 60),
    order=st.sampled_from(["grouped", "scattered", "random"]),
    layout=st.sampled_from(["auto", "scattered", "grouped"]),
    position=st.booleans(),
    bad=st.booleans(),
    cap=st.integers(1, 4),
    by=st.sampled_from([("segment", "surface"), ("segment",), (), ("surface", "model")]),
)
def test_streaming_equals_in_memory(
    seed: int, n_requests: int, fmt: str, batch_rows: int, order: str, layout: str, position: bool, bad: bool,
    cap: int, by: tuple[str, ...],
) -> None:  # fmt: skip
    rng = np.random.default_rng(seed)
    frame = random_frame(rng, n_requests, position=position, bad_share=0.1 if bad else 0.0, model=seed % 2 == 0,
                         int_ids=seed % 3 == 0)  # fmt: skip
    if order == "scattered":
        frame = scatter(frame, rng)
    elif order == "random":
        frame = frame.sample(frac=1, random_state=seed % 1000).reset_index(drop=True)
    if layout == "grouped" and order != "grouped":
        layout = "auto"
    options = MetricOptions(ndcg_cutoffs=(1, 3), map_cutoffs=(2,), no_relevant="zero" if seed % 5 == 0 else "skip")
    spec = SliceSpec(by=by, max_values_per_label=cap)
    with tempfile.TemporaryDirectory() as tmp:
        path = write(frame, Path(tmp) / fmt)
        try:
            expected = compute_baseline(read_evaluation_files([path], skip_invalid=bad), options=options,
                                        slice_spec=spec)  # fmt: skip
        except InvalidEvaluationData as e:  # every row invalid: the same error
            with pytest.raises(InvalidEvaluationData, match="no valid rows"):
                stream_baseline([path], options=options, slice_spec=spec, skip_invalid=bad, batch_rows=batch_rows,
                                layout=layout, spill_dir=tmp)  # type: ignore[arg-type]  # fmt: skip
            assert "no valid rows" in str(e)
            return
        got = stream_baseline([path], options=options, slice_spec=spec, skip_invalid=bad, batch_rows=batch_rows,
                              layout=layout, spill_dir=tmp)  # type: ignore[arg-type]  # fmt: skip
    assert_same_result(got, expected)
    assert got.inputs == (str(path),)


def test_streaming_matches_the_naive_oracle_with_ties_and_one_item_lists(tmp_path: Path) -> None:
    frame = random_frame(np.random.default_rng(3), 60)
    options = MetricOptions()
    got = stream_baseline([write(scatter(frame, np.random.default_rng(4)), tmp_path / "s.csv")], batch_rows=7,
                          options=options)  # fmt: skip
    assert_matches_naive(got, frame, options, ("segment", "surface"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_shuffled_rows_give_the_grouped_result(tmp_path: Path, fmt: str) -> None:
    rng = np.random.default_rng(11)
    frame = random_frame(rng, 80, position=True)
    grouped = stream_baseline([write(frame, tmp_path / f"g-{fmt}")], batch_rows=13)
    stats = StreamStats()
    shuffled = stream_baseline([write(scatter(frame, rng), tmp_path / f"s-{fmt}")], batch_rows=13, stats=stats)
    assert stats.layout == "scattered" and stats.partitions >= 1
    assert_same_result(shuffled, grouped)


def test_a_single_bad_row_gives_the_in_memory_message(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    for fmt in FORMATS:
        for trial in range(3):
            frame = random_frame(rng, 30, position=trial == 0)
            row = int(rng.integers(0, len(frame)))
            frame.loc[row, "label"] = -1 if trial < 2 else frame.loc[row, "label"]
            if trial == 2:
                frame["score"] = frame["score"].astype(object)
                frame.loc[row, "score"] = None
            path = write(frame if trial != 1 else scatter(frame, rng), tmp_path / f"{trial}-{fmt}")
            with pytest.raises(InvalidEvaluationData) as expected:
                read_evaluation_files([path])
            with pytest.raises(InvalidEvaluationData) as got:
                stream_baseline([path], batch_rows=int(rng.integers(1, 20)))
            assert str(got.value) == str(expected.value), fmt


def test_bad_json_and_bad_csv_lines_are_counted_or_named(tmp_path: Path) -> None:
    text = '{"request_id": "a", "item_id": "x", "score": 1, "label": 1}\nnot json\n[1]\n'
    text += '{"request_id": "a", "item_id": "y", "score": 0.5, "label": 0}\n'
    (tmp_path / "e.jsonl").write_text(text)
    with pytest.raises(InvalidEvaluationData, match="e.jsonl: row 2: bad JSON"):
        stream_baseline([tmp_path / "e.jsonl"], batch_rows=1)
    got = stream_baseline([tmp_path / "e.jsonl"], batch_rows=1, skip_invalid=True)
    assert got.skipped_by_reason == {"bad_json": 1, "not_object": 1} and got.overall.items == 2
    (tmp_path / "e.csv").write_text("request_id,item_id,score,label\na,x,1,1\na,y,2,0,9\nb,z,1,0\n")
    expected = read_evaluation_files([tmp_path / "e.csv"], skip_invalid=True)
    got = stream_baseline([tmp_path / "e.csv"], batch_rows=1, skip_invalid=True)
    assert got.skipped_by_reason == expected.skipped_by_reason == {"bad_csv_line": 1}
    with pytest.raises(InvalidEvaluationData, match="e.csv: row 2: Expected 4 fields"):
        stream_baseline([tmp_path / "e.csv"], batch_rows=1)


def test_grouped_layout_refuses_a_request_that_comes_back(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("request_id,item_id,score,label\na,x,1,1\nb,y,2,0\nc,z,1,0\na,w,1,0\n")
    with pytest.raises(RequestsNotGrouped, match=r"e.csv: row 4: the rows of a request are not contiguous"):
        stream_baseline([path], batch_rows=2, layout="grouped")
    expected = compute_baseline(read_evaluation_files([path]))
    assert_same_result(stream_baseline([path], batch_rows=2), expected)


def test_an_oversized_partition_is_split_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(8)
    frame = scatter(random_frame(rng, 200), rng)
    path = write(frame, tmp_path / "s.parquet")
    monkeypatch.setattr(offline_stream, "estimated_rows", lambda files: 1)  # one partition for everything
    stats = StreamStats()
    got = stream_baseline([path], batch_rows=offline_stream.MIN_BATCH_ROWS, layout="scattered", stats=stats)
    assert stats.partitions == 1
    assert_same_result(got, compute_baseline(read_evaluation_files([path])))
    monkeypatch.setattr(offline_stream, "MIN_BATCH_ROWS", 10)  # now the one partition is too big: re-split
    stats = StreamStats()
    got = stream_baseline([path], batch_rows=20, layout="scattered", stats=stats)
    assert stats.partitions == 1 and stats.spilled_bytes > 0
    assert_same_result(got, compute_baseline(read_evaluation_files([path])))


def test_directories_hive_partitions_globs_and_requests_across_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    frame = random_frame(rng, 120)
    frame.to_parquet(tmp_path / "hive", partition_cols=["segment"], index=False)
    expected = compute_baseline(pd.read_parquet(tmp_path / "hive"))
    got = stream_baseline([tmp_path / "hive"], batch_rows=17)
    _close(got.document(), expected.document(), "result")  # the inputs' names differ, nothing else
    assert (got.rows, got.skipped_rows) == (expected.rows, expected.skipped_rows)
    # The same rows as CSV pieces: a request may continue in the next file.
    cuts = [0, 40, 41, 200, len(frame)]
    for i in range(len(cuts) - 1):
        frame.iloc[cuts[i] : cuts[i + 1]].to_csv(tmp_path / f"part-{i}.csv", index=False)
    files = sorted(tmp_path.glob("part-*.csv"))
    expected = compute_baseline(read_evaluation_files(files))
    assert_same_result(stream_baseline([str(tmp_path / "part-*.csv")], batch_rows=9), expected)
    with pytest.raises(FileNotFoundError, match="no file matches"):
        stream_baseline([str(tmp_path / "nothing-*.csv")])
    with pytest.raises(FileNotFoundError, match="missing.csv: no such file"):
        stream_baseline([tmp_path / "missing.csv"])


def test_budget_sets_the_batch_size() -> None:
    assert batch_rows_for(768 << 20) > batch_rows_for(512 << 20) > batch_rows_for(384 << 20) > 0
    with pytest.raises(ValueError, match="cannot be honoured"):
        batch_rows_for(100 << 20)


CHILD = """
import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
n, path = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
g = rng.permutation(n)  # row j holds global row g[j]: the 20 rows of a request are scattered
req = g // 20
pq.write_table(pa.table({"request_id": pa.array(req).cast(pa.string()), "item_id": pa.array(g % 20).cast(pa.string()),
    "score": (g % 997) / 997.0, "label": (rng.random(n) < 0.2).astype(np.int64),
    "segment": pa.array(req % 5).cast(pa.string())}), path, row_group_size=200_000)
"""


def test_shuffled_input_stays_within_a_small_budget(tmp_path: Path) -> None:
    """1.2 M scattered rows (the in-memory path needs about 600 MB) under a 384 MiB budget."""
    path = tmp_path / "s.parquet"
    subprocess.run([sys.executable, "-c", CHILD, "1200000", str(path)], check=True, timeout=300)
    wrapper = (
        # VmHWM is the peak of this process's own memory map. Not ru_maxrss: Linux carries it across exec, so
        # a child spawned (vfork) by a large pytest process would report the parent's resident size.
        "import runpy, sys\n"
        "sys.argv = ['rankwatch', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('rankwatch', run_name='__main__')\n"
        "finally:\n    hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')][0].split()[1]\n"
        "    print('PEAK', hwm, file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", wrapper, "offline", str(path), "--memory-limit", "384M", "--format", "json",
         "--spill-dir", str(tmp_path), "--no-progress"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    peak_kib = int(out.stderr.split("PEAK")[-1])
    assert peak_kib < 384 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
    assert '"requests": 60000' in out.stdout
    assert not list(tmp_path.glob("rankwatch-spill-*")), "spill files are removed"


def test_partitions_by_another_column_constant_within_requests(tmp_path: Path) -> None:
    """``partition_by`` (for a user id, say): every partition holds complete groups, results unchanged."""
    rng = np.random.default_rng(12)
    frame = scatter(random_frame(rng, 150), rng)
    path = write(frame, tmp_path / "s.parquet")
    stats = StreamStats()
    got = stream_baseline([path], batch_rows=20, partition_by="segment", stats=stats, spill_dir=tmp_path)
    assert stats.layout == "scattered"
    assert_same_result(got, compute_baseline(read_evaluation_files([path])))


def test_batches_of_tiny_requests_are_scored_in_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(13)
    frame = random_frame(rng, 200, max_len=1)  # one-item lists only: a request per row
    path = write(frame, tmp_path / "g.csv")
    monkeypatch.setattr(offline_stream, "MIN_BATCH_ROWS", 8)  # parts of at least one request
    got = stream_baseline([path], batch_rows=64, layout="grouped")
    assert_same_result(got, compute_baseline(read_evaluation_files([path])))


@pytest.mark.parametrize("shuffled", [False, True])
def test_gauc_by_user_is_exact_when_a_users_requests_span_batches(tmp_path: Path, shuffled: bool) -> None:
    """GAUC by user closes a user's group only when all of the user's rows are scored together: a
    ``user_id`` column routes the run to the scattered layout partitioned by user (tiny batches here, so
    every user's requests span many of them), equal to the in-memory path and to a naive sklearn loop."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(31)
    frame = random_frame(rng, 400, max_len=8)
    requests = frame["request_id"].astype(str)
    users = {r: f"u{rng.integers(0, 25)}" for r in requests.unique()}
    frame["user_id"] = requests.map(users)
    if shuffled:
        frame = scatter(frame, rng)
    path = write(frame, tmp_path / "users.parquet")
    stats = StreamStats()
    got = stream_baseline([path], batch_rows=17, stats=stats, spill_dir=tmp_path)
    assert stats.layout == "scattered"
    want = compute_baseline(read_evaluation_files([path]))
    assert_same_result(got, want)
    total = weight = 0.0
    for _, rows in frame.groupby("user_id"):
        y = rows["label"].to_numpy() > 0
        if y.all() or not y.any():
            continue
        total += len(rows) * roc_auc_score(y, rows["score"].to_numpy())
        weight += len(rows)
    assert got.overall.values()["gauc"] == pytest.approx(total / weight, abs=1e-12)
