"""The field mapping run backwards: section 1 events to records in a team's own schema.

Layout: :func:`reverser` returns, for one stream of an :class:`~pipeline.events.mapping.EventMapping`, a
function from a decoded section 1 event (a dict) to the list of records the team would log for it (one in
the list layout and for feedback; one per shown item in the item layout). Each field is written at its
path; ``unit`` converts epoch milliseconds to the team's unit (``s`` and ``us`` / ``ns`` numbers, or an
RFC 3339 string), ``map`` is inverted (the first team value naming a rankwatch value wins), ``base = 0``
shifts positions down by one. Fields the event does not carry are left out.

Why: ``rankwatch simulate --config`` produces traffic in the configured schema, and the tests write the same
events in foreign shapes, so the whole loop runs on a team's shape; reading the records back through the
forward mapping gives the original section 1 events (tests/pipeline/events/test_reverse.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from rankwatch.pipeline.events.mapping import EVENT_FIELDS, ITEM_FIELDS, EventMapping
from rankwatch.pipeline.events.paths import parse_path

Record = dict[str, Any]
_PER_MS = {"ms": 1, "s": 1000, "us": 0.001, "ns": 0.000001}


def _ms(ts: Any) -> int:
    if type(ts) is int:
        return ts
    return round(datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp() * 1000)


def _ts_out(unit: str | None) -> Callable[[Any], Any]:
    if unit is None:
        return lambda v: v
    if unit == "rfc3339":
        return lambda v: datetime.fromtimestamp(_ms(v) / 1000, tz=UTC).isoformat(timespec="milliseconds").replace(
            "+00:00", "Z")
    if unit == "ms":
        return _ms
    if unit == "s":
        return lambda v: _ms(v) // 1000 if _ms(v) % 1000 == 0 else _ms(v) / 1000
    factor = 1000 if unit == "us" else 1_000_000
    return lambda v: _ms(v) * factor


def _rule(name: str, spec: Any) -> tuple[tuple[str, ...], Callable[[Any], Any]]:
    """(path keys, value transform) of one field's spec (a path string, a table, or None)."""
    if spec is None:
        return (name,), lambda v: v
    if isinstance(spec, str):
        return parse_path(spec), lambda v: v
    keys = parse_path(spec.get("path", name))
    steps: list[Callable[[Any], Any]] = []
    if name == "ts":
        steps.append(_ts_out(spec.get("unit")))
    if name == "position" and spec.get("base", 1) == 0:
        steps.append(lambda v: v - 1)
    value_map = spec.get("map")
    if isinstance(value_map, Mapping):
        inverse: dict[Any, Any] = {}
        for team, ours in value_map.items():
            inverse.setdefault(ours, team)
        steps.append(lambda v: inverse.get(v, v))

    def transform(v: Any) -> Any:
        for step in steps:
            v = step(v)
        return v

    return keys, transform


def _put(tree: Record, keys: tuple[str, ...], value: Any) -> None:
    for key in keys[:-1]:
        tree = tree.setdefault(key, {})
    tree[keys[-1]] = value


def reverser(mapping: EventMapping, stream: str) -> Callable[[Record], list[Record]]:
    """The function from a section 1 event of ``stream`` to the team's records (module docstring)."""
    table = dict(mapping.tables.get(stream) or {})
    fields = dict(table.get("fields") or {})
    layout = table.get("layout", "list") if stream == "impressions" else "item"
    event_names = [n for n in EVENT_FIELDS[stream] if n != "items"]
    event_rules = [(n, *_rule(n, fields.get(n))) for n in event_names]
    if stream == "clicks":
        def click(event: Record) -> list[Record]:
            out: Record = {}
            for name, keys, transform in event_rules:
                if name in event:
                    _put(out, keys, transform(event[name]))
            return [out]

        return click
    item_rules = [(n, *_rule(n, fields.get(n))) for n in ITEM_FIELDS]
    items_keys = _rule("items", fields.get("items"))[0]

    def head(event: Record) -> Record:
        out: Record = {}
        for name, keys, transform in event_rules:
            if name in event:
                _put(out, keys, transform(event[name]))
        return out

    def element(item: Record, into: Record) -> Record:
        for name, keys, transform in item_rules:
            if name in item:
                _put(into, keys, transform(item[name]))
        return into

    if layout == "item":
        return lambda event: [element(item, head(event)) for item in event.get("items", [])]

    def listed(event: Record) -> list[Record]:
        out = head(event)
        _put(out, items_keys, [element(item, {}) for item in event.get("items", [])])
        return [out]

    return listed
