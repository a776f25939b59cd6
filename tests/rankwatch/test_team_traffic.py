"""``rankwatch simulate --config`` writes the generator's events in the config's schema: read back through
the same config's translator they are the generator's section 1 events (JSON and raw Avro); Protobuf is
refused with one line; malformed events are sent as they are."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from foreign_shapes import EVENTS_TOML, write_avsc  # noqa: E402

from rankwatch.commands.team_traffic import in_team_schema, team_encoders  # noqa: E402
from rankwatch.config import load_config  # noqa: E402
from rankwatch.consumers.decoding import translator_of  # noqa: E402
from rankwatch.errors import ConfigError  # noqa: E402
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_events  # noqa: E402

TOPICS = {"impressions": "imp", "clicks": "clk"}
AVRO_HEAD = {s: f'[events.{s}]\nformat = "avro"\nschema_file = "{s}.avsc"\n\n[events.{s}.fields]'
             for s in ("impressions", "clicks")}


def _config(tmp: Path, avro: bool) -> Path:
    text = EVENTS_TOML
    if avro:
        pytest.importorskip("fastavro")
        write_avsc(tmp)
        for s, head in AVRO_HEAD.items():
            text = text.replace(f"[events.{s}.fields]", head)
    (tmp / "team.toml").write_text(text)
    return tmp / "team.toml"


@pytest.mark.parametrize("avro", [False, True], ids=["json", "avro"])
def test_traffic_in_the_team_schema_reads_back_as_the_generated_events(tmp_path: Path, avro: bool) -> None:
    cfg = load_config(_config(tmp_path, avro))
    events = list(itertools.islice(generate_events(TrafficConfig(duration_s=20, malformed_rate=0.1)), 400))
    natives: list[bytes] = []
    sent = list(in_team_schema(events, team_encoders(cfg, TOPICS), on_native=lambda e: natives.append(e.value)))
    assert natives == [e.value for e in events] and len(sent) == len(events)
    translator = translator_of(cfg.events, cfg.formats, None, 1_000_000)
    same = 0
    for original, out in zip(events, sent, strict=True):
        assert out.key == original.key and out.ts_ms == original.ts_ms
        try:
            want = json.loads(original.value)
        except ValueError:
            assert out.value == original.value  # malformed on purpose: as it was
            continue
        back = translator.translate(original.stream, out.value)
        if isinstance(back, list) and isinstance(want, dict):
            same += [_ms_ts(json.loads(b)) for b in back] == [_ms_ts(want)]
    valid = sum(not e.value.startswith(b"{\"bad") for e in events)
    assert same >= 0.9 * valid, (same, valid)


def _ms_ts(event: dict) -> dict:
    """``ts`` as epoch ms (the clicks' rfc3339 unit gives it back as a string)."""
    from datetime import datetime

    ts = event.get("ts")
    if isinstance(ts, str):
        event = {**event, "ts": round(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)}
    return event


def test_protobuf_traffic_is_refused_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("google.protobuf")
    from foreign_shapes import descriptor_set

    descriptor_set(tmp_path / "team.desc")
    text = EVENTS_TOML.replace("[events.clicks.fields]", '[events.clicks]\nformat = "protobuf"\n'
                               'descriptor_set = "team.desc"\nmessage = "shop.team.Click"\n\n[events.clicks.fields]')
    (tmp_path / "p.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        team_encoders(load_config(tmp_path / "p.toml"), TOPICS)
    assert "protobuf" in str(err.value) and "\n" not in str(err.value)
