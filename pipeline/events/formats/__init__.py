"""Foreign wire formats (SPEC section 6): raw Kafka or file bytes to the record tree the field mapping reads.

Layout:

- this module: the :class:`Decoder` protocol every format implements, its errors (:class:`DecodeError`
  for bad input, :class:`RegistryUnavailable` for an outage) and :func:`require`, the start-up check that a
  format's optional dependencies are installed;
- ``framing``: the Confluent Schema Registry wire framing (magic byte, schema id, Protobuf message indexes);
- ``avro``: Avro with fastavro (Confluent-framed, raw datums with a schema file, object container files),
  and the Confluent-framed encoder the simulator produces with;
- ``protobuf``: Protobuf from a FileDescriptorSet and a message name (raw or Confluent-framed).

Why here, in the pure core: a decoded record is a plain ``dict`` / ``list`` tree whatever the wire format,
so the mapping and everything after it never learn which format a team uses. Nothing here talks to a
network: a registry is reached through an injected ``schema_of(schema_id)`` callable (the Kafka layer's
``consumers.registry`` provides one), which keeps the core testable without one and lets the caller tell
bad bytes (dead-lettered) from a registry outage (retried, nothing dead-lettered).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Protocol

from rankwatch.pipeline.errors import ConfigError

UNDECODABLE = "undecodable"  # bytes that are not a valid value of the configured format / framing
UNKNOWN_SCHEMA = "unknown_schema"  # a schema id the registry does not have (or of the wrong schema type)

FORMATS = ("json", "avro", "protobuf")
FRAMINGS = ("none", "confluent")

# format -> (extra, modules it needs). Checked with find_spec, so nothing is imported to check.
_NEEDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "avro": ("avro", ("fastavro",)),
    "protobuf": ("protobuf", ("google.protobuf",)),
}
_REGISTRY_MODULES = ("confluent_kafka",)


class DecodeError(Exception):
    """Bad input: the bytes cannot be read as the configured format. Count it, dead-letter it.

    Parameters
    ----------
    reason
        ``"undecodable"`` or ``"unknown_schema"`` (the values of the stream's rejection reasons).
    detail
        One line for the dead letter: what was wrong, never the payload itself.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class UnknownSchema(DecodeError):
    """The registry answered, and it has no schema with this id: bad input (the producer's fault)."""

    def __init__(self, schema_id: int, detail: str = "") -> None:
        super().__init__(UNKNOWN_SCHEMA, detail or f"schema id {schema_id} is not in the schema registry")
        self.schema_id = schema_id


class RegistryUnavailable(Exception):
    """The schema registry could not be asked (refused, timed out, 5xx, unauthorized): an OUTAGE.

    Not bad input: the consuming layer must retry the same message later (backoff, one log line, a health
    gauge), and must not dead-letter or skip it. The message names the registry, never a credential.
    """


class Decoder(Protocol):
    """Raw message bytes to a record tree (``dict`` / ``list`` / ``str`` / ``int`` / ``float`` / ``bool`` /
    ``bytes`` / ``None``).

    ``decode`` raises :class:`DecodeError` for bad input and :class:`RegistryUnavailable` when the schema
    cannot be fetched; it never returns a partial record.
    """

    def decode(self, raw: bytes) -> object: ...


SchemaOf = Callable[[int], object]
"""``schema_of(schema_id)``: the registry's schema for an id (text or parsed), raising
:class:`UnknownSchema` when the registry has none and :class:`RegistryUnavailable` when it cannot answer."""


def install_hint(fmt: str) -> str:
    """The pip command that adds ``fmt``'s optional dependencies."""
    extra = _NEEDS[fmt][0] if fmt in _NEEDS else fmt
    return f"pip install 'rankwatch[{extra}]'"


def require(fmt: str, framing: str = "none", *, key: str = "format") -> None:
    """Check at start-up that ``fmt`` (with ``framing``) can be read here; raise a one-line ConfigError if not.

    Parameters
    ----------
    fmt
        ``json``, ``avro`` or ``protobuf``.
    framing
        ``none`` or ``confluent``; ``confluent`` also needs the registry client (confluent-kafka).
    key
        The config key to name in the message (e.g. ``events.impressions.format``).

    Raises
    ------
    ConfigError
        Unknown format or framing, or a missing optional dependency (the message names the extra).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"{key}: unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    if framing not in FRAMINGS:
        raise ConfigError(f"{key}: unknown framing {framing!r} (one of {', '.join(FRAMINGS)})")
    if fmt == "json":
        if framing != "none":
            raise ConfigError(f"{key}: framing {framing!r} applies to avro and protobuf, not json")
        return
    extra, modules = _NEEDS[fmt]
    needed = modules + (_REGISTRY_MODULES if framing == "confluent" else ())
    missing = [m for m in needed if not _installed(m)]
    if missing:
        raise ConfigError(
            f"{key} = {fmt!r} needs {', '.join(missing)}, not installed: {install_hint(fmt)}"
        )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken install
        return False


__all__ = [
    "FORMATS",
    "FRAMINGS",
    "UNDECODABLE",
    "UNKNOWN_SCHEMA",
    "DecodeError",
    "Decoder",
    "RegistryUnavailable",
    "SchemaOf",
    "UnknownSchema",
    "install_hint",
    "require",
]
