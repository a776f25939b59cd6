"""consumers/decoding.py: format keys checked at load, decoders that reject bad bytes with a reason, and the
schema gate that holds records while the registry is down (an outage) and ships what it learns to the core."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastavro")

from rankwatch.config import config_from_dict  # noqa: E402
from rankwatch.consumers.decoding import SchemaCache, SchemaGate, build_decoders, format_specs  # noqa: E402
from rankwatch.consumers.outage import FatalKafkaError, KafkaOutage  # noqa: E402
from rankwatch.consumers.registry import RegistryRefused  # noqa: E402
from rankwatch.errors import ConfigError  # noqa: E402
from rankwatch.pipeline.events.formats import RegistryUnavailable, UnknownSchema  # noqa: E402
from rankwatch.pipeline.events.formats.avro import ConfluentAvroEncoder, RawAvroEncoder, parse_schema  # noqa: E402
from rankwatch.pipeline.events.mapping import EventMapping  # noqa: E402
from rankwatch.pipeline.events.validation import Rejection  # noqa: E402

SCHEMA = {"type": "record", "name": "Click", "fields": [
    {"name": "rid", "type": "string"}, {"name": "sku", "type": "long"}, {"name": "at", "type": "long"}]}
RECORD = {"rid": "r1", "sku": 7, "at": 1_764_460_800_000}


def _events(**table: object) -> EventMapping:
    return EventMapping.from_tables({"clicks": {**table, "fields": {"request_id": "rid", "item_id": "sku", "ts": "at"}}})


@pytest.mark.parametrize(("table", "says"), [
    ({"format": "avro"}, "schema_file"),
    ({"format": "avro", "framing": "confluent"}, "[schema_registry]"),
    ({"format": "protobuf", "descriptor_set": "x.desc"}, "message"),
    ({"format": "json", "schema_file": "x.avsc"}, "schema_file"),
    ({"format": "avro", "schema_file": "missing.avsc"}, "missing.avsc"),
    ({"format": "avro", "framing": "gzip"}, "framing"),
])
def test_format_keys_are_checked_at_load(tmp_path: Path, table: dict, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"events": {"clicks": table}}, where="c.toml", base=tmp_path)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_raw_avro_decoder_maps_and_rejects_bad_bytes(tmp_path: Path) -> None:
    (tmp_path / "click.avsc").write_text(json.dumps(SCHEMA))
    specs = format_specs(_events(format="avro", schema_file="click.avsc"), base=tmp_path)
    decode = build_decoders(specs, None, 1000)["clicks"]
    raw = RawAvroEncoder(parse_schema(SCHEMA)).encode(RECORD)
    assert decode(raw) == RECORD
    bad = decode(raw + b"\x01")
    assert isinstance(bad, Rejection) and bad.reason == "undecodable"
    assert decode(b"x" * 2000).reason == "too_large"


class FakeRegistry:
    resource = "schema registry http://fake"

    def __init__(self) -> None:
        self.down = False
        self.refuse = False
        self.schemas = {5: json.dumps(SCHEMA)}
        self.asked: list[int] = []

    def schema_of(self, schema_type: str):  # noqa: ANN201
        def schema_of(schema_id: int) -> str:
            self.asked.append(schema_id)
            if self.refuse:
                raise RegistryRefused("schema registry http://fake: refused (401)")
            if self.down:
                raise RegistryUnavailable("schema registry http://fake: failed (ConnectError)")
            if schema_id not in self.schemas:
                raise UnknownSchema(schema_id)
            return self.schemas[schema_id]
        return schema_of


class Cores:
    def __init__(self) -> None:
        self.cache = SchemaCache()

    def add_schemas(self, entries: dict) -> None:
        self.cache.update(entries)


def _rec(value: bytes) -> SimpleNamespace:
    return SimpleNamespace(value=value)


def test_the_gate_holds_records_while_the_registry_is_down_and_ships_schemas_to_the_core() -> None:
    registry, cores = FakeRegistry(), Cores()
    outage = KafkaOutage(resource=registry.resource, clock=lambda: 0.0)
    gate = SchemaGate(registry, {"clicks": "AVRO"}, outage)
    enc = ConfluentAvroEncoder(5, parse_schema(SCHEMA))
    values = [enc.encode(RECORD), enc.encode(RECORD), ConfluentAvroEncoder(9, parse_schema(SCHEMA)).encode(RECORD),
              b"not framed"]
    assert gate.ready(cores)  # nothing pending
    gate.note("impressions", [_rec(v) for v in values])  # not a Confluent topic: nothing to resolve
    assert not gate.blocked
    registry.down = True
    gate.note("clicks", [_rec(v) for v in values])
    assert gate.blocked and not gate.ready(cores) and outage.active and outage.backoff() > 0
    registry.down = False
    assert gate.ready(cores) and not outage.active and not gate.blocked
    decode = build_decoders({"clicks": format_specs(_events(format="avro", framing="confluent"),
                                                    registry=object())["clicks"]},
                            cores.cache.schema_of, 10_000)["clicks"]
    assert decode(values[0]) == RECORD
    unknown = decode(values[2])
    assert isinstance(unknown, Rejection) and unknown.reason == "unknown_schema"
    assert decode(values[3]).reason == "undecodable"
    asked = len(registry.asked)
    gate.note("clicks", [_rec(values[0])])  # found ids are never asked again
    assert gate.ready(cores) and len(registry.asked) == asked


def test_refused_credentials_end_the_service_with_one_line() -> None:
    registry = FakeRegistry()
    registry.refuse = True
    gate = SchemaGate(registry, {"clicks": "AVRO"})
    gate.note("clicks", [_rec(ConfluentAvroEncoder(5, parse_schema(SCHEMA)).encode(RECORD))])
    with pytest.raises(FatalKafkaError) as err:
        gate.ready(Cores())
    assert "401" in str(err.value)
