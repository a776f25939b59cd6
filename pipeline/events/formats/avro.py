"""Avro with fastavro: Confluent-framed values, raw datums, object container files; and the encoders.

Layout: :func:`parse_schema` / :func:`load_schema_file` (schema text or ``.avsc`` to a parsed schema);
decoders :class:`RawAvroDecoder` (``framing = "none"``, one datum per message, schema from the config's
``schema_file``) and :class:`ConfluentAvroDecoder` (magic byte, schema id, datum; the writer schema from an
injected ``schema_of`` and cached per id); :func:`iter_container` for ``.avro`` files in replay; encoders
:class:`RawAvroEncoder` / :class:`ConfluentAvroEncoder` and :func:`write_container` for the simulator.

Why logical types are read as their underlying values: the field mapping's units already say what a
number means (``ts = { path = "at", unit = "ms" }`` for ``timestamp-millis``, ``"us"`` for
``timestamp-micros``), and a ``datetime`` in the record tree would be a second, lossy route to the same
value. Optional fields (``["null", T]`` unions) decode to ``None``, which the mapping treats as absent.
A datum followed by stray bytes is undecodable, not silently truncated.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import fastavro

from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.formats import UNDECODABLE, DecodeError, SchemaOf, UnknownSchema
from rankwatch.pipeline.events.formats.framing import frame_confluent, split_confluent

ParsedSchema = Any  # fastavro's parsed schema (a dict / list / str tree)


def _strip_logical(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_logical(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_strip_logical(v) for v in node]
    return node


def parse_schema(schema: str | dict | list, *, logical_types: bool = False) -> ParsedSchema:
    """Parse an Avro schema (JSON text or its loaded tree) for decoding and encoding.

    Parameters
    ----------
    schema
        The schema as the registry or an ``.avsc`` file holds it.
    logical_types
        False (the default for decoding): ``logicalType`` annotations are dropped, so ``timestamp-millis``
        reads as the long it is on the wire.

    Raises
    ------
    ValueError
        Not JSON, or not a valid Avro schema (the message says why).
    """
    tree = json.loads(schema) if isinstance(schema, str) else schema
    if not logical_types:
        tree = _strip_logical(tree)
    try:
        return fastavro.parse_schema(tree)
    except Exception as exc:  # fastavro raises SchemaParseException, TypeError, KeyError, ...
        raise ValueError(f"not a valid Avro schema: {exc}") from exc


def load_schema_file(path: str | Path) -> ParsedSchema:
    """Read an ``.avsc`` file; a missing or invalid file is a one-line ConfigError naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"schema_file {str(path)!r}: cannot read ({exc.strerror or exc})") from exc
    try:
        return parse_schema(text)
    except ValueError as exc:
        raise ConfigError(f"schema_file {str(path)!r}: {exc}") from exc


def _read_datum(payload: bytes | memoryview, schema: ParsedSchema) -> object:
    buf = io.BytesIO(payload)
    try:
        record = fastavro.schemaless_reader(buf, schema, None)
    except Exception as exc:  # EOFError, IndexError (union branch), UnicodeDecodeError, ValueError, ...
        raise DecodeError(UNDECODABLE, f"not an Avro datum of the schema: {type(exc).__name__}: {exc}") from None
    left = len(payload) - buf.tell()
    if left:
        raise DecodeError(UNDECODABLE, f"{left} bytes left after the Avro datum")
    return record


class RawAvroDecoder:
    """``framing = "none"``: each message is one Avro datum written with ``schema``."""

    def __init__(self, schema: ParsedSchema) -> None:
        self._schema = schema

    def decode(self, raw: bytes) -> object:
        return _read_datum(raw, self._schema)


class ConfluentAvroDecoder:
    """``framing = "confluent"``: magic byte 0, 4-byte big-endian schema id, one datum of that schema.

    Parameters
    ----------
    schema_of
        ``schema_of(schema_id)`` returns the writer schema (JSON text or tree); it raises UnknownSchema
        when the registry has no such id and RegistryUnavailable when the registry cannot be asked (that
        exception passes through ``decode`` untouched: an outage, not bad input).

    Each id is asked once: parsed schemas are cached, and so are ids whose schema is not Avro (ids are
    immutable in a registry). Unknown ids are not cached here (the registry client decides how long a
    miss stays a miss, since the schema may be registered a moment later).
    """

    def __init__(self, schema_of: SchemaOf) -> None:
        self._schema_of = schema_of
        self._schemas: dict[int, ParsedSchema] = {}
        self._not_avro: dict[int, str] = {}

    def schema(self, schema_id: int) -> ParsedSchema:
        """The parsed writer schema of ``schema_id`` (cached)."""
        schema = self._schemas.get(schema_id)
        if schema is not None:
            return schema
        if schema_id in self._not_avro:
            raise UnknownSchema(schema_id, self._not_avro[schema_id])
        text = self._schema_of(schema_id)  # UnknownSchema / RegistryUnavailable propagate
        try:
            schema = parse_schema(text)  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            detail = f"schema id {schema_id} is not an Avro schema ({exc})"
            self._not_avro[schema_id] = detail
            raise UnknownSchema(schema_id, detail) from None
        self._schemas[schema_id] = schema
        return schema

    def decode(self, raw: bytes) -> object:
        schema_id, payload = split_confluent(raw)
        return _read_datum(payload, self.schema(schema_id))


def iter_container(fileobj: IO[bytes]) -> Iterator[object]:
    """The records of an Avro object container file (schema inside), logical types as raw values.

    Raises
    ------
    DecodeError
        ``undecodable`` when the header or a block is not valid Avro (raised where the damage is met,
        after the records before it were yielded).
    """
    try:
        blocks = fastavro.block_reader(fileobj)
        schema = parse_schema(blocks.metadata["avro.schema"])  # the text, before fastavro expanded it
    except Exception as exc:
        raise DecodeError(UNDECODABLE, f"not an Avro container file: {type(exc).__name__}: {exc}") from None
    while True:
        try:
            block = next(blocks)
        except StopIteration:
            return
        except Exception as exc:
            raise DecodeError(UNDECODABLE, f"damaged Avro block: {type(exc).__name__}: {exc}") from None
        data = block.bytes_  # type: ignore[attr-defined]  # the decompressed block (BytesIO)
        for _ in range(block.num_records):
            try:
                record = fastavro.schemaless_reader(data, schema, None)
            except Exception as exc:
                raise DecodeError(UNDECODABLE, f"damaged Avro record: {type(exc).__name__}: {exc}") from None
            yield record


def _write_datum(record: object, schema: ParsedSchema) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


class RawAvroEncoder:
    """One record to one raw Avro datum (``framing = "none"``)."""

    def __init__(self, schema: ParsedSchema) -> None:
        self._schema = schema

    def encode(self, record: object) -> bytes:
        """Raises ValueError (fastavro's) when ``record`` does not fit the schema."""
        return _write_datum(record, self._schema)


class ConfluentAvroEncoder:
    """One record to a Confluent-framed Avro value for ``schema_id`` (registered by the caller)."""

    def __init__(self, schema_id: int, schema: ParsedSchema) -> None:
        self.schema_id = schema_id
        self._schema = schema
        self._header = frame_confluent(schema_id, b"")

    def encode(self, record: object) -> bytes:
        return self._header + _write_datum(record, self._schema)


def write_container(
    fileobj: IO[bytes], schema: ParsedSchema, records: Iterable[object], codec: str = "null"
) -> None:
    """Write ``records`` as an Avro object container file (``codec``: ``null`` or ``deflate``)."""
    fastavro.writer(fileobj, schema, records, codec=codec)
