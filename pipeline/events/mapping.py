"""A team's own event schema (SPEC section 6): the ``[events.impressions]`` / ``[events.clicks]`` tables,
checked and compiled once into an :class:`EventMapping`.

Layout: :class:`StreamMapping` is one table compiled (format, layout, one getter per section 1 field, see
:mod:`pipeline.events.paths`); :class:`EventMapping` holds the two; :func:`pipeline.events.translate.translator_for` builds the
:class:`~pipeline.events.translate.Translator` that turns a team's events into section 1 events.

Why compile into section 1 *bytes* rather than records: the unchanged native core (per-record and batch
paths) then validates, counts and joins them, so every rule of section 1 holds for mapped events and the
batch path equals the per-record path by construction. A config that maps nothing is the identity: no
translator at all, and native events cost nothing more than before.

Errors are :class:`pipeline.errors.ConfigError` lines naming the table and key, e.g.
``config.toml: events.impressions.fields.position.base: must be 0 or 1, got 2``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.paths import (
    TS_UNITS,
    Getter,
    compile_path,
    compile_rule,
    parse_path,
    position_converter,
    ts_converter,
)

STREAM_NAMES = ("impressions", "clicks")
FORMATS = ("json", "avro", "protobuf")
LAYOUTS = ("list", "item")
# Section 1's fields per stream (the keys a ``fields`` table may have).
EVENT_FIELDS = {
    "impressions": ("event_id", "request_id", "ts", "user_id", "segment", "surface", "variant", "model", "items"),
    "clicks": ("event_id", "request_id", "item_id", "ts", "action", "grade"),
}
ITEM_FIELDS = ("item_id", "position", "score")
REQUIRED = frozenset({"request_id", "ts", "item_id", "position", "score"})  # absent: missing_field
# Keys of a stream table; format-specific ones (framing, schema_file, ...) are read by the format's decoder.
TABLE_KEYS = frozenset({"format", "layout", "fields", "framing", "schema_file", "descriptor_set", "message"})
RULE_KEYS = frozenset({"path", "unit", "map", "default", "base"})


def digest_id(raw: bytes) -> str:
    """The event id of a message without one: BLAKE2b-128 of its bytes, hex."""
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Field:
    """One compiled field: its section 1 ``name``, the team's ``path`` (text) and its getter."""

    name: str
    path: str
    get: Getter = field(compare=False)
    mapped: bool = True  # named in the ``fields`` table (else section 1's own name is the path)
    # The rule the getter was compiled from, for pipeline.events.translate_compiled's generated code.
    keys: tuple[str, ...] = field(default=(), compare=False)
    default: Any = field(default=None, compare=False)
    value_map: Mapping[str, Any] | None = field(default=None, compare=False)
    unit: str | None = field(default=None, compare=False)
    base: int = field(default=1, compare=False)


@dataclass(frozen=True)
class StreamMapping:
    """One ``[events.<stream>]`` table, compiled.

    ``fields`` are the event-level fields (from the root); ``item_fields`` are ``item_id``, ``position``,
    ``score``: inside one element of ``items`` in the list layout, from the root in the item layout.
    ``options`` keeps the format's own keys (``framing``, ``schema_file``, ``descriptor_set``, ``message``)
    for its decoder.
    """

    stream: str
    format: str = "json"
    layout: str = "list"
    fields: tuple[Field, ...] = ()
    item_fields: tuple[Field, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    identity: bool = True  # maps nothing: section 1 events read unchanged

    def field(self, name: str) -> Field | None:
        return next((f for f in (*self.fields, *self.item_fields) if f.name == name), None)


def compile_stream(stream: str, table: Mapping[str, Any], where: str = "config") -> StreamMapping:
    """Check and compile one ``[events.<stream>]`` table (a :class:`ConfigError` naming the key)."""
    prefix = f"{where}: events.{stream}"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{prefix}: expected a table")
    for key in table:
        if key not in TABLE_KEYS:
            raise ConfigError(f"{prefix}.{key}: unknown key (known: {', '.join(sorted(TABLE_KEYS))})")
    fmt = table.get("format", "json")
    if fmt not in FORMATS:
        raise ConfigError(f"{prefix}.format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    layout = table.get("layout", "list")
    if layout not in LAYOUTS or (stream == "clicks" and "layout" in table and layout != "item"):
        allowed = "list or item" if stream == "impressions" else "item (feedback has one event per item)"
        raise ConfigError(f"{prefix}.layout: must be {allowed}, got {layout!r}")
    fields_table = table.get("fields", {})
    if not isinstance(fields_table, Mapping):
        raise ConfigError(f"{prefix}.fields: expected a table of rankwatch field = path")
    known = EVENT_FIELDS[stream] + (ITEM_FIELDS if stream == "impressions" else ())
    for name in fields_table:
        if name not in known:
            raise ConfigError(f"{prefix}.fields.{name}: not a section 1 field of {stream} (known: {', '.join(known)})")
    if stream == "impressions" and layout == "item" and "items" in fields_table:
        raise ConfigError(f"{prefix}.fields.items: the item layout has no items array (layout = \"list\" has)")
    options = {k: table[k] for k in ("framing", "schema_file", "descriptor_set", "message") if k in table}
    identity = fmt == "json" and not fields_table and "layout" not in table and not options

    def compiled(name: str) -> Field:
        return _compile_field(name, fields_table.get(name), f"{prefix}.fields.{name}")

    if stream == "clicks":
        return StreamMapping(stream, fmt, "item", tuple(compiled(n) for n in EVENT_FIELDS["clicks"]), (),
                             options, identity)
    event_names = EVENT_FIELDS["impressions"] if layout == "list" else EVENT_FIELDS["impressions"][:-1]
    return StreamMapping(stream, fmt, layout, tuple(compiled(n) for n in event_names),
                         tuple(compiled(n) for n in ITEM_FIELDS), options, identity)


def _compile_field(name: str, spec: Any, where: str) -> Field:
    if spec is None:
        return Field(name, name, compile_path((name,)), mapped=False, keys=(name,))
    if isinstance(spec, str):
        spec = {"path": spec}
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a path string or a table with path, unit, map, default, base")
    for key in spec:
        if key not in RULE_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(sorted(RULE_KEYS))})")
    text = spec.get("path", name)
    try:
        keys = parse_path(text)
    except ValueError as e:
        raise ConfigError(f"{where}.path: {e}") from None
    unit = spec.get("unit")
    if unit is not None and (name != "ts" or unit not in TS_UNITS):
        raise ConfigError(f"{where}.unit: " + (f"must be one of {', '.join(TS_UNITS)}, got {unit!r}" if name == "ts"
                                               else "only ts has a unit"))
    base = spec.get("base", 1)
    if "base" in spec and (name != "position" or type(base) is not int or base not in (0, 1)):
        raise ConfigError(f"{where}.base: " + (f"must be 0 or 1, got {base!r}" if name == "position"
                                               else "only position has a base"))
    value_map = spec.get("map")
    if value_map is not None and (not isinstance(value_map, Mapping) or name == "items"):
        raise ConfigError(f"{where}.map: " + ("items has no map" if name == "items" else
                                              "expected a table of team value = rankwatch value"))
    default = spec.get("default")
    if default is not None and (name == "items" or isinstance(default, Mapping | list)):
        raise ConfigError(f"{where}.default: expected a single value")
    convert: Callable[[Any], Any] | None = None
    if name == "ts":
        convert = ts_converter(unit, text)
    elif name == "position":
        convert = position_converter(base)
    getter = compile_rule(compile_path(keys), default=default, value_map=value_map, convert=convert)
    return Field(name, text, getter, mapped=True, keys=keys, default=default,
                 value_map=dict(value_map) if value_map is not None else None, unit=unit, base=base)


@dataclass(frozen=True)
class EventMapping:
    """Both streams' mappings, compiled from the config's ``[events]`` table (see module docstring)."""

    impressions: StreamMapping
    clicks: StreamMapping
    tables: Mapping[str, Any] = field(default_factory=dict, compare=False)  # the source, to pickle by
    where: str = field(default="config", compare=False)

    @classmethod
    def from_tables(cls, tables: Mapping[str, Any] | None, where: str = "config") -> EventMapping:
        """Compile the ``[events]`` table (``{"impressions": {...}, "clicks": {...}}``; None or {}: identity)."""
        tables = dict(tables or {})
        for key in tables:
            if key not in STREAM_NAMES:
                raise ConfigError(f"{where}: events.{key}: unknown table (known: events.impressions, events.clicks)")
        return cls(compile_stream("impressions", tables.get("impressions", {}), where),
                   compile_stream("clicks", tables.get("clicks", {}), where), tables, where)

    @property
    def identity(self) -> bool:
        """True when the config maps nothing: section 1 events read unchanged, no translation at all."""
        return self.impressions.identity and self.clicks.identity

    def stream(self, name: str) -> StreamMapping:
        return self.impressions if name == "impressions" else self.clicks

    def __reduce__(self) -> tuple[Any, ...]:
        # Getters are closures: a mapping travels (to the core process) as its tables and is compiled again.
        return (EventMapping.from_tables, (dict(self.tables), self.where))


IDENTITY = EventMapping.from_tables(None)
