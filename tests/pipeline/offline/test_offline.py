"""Offline baselines: reading, validation with row numbers, ordering, slicing, caps and baseline files."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_metrics import auc_roc, mean_metrics, order_by_score
from sklearn.metrics import average_precision_score

from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import (
    BASELINE_FORMAT,
    compute_baseline,
    load_baseline,
    parse_baseline,
    rank_order,
    write_baseline,
)
from rankwatch.pipeline.offline.readers import (
    InvalidEvaluationData,
    read_evaluation_files,
    validate_evaluation_frame,
)
from rankwatch.pipeline.slicing import SliceSpec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TOL = 1e-9
CLOCK = ManualClock(datetime(2026, 11, 30, 6, 0, 0, 250000, tzinfo=UTC))


def naive_baseline(frame: pd.DataFrame, options: MetricOptions, by: tuple[str, ...]) -> dict:
    """Per-slice values by plain Python grouping: the oracle for compute_baseline."""
    requests: dict[str, list[int]] = {}
    for i, rid in enumerate(frame["request_id"].astype(str)):
        requests.setdefault(rid, []).append(i)
    slices: dict[tuple, list[list[int]]] = {(): []}
    for rows in requests.values():
        if "position" in frame.columns:
            ranked = sorted(rows, key=lambda i: frame["position"].iloc[i])
        else:
            ranked = [rows[j] for j in order_by_score([float(frame["score"].iloc[i]) for i in rows])]
        slices[()].append(ranked)
        key = tuple((lbl, str(frame[lbl].iloc[rows[0]]) if lbl in frame.columns else "unknown") for lbl in by)
        slices.setdefault(key, []).append(ranked) if by else None
    out = {}
    for key, lists in slices.items():
        labels = [[float(frame["label"].iloc[i]) for i in ranked] for ranked in lists]
        values = mean_metrics(
            labels, no_relevant=options.no_relevant, ndcg_cutoffs=options.ndcg_cutoffs,
            map_cutoffs=options.map_cutoffs, gain=options.gain, map_normalization=options.map_normalization,
        )  # fmt: skip
        scores = [float(frame["score"].iloc[i]) for ranked in lists for i in ranked]
        rel = [lab > 0 for ls in labels for lab in ls]
        values["auc_roc"] = auc_roc(scores, rel)
        values["auc_pr"] = average_precision_score(rel, scores) if 0 < sum(rel) < len(rel) else None
        values["requests"] = len(lists)
        values["items"] = len(scores)
        values["requests_with_relevant"] = sum(1 for ls in labels if any(x > 0 for x in ls))
        out[key] = values
    return out


def assert_matches_naive(result, frame: pd.DataFrame, options: MetricOptions, by: tuple[str, ...]) -> None:
    naive = naive_baseline(frame, options, by)
    ours = {(): result.overall.values(), **{k: a.values() for k, a in result.slices.items()}}
    assert set(ours) == set(naive)
    for key, expected in naive.items():
        for name, value in expected.items():
            got = ours[key][name]
            assert (got is None) == (value is None), (key, name)
            if value is not None:
                assert got == pytest.approx(value, abs=TOL), (key, name)


# -- reading ------------------------------------------------------------------------------------------------
def test_examples_in_all_three_formats_give_one_result() -> None:
    docs = [compute_baseline(read_evaluation_files([EXAMPLES / f"eval.{ext}"])).document()
            for ext in ("csv", "jsonl", "parquet")]  # fmt: skip
    assert docs[0] == docs[1] == docs[2]
    assert docs[0]["overall"]["requests"] == 40 and len(docs[0]["slices"]) == 6
    frame = pd.read_csv(EXAMPLES / "eval.csv")
    assert_matches_naive(compute_baseline(frame), frame, MetricOptions(), ("segment", "surface"))


def test_several_inputs_are_one_evaluation_set(tmp_path: Path) -> None:
    frame = pd.read_csv(EXAMPLES / "eval.csv")
    frame.iloc[:100].to_csv(tmp_path / "a.csv", index=False)
    frame.iloc[100:].to_json(tmp_path / "b.jsonl", orient="records", lines=True)
    evalset = read_evaluation_files([tmp_path / "a.csv", tmp_path / "b.jsonl"])
    assert evalset.inputs == (str(tmp_path / "a.csv"), str(tmp_path / "b.jsonl")) and evalset.rows == len(frame)
    assert compute_baseline(evalset).document() == compute_baseline(frame).document()


def test_gzip_and_unknown_extension(tmp_path: Path) -> None:
    frame = pd.read_csv(EXAMPLES / "eval.csv")
    frame.to_csv(tmp_path / "e.csv.gz", index=False)
    assert read_evaluation_files([tmp_path / "e.csv.gz"]).rows == len(frame)
    (tmp_path / "e.txt").write_text("x")
    with pytest.raises(InvalidEvaluationData, match="format"):
        read_evaluation_files([tmp_path / "e.txt"])
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_evaluation_files([tmp_path / "missing.csv"])


CSV_HEADER = "request_id,item_id,position,score,label,segment\n"
GOOD = ["r1,a,1,0.9,1,s", "r1,b,2,0.5,0,s", "r2,a,1,0.3,2,t", "r2,c,2,0.1,0,t"]


@pytest.mark.parametrize(
    ("bad_line", "row", "reason"),
    [
        ("r3,x,1,abc,0,s", 5, "score is not a number: 'abc'"),
        ("r3,x,1,,0,s", 5, "score is missing"),
        ("r3,x,1,inf,0,s", 5, "score is not finite"),
        ("r3,x,1,0.5,-1,s", 5, "label must be >= 0"),
        ("r3,x,1,0.5,high,s", 5, "label is not a number"),
        ("r3,x,0,0.5,1,s", 5, "position must be an integer >= 1"),
        ("r3,x,1.5,0.5,1,s", 5, "position must be an integer >= 1"),
        (",x,1,0.5,1,s", 5, "request_id is missing"),
        ("r3,,1,0.5,1,s", 5, "item_id is missing"),
        ("r1,x,2,0.5,1,s", 5, "position 2 appears twice in request 'r1'"),
        ("r1,x,3,0.5,1,other", 5, "segment 'other' differs from an earlier row of request 'r1'"),
        ("r3,x,1,0.5,1,s,extra", 5, "Expected 6 fields"),
    ],
)
def test_csv_validation_names_file_row_and_reason(tmp_path: Path, bad_line: str, row: int, reason: str) -> None:
    path = tmp_path / "e.csv"
    path.write_text(CSV_HEADER + "\n".join([*GOOD, bad_line, "r9,z,1,0.5,1,s"]) + "\n")
    with pytest.raises(InvalidEvaluationData) as err:
        read_evaluation_files([path])
    assert str(err.value).startswith(f"{path}: row {row}: ") and reason in str(err.value)
    # With skip_invalid the row is skipped and counted, and the rest equals the clean input.
    evalset = read_evaluation_files([path], skip_invalid=True)
    assert evalset.skipped_rows == 1 and evalset.rows == 5 and sum(evalset.skipped_by_reason.values()) == 1
    clean = tmp_path / "clean.csv"
    clean.write_text(CSV_HEADER + "\n".join([*GOOD, "r9,z,1,0.5,1,s"]) + "\n")
    result = compute_baseline(evalset)
    assert result.document()["overall"] == compute_baseline(read_evaluation_files([clean])).document()["overall"]
    assert result.document()["skipped_rows"] == 1


def test_missing_column_fails_even_when_skipping(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("request_id,item_id,score\nr1,a,0.5\n")
    for skip in (False, True):
        with pytest.raises(InvalidEvaluationData, match="missing column 'label'"):
            read_evaluation_files([path], skip_invalid=skip)


def test_jsonl_validation_uses_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    lines = [
        '{"request_id": "r1", "item_id": "a", "score": 0.9, "label": 1}',
        "",
        '{"request_id": "r1", "item_id": "b", "score": 0.5, "label": 0}',
        '{"request_id": "r2", "item_id": "a", "score": 0.5, "label": 0,}',
        '["not", "an", "object"]',
        '{"request_id": "r2", "item_id": "c", "label": 1}',
        '{"request_id": 7, "item_id": "c", "score": "0.25", "label": true}',
        '{"request_id": "7", "item_id": "d", "score": 0.75, "label": 2}',
    ]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidEvaluationData, match=r"e\.jsonl: row 4: bad JSON"):
        read_evaluation_files([path])
    evalset = read_evaluation_files([path], skip_invalid=True)
    assert evalset.skipped_by_reason == {"bad_json": 1, "not_object": 1, "bad_score": 1, "bad_label": 1}
    assert evalset.skipped_rows == 4 and evalset.rows == 3
    # Request id 7 (a number) and "7" are one request; "0.25" as text is not the problem, true as a label is.
    assert evalset.n_requests == 2
    path.write_text("\n".join(lines[:3] + lines[5:6]) + "\n")
    with pytest.raises(InvalidEvaluationData, match=r"row 4: score is missing"):
        read_evaluation_files([path])


def test_all_rows_invalid_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("request_id,item_id,score,label\nr1,a,x,1\n")
    with pytest.raises(InvalidEvaluationData, match="no valid rows"):
        read_evaluation_files([path], skip_invalid=True)


def test_frame_validation_numbers_rows_and_never_modifies_the_frame() -> None:
    frame = pd.DataFrame({"request_id": ["a", "a", "b"], "item_id": ["x", "y", "z"],
                          "score": [0.1, np.nan, 0.3], "label": [1, 0, 0]})  # fmt: skip
    before = frame.copy()
    with pytest.raises(InvalidEvaluationData, match=r"<frame>: row 2: score is missing"):
        compute_baseline(frame)
    result = compute_baseline(frame, skip_invalid=True)
    assert result.skipped_rows == 1 and result.rows == 2
    pd.testing.assert_frame_equal(frame, before)
    with pytest.raises(InvalidEvaluationData, match="missing column 'label'"):
        validate_evaluation_frame(frame.drop(columns=["label"]))


# -- ordering -------------------------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=25),
    shuffle=st.booleans(),
    long_list=st.booleans(),
    uniform=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_rank_order_by_score_descending_ties_in_input_order(lengths, shuffle, long_list, uniform, seed) -> None:
    if uniform:
        lengths = [max(lengths[0], 1)] * len(lengths)  # top-k lists of one length (the 2-D fast path)
    if long_list:
        lengths = [*lengths, 3000]  # far longer than the rest: the dense-rank path instead of the grid
    codes = np.repeat(np.arange(len(lengths)), lengths)
    if shuffle:
        codes = codes[np.random.default_rng(len(codes)).permutation(codes.size)]
        codes = pd.factorize(codes)[0]  # renumber by first appearance, as the readers do
    # Few distinct values, so most lists have ties.
    scores = np.random.default_rng(seed).choice([-1.0, 0.0, -0.0, 0.5, 2.0, 1e300, -1e300], size=codes.size)
    order = rank_order(codes.astype(np.int64), scores=scores)
    expected = []
    for c in range(int(codes.max()) + 1 if codes.size else 0):
        rows = np.flatnonzero(codes == c).tolist()
        expected += [rows[j] for j in order_by_score(scores[rows].tolist())]
    assert order.tolist() == expected


def test_rank_order_by_position_and_rank_is_the_place_not_the_value() -> None:
    frame = pd.DataFrame({"request_id": ["q"] * 3, "item_id": ["a", "b", "c"], "position": [5, 1, 2],
                          "score": [9.0, 0.0, 0.0], "label": [1, 0, 0]})  # fmt: skip
    # Position 5 is the third item shown: RR = 1/3 whatever its score.
    assert compute_baseline(frame).overall.values()["mrr"] == pytest.approx(1 / 3)
    assert compute_baseline(frame.drop(columns=["position"])).overall.values()["mrr"] == 1.0


def random_frame(seed: int, n_requests: int, *, position: bool, interleave: bool) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    segs, surfs = ["new", "returning", "power"], ["feed", "search"]
    for r in range(n_requests):
        n = int(rng.integers(0 if r else 1, 9))
        seg, surf = segs[rng.integers(0, 3)], surfs[rng.integers(0, 2)]
        for pos in rng.permutation(n) + 1:
            rows.append({"request_id": f"r{r}", "item_id": f"i{pos}", "position": int(pos),
                         "score": float(rng.choice([0.1, 0.2, 0.5, 0.9, rng.normal()])),
                         "label": int(rng.choice([0, 0, 0, 1, 2, 3])), "segment": seg, "surface": surf})  # fmt: skip
    frame = pd.DataFrame(rows)
    if interleave:
        frame = frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    return frame if position else frame.drop(columns=["position"])


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    position=st.booleans(),
    interleave=st.booleans(),
    by=st.sampled_from([("segment", "surface"), ("segment",), (), ("surface", "variant")]),
    options=st.builds(MetricOptions, gain=st.sampled_from(["exponential", "linear"]),
                      map_normalization=st.sampled_from(["relevant", "min_relevant_k"]),
                      no_relevant=st.sampled_from(["skip", "zero"]), ndcg_cutoffs=st.just((1, 5)),
                      map_cutoffs=st.just((3, 10))),  # fmt: skip
)
def test_compute_baseline_equals_naive_grouping(seed, position, interleave, by, options) -> None:
    frame = random_frame(seed, 30, position=position, interleave=interleave)
    result = compute_baseline(frame, options=options, slice_spec=SliceSpec(by=by))
    assert_matches_naive(result, frame, options, SliceSpec(by=by).by)


# -- slices, caps and metadata ----------------------------------------------------------------------------
def test_label_cap_keeps_most_frequent_values_ties_by_name_and_counts_requests() -> None:
    counts = {"a": 5, "b": 3, "c": 3, "d": 1, "e": 2}
    rows = [
        {"request_id": f"{seg}{i}", "item_id": "x", "score": 0.5, "label": i % 2, "segment": seg}
        for seg, n in counts.items() for i in range(n)
    ]  # fmt: skip
    result = compute_baseline(pd.DataFrame(rows), slice_spec=SliceSpec(by=("segment",), max_values_per_label=2))
    assert sorted(v for (_, v), in result.slices) == ["__other__", "a", "b"]
    assert result.label_overflow == {"segment": 3 + 1 + 2}
    assert result.slices[(("segment", "__other__"),)].requests == 6
    assert result.document()["label_overflow"] == {"segment": 6}
    assert sum(a.requests for a in result.slices.values()) == result.overall.requests == 14


def test_missing_label_values_are_unknown_and_model_variant_metadata() -> None:
    frame = pd.DataFrame({"request_id": ["a", "b", "c"], "item_id": ["x"] * 3, "score": [0.1, 0.2, 0.3],
                          "label": [1, 0, 1], "segment": ["s", None, ""], "model": ["m1"] * 3,
                          "variant": ["control", "treatment", "control"]})  # fmt: skip
    result = compute_baseline(frame, slice_spec=SliceSpec(by=("segment", "variant")))
    assert {k for k in result.slices} == {
        (("segment", "s"), ("variant", "control")),
        (("segment", "unknown"), ("variant", "treatment")),
        (("segment", "unknown"), ("variant", "control")),
    }
    assert result.model == "m1" and result.variant is None
    assert compute_baseline(frame.drop(columns=["model"])).model is None


# -- baseline files -----------------------------------------------------------------------------------------
def test_baseline_file_round_trip(tmp_path: Path) -> None:
    evalset = read_evaluation_files([EXAMPLES / "eval.csv"])
    options = MetricOptions(ndcg_cutoffs=(3,), map_cutoffs=(3, 5), gain="linear")
    result = compute_baseline(evalset, options=options, slice_spec=SliceSpec(by=("surface", "model")))
    path = tmp_path / "baseline.json"
    written = write_baseline(path, result, clock=CLOCK)
    raw = json.loads(path.read_text())
    assert raw == written
    assert list(raw) == ["format", "created", "inputs", "rows", "skipped_rows", "model", "variant", "options",
                         "slice_by", "result"]  # fmt: skip
    assert raw["format"] == BASELINE_FORMAT and raw["created"] == "2026-11-30T06:00:00.250Z"
    assert raw["rows"] == 364 and raw["model"] == "ranker-v12" and raw["variant"] == "control"
    assert raw["slice_by"] == ["surface", "model"] and raw["options"] == options.to_dict()
    loaded = load_baseline(path)
    assert loaded.created == CLOCK.now() and loaded.options == options and loaded.inputs == (str(EXAMPLES / "eval.csv"),)
    assert loaded.result == result.document()
    frame = pd.read_csv(EXAMPLES / "eval.csv")
    searches = frame.loc[frame["surface"] == "search", "request_id"].nunique()
    assert loaded.slices[(("surface", "search"), ("model", "ranker-v12"))]["requests"] == searches
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="other/1"), "format"),
        (lambda d: d.pop("rows"), "missing key 'rows'"),
        (lambda d: d.update(created="yesterday"), "RFC 3339"),
        (lambda d: d.update(created="2026-11-30T06:00:00"), "time zone"),
        (lambda d: d.update(rows=-1), "rows"),
        (lambda d: d.update(options={"gain": "cubic"}), "options"),
        (lambda d: d.update(slice_by=["colour"]), "slice_by"),
        (lambda d: d["result"]["overall"].update(mrr="high"), "result.overall.mrr"),
        (lambda d: d["result"]["overall"].pop("auc_pr"), "auc_pr"),
        (lambda d: d["result"]["slices"][0].pop("segment"), "segment"),
        (lambda d: d["result"].update(slices={}), "slices"),
        (lambda d: d.update(model=3), "model"),
    ],
)
def test_corrupt_baselines_are_rejected_with_a_reason(tmp_path: Path, mutate, message: str) -> None:
    doc = json.loads(json.dumps(write_baseline(tmp_path / "b.json", compute_baseline(
        read_evaluation_files([EXAMPLES / "eval.csv"])), clock=CLOCK)))  # fmt: skip
    mutate(doc)
    with pytest.raises(ValueError, match=message):
        parse_baseline(doc, source="b.json")


def test_unreadable_baseline_files(tmp_path: Path) -> None:
    (tmp_path / "half.json").write_text('{"format": "rankwatch-baseline/1", "crea')
    with pytest.raises(ValueError, match="invalid JSON"):
        load_baseline(tmp_path / "half.json")
    with pytest.raises(ValueError, match="cannot read"):
        load_baseline(tmp_path / "absent.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="not a JSON object"):
        load_baseline(tmp_path / "list.json")


def test_byte_order_mark_and_non_numbers_of_other_types(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffrequest_id,item_id,score,label\nr1,a,0.5,1\n".encode())
    assert read_evaluation_files([path]).rows == 1
    frame = pd.DataFrame({"request_id": ["a", "a"], "item_id": ["x", "y"], "label": [1, 0],
                          "score": pd.Series([{"v": 1}, " 0.5 "], dtype=object)})  # fmt: skip
    with pytest.raises(InvalidEvaluationData, match=r"row 1: score is not a number: \{'v': 1\}"):
        compute_baseline(frame)
    frame["score"] = pd.to_datetime(["2020-01-01", "2020-01-02"])
    with pytest.raises(InvalidEvaluationData, match="row 1: score is not a number"):
        compute_baseline(frame)


@pytest.mark.parametrize("dtype", ["str", "int64", "object"])
def test_a_request_id_that_comes_back_later_is_one_request(dtype: str) -> None:
    ids = pd.Series([1, 1, 2, 2, 1], dtype=dtype) if dtype == "int64" else pd.Series(["1", "1", "2", "2", "1"], dtype=dtype)
    frame = pd.DataFrame({"request_id": ids, "item_id": list("abcde"), "score": [0.5, 0.4, 0.3, 0.2, 0.9],
                          "label": [0, 0, 1, 0, 1]})  # fmt: skip
    result = compute_baseline(frame)
    assert result.overall.requests == 2 and result.overall.values()["mrr"] == 1.0
    grouped = compute_baseline(frame.iloc[[0, 1, 4, 2, 3]])
    assert grouped.document() == result.document()
