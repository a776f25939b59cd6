"""``rankwatch inspect --file``: each event as the section 1 event it maps to, or its rejection reason."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from rankwatch.cli import cli, main

CONFIG = """
[events.impressions.fields]
request_id = "req.id"
ts = { path = "at", unit = "s" }
items = "results"
item_id = "sku"
position = { path = "rank", base = 0 }
score = "s"
"""


def test_inspect_file_json_and_table(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(CONFIG)
    lines = [{"event_id": "a", "req": {"id": 17}, "at": 1.5, "results": [{"sku": 1, "rank": 0, "s": 0.5}]},
             {"event_id": "b", "at": 2, "results": []},
             {"event_id": "c", "req": {"id": 18}, "at": 2, "results": [{"sku": 1, "rank": -1, "s": 0.5}]}]
    (tmp_path / "e.jsonl").write_text("\n".join(json.dumps(d) for d in lines) + "\nnot json\n")
    args = ["inspect", "--config", str(tmp_path / "c.toml"), "--file", str(tmp_path / "e.jsonl"), "--format", "json"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows[0]["events"] == [{"event_id": "a", "request_id": 17, "ts": 1500,
                                  "items": [{"item_id": 1, "position": 1, "score": 0.5}]}]
    assert [r.get("rejected") for r in rows] == [None, "missing_field", "bad_position", "invalid_json"]
    assert "path req.id" in rows[1]["detail"]
    table = CliRunner().invoke(cli, [*args[:-2], "--limit", "2"])
    assert table.exit_code == 0 and "missing_field" in table.stdout and "bad_position" not in table.stdout


def test_inspect_needs_one_source(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "c.toml").write_text(CONFIG)
    assert main(["inspect", "--config", str(tmp_path / "c.toml")]) != 0
    assert "exactly one of --file PATH or --topic NAME" in capsys.readouterr().err
    (tmp_path / "bad.toml").write_text('[events.impressions.fields]\nrequest_id = "a..b"\n')
    assert main(["inspect", "--config", str(tmp_path / "bad.toml"), "--file", "x"]) == 2
    err = capsys.readouterr().err
    assert "events.impressions.fields.request_id.path: malformed" in err and err.count("\n") == 1
