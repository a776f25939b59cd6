"""``rankwatch offline``: output formats, options, baseline files and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rankwatch.cli import main
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import compute_baseline, load_baseline
from rankwatch.pipeline.slicing import SliceSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "eval.csv")


def run_json(capsys, *args: str) -> dict:
    assert main(["offline", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def assert_equal_to_rounding(got: object, want: object, where: str = "") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), where
        for key in want:
            assert_equal_to_rounding(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_equal_to_rounding(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), where
    else:
        assert got == want, where


def test_json_is_the_result_document(capsys) -> None:
    doc = run_json(capsys, EXAMPLE)
    expected = json.loads(json.dumps(compute_baseline(pd.read_csv(EXAMPLE)).document()))
    # The command streams its input (merged per-batch moments): floats equal to rounding, the rest exactly.
    assert_equal_to_rounding(doc, expected)
    assert list(doc["overall"]) == ["requests", "requests_with_relevant", "items", "mrr", "ndcg@5", "ndcg@10",
                                    "map@10", "precision@5", "precision@10", "recall@10", "hit_rate@10",
                                    "auc_roc", "auc_pr", "gauc", "gauc_groups", "gauc_groups_excluded", "gauc_items_dropped",
                                    "positive_rate", "positives", "position_ctr", "position_shown", "stderr", "score_distribution"]  # fmt: skip
    assert list(doc["overall"]["stderr"]) == ["mrr", "ndcg@5", "ndcg@10", "map@10", "precision@5", "precision@10",
                                              "recall@10", "hit_rate@10", "auc_roc", "auc_pr", "gauc"]
    assert {(s["segment"], s["surface"]) for s in doc["slices"]} == {
        (seg, surf) for seg in ("new_user", "returning", "power_user") for surf in ("home_feed", "search")
    }


def test_options_reach_the_kernel(capsys) -> None:
    frame = pd.read_csv(EXAMPLE)
    doc = run_json(capsys, EXAMPLE, "--k", "3,20", "--gain", "linear", "--map-norm", "min-relevant-k",
                   "--no-relevant", "zero", "--by", "surface")  # fmt: skip
    options = MetricOptions(ndcg_cutoffs=(3, 20), map_cutoffs=(3, 20), gain="linear",
                            map_normalization="min_relevant_k", no_relevant="zero")  # fmt: skip
    expected = compute_baseline(frame, options=options, slice_spec=SliceSpec(by=("surface",)))
    assert_equal_to_rounding(doc, json.loads(json.dumps(expected.document())))
    doc = run_json(capsys, EXAMPLE, "--k", "3", "--map-k", "7", "--by", "")
    assert {"ndcg@3", "map@7"} <= set(doc["overall"]) and "map@3" not in doc["overall"] and doc["slices"] == []
    doc = run_json(capsys, EXAMPLE, "--ndcg-k", "1", "--by", "segment", "--max-label-values", "1")
    assert "ndcg@1" in doc["overall"] and "map@10" in doc["overall"]
    assert sorted(s["segment"] for s in doc["slices"]) == ["__other__", "new_user"]
    assert doc["label_overflow"]["segment"] == doc["overall"]["requests"] - doc["slices"][1]["requests"]


def test_output_writes_a_loadable_baseline_and_table_output(capsys, tmp_path: Path) -> None:
    out = tmp_path / "baseline.json"
    assert main(["offline", EXAMPLE, "--output", str(out)]) == 0
    text = capsys.readouterr().out
    baseline = load_baseline(out)
    assert baseline.inputs == (EXAMPLE,) and baseline.rows == 364 and baseline.model == "ranker-v12"
    overall = baseline.overall
    # The table shows the overall row, every slice and the share of requests with a relevant item.
    share = overall["requests_with_relevant"] / overall["requests"]
    assert "overall" in text and f"{share:.1%}" in text and "power_user" in text and f"{overall['mrr']:.4f}" in text
    assert f"baseline written to {out}" in text


def test_skip_invalid_counts_rows(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    lines = Path(EXAMPLE).read_text().splitlines()
    lines[5] = lines[5].replace(",0.", ",oops")  # the score of data row 5
    bad.write_text("\n".join(lines) + "\n")
    assert main(["offline", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}: row 5: score is not a number" in err
    doc = run_json(capsys, str(bad), "--skip-invalid")
    assert doc["skipped_rows"] == 1 and doc["overall"]["items"] == 363
    assert main(["offline", str(bad), "--skip-invalid"]) == 0
    assert "skipped 1 invalid rows (bad_score 1)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["missing.csv"], 1, "missing.csv: no such file"),
        ([EXAMPLE, "--by", "colour"], 2, "cannot slice by 'colour'"),
        ([EXAMPLE, "--k", "0"], 2, "--k takes a comma list of positive integers"),
        ([EXAMPLE, "--map-k", "ten"], 2, "--map-k takes a comma list"),
        ([EXAMPLE, "--gain", "cubic"], 2, "--gain"),
        ([EXAMPLE, "--max-label-values", "0"], 2, "--max-label-values"),
        ([], 2, "Missing argument"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(capsys, args: list[str], code: int, message: str) -> None:
    assert main(["offline", *args]) == code
    err = capsys.readouterr().err
    assert err.startswith("rankwatch: error:") and err.count("\n") == 1 and message in err


def test_unknown_column_layout_is_one_line(capsys, tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("request,item_id,score,label\nr1,a,0.5,1\n")
    assert main(["offline", str(path)]) == 1
    assert "missing column 'request_id'" in capsys.readouterr().err


def test_subprocess_json_and_error() -> None:
    ok = subprocess.run([sys.executable, "-m", "rankwatch.cli", "offline", EXAMPLE, "--format", "json"],
                        capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert ok.returncode == 0 and json.loads(ok.stdout)["overall"]["requests"] == 40
    bad = subprocess.run([sys.executable, "-m", "rankwatch.cli", "offline", "nope.parquet"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
