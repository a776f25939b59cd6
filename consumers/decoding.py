"""The configured wire formats, built: per stream a decoder (bytes -> record tree, or a Rejection) for the
field mapping's :class:`~pipeline.events.translate.Translator`, and the schema-id bookkeeping that keeps a
registry outage from ever reaching the core.

Layout:

- :class:`FormatSpec` / :func:`format_specs`: the ``[events.<stream>]`` keys ``format``, ``framing``,
  ``schema_file``, ``descriptor_set``, ``message`` checked at config load (``formats.require`` names the
  missing extra; the schema file and descriptor set are read once to fail early). Picklable, so the core
  process builds the same decoders from it.
- :func:`build_decoders` / :func:`translator_of`: the decoders of the specs, each wrapped so that bad
  bytes (:class:`~pipeline.events.formats.DecodeError`) become a Rejection (``undecodable``,
  ``unknown_schema``: counted, dead-lettered with the original bytes) while
  :class:`~pipeline.events.formats.RegistryUnavailable` passes through.
- :class:`SchemaCache`: the schemas the core's Confluent decoders read, filled by the consuming side.
- :class:`SchemaGate`: on the consuming side, every Confluent schema id of the buffered records is asked of
  the registry *before* those records are fed (:meth:`SchemaGate.note` at buffering, :meth:`SchemaGate.open`
  before feeding); what it learns is shipped to the core's :class:`SchemaCache`.

Why the gate: a registry that is down is an outage, not bad input (docs/formats.md). Were the core to ask
the registry mid-batch, the records before the failing one would have changed the state and the rest not,
and the core may be another process whose batches are asynchronous. So the core never asks: the
consuming side resolves every id first, and while the registry cannot answer nothing is fed (records stay
buffered, offsets uncommitted), the loop backs off, logs one line and shows the outage in its health;
feeding resumes where it stopped. Ids the registry does not have are sent as such (``unknown_schema``
in the core) and asked again after the client's miss TTL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.formats import DecodeError, RegistryUnavailable, UnknownSchema, require
from rankwatch.pipeline.events.mapping import EventMapping
from rankwatch.pipeline.events.validation import Rejection, RejectReason

if TYPE_CHECKING:
    from rankwatch.consumers.outage import KafkaOutage

log = logging.getLogger(__name__)

Decoder = Callable[[bytes], Any]  # bytes -> record tree | Rejection
SchemaOfType = Callable[[str], Callable[[int], object]]  # "AVRO" / "PROTOBUF" -> schema_of(id)
SCHEMA_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF"}
# (schema type, id) -> (True, schema text) or (False, why the registry has no such schema)
Entries = dict[tuple[str, int], tuple[bool, str]]


@dataclass(frozen=True)
class FormatSpec:
    """One stream's wire format (``format`` avro or protobuf; JSON streams have none)."""

    stream: str
    format: str
    framing: str = "none"
    schema_file: Path | None = None
    descriptor_set: Path | None = None
    message: str | None = None

    @property
    def schema_type(self) -> str:
        return SCHEMA_TYPES[self.format]

    @property
    def confluent(self) -> bool:
        return self.framing == "confluent"


def format_specs(mapping: EventMapping, *, base: Path = Path("."), registry: object | None = None,
                 where: str = "config") -> dict[str, FormatSpec]:
    """Check the format keys of both streams (one-line ConfigError naming the key) and return the specs of
    the Avro / Protobuf streams. ``registry``: the ``[schema_registry]`` settings, if any (Confluent
    framing needs them). Files are read once here so a wrong path fails at start-up."""
    specs: dict[str, FormatSpec] = {}
    for stream in ("impressions", "clicks"):
        sm = mapping.stream(stream)
        opts = sm.options
        key = f"{where}: events.{stream}"
        framing = opts.get("framing", "none")
        require(sm.format, framing if isinstance(framing, str) else "?", key=f"{key}.format")
        if sm.format == "json":
            extra = [k for k in ("schema_file", "descriptor_set", "message") if k in opts]
            if extra:
                raise ConfigError(f"{key}.{extra[0]}: only for format = \"avro\" / \"protobuf\"")
            continue
        for k in ("schema_file", "descriptor_set", "message"):
            if k in opts and (not isinstance(opts[k], str) or not opts[k]):
                raise ConfigError(f"{key}.{k}: expected a non-empty string")
        spec = FormatSpec(stream, sm.format, framing,
                          base / opts["schema_file"] if "schema_file" in opts else None,
                          base / opts["descriptor_set"] if "descriptor_set" in opts else None,
                          opts.get("message"))
        if spec.format == "avro":
            for k in ("descriptor_set", "message"):
                if k in opts:
                    raise ConfigError(f"{key}.{k}: only for format = \"protobuf\"")
            if not spec.confluent and spec.schema_file is None:
                raise ConfigError(f"{key}.schema_file: format = \"avro\" with framing = \"none\" needs the "
                                  "writer schema (an .avsc file)")
            if spec.schema_file is not None:
                from rankwatch.pipeline.events.formats.avro import load_schema_file

                load_schema_file(spec.schema_file)
        else:
            if "schema_file" in opts:
                raise ConfigError(f"{key}.schema_file: only for format = \"avro\" (protobuf: descriptor_set)")
            if spec.descriptor_set is None or spec.message is None:
                missing = "descriptor_set" if spec.descriptor_set is None else "message"
                raise ConfigError(f"{key}.{missing}: format = \"protobuf\" needs descriptor_set and message")
            from rankwatch.pipeline.events.formats.protobuf import load_message

            load_message(spec.descriptor_set, spec.message)
        if spec.confluent and registry is None:
            raise ConfigError(f"{key}.framing: \"confluent\" needs a [schema_registry] table with its url")
        specs[stream] = spec
    return specs


def rejecting(decode: Callable[[bytes], object], max_event_bytes: int) -> Decoder:
    """``decode`` with bad bytes as Rejections (RegistryUnavailable passes through)."""
    undecodable, unknown, too_large = RejectReason.undecodable, RejectReason.unknown_schema, RejectReason.too_large

    def decode_or_reject(raw: bytes) -> Any:
        if len(raw) > max_event_bytes:
            return Rejection(too_large, f"{len(raw)} bytes > {max_event_bytes}")
        try:
            return decode(raw)
        except DecodeError as e:
            return Rejection(unknown if e.reason == "unknown_schema" else undecodable, e.detail)

    return decode_or_reject


def build_decoder(spec: FormatSpec, schema_of_type: SchemaOfType | None, max_event_bytes: int) -> Decoder:
    """The decoder of one spec; ``schema_of_type(type)`` gives the ``schema_of`` of a Confluent framing."""
    schema_of = None
    if spec.confluent:
        if schema_of_type is None:
            raise ConfigError(f"events.{spec.stream}.framing: \"confluent\" needs [schema_registry]")
        schema_of = schema_of_type(spec.schema_type)
    if spec.format == "avro":
        from rankwatch.pipeline.events.formats import avro

        dec: Any = (avro.ConfluentAvroDecoder(schema_of) if schema_of is not None
                    else avro.RawAvroDecoder(avro.load_schema_file(spec.schema_file)))  # type: ignore[arg-type]
    else:
        from rankwatch.pipeline.events.formats import protobuf

        descriptor = protobuf.load_message(spec.descriptor_set, spec.message)  # type: ignore[arg-type]
        dec = (protobuf.ConfluentProtobufDecoder(descriptor, schema_of) if spec.confluent
               else protobuf.RawProtobufDecoder(descriptor))
    return rejecting(dec.decode, max_event_bytes)


def build_decoders(specs: Mapping[str, FormatSpec] | None, schema_of_type: SchemaOfType | None,
                   max_event_bytes: int) -> dict[str, Decoder]:
    """The decoders of ``specs`` per stream (JSON streams: none, the translator's own JSON decoder)."""
    return {s: build_decoder(spec, schema_of_type, max_event_bytes) for s, spec in (specs or {}).items()}


def translator_of(mapping: EventMapping | None, specs: Mapping[str, FormatSpec] | None,
                  schema_of_type: SchemaOfType | None, max_event_bytes: int) -> Any:
    """The :class:`~pipeline.events.translate.Translator` of a mapping and its formats (None: identity)."""
    from rankwatch.pipeline.events.translate import translator_for

    if mapping is None:
        return None
    return translator_for(mapping, max_event_bytes=max_event_bytes,
                          decoders=build_decoders(specs, schema_of_type, max_event_bytes))


class SchemaCache:
    """The core's view of the registry: only what the consuming side resolved (:class:`SchemaGate`).

    An id the gate has not sent cannot be in a batch (the gate resolves every id before its records are
    fed); if it were, it is :class:`RegistryUnavailable` (a bug, loud), never a silent rejection.
    """

    def __init__(self) -> None:
        self.entries: Entries = {}

    def update(self, entries: Entries) -> None:
        self.entries.update(entries)

    def schema_of(self, schema_type: str) -> Callable[[int], object]:
        entries = self.entries

        def schema_of(schema_id: int) -> object:
            entry = entries.get((schema_type, schema_id))
            if entry is None:
                raise RegistryUnavailable(f"schema id {schema_id} was not resolved before its batch")
            found, text = entry
            if not found:
                raise UnknownSchema(schema_id, text)
            return text

        return schema_of


class SchemaGate:
    """Resolves the Confluent schema ids of buffered records before they are fed (module docstring).

    Parameters
    ----------
    registry
        A :class:`consumers.registry.SchemaRegistry` (``schema_of(type)(id)`` raising UnknownSchema,
        RegistryUnavailable or RegistryRefused).
    types
        Topic -> schema type (``AVRO`` / ``PROTOBUF``) of the Confluent-framed topics.
    outage
        The registry's outage record (one log line per outage, backoff, seconds; a :class:`KafkaOutage`
        named for the registry).
    """

    def __init__(self, registry: Any, types: Mapping[str, str], outage: KafkaOutage | None = None) -> None:
        self.registry = registry
        self.types = dict(types)
        from rankwatch.consumers.outage import KafkaOutage

        self.outage = outage or KafkaOutage(resource=getattr(registry, "resource", "schema registry"))
        self._lookups = {t: registry.schema_of(t) for t in set(self.types.values())}
        self._resolved: set[tuple[str, int]] = set()  # found: never asked again (ids are immutable)
        self._pending: set[tuple[str, int]] = set()
        self._new: Entries = {}

    @property
    def blocked(self) -> bool:
        """Ids wait for the registry: nothing may be fed."""
        return bool(self._pending)

    def note(self, topic: str, records: Iterable[Any]) -> None:
        """Remember the schema ids of newly buffered ``records`` of ``topic`` that are not resolved yet."""
        schema_type = self.types.get(topic)
        if schema_type is None:
            return
        last = b""
        resolved, pending = self._resolved, self._pending
        for rec in records:
            value = rec.value
            if not value or value[0] != 0 or len(value) < 5:
                continue  # not framed: the decoder rejects it (undecodable), no registry involved
            head = value[:5]
            if head == last:
                continue
            last = head
            key = (schema_type, int.from_bytes(head[1:5], "big"))
            if key not in resolved:
                pending.add(key)

    def open(self) -> bool:
        """Ask the registry for every pending id; True when none is left (feeding may go on).

        An outage (RegistryUnavailable) is recorded in :attr:`outage` (one WARNING per outage) and
        False returned; RegistryRefused (401/403, a ConfigError) propagates.
        """
        if not self._pending:
            return True
        for key in sorted(self._pending):
            schema_type, schema_id = key
            try:
                text = self._lookups[schema_type](schema_id)
            except UnknownSchema as e:
                self._new[key] = (False, e.detail)
            except RegistryUnavailable as e:
                self.outage.failed(f"schema id {schema_id}", e)
                return False
            else:
                self._new[key] = (True, str(text))
                self._resolved.add(key)
            self._pending.discard(key)
        self.outage.succeeded()
        return True

    def ready(self, cores: Any) -> bool:
        """:meth:`open`, then what was learnt shipped to ``cores`` (``add_schemas``). Credentials refused
        (401/403) end the service with one line, as Kafka's do (a FatalKafkaError)."""
        from rankwatch.consumers.outage import FatalKafkaError

        try:
            ready = self.open()
        except ConfigError as e:
            raise FatalKafkaError(str(e)) from None
        if self._new:
            cores.add_schemas(self.take_new())
        return ready

    def take_new(self) -> Entries:
        """What was learnt since the last call (to ship to the core's :class:`SchemaCache`)."""
        new, self._new = self._new, {}
        return new


def schema_gate(kafka: Any, formats: Mapping[str, FormatSpec] | None, registry: Any) -> SchemaGate | None:
    """The gate of the service's Confluent-framed topics (None when there is none)."""
    topics = {"impressions": kafka.impressions_topic, "clicks": kafka.clicks_topic}
    types = {topics[s]: spec.schema_type for s, spec in (formats or {}).items() if spec.confluent}
    if not types:
        return None
    if registry is None:
        raise ConfigError("framing = \"confluent\" needs [schema_registry]")
    from rankwatch.consumers.outage import KafkaOutage

    outage = KafkaOutage(backoff_max_s=kafka.retry_backoff_max_s, resource=registry.resource)
    return SchemaGate(registry, types, outage)


def registry_schema_of(settings: Any) -> tuple[Any, SchemaOfType]:
    """A :class:`consumers.registry.SchemaRegistry` for ``[schema_registry]`` and its ``schema_of``."""
    from rankwatch.consumers.registry import SchemaRegistry

    registry = SchemaRegistry(settings)
    return registry, registry.schema_of
