"""Protobuf from a FileDescriptorSet and a message name: raw or Confluent-framed values to record trees.

Layout: :func:`load_message` (``descriptor_set`` file + fully-qualified ``message`` to a descriptor, the
set's imports resolved, well-known types supplied when the set omits them); decoders
:class:`RawProtobufDecoder` (``framing = "none"``) and :class:`ConfluentProtobufDecoder` (header, schema id,
message indexes); :class:`TreeConverter` (a parsed message to a ``dict`` tree); encoders for tests and the
simulator.

Why a direct conversion rather than ``json_format.MessageToDict``: the JSON mapping writes 64-bit integers
as strings (ids and timestamps are int64 in most event schemas) and drops proto3 zero values (a 0-based
rank 0 would read as absent). Here field names stay as written in the .proto, int64 stays int, a proto3
scalar without presence always has its value (0, "", false), a field with presence that is not set is
absent, enums read as their names (the number when the writer used one the reader does not know), bytes
stay bytes, ``google.protobuf.Timestamp`` reads as an RFC 3339 string and wrapper types as their value.

Why the local descriptor set also reads Confluent-framed values: the registry holds a Protobuf schema as
.proto source text (or a serialized descriptor, depending on who registered it), and compiling .proto
text needs protoc. Protobuf's wire format is read with the reader's descriptor anyway (that is its
compatibility model), so the message indexes select the message inside the file of the configured
``message``, and the registry is asked only whether the schema id exists (unknown ids are bad input).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.formats import UNDECODABLE, DecodeError, SchemaOf
from rankwatch.pipeline.events.formats.framing import (
    frame_confluent,
    message_indexes_bytes,
    read_message_indexes,
    split_confluent,
)

_WRAPPERS = {
    f"google.protobuf.{n}Value"
    for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
}
_JSONISH = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}
# kinds of a field, decided once per message type
_SCALAR, _ENUM, _MESSAGE, _REP_SCALAR, _REP_ENUM, _REP_MESSAGE, _MAP = range(7)


def _well_known(name: str) -> descriptor_pb2.FileDescriptorProto | None:
    from google.protobuf import (  # noqa: F401  (imported to register them in the default pool)
        any_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    try:
        fd = descriptor_pool.Default().FindFileByName(name)
    except KeyError:
        return None
    return descriptor_pb2.FileDescriptorProto.FromString(fd.serialized_pb)


def load_pool(path: str | Path) -> descriptor_pool.DescriptorPool:
    """A descriptor pool with every file of the FileDescriptorSet at ``path`` (``protoc
    --include_imports --descriptor_set_out``); imports of well-known types the set lacks are supplied.

    Raises
    ------
    ConfigError
        Unreadable file, not a FileDescriptorSet, or an import neither in the set nor well-known.
    """
    where = f"descriptor_set {str(path)!r}"
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror or exc})") from exc
    try:
        files = {f.name: f for f in descriptor_pb2.FileDescriptorSet.FromString(data).file}
    except Exception as exc:
        raise ConfigError(f"{where}: not a FileDescriptorSet ({exc})") from exc
    if not files:
        raise ConfigError(f"{where}: the set holds no .proto file")
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str, chain: tuple[str, ...]) -> None:
        if name in added:
            return
        if name in chain:
            raise ConfigError(f"{where}: import cycle through {name}")
        fdp = files.get(name) or _well_known(name)
        if fdp is None:
            raise ConfigError(f"{where}: imports {name}, which is not in the set (protoc --include_imports)")
        for dep in fdp.dependency:
            add(dep, chain + (name,))
        try:
            pool.Add(fdp)
        except Exception as exc:
            raise ConfigError(f"{where}: {name} does not build ({exc})") from exc
        added.add(name)

    for name in files:
        add(name, ())
    return pool


def load_message(path: str | Path, message: str) -> Descriptor:
    """The descriptor of the fully-qualified ``message`` (``package.Outer.Inner``) in the set at ``path``."""
    pool = load_pool(path)
    try:
        return pool.FindMessageTypeByName(message)
    except KeyError:
        raise ConfigError(
            f"message {message!r}: not in descriptor_set {str(path)!r} (use the fully-qualified name)"
        ) from None


class TreeConverter:
    """Parsed messages to ``dict`` trees; each message type's field plan is built once and reused."""

    def __init__(self) -> None:
        self._plans: dict[str, list[tuple[str, bool, int, Any]]] = {}

    def _plan(self, desc: Descriptor) -> list[tuple[str, bool, int, Any]]:
        plan = []
        for f in desc.fields:
            extra: Any = None
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                kind, extra = _MAP, f.message_type.fields_by_name["value"]
            elif f.type == FieldDescriptor.TYPE_MESSAGE or f.type == FieldDescriptor.TYPE_GROUP:
                kind = _REP_MESSAGE if f.is_repeated else _MESSAGE
            elif f.type == FieldDescriptor.TYPE_ENUM:
                kind, extra = (_REP_ENUM if f.is_repeated else _ENUM), f.enum_type.values_by_number
            else:
                kind = _REP_SCALAR if f.is_repeated else _SCALAR
            plan.append((f.name, (not f.is_repeated) and f.has_presence, kind, extra))
        self._plans[desc.full_name] = plan
        return plan

    def _message(self, msg: Any) -> object:
        name = msg.DESCRIPTOR.full_name
        if name == "google.protobuf.Timestamp":
            return msg.ToJsonString()
        if name in _WRAPPERS:
            return msg.value
        if name in _JSONISH:
            return json_format.MessageToDict(msg)
        return self.tree(msg)

    @staticmethod
    def _enum(values: Any, number: int) -> object:
        value = values.get(number)
        return value.name if value is not None else number

    def _map_value(self, field: FieldDescriptor, value: Any) -> object:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            return self._message(value)
        if field.type == FieldDescriptor.TYPE_ENUM:
            return self._enum(field.enum_type.values_by_number, value)
        return value

    def tree(self, msg: Any) -> dict[str, object]:
        """``msg`` as a dict keyed by the .proto field names (see the module docstring for the values)."""
        desc = msg.DESCRIPTOR
        plan = self._plans.get(desc.full_name) or self._plan(desc)
        out: dict[str, object] = {}
        for name, presence, kind, extra in plan:
            if presence and not msg.HasField(name):
                continue
            value = getattr(msg, name)
            if kind == _SCALAR:
                out[name] = value
            elif kind == _REP_SCALAR:
                out[name] = list(value)
            elif kind == _MESSAGE:
                out[name] = self._message(value)
            elif kind == _REP_MESSAGE:
                out[name] = [self._message(v) for v in value]
            elif kind == _ENUM:
                out[name] = self._enum(extra, value)
            elif kind == _REP_ENUM:
                out[name] = [self._enum(extra, v) for v in value]
            else:  # _MAP
                out[name] = {k: self._map_value(extra, v) for k, v in value.items()}
        return out


def _parse(cls: Any, payload: bytes | memoryview, converter: TreeConverter) -> dict[str, object]:
    try:
        msg = cls.FromString(bytes(payload))
    except Exception as exc:  # google.protobuf.message.DecodeError, RuntimeError from upb, ...
        raise DecodeError(UNDECODABLE, f"not a {cls.DESCRIPTOR.full_name}: {exc}") from None
    try:
        return converter.tree(msg)
    except ValueError as exc:  # a Timestamp outside years 1..9999 has no RFC 3339 form
        raise DecodeError(UNDECODABLE, f"{cls.DESCRIPTOR.full_name}: {exc}") from None


class RawProtobufDecoder:
    """``framing = "none"``: each message is one serialized ``descriptor`` message."""

    def __init__(self, descriptor: Descriptor) -> None:
        self._cls = message_factory.GetMessageClass(descriptor)
        self._converter = TreeConverter()

    def decode(self, raw: bytes) -> object:
        return _parse(self._cls, raw, self._converter)


def _file_proto(descriptor: Descriptor) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(descriptor.file.serialized_pb)


def message_indexes(descriptor: Descriptor) -> list[int]:
    """The Confluent message-index path of ``descriptor`` inside its .proto file."""
    path: list[int] = []
    desc = descriptor
    while desc.containing_type is not None:
        parent = desc.containing_type
        path.append([d.full_name for d in parent.nested_types].index(desc.full_name))
        desc = parent
    top = [m.name for m in _file_proto(descriptor).message_type]
    path.append(top.index(desc.name))
    return path[::-1]


class ConfluentProtobufDecoder:
    """``framing = "confluent"``: header, schema id, message indexes, then the message.

    Parameters
    ----------
    descriptor
        The configured message; the indexes select a message of the same .proto file (``[0]`` its first
        top-level message, ``[1, 0]`` the first message nested in the second).
    schema_of
        ``schema_of(schema_id)`` raising UnknownSchema / RegistryUnavailable; asked once per id (known ids
        are cached) so that ids the registry does not have are rejected as ``unknown_schema``. None: no
        registry check (the id is read and ignored).
    """

    def __init__(self, descriptor: Descriptor, schema_of: SchemaOf | None) -> None:
        self._descriptor = descriptor
        self._pool = descriptor.file.pool
        self._file = _file_proto(descriptor)
        self._schema_of = schema_of
        self._known: set[int] = set()
        self._classes: dict[tuple[int, ...], Any] = {}
        self._converter = TreeConverter()

    def _class(self, indexes: tuple[int, ...]) -> Any:
        cls = self._classes.get(indexes)
        if cls is not None:
            return cls
        messages = self._file.message_type
        name = self._file.package
        for depth, index in enumerate(indexes):
            if index >= len(messages):
                where = "top-level" if depth == 0 else "nested"
                raise DecodeError(
                    UNDECODABLE,
                    f"message index {list(indexes)} out of range: {self._file.name} has {len(messages)} "
                    f"{where} message(s) there",
                )
            name = f"{name}.{messages[index].name}" if name else messages[index].name
            messages = messages[index].nested_type
        cls = message_factory.GetMessageClass(self._pool.FindMessageTypeByName(name))
        self._classes[indexes] = cls
        return cls

    def decode(self, raw: bytes) -> object:
        schema_id, payload = split_confluent(raw)
        if self._schema_of is not None and schema_id not in self._known:
            self._schema_of(schema_id)  # UnknownSchema / RegistryUnavailable propagate
            self._known.add(schema_id)
        indexes, body = read_message_indexes(payload)
        return _parse(self._class(tuple(indexes)), body, self._converter)


def _to_message(descriptor: Descriptor) -> Callable[[object], bytes]:
    cls = message_factory.GetMessageClass(descriptor)

    def encode(record: object) -> bytes:
        if isinstance(record, dict):
            record = json_format.ParseDict(record, cls(), ignore_unknown_fields=False)
        return record.SerializeToString()  # type: ignore[attr-defined]

    return encode


class RawProtobufEncoder:
    """A record (dict keyed by .proto field names, or a message) to raw Protobuf bytes."""

    def __init__(self, descriptor: Descriptor) -> None:
        self._encode = _to_message(descriptor)

    def encode(self, record: object) -> bytes:
        return self._encode(record)


class ConfluentProtobufEncoder:
    """A record to a Confluent-framed Protobuf value for ``schema_id`` with ``descriptor``'s indexes."""

    def __init__(self, schema_id: int, descriptor: Descriptor) -> None:
        self._encode = _to_message(descriptor)
        self._header = frame_confluent(schema_id, message_indexes_bytes(message_indexes(descriptor)))

    def encode(self, record: object) -> bytes:
        return self._header + self._encode(record)
