"""The transfer ledger: round trip, defaults, validation errors naming file and line, latest per comparison."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rankwatch.pipeline.transfer.ledger import (
    Difference,
    LedgerEntry,
    LedgerError,
    append_to_ledger,
    entry_to_line,
    latest_entries,
    parse_ledger_line,
    read_ledgers,
)


def _doc(**over: object) -> dict:
    doc = {"experiment": "e1", "candidate": "v2", "reference": "v1", "segment": "new_user", "surface": "search",
           "metric": "ndcg@10", "online_metric": "mrr", "offline": {"diff": 0.01, "stderr": 0.002, "n": 500},
           "online": {"diff": 0.004, "stderr": 0.001, "n": 90000}, "recorded_at": "2026-12-01T10:00:00Z"}  # fmt: skip
    doc.update(over)
    return doc


def test_round_trip_keeps_every_field_and_the_spec_key_order() -> None:
    entry = parse_ledger_line(json.dumps(_doc()))
    assert entry.offline == Difference(0.01, 0.002, 500) and entry.online_metric == "mrr"
    line = entry_to_line(entry)
    assert list(json.loads(line)) == ["experiment", "candidate", "reference", "segment", "surface", "metric",
                                      "online_metric", "offline", "online", "recorded_at"]  # fmt: skip
    assert json.loads(line) == _doc()
    assert parse_ledger_line(line) == entry


def test_online_metric_defaults_to_metric_and_unknown_keys_are_ignored() -> None:
    doc = _doc(extra={"x": 1})
    del doc["online_metric"]
    assert parse_ledger_line(json.dumps(doc)).online_metric == "ndcg@10"
    assert parse_ledger_line(json.dumps(_doc(online_metric=None))).online_metric == "ndcg@10"
    e = LedgerEntry(experiment="e", candidate="c", reference="r", segment="s", surface="f", metric="m",
                    offline=Difference(1, 0, 1), online=Difference(0.5, 0.1, 2), recorded_at="2026-01-01T00:00:00+01:00")  # fmt: skip
    assert e.online_metric == "m" and isinstance(e.offline.diff, float)


@pytest.mark.parametrize(("change", "expected"), [
    ({"experiment": 3}, "experiment: Expected str"),
    ({"segment": ""}, "segment must be a non-empty string"),
    ({"offline": {"diff": 0.1, "stderr": -1.0, "n": 3}}, "stderr must be >= 0"),
    ({"offline": {"diff": 0.1, "stderr": 1.0}}, "offline: Object missing required field n"),
    ({"online": {"diff": 0.1, "stderr": 1.0, "n": 0}}, "n must be a positive integer"),
    ({"online": {"diff": 0.1, "stderr": 1.0, "n": 1.5}}, "online.n: Expected int"),
    ({"recorded_at": "2026-12-01T10:00:00"}, "RFC 3339"),
    ({"recorded_at": "2026-13-01T10:00:00Z"}, "not a valid instant"),
])  # fmt: skip
def test_bad_lines_name_file_line_and_field(change: dict, expected: str) -> None:
    with pytest.raises(LedgerError, match="^ledger.jsonl:7: ") as info:
        parse_ledger_line(json.dumps(_doc(**change)), source="ledger.jsonl", line_number=7)
    assert expected in str(info.value)


def test_not_json_and_missing_files() -> None:
    with pytest.raises(LedgerError, match="^f:2: not a JSON object"):
        parse_ledger_line("{oops", source="f", line_number=2)
    with pytest.raises(LedgerError, match="nope.jsonl: no such ledger file"):
        read_ledgers(["nope.jsonl"])


def test_read_ledgers_plain_and_gzip_skip_blank_lines_and_count_lines(tmp_path: Path) -> None:
    plain, packed = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    plain.write_text(json.dumps(_doc()) + "\n\n" + json.dumps(_doc(candidate="v3")) + "\n")
    with gzip.open(packed, "wt") as f:
        f.write(json.dumps(_doc(candidate="v4")) + "\n")
    assert [e.candidate for e in read_ledgers([plain, str(packed)])] == ["v2", "v3", "v4"]
    plain.write_text(json.dumps(_doc()) + "\n\n" + '{"experiment": "e"}\n')
    with pytest.raises(LedgerError, match=r"a.jsonl:3: Object missing required field"):
        read_ledgers([plain])


def test_append_then_read_back(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    entries = [parse_ledger_line(json.dumps(_doc(candidate=f"v{i}"))) for i in range(3)]
    assert append_to_ledger(path, entries[:2]) == 2 and append_to_ledger(path, entries[2:]) == 1
    assert read_ledgers([path]) == entries


def test_latest_entries_keeps_the_latest_recording_of_each_comparison() -> None:
    first = parse_ledger_line(json.dumps(_doc(recorded_at="2026-12-01T10:00:00Z")))
    later = parse_ledger_line(json.dumps(_doc(recorded_at="2026-12-01T11:30:00+01:00", online={"diff": 1.0, "stderr": 1.0, "n": 2})))
    earlier = parse_ledger_line(json.dumps(_doc(recorded_at="2026-12-01T09:00:00Z")))
    other = parse_ledger_line(json.dumps(_doc(surface="home")))
    assert latest_entries([first, other, later, earlier]) == [later, other]
