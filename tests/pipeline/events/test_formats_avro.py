"""Avro decoding against fastavro's own writer: raw datums, Confluent framing, container files, bad bytes."""

import io
import json
from pathlib import Path

import pytest

from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.formats import (
    UNDECODABLE,
    UNKNOWN_SCHEMA,
    DecodeError,
    RegistryUnavailable,
    UnknownSchema,
)
from rankwatch.pipeline.events.formats.avro import (
    ConfluentAvroDecoder,
    ConfluentAvroEncoder,
    RawAvroDecoder,
    RawAvroEncoder,
    iter_container,
    load_schema_file,
    parse_schema,
    write_container,
)

SCHEMA = {
    "type": "record",
    "name": "Impression",
    "namespace": "shop",
    "fields": [
        {"name": "meta", "type": {"type": "record", "name": "Meta", "fields": [
            {"name": "id", "type": "string"},
            {"name": "sent_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ]}},
        {"name": "req", "type": "long"},
        {"name": "tier", "type": ["null", {"type": "enum", "name": "Tier", "symbols": ["N", "R", "P"]}],
         "default": None},
        {"name": "page", "type": ["null", "string"], "default": None},
        {"name": "results", "type": {"type": "array", "items": {"type": "record", "name": "Result", "fields": [
            {"name": "sku", "type": "long"}, {"name": "rank", "type": "int"}, {"name": "s", "type": "double"},
        ]}}},
        {"name": "attrs", "type": {"type": "map", "values": "string"}, "default": {}},
    ],
}
RECORD = {
    "meta": {"id": "imp-1", "sent_at": 1_764_460_800_123},
    "req": 2**40 + 7,  # beyond int32: must stay an exact int
    "tier": "R",
    "page": None,
    "results": [{"sku": 101, "rank": 0, "s": 0.91}, {"sku": 7, "rank": 1, "s": -2.5}],
    "attrs": {"k": "v"},
}


def test_raw_datum_round_trip_keeps_int64_nested_records_and_nulls() -> None:
    schema = parse_schema(json.dumps(SCHEMA))
    raw = RawAvroEncoder(schema).encode(RECORD)
    decoded = RawAvroDecoder(schema).decode(raw)
    assert decoded == RECORD
    assert decoded["page"] is None and type(decoded["req"]) is int  # type: ignore[index]


def test_timestamp_millis_reads_as_the_long_on_the_wire_not_a_datetime() -> None:
    decoded = RawAvroDecoder(parse_schema(SCHEMA)).decode(RawAvroEncoder(parse_schema(SCHEMA)).encode(RECORD))
    assert decoded["meta"]["sent_at"] == 1_764_460_800_123  # type: ignore[index]


def test_trailing_and_truncated_bytes_are_undecodable() -> None:
    schema = parse_schema(SCHEMA)
    raw = RawAvroEncoder(schema).encode(RECORD)
    for bad in (raw + b"\x00", raw[:-3], b"", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"):
        with pytest.raises(DecodeError) as err:
            RawAvroDecoder(schema).decode(bad)
        assert err.value.reason == UNDECODABLE


def test_union_branch_out_of_range_is_undecodable() -> None:
    schema = parse_schema({"type": "record", "name": "U", "fields": [{"name": "o", "type": ["null", "long"]}]})
    with pytest.raises(DecodeError) as err:
        RawAvroDecoder(schema).decode(b"\x08")  # branch 4 of a two-branch union
    assert err.value.reason == UNDECODABLE


class Registry:
    """schema_of over a dict, counting the look-ups (the cache must ask once per id)."""

    def __init__(self, schemas: dict[int, str], down: bool = False) -> None:
        self.schemas, self.down, self.asked = schemas, down, 0

    def __call__(self, schema_id: int) -> str:
        self.asked += 1
        if self.down:
            raise RegistryUnavailable("schema registry http://127.0.0.1:1: connection refused")
        if schema_id not in self.schemas:
            raise UnknownSchema(schema_id)
        return self.schemas[schema_id]


def test_confluent_framed_values_decode_with_the_schema_of_their_id_asked_once() -> None:
    registry = Registry({42: json.dumps(SCHEMA)})
    encoder = ConfluentAvroEncoder(42, parse_schema(SCHEMA))
    decoder = ConfluentAvroDecoder(registry)
    raw = encoder.encode(RECORD)
    assert raw[:5] == b"\x00\x00\x00\x00\x2a"
    assert [decoder.decode(raw) for _ in range(3)] == [RECORD] * 3
    assert registry.asked == 1


def test_unknown_id_is_unknown_schema_and_an_unreachable_registry_is_not_bad_input() -> None:
    raw = ConfluentAvroEncoder(43, parse_schema(SCHEMA)).encode(RECORD)
    with pytest.raises(DecodeError) as err:
        ConfluentAvroDecoder(Registry({42: json.dumps(SCHEMA)})).decode(raw)
    assert err.value.reason == UNKNOWN_SCHEMA and "43" in err.value.detail
    with pytest.raises(RegistryUnavailable):
        ConfluentAvroDecoder(Registry({}, down=True)).decode(raw)


def test_an_id_whose_schema_is_not_avro_is_unknown_schema_and_cached() -> None:
    registry = Registry({5: 'syntax = "proto3"; message M {}'})
    decoder = ConfluentAvroDecoder(registry)
    raw = b"\x00\x00\x00\x00\x05\x00"
    for _ in range(2):
        with pytest.raises(DecodeError) as err:
            decoder.decode(raw)
        assert err.value.reason == UNKNOWN_SCHEMA
    assert registry.asked == 1


def test_bad_framing_never_reaches_the_registry() -> None:
    registry = Registry({}, down=True)
    for raw in (b"\x01\x00\x00\x00\x01\x00", b"\x00\x00", json.dumps(RECORD).encode()):
        with pytest.raises(DecodeError) as err:
            ConfluentAvroDecoder(registry).decode(raw)
        assert err.value.reason == UNDECODABLE
    assert registry.asked == 0


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_container_files_iterate_their_records(codec: str) -> None:
    records = [dict(RECORD, req=i) for i in range(2500)]  # several blocks
    buf = io.BytesIO()
    write_container(buf, parse_schema(SCHEMA, logical_types=True), records, codec=codec)
    buf.seek(0)
    assert list(iter_container(buf)) == records


def test_a_damaged_container_file_is_undecodable() -> None:
    buf = io.BytesIO()
    write_container(buf, parse_schema(SCHEMA), [RECORD] * 10)
    with pytest.raises(DecodeError):
        list(iter_container(io.BytesIO(b"not avro at all")))
    data = buf.getvalue()
    with pytest.raises(DecodeError) as err:
        list(iter_container(io.BytesIO(data[:-40])))
    assert err.value.reason == UNDECODABLE


def test_schema_files_load_or_fail_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "imp.avsc"
    good.write_text(json.dumps(SCHEMA))
    assert RawAvroDecoder(load_schema_file(good)).decode(RawAvroEncoder(parse_schema(SCHEMA)).encode(RECORD))
    bad = tmp_path / "bad.avsc"
    bad.write_text('{"type": "nonsense"}')
    not_json = tmp_path / "not_json.avsc"
    not_json.write_text("record X {")
    for path in (bad, not_json, tmp_path / "missing.avsc"):
        with pytest.raises(ConfigError) as err:
            load_schema_file(path)
        assert str(path) in str(err.value) and "\n" not in str(err.value)
