"""Protobuf decoding: a descriptor set built in the test (no protoc), message indexes, int64, presence."""

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, message_factory, timestamp_pb2

from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.formats import (
    UNDECODABLE,
    UNKNOWN_SCHEMA,
    DecodeError,
    RegistryUnavailable,
    UnknownSchema,
)
from rankwatch.pipeline.events.formats.framing import frame_confluent
from rankwatch.pipeline.events.formats.protobuf import (
    ConfluentProtobufDecoder,
    ConfluentProtobufEncoder,
    RawProtobufDecoder,
    RawProtobufEncoder,
    load_message,
    message_indexes,
)

F = descriptor_pb2.FieldDescriptorProto


def _field(msg: descriptor_pb2.DescriptorProto, name: str, number: int, ftype: int, **kw: object) -> None:
    msg.field.add(name=name, number=number, type=ftype, label=kw.pop("label", F.LABEL_OPTIONAL), **kw)


def _descriptor_set(path: Path, with_timestamp_file: bool = False) -> Path:
    """shop/events.proto (proto3), written the way `protoc --descriptor_set_out` would:

        message Envelope { string note = 1; }                                // [0]
        message Impression {                                                 // [1]
          message Meta { string id = 1; int64 sent_at = 2; }                 // [1, 0]
          message Result { string sku = 1; int32 rank = 2; double s = 3; }   // [1, 1]
          enum Tier { T_UNKNOWN = 0; N = 1; R = 2; }
          Meta meta = 1; int64 request_id = 2; repeated Result results = 3;
          optional string segment = 4; Tier tier = 5; map<string, int64> attrs = 6;
          uint64 big = 7; google.protobuf.Timestamp at = 8; repeated int64 ids = 9;
        }
    """
    fdp = descriptor_pb2.FileDescriptorProto(name="shop/events.proto", package="shop.events", syntax="proto3")
    fdp.dependency.append("google/protobuf/timestamp.proto")
    env = fdp.message_type.add(name="Envelope")
    _field(env, "note", 1, F.TYPE_STRING)
    imp = fdp.message_type.add(name="Impression")
    meta = imp.nested_type.add(name="Meta")
    _field(meta, "id", 1, F.TYPE_STRING)
    _field(meta, "sent_at", 2, F.TYPE_INT64)
    result = imp.nested_type.add(name="Result")
    _field(result, "sku", 1, F.TYPE_STRING)
    _field(result, "rank", 2, F.TYPE_INT32)
    _field(result, "s", 3, F.TYPE_DOUBLE)
    entry = imp.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, F.TYPE_STRING)
    _field(entry, "value", 2, F.TYPE_INT64)
    tier = imp.enum_type.add(name="Tier")
    for number, name in enumerate(("T_UNKNOWN", "N", "R")):
        tier.value.add(name=name, number=number)
    _field(imp, "meta", 1, F.TYPE_MESSAGE, type_name=".shop.events.Impression.Meta")
    _field(imp, "request_id", 2, F.TYPE_INT64)
    _field(imp, "results", 3, F.TYPE_MESSAGE, type_name=".shop.events.Impression.Result", label=F.LABEL_REPEATED)
    _field(imp, "segment", 4, F.TYPE_STRING, proto3_optional=True, oneof_index=0)
    imp.oneof_decl.add(name="_segment")
    _field(imp, "tier", 5, F.TYPE_ENUM, type_name=".shop.events.Impression.Tier")
    _field(imp, "attrs", 6, F.TYPE_MESSAGE, type_name=".shop.events.Impression.AttrsEntry", label=F.LABEL_REPEATED)
    _field(imp, "big", 7, F.TYPE_UINT64)
    _field(imp, "at", 8, F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    _field(imp, "ids", 9, F.TYPE_INT64, label=F.LABEL_REPEATED)
    fds = descriptor_pb2.FileDescriptorSet()
    if with_timestamp_file:  # protoc --include_imports puts the import first
        fds.file.add().ParseFromString(timestamp_pb2.DESCRIPTOR.serialized_pb)
    fds.file.append(fdp)
    path.write_bytes(fds.SerializeToString())
    return path


@pytest.fixture(params=[False, True], ids=["timestamp-supplied", "include-imports"])
def desc_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return _descriptor_set(tmp_path / "events.desc", with_timestamp_file=request.param)


RECORD = {
    "meta": {"id": "imp-1", "sent_at": 1_764_460_800_123},
    "request_id": 2**53 + 1,  # not exact in float64, not a string either
    "results": [{"sku": "i-1", "rank": 0, "s": 0.91}, {"sku": "i-7", "rank": 1, "s": -2.5}],
    "tier": "R",
    "attrs": {"a": 2**62},
    "big": 2**64 - 1,
    "at": "2026-11-30T10:00:00.250Z",
    "ids": [1, 2**40],
}


def test_round_trip_keeps_proto_names_int64_zero_values_and_absent_optionals(desc_path: Path) -> None:
    desc = load_message(desc_path, "shop.events.Impression")
    raw = RawProtobufEncoder(desc).encode(RECORD)
    tree = RawProtobufDecoder(desc).decode(raw)
    assert tree == {**RECORD}
    assert "segment" not in tree  # type: ignore[operator]  # optional, unset: absent
    assert tree["results"][0]["rank"] == 0  # type: ignore[index]  # proto3 default still present


def test_set_optional_empty_string_is_present_and_unknown_enum_number_reads_as_number(desc_path: Path) -> None:
    desc = load_message(desc_path, "shop.events.Impression")
    cls = message_factory.GetMessageClass(desc)
    msg = cls(segment="", tier=9)
    tree = RawProtobufDecoder(desc).decode(msg.SerializeToString())
    assert tree["segment"] == "" and tree["tier"] == 9  # type: ignore[index]
    assert tree["request_id"] == 0 and tree["results"] == [] and "meta" not in tree  # type: ignore[index,operator]


def test_confluent_indexes_select_top_level_and_nested_messages(desc_path: Path) -> None:
    imp = load_message(desc_path, "shop.events.Impression")
    meta = load_message(desc_path, "shop.events.Impression.Meta")
    env = load_message(desc_path, "shop.events.Envelope")
    assert message_indexes(env) == [0] and message_indexes(imp) == [1] and message_indexes(meta) == [1, 0]
    asked: list[int] = []

    def schema_of(schema_id: int) -> str:
        asked.append(schema_id)
        if schema_id != 7:
            raise UnknownSchema(schema_id)
        return "syntax = 'proto3'; ..."

    decoder = ConfluentProtobufDecoder(imp, schema_of)
    raw_env = ConfluentProtobufEncoder(7, env).encode({"note": "x"})
    assert raw_env[5:6] == b"\x00"  # [0] written as one zero byte
    assert decoder.decode(raw_env) == {"note": "x"}
    assert decoder.decode(ConfluentProtobufEncoder(7, imp).encode(RECORD)) == RECORD
    assert decoder.decode(ConfluentProtobufEncoder(7, meta).encode({"id": "m"})) == {"id": "m", "sent_at": 0}
    assert asked == [7]
    with pytest.raises(DecodeError) as err:
        decoder.decode(ConfluentProtobufEncoder(8, imp).encode(RECORD))
    assert err.value.reason == UNKNOWN_SCHEMA


@pytest.mark.parametrize(
    "raw",
    [
        frame_confluent(7, b"\x02\x06"),  # index [3]: the file has two top-level messages
        frame_confluent(7, b"\x04\x02\x08"),  # [1, 4]: Impression has three nested messages
        frame_confluent(7, b"\x02\x02\xff\xff"),  # [1] then bytes that are no message
        frame_confluent(7, b""),  # no indexes at all
        b"\x01\x00\x00\x00\x07\x00",  # bad magic
    ],
)
def test_bad_confluent_protobuf_values_are_undecodable(desc_path: Path, raw: bytes) -> None:
    decoder = ConfluentProtobufDecoder(load_message(desc_path, "shop.events.Impression"), lambda i: "")
    with pytest.raises(DecodeError) as err:
        decoder.decode(raw)
    assert err.value.reason == UNDECODABLE


def test_an_unreachable_registry_passes_through_as_an_outage(desc_path: Path) -> None:
    imp = load_message(desc_path, "shop.events.Impression")

    def down(schema_id: int) -> str:
        raise RegistryUnavailable("schema registry http://127.0.0.1:1: connection refused")

    with pytest.raises(RegistryUnavailable):
        ConfluentProtobufDecoder(imp, down).decode(ConfluentProtobufEncoder(7, imp).encode(RECORD))


def test_raw_junk_and_impossible_timestamps_are_undecodable(desc_path: Path) -> None:
    desc = load_message(desc_path, "shop.events.Impression")
    far = message_factory.GetMessageClass(desc)()
    far.at.seconds = 2**40  # parses, but has no RFC 3339 form
    for raw in (b"\xff\xff\xff", far.SerializeToString()):
        with pytest.raises(DecodeError) as err:
            RawProtobufDecoder(desc).decode(raw)
        assert err.value.reason == UNDECODABLE


def test_message_to_dict_would_have_stringified_int64(desc_path: Path) -> None:
    """Why the module converts by itself: protobuf's JSON mapping writes int64 as strings."""
    from google.protobuf import json_format

    desc = load_message(desc_path, "shop.events.Impression")
    msg = message_factory.GetMessageClass(desc)(request_id=17)
    assert json_format.MessageToDict(msg, preserving_proto_field_name=True)["request_id"] == "17"
    assert RawProtobufDecoder(desc).decode(msg.SerializeToString())["request_id"] == 17  # type: ignore[index]


def test_config_errors_are_one_line_naming_the_file_or_message(tmp_path: Path, desc_path: Path) -> None:
    junk = tmp_path / "junk.desc"
    junk.write_bytes(b"\xff\xff")
    fds = descriptor_pb2.FileDescriptorSet()
    orphan = fds.file.add(name="a.proto", syntax="proto3")
    orphan.dependency.append("b.proto")
    missing_import = tmp_path / "orphan.desc"
    missing_import.write_bytes(fds.SerializeToString())
    cases = [
        (tmp_path / "missing.desc", "shop.events.Impression", "missing.desc"),
        (junk, "x.Y", "junk.desc"),
        (missing_import, "x.Y", "b.proto"),
        (desc_path, "Impression", "fully-qualified"),
    ]
    for path, message, says in cases:
        with pytest.raises(ConfigError) as err:
            load_message(path, message)
        assert says in str(err.value) and "\n" not in str(err.value)
