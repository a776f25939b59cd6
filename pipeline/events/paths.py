"""Paths and value rules of a field mapping (SPEC section 6), compiled once into plain closures.

Layout: :func:`parse_path` checks a path's text; :func:`compile_path` turns it into a getter (a tight loop
over a tuple of keys, or one ``dict.get`` for a single key); :func:`compile_rule` adds a field's ``default``,
``map``, ``unit`` (``ts``) and ``base`` (``position``) around the getter; :data:`TS_UNITS` lists the units.

Why closures built at start: a mapping is read at a million events a minute, so nothing is interpreted per
event (no path splitting, no rule lookups); each field costs one Python call and a few comparisons.

A getter returns the value, ``None`` when the path is absent (a JSON null or an Avro optional left unset
counts as absent), or a :class:`~pipeline.events.validation.Rejection` (``bad_type``) when the path walks
through a value that is neither an object nor a list.
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from rankwatch.pipeline.events.validation import Rejection, RejectReason

Getter = Callable[[Any], Any]
TS_UNITS = ("ms", "s", "us", "ns", "rfc3339")
_SEGMENT = re.compile(r"[^.\s]+")
# What a compiled getter does, when it is simple enough for a caller to inline (the items loop of
# pipeline.events.translate): a single-key getter's key, and a rule that only shifts a single key's integer.
SINGLE_KEY: weakref.WeakKeyDictionary[Getter, str] = weakref.WeakKeyDictionary()
SHIFTED_KEY: weakref.WeakKeyDictionary[Getter, tuple[str, int]] = weakref.WeakKeyDictionary()


def parse_path(text: str) -> tuple[str, ...]:
    """The keys of a dot-separated path; a ValueError says what is wrong (empty key, whitespace)."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"not a path: {text!r} (dot-separated keys, e.g. 'req.id')")
    keys = tuple(text.split("."))
    for key in keys:
        if not _SEGMENT.fullmatch(key):
            raise ValueError(f"malformed path {text!r}: empty key or whitespace (dot-separated keys, e.g. 'req.id')")
    return keys


def compile_path(keys: tuple[str, ...]) -> Getter:
    """A getter for ``keys``: a key that is all digits also indexes a list (``results.0.sku``)."""
    text = ".".join(keys)
    steps = tuple((k, int(k) if k.isdigit() else None) for k in keys)
    if len(steps) == 1 and steps[0][1] is None:
        key = keys[0]

        def get_one(tree: Any) -> Any:
            if type(tree) is dict:
                return tree.get(key)
            return None if tree is None else _through(text, key, tree)

        SINGLE_KEY[get_one] = key
        return get_one
    general = _walk(text, steps)
    if len(steps) == 2 and steps[0][1] is None and steps[1][1] is None:  # "req.id": the usual nesting
        first, second = keys

        def get_two(tree: Any) -> Any:
            if type(tree) is dict:
                inner = tree.get(first)
                if type(inner) is dict:
                    return inner.get(second)
                if inner is None:
                    return None
            return general(tree)

        return get_two
    return general


def _walk(text: str, steps: tuple[tuple[str, int | None], ...]) -> Getter:
    """The general getter: every step, list indexes and mappings other than dict included."""

    def get(tree: Any) -> Any:
        value = tree
        for key, index in steps:
            if type(value) is dict:
                value = value.get(key)
            elif type(value) is list and index is not None:
                value = value[index] if index < len(value) else None
            elif isinstance(value, Mapping):  # decoders other than JSON may hand other mappings
                value = value.get(key)
            else:
                return _through(text, key, value)
            if value is None:
                return None
        return value

    return get


def _through(path: str, key: str, value: Any) -> Any:
    """``value[key]`` for a mapping other than dict (other decoders), else ``bad_type`` naming the path."""
    if isinstance(value, Mapping):
        return value.get(key)
    return Rejection(RejectReason.bad_type, f"path {path}: {key!r} is looked up in a {type(value).__name__}, "
                                            "not an object")


def _map_key(value: Any) -> Any:
    """The TOML key a value is looked up by in a ``map`` (TOML keys are strings)."""
    if type(value) is str:
        return value
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    return None


def ts_converter(unit: str | None, path: str) -> Callable[[Any], Any] | None:
    """Epoch ms (int) from a ``ts`` value in ``unit``; None for the default (section 1's forms, checked by
    the core). Numbers are rounded to the nearest millisecond; a wrong type is ``bad_timestamp``."""
    if unit is None:
        return None
    bad = RejectReason.bad_timestamp
    if unit == "rfc3339":
        def rfc3339(v: Any) -> Any:
            if type(v) is str:
                return v
            if isinstance(v, datetime):
                return _datetime_ms(v, path)
            return Rejection(bad, f"path {path}: expected an RFC 3339 string, got {type(v).__name__}")
        return rfc3339
    per_ms = {"ms": 1, "s": 0.001, "us": 1000, "ns": 1_000_000}[unit]

    def number(v: Any) -> Any:
        t = type(v)
        if t is int:
            if per_ms == 1:
                return v
            if per_ms < 1:
                return v * 1000
            return (v + per_ms // 2) // per_ms  # nearest ms, halves up
        if t is float:
            if not math.isfinite(v):
                return Rejection(bad, f"path {path}: {v} is not a finite number")
            return round(v * 1000) if per_ms < 1 else round(v / per_ms)
        if isinstance(v, datetime):  # Avro timestamp logical types decode to datetimes
            return _datetime_ms(v, path)
        return Rejection(bad, f"path {path}: expected a number of {unit}, got {type(v).__name__}")
    return number


def _datetime_ms(v: datetime, path: str) -> Any:
    if v.tzinfo is None:
        return Rejection(RejectReason.bad_timestamp, f"path {path}: a timestamp without a zone")
    return round(v.timestamp() * 1000)


def compile_rule(getter: Getter, *, default: Any = None, value_map: Mapping[str, Any] | None = None,
                 convert: Callable[[Any], Any] | None = None) -> Getter:
    """``getter`` with a default (absent -> default), a value map (values not in it pass) and a converter.

    The converter (``ts`` unit, ``position`` base) sees the mapped value; it may return a Rejection.
    With none of the three the getter itself is returned: the plain case costs nothing extra.
    """
    if default is None and value_map is None and convert is None:
        return getter
    vmap = dict(value_map) if value_map is not None else None

    def rule(tree: Any) -> Any:
        v = getter(tree)
        if v is None:
            if default is None:
                return None
            v = default
        elif type(v) is Rejection:
            return v
        if vmap is not None:
            key = _map_key(v)
            if key is not None and key in vmap:
                v = vmap[key]
        return v if convert is None else convert(v)

    if default is None and vmap is None and getter in SINGLE_KEY and convert is not None and convert in SHIFTED_KEY:
        SHIFTED_KEY[rule] = (SINGLE_KEY[getter], SHIFTED_KEY[convert][1])
    return rule


def position_converter(base: int) -> Callable[[Any], Any] | None:
    """0-based positions to section 1's 1-based ones (anything but an int passes: the core names it)."""
    if base == 1:
        return None

    def shift(v: Any) -> Any:
        return v + 1 if type(v) is int else v

    SHIFTED_KEY[shift] = ("", 1)
    return shift
