"""``rankwatch simulate --config``: the generator's section 1 events written in the config's own schema.

Layout: :func:`team_encoders` builds, per stream, a function from one generated event to the messages the
team's producer would send (the field mapping run backwards, :mod:`pipeline.events.reverse`, then the
stream's format: JSON, or Avro as raw datums with ``schema_file`` or Confluent-framed after registering
``schema_file`` under ``<topic>-value``); :func:`in_team_schema` applies them to an event stream.

Why a module of its own: the simulator stays wiring; what is supported is said in one place. Protobuf
traffic is not produced (the registry would need the .proto source; a start-up error says so). Events
that are malformed on purpose (the generator's bad lines) are sent as they are: they stay bad input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

import msgspec

from rankwatch.errors import ConfigError, RankwatchError

Encode = Callable[[Any], list[bytes]]


def team_encoders(cfg: Any, topics: dict[str, str]) -> dict[str, Encode]:
    """Per stream, generated event -> the team's message values (see the module docstring)."""
    from rankwatch.pipeline.events.reverse import reverser

    out: dict[str, Encode] = {}
    registry = None
    for stream in ("impressions", "clicks"):
        reverse = reverser(cfg.events, stream)
        spec = cfg.formats.get(stream)
        if spec is None:
            write: Callable[[Any], bytes] = msgspec.json.encode
        elif spec.format == "protobuf":
            raise ConfigError(f"simulate --config: events.{stream}.format = \"protobuf\" is not produced "
                              "(json and avro are)")
        else:
            from rankwatch.pipeline.events.formats.avro import RawAvroEncoder, load_schema_file

            if spec.schema_file is None:
                raise ConfigError(f"simulate --config: events.{stream}.schema_file is needed to write Avro")
            if spec.confluent:
                from rankwatch.consumers.registry import SchemaRegistry, confluent_avro_encoder
                from rankwatch.pipeline.events.formats import RegistryUnavailable

                registry = registry or SchemaRegistry(cfg.schema_registry)
                try:
                    encoder: Any = confluent_avro_encoder(registry, f"{topics[stream]}-value",
                                                          spec.schema_file.read_text(encoding="utf-8"))
                except RegistryUnavailable as e:
                    raise RankwatchError(str(e)) from None
            else:
                encoder = RawAvroEncoder(load_schema_file(spec.schema_file))
            write = encoder.encode
        out[stream] = _encoder(reverse, write)
    return out


def _encoder(reverse: Callable[[dict[str, Any]], list[dict[str, Any]]], write: Callable[[Any], bytes]) -> Encode:
    decode = msgspec.json.decode

    def encode(value: bytes) -> list[bytes]:
        try:
            event = decode(value)
        except msgspec.DecodeError:
            return [value]  # malformed on purpose: sent as it is
        if type(event) is not dict:
            return [value]
        try:
            return [write(record) for record in reverse(event)]
        except (ValueError, TypeError, KeyError, AttributeError):
            return [value]  # an event the schema cannot hold (a bad type on purpose): sent as it is

    return encode


def in_team_schema(events: Iterable[Any], encoders: dict[str, Encode],
                   on_native: Callable[[Any], None] | None = None) -> Iterator[Any]:
    """Each generated event as the team's messages (same key and time); ``on_native`` sees the original."""
    for event in events:
        if on_native is not None:
            on_native(event)
        for value in encoders[event.stream](event.value):
            yield replace(event, value=value)
