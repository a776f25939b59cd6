"""``rankwatch replay --config`` of ``.avro`` object container files (schema inside) gives exactly plain
replay's result, windows and counts on the same section 1 events; ``rankwatch inspect --file`` reads them."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("fastavro")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from foreign_shapes import AVRO, EVENTS_TOML, team_records  # noqa: E402

from rankwatch.cli import cli  # noqa: E402
from rankwatch.pipeline.events.formats.avro import parse_schema, write_container  # noqa: E402
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_events  # noqa: E402

CONFIG = EVENTS_TOML.replace("[events.impressions.fields]", '[events.impressions]\nformat = "avro"\nframing = "none"\n'
                             'schema_file = "impressions.avsc"\n\n[events.impressions.fields]').replace(
    "[events.clicks.fields]", '[events.clicks]\nformat = "avro"\nschema_file = "clicks.avsc"\n\n[events.clicks.fields]')


def _traffic() -> dict[str, list[bytes]]:
    cfg = TrafficConfig(seed=3, requests_per_second=20, duration_s=240, items_per_request=5, duplicate_rate=0.05,
                        out_of_order_ms=20_000, attribution_window_ms=60_000)
    out: dict[str, list[bytes]] = {"impressions": [], "clicks": []}
    for e in generate_events(cfg):
        out[e.stream].append(e.value)
    return out


def _replay(tmp: Path, name: str, imp: Path, clk: Path, config: Path | None) -> dict:
    args = ["replay", "--impressions", str(imp), "--clicks", str(clk), "--format", "json", "--window", "1m,5m",
            "--attribution-window", "1m", "--allowed-disorder", "30s", "--windows-out", str(tmp / f"{name}.w")]
    if config is not None:
        args += ["--config", str(config)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return {"result": json.loads(result.stdout), "summary": result.stderr.strip(),
            "windows": (tmp / f"{name}.w").read_text().splitlines()}


def test_avro_container_files_replay_exactly_as_the_native_events(tmp_path: Path) -> None:
    traffic = _traffic()
    native = {}
    for stream, values in traffic.items():
        native[stream] = tmp_path / f"{stream}.jsonl"
        native[stream].write_bytes(b"".join(v + b"\n" for v in values))
        (tmp_path / f"{stream}.avsc").write_text(json.dumps(AVRO[stream]))
        buf = io.BytesIO()
        write_container(buf, parse_schema(AVRO[stream]), team_records(stream, values), codec="deflate")
        (tmp_path / f"{stream}.avro").write_bytes(buf.getvalue())
    (tmp_path / "team.toml").write_text(CONFIG)
    plain = _replay(tmp_path, "plain", native["impressions"], native["clicks"], None)
    avro = _replay(tmp_path, "avro", tmp_path / "impressions.avro", tmp_path / "clicks.avro", tmp_path / "team.toml")
    assert plain["result"]["overall"]["requests"] > 1000 and "duplicate" in plain["summary"]
    assert avro == plain

    shown = CliRunner().invoke(cli, ["inspect", "--config", str(tmp_path / "team.toml"), "--file",
                                     str(tmp_path / "clicks.avro"), "--stream", "clicks", "--limit", "3",
                                     "--format", "json"])
    assert shown.exit_code == 0, shown.output
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [r["source"] for r in rows] == ["clicks.avro#1", "clicks.avro#2", "clicks.avro#3"]
    first = json.loads(traffic["clicks"][0])
    assert rows[0]["events"][0]["event_id"] == first["event_id"]


def test_an_avro_file_for_a_json_stream_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "plain.toml").write_text(EVENTS_TOML)
    (tmp_path / "x.avro").write_bytes(b"")
    result = CliRunner().invoke(cli, ["replay", "--impressions", str(tmp_path / "x.avro"), "--config",
                                      str(tmp_path / "plain.toml")])
    assert result.exit_code != 0 and 'need format = "avro"' in str(result.exception)
    assert "\n" not in str(result.exception)
