"""The Confluent Schema Registry wire framing, both ways.

Layout: :func:`split_confluent` / :func:`frame_confluent` for the 5-byte header (magic byte 0, then the
schema id as a 4-byte big-endian integer); :func:`read_message_indexes` / :func:`message_indexes_bytes`
for the array of zig-zag varints Protobuf values carry after the header (the path of the message inside
its schema: ``[0]`` is the first top-level message, ``[1, 2]`` the third message nested in the second; the
common ``[0]`` is written as one ``0`` byte).

Why a module of its own: Avro and Protobuf share the header, and getting it wrong is the most common way
a foreign topic turns into nothing but dead letters; one tested parser, errors that say which byte.
"""

from __future__ import annotations

from rankwatch.pipeline.events.formats import UNDECODABLE, DecodeError

MAGIC = 0
HEADER_BYTES = 5
MAX_INDEXES = 64  # deeper nesting than any real schema; bounds the work junk bytes can cause
_MAX_VARINT_BYTES = 10


def split_confluent(raw: bytes) -> tuple[int, memoryview]:
    """Split a Confluent-framed value into ``(schema_id, payload)``.

    Raises
    ------
    DecodeError
        ``undecodable`` when the value is shorter than the header or its first byte is not the magic 0.
    """
    if len(raw) < HEADER_BYTES:
        raise DecodeError(UNDECODABLE, f"{len(raw)} bytes, shorter than the 5-byte Confluent header")
    if raw[0] != MAGIC:
        raise DecodeError(UNDECODABLE, f"first byte {raw[0]:#04x} is not the Confluent magic byte 0x00")
    return int.from_bytes(raw[1:HEADER_BYTES], "big"), memoryview(raw)[HEADER_BYTES:]


def frame_confluent(schema_id: int, payload: bytes) -> bytes:
    """``payload`` behind the Confluent header for ``schema_id`` (0 <= id < 2**31)."""
    if not 0 <= schema_id < 2**31:
        raise ValueError(f"schema id {schema_id} outside 0..2**31-1")
    return bytes((MAGIC,)) + schema_id.to_bytes(4, "big") + payload


def _read_zigzag(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(buf):
            raise DecodeError(UNDECODABLE, "message indexes truncated")
        byte = buf[pos + i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos + i + 1
        shift += 7
    raise DecodeError(UNDECODABLE, "message index varint longer than 10 bytes")


def read_message_indexes(payload: memoryview) -> tuple[list[int], memoryview]:
    """Read the Protobuf message-index array; return ``(indexes, rest of the payload)``.

    A count of 0 (one ``0`` byte) means ``[0]``.

    Raises
    ------
    DecodeError
        ``undecodable`` for a truncated array, a negative count or index, or more than MAX_INDEXES.
    """
    count, pos = _read_zigzag(payload, 0)
    if count == 0:
        return [0], payload[pos:]
    if count < 0 or count > MAX_INDEXES:
        raise DecodeError(UNDECODABLE, f"message index count {count} outside 1..{MAX_INDEXES}")
    indexes = []
    for _ in range(count):
        index, pos = _read_zigzag(payload, pos)
        if index < 0:
            raise DecodeError(UNDECODABLE, f"negative message index {index}")
        indexes.append(index)
    return indexes, payload[pos:]


def _zigzag_bytes(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def message_indexes_bytes(indexes: list[int]) -> bytes:
    """Encode a message-index array the way Confluent serializers do (``[0]`` as the single byte 0)."""
    if indexes == [0]:
        return b"\x00"
    return _zigzag_bytes(len(indexes)) + b"".join(_zigzag_bytes(i) for i in indexes)
