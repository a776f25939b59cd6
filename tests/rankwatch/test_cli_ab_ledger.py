"""``rankwatch ab --arm model`` paired over shared requests, and ``--ledger FILE --offline ...``: the lines
against naive per-request differences (a dict of requests per model, statistics.stdev), the report's own
diff and standard error, and the unpaired baseline rule sqrt(se1^2 + se2^2)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankwatch.cli import main
from rankwatch.pipeline.transfer.ledger import read_ledgers
from tests.pipeline import naive_metrics as naive


def _rows(seed: int, n_requests: int, shared: bool) -> pd.DataFrame:
    """Each request scored by v1 and v2 (``shared``) or by one of them; v2 ranks relevant items higher."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n_requests):
        seg = str(rng.choice(["new_user", "returning"]))
        labels = rng.choice([0, 0, 0, 1, 2], size=int(rng.integers(2, 10)))
        models = ["v1", "v2"] if shared else [str(rng.choice(["v1", "v2"]))]
        base = rng.normal(size=labels.size)  # what both models see in an item: their scores correlate
        for model in models:
            lift = 0.8 if model == "v2" else 0.4
            for i, lab in enumerate(labels):
                rows.append({"request_id": f"q{r}", "item_id": f"i{i}", "score": float(lab * lift + base[i] + 0.3 * rng.normal()),
                             "label": int(lab), "segment": seg, "surface": "home", "model": model})  # fmt: skip
    return pd.DataFrame(rows)


def _naive_paired(frame: pd.DataFrame, segment: str | None, metric: str) -> tuple[int, float, float]:
    diffs = []
    for _rid, req in frame.groupby("request_id", sort=False):
        if segment is not None and req["segment"].iloc[0] != segment:
            continue
        vals = {}
        for model, lst in req.groupby("model"):
            order = naive.order_by_score(lst["score"].tolist())
            vals[model] = naive.request_metrics([float(lst["label"].iloc[i]) for i in order])[metric]
        if vals.get("v1") is not None and vals.get("v2") is not None:
            diffs.append(vals["v2"] - vals["v1"])
    return len(diffs), statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))


def _ab(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["ab", *args, "--arm", "model", "--control", "v1", "--treatment", "v2", "--min-requests", "10",
                 "--format", "json"]) == 0  # fmt: skip
    return json.loads(capsys.readouterr().out)


def test_paired_report_on_shared_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    frame = _rows(1, 300, shared=True)
    path = tmp_path / "eval.csv"
    frame.to_csv(path, index=False)
    doc = _ab(capsys, str(path), "--by", "segment")
    row = next(p for p in doc["paired"] if p["metric"] == "ndcg@10" and p["segment"] == "new_user")
    n, diff, se = _naive_paired(frame, "new_user", "ndcg@10")
    assert row["paired"] is True and row["n_pairs"] == n
    assert row["diff"] == pytest.approx(diff, abs=1e-12)
    assert row["stderr"] == pytest.approx(se, rel=1e-9)
    assert row["diff_ci"] == pytest.approx([diff - 1.959963984540054 * se, diff + 1.959963984540054 * se])
    unpaired = next(c for c in doc["comparisons"] if c["metric"] == "ndcg@10" and c["segment"] == "new_user")
    assert unpaired["diff"] == pytest.approx(diff, abs=1e-9)  # same requests in both arms: same means
    assert unpaired["diff_stderr"] > 1.5 * se  # pairing removes the shared request variance


@pytest.mark.parametrize("by", ["segment", "segment,surface"])
def test_ledger_lines_from_online_rows_and_paired_offline(tmp_path: Path, capsys, by: str) -> None:
    online, offline = _rows(2, 2000, shared=False), _rows(3, 400, shared=True)
    on_path, off_path, ledger = tmp_path / "online.csv", tmp_path / "offline.csv", tmp_path / "ledger.jsonl"
    online.to_csv(on_path, index=False)
    offline.to_csv(off_path, index=False)
    doc = _ab(capsys, str(on_path), "--by", by, "--ledger", str(ledger), "--offline", str(off_path))
    entries = read_ledgers([ledger])
    segments = {e.segment for e in entries}
    assert segments == ({"new_user", "returning"} if by == "segment" else {"all"})  # one level per ledger
    assert {e.surface for e in entries} == {"all"}
    for e in entries:
        assert (e.experiment, e.candidate, e.reference) == ("experiment", "v2", "v1")
        assert e.recorded_at.endswith("Z")
        c = next(c for c in doc["comparisons"] if c["metric"] == e.metric and c.get("segment", "all") == e.segment
                 and c.get("surface", "all") == "all")  # fmt: skip
        assert (e.online.diff, e.online.stderr, e.online.n) == (c["diff"], c["diff_stderr"], c["n"] + c["n_control"])
        if e.metric in ("mrr", "ndcg@10", "map@10"):
            n, diff, se = _naive_paired(offline, None if e.segment == "all" else e.segment, e.metric)
            assert e.offline.n == n
            assert e.offline.diff == pytest.approx(diff, abs=1e-12)
            assert e.offline.stderr == pytest.approx(se, rel=1e-9)
    assert "auc_roc" in {e.metric for e in entries}
    before = len(entries)
    _ab(capsys, str(on_path), "--by", by, "--ledger", str(ledger), "--offline", str(off_path))
    assert len(read_ledgers([ledger])) == 2 * before  # appended


def test_ledger_from_baseline_files_is_unpaired(tmp_path: Path, capsys) -> None:
    online, offline = _rows(4, 1500, shared=False), _rows(5, 300, shared=True)
    on_path, ledger = tmp_path / "online.csv", tmp_path / "ledger.jsonl"
    online.to_csv(on_path, index=False)
    docs = {}
    for model in ("v1", "v2"):
        rows = tmp_path / f"{model}.csv"
        offline[offline["model"] == model].to_csv(rows, index=False)
        assert main(["offline", str(rows), "--output", str(tmp_path / f"{model}.json")]) == 0
        docs[model] = json.loads((tmp_path / f"{model}.json").read_text())["result"]["overall"]
    capsys.readouterr()
    _ab(capsys, str(on_path), "--by", "", "--ledger", str(ledger), "--offline", str(tmp_path / "v1.json"),
        "--offline", str(tmp_path / "v2.json"))  # fmt: skip
    entry = next(e for e in read_ledgers([ledger]) if e.metric == "mrr")
    assert entry.offline.diff == pytest.approx(docs["v2"]["mrr"] - docs["v1"]["mrr"], abs=1e-12)
    assert entry.offline.stderr == pytest.approx(math.hypot(docs["v2"]["stderr"]["mrr"], docs["v1"]["stderr"]["mrr"]))


def test_ledger_without_offline_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "online.csv"
    _rows(6, 100, shared=False).to_csv(path, index=False)
    code = main(["ab", str(path), "--arm", "model", "--control", "v1", "--treatment", "v2", "--ledger",
                 str(tmp_path / "l.jsonl")])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "--offline" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
