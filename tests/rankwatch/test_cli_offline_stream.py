"""``rankwatch offline`` streaming options: --memory-limit, --layout, --spill-dir, --progress, directories."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from rankwatch.cli import main
from rankwatch.commands.offline import parse_size
from rankwatch.errors import ConfigError
from rankwatch.pipeline.offline.baseline import compute_baseline
from rankwatch.pipeline.offline.readers import read_evaluation_files

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
from offline_data import _close  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "eval.csv"


def run_json(capsys, *args: str) -> dict:  # type: ignore[no-untyped-def]
    assert main(["offline", *args, "--format", "json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


def test_streaming_options_give_the_in_memory_document(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    expected = compute_baseline(read_evaluation_files([EXAMPLE])).document()
    _close(run_json(capsys, str(EXAMPLE)), expected, "doc")
    shuffled = tmp_path / "s.csv"
    pd.read_csv(EXAMPLE, dtype=str, keep_default_na=False).sample(frac=1, random_state=1).to_csv(shuffled, index=False)
    expected_shuffled = compute_baseline(read_evaluation_files([shuffled])).document()
    for layout in ("auto", "scattered"):
        doc = run_json(capsys, str(shuffled), "--layout", layout, "--memory-limit", "512M", "--spill-dir", str(tmp_path))
        _close(doc, expected_shuffled, layout)
    assert list(tmp_path.iterdir()) == [shuffled]  # spill files removed


def test_layout_grouped_on_scattered_rows_is_one_line(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "e.csv"
    path.write_text("request_id,item_id,score,label\na,x,1,1\nb,y,2,0\na,w,1,0\n")
    assert main(["offline", str(path), "--layout", "grouped"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "e.csv: row 3: the rows of a request are not contiguous" in err


def test_directory_input_and_progress_bar(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    frame = pd.read_csv(EXAMPLE, dtype=str, keep_default_na=False)
    (tmp_path / "d" / "day=1").mkdir(parents=True)
    frame.iloc[:100].to_csv(tmp_path / "d" / "day=1" / "a.csv", index=False)
    frame.iloc[100:].to_csv(tmp_path / "d" / "day=1" / "b.csv", index=False)
    (tmp_path / "d" / "_SUCCESS").write_text("")
    expected = compute_baseline(read_evaluation_files([EXAMPLE])).document()
    assert main(["offline", str(tmp_path / "d"), "--format", "json", "--progress"]) == 0
    _close(json.loads(capsys.readouterr().out), expected, "doc")


@pytest.mark.parametrize(("text", "size"), [("1G", 1 << 30), ("768M", 768 << 20), ("1.5GiB", 3 << 29),
                                            ("500000000", 500_000_000), ("2gb", 2 << 30)])  # fmt: skip
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text, "--memory-limit") == size


@pytest.mark.parametrize("text", ["lots", "10M", "", "-1G"])
def test_bad_sizes_are_one_line_errors(capsys, text: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="--memory-limit takes a size of at least 384M"):
        parse_size(text, "--memory-limit")
    assert main(["offline", str(EXAMPLE), "--memory-limit", text]) == 2
    assert capsys.readouterr().err.count("\n") == 1
