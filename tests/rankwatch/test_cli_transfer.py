"""``rankwatch transfer``: the JSON schema of SPEC section 7, the tables, the options and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rankwatch.cli import main
from rankwatch.pipeline.transfer.ledger import Difference, LedgerEntry, append_to_ledger
from rankwatch.pipeline.transfer.report import groups_document, transfer_groups

GROUP_KEYS = ["metric", "online_metric", "segment", "n", "slope_ols", "slope_corrected", "slope_corrected_ci",
              "correlation_corrected", "correlation_corrected_ci", "sign_agreement", "sign_agreement_n",
              "kendall_tau", "predicted_online", "predicted_online_ci", "comparisons"]  # fmt: skip
COMPARISON_KEYS = ["experiment", "candidate", "reference", "segment", "surface", "ratio", "ratio_ci"]


def _ledger(path: Path, seed: int = 0, n: int = 24) -> list[LedgerEntry]:
    rng = np.random.default_rng(seed)
    entries = []
    for i in range(n):
        xi, sx = float(rng.normal(0, 0.01)), float(rng.uniform(0.002, 0.005))
        entries.append(LedgerEntry(
            experiment=f"exp{i // 4}", candidate=f"m{i}", reference="base", segment=("new", "old")[i % 2],
            surface="search", metric=("ndcg@10", "mrr")[i % 3 == 0],
            offline=Difference(xi + float(rng.normal()) * sx, sx, 4000),
            online=Difference(0.5 * xi + float(rng.normal()) * 0.001, 0.001, 80000), recorded_at="2026-12-01T10:00:00Z"))  # fmt: skip
    append_to_ledger(path, entries)
    return entries


def _run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["transfer", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_schema_and_values_match_the_report_api(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ledger.jsonl"
    entries = _ledger(path)
    doc = _run_json(capsys, str(path), "--candidate", "0.01,0.002", "--bootstrap", "300", "--seed", "4")
    assert list(doc) == ["groups"] and [g["metric"] for g in doc["groups"]] == ["mrr", "ndcg@10"]
    for g in doc["groups"]:
        assert list(g) == GROUP_KEYS and g["segment"] == "all"
        assert all(list(c) == COMPARISON_KEYS for c in g["comparisons"]) and len(g["comparisons"]) == g["n"]
        for key in ("slope_corrected_ci", "correlation_corrected_ci", "predicted_online_ci"):
            assert g[key] is None or (len(g[key]) == 2 and g[key][0] <= g[key][1])
        assert isinstance(g["sign_agreement_n"], int)
    expected = groups_document(transfer_groups(entries, candidate=(0.01, 0.002), seed=4, resamples=300))
    assert doc == json.loads(json.dumps(expected))


def test_metric_filter_by_segment_and_several_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _ledger(a, seed=1)
    _ledger(b, seed=2)  # same comparison keys and recorded_at: the later file's line wins
    doc = _run_json(capsys, str(a), str(b), "--metric", "ndcg@10", "--by", "segment", "--bootstrap", "100")
    assert [(g["metric"], g["segment"]) for g in doc["groups"]] == [("ndcg@10", "new"), ("ndcg@10", "old")]
    assert all(g["predicted_online"] is None and g["predicted_online_ci"] is None for g in doc["groups"])
    assert sum(g["n"] for g in doc["groups"]) == 16


def test_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ledger.jsonl"
    _ledger(path)
    append_to_ledger(path, [LedgerEntry(experiment="zero", candidate="z", reference="base", segment="new",
                                        surface="search", metric="mrr", offline=Difference(0.0, 0.01, 10),
                                        online=Difference(0.001, 0.001, 10), recorded_at="2026-12-01T10:00:00Z")])  # fmt: skip
    assert main(["transfer", str(path), "--candidate", "0.01,0.002", "--bootstrap", "200"]) == 0
    out = capsys.readouterr().out
    for text in ("slope OLS", "slope corrected", "sign agreement", "kendall tau-b", "predicted online",
                 "offline interval holds 0", "zero", "ndcg@10", "mrr"):  # fmt: skip
        assert text in out


@pytest.mark.parametrize(("content", "args", "message"), [
    (None, (), "missing.jsonl: no such ledger file"),
    ('{"experiment": "e"}\n', (), "ledger.jsonl:1: Object missing required field"),
    ("\nnot json\n", (), "ledger.jsonl:2: not a JSON object"),
    ("", ("--candidate", "0.1"), "--candidate takes DIFF,STDERR"),
    ("", ("--candidate", "0.1,-1"), "STDERR >= 0"),
    ("", ("--candidate", "0.1,nan"), "finite"),
])  # fmt: skip
def test_bad_input_is_one_line_naming_the_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                content: str | None, args: tuple[str, ...], message: str) -> None:  # fmt: skip
    path = tmp_path / ("missing.jsonl" if content is None else "ledger.jsonl")
    if content is not None:
        path.write_text(content)
    assert main(["transfer", str(path), *args]) != 0
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_unknown_metric_and_empty_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ledger.jsonl"
    _ledger(path)
    assert main(["transfer", str(path), "--metric", "map@10"]) == 1
    assert "no comparison of metric 'map@10'" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert _run_json(capsys, str(empty)) == {"groups": []}
    assert main(["transfer"]) == 2


def test_table_notes_an_undefined_leave_one_out_slope(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Without the outlier the offline spread (0.01 apart) is below its noise (sx = 0.05): no interval.
    path = tmp_path / "ledger.jsonl"
    append_to_ledger(path, [
        LedgerEntry(experiment=f"e{i}", candidate=f"m{i}", reference="base", segment="all", surface="all",
                    metric="ndcg@10", offline=Difference(x, 0.05, 1000), online=Difference(x, 0.01, 1000),
                    recorded_at="2026-12-01T10:00:00Z")
        for i, x in enumerate((0.0, 0.01, 0.02, 1.0))])  # fmt: skip
    assert main(["transfer", str(path), "--bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert "ndcg@10/all: slope defined in 3 of 4 leave-one-out fits (no interval)" in out
