"""Confluent framing and message indexes against hand-written bytes (the bytes Confluent serializers write)."""

import pytest

from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.formats import UNDECODABLE, DecodeError, install_hint, require
from rankwatch.pipeline.events.formats.framing import (
    frame_confluent,
    message_indexes_bytes,
    read_message_indexes,
    split_confluent,
)


def test_header_is_magic_then_big_endian_id() -> None:
    raw = bytes([0, 0, 0, 1, 2]) + b"datum"
    schema_id, payload = split_confluent(raw)
    assert schema_id == 258 and bytes(payload) == b"datum"
    assert frame_confluent(258, b"datum") == raw


@pytest.mark.parametrize(
    ("raw", "says"),
    [(b"", "0 bytes"), (b"\x00\x00\x00\x01", "4 bytes"), (b"\x01\x00\x00\x00\x01x", "0x01"), (b'{"a":1}', "0x7b")],
)
def test_short_or_unmagic_values_are_undecodable(raw: bytes, says: str) -> None:
    with pytest.raises(DecodeError) as err:
        split_confluent(raw)
    assert err.value.reason == UNDECODABLE and says in err.value.detail


@pytest.mark.parametrize(
    ("indexes", "wire"),
    [([0], b"\x00"), ([1], b"\x02\x02"), ([1, 0], b"\x04\x02\x00"), ([0, 2], b"\x04\x00\x04"), ([70], b"\x02\x8c\x01")],
)
def test_message_indexes_are_zigzag_varints_and_zero_means_first(indexes: list[int], wire: bytes) -> None:
    assert message_indexes_bytes(indexes) == wire
    read, rest = read_message_indexes(memoryview(wire + b"msg"))
    assert read == indexes and bytes(rest) == b"msg"


@pytest.mark.parametrize(
    "wire", [b"", b"\x04\x02", b"\x01", b"\x02\x01", b"\xff" * 11, b"\x82\x01" + b"\x00" * 65]
)
def test_bad_message_indexes_are_undecodable(wire: bytes) -> None:
    # empty, truncated, negative count, negative index, endless varint, count beyond the bound
    with pytest.raises(DecodeError) as err:
        read_message_indexes(memoryview(wire))
    assert err.value.reason == UNDECODABLE


def test_require_names_the_extra_when_a_module_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import rankwatch.pipeline.events.formats as formats

    require("json")
    monkeypatch.setattr(formats, "_installed", lambda module: module != "fastavro")
    with pytest.raises(ConfigError) as err:
        require("avro", key="events.impressions.format")
    message = str(err.value)
    assert "\n" not in message and "events.impressions.format" in message
    assert "pip install 'rankwatch[avro]'" in message and install_hint("avro") in message
    require("protobuf")


def test_require_rejects_unknown_formats_and_framings() -> None:
    for call in (lambda: require("xml"), lambda: require("avro", "magic"), lambda: require("json", "confluent")):
        with pytest.raises(ConfigError):
            call()
