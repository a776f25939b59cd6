"""One stream's mapping compiled into one generated Python function: :func:`compiled_translator`.

Layout: :func:`compiled_translator` writes the source of a per-record function for a
:class:`~pipeline.events.mapping.StreamMapping` (nested ``dict.get`` chains for the paths, value maps as
dict lookups, the common timestamp units and the 0-based position shift inline, defaults as constants),
``exec``\\ s it once and returns it; ``_Source`` collects the lines and the constants the code refers to.
The function takes ``(tree, raw)`` and returns ``[section 1 bytes]`` or calls ``slow(tree, raw)``:
the general translator of :mod:`pipeline.events.translate` (the path getters of
:mod:`pipeline.events.paths`), for everything out of the ordinary.

Why generated code: per record the general translator calls one closure per field (two for a rule), and a
20-item impression calls three per item; the generated function reads every path inline in one frame and
builds the items in one list comprehension, several times cheaper (an item value that is None is found
by one search of the encoded bytes for ``:null`` instead of a test per value). Why a fallback rather than a second
implementation of every rule: the generated code handles only records whose every path meets an object
(or a list by index), whose required values are present and whose values convert without question; at
the first anything else (a missing required field, a path through a scalar, a non-dict mapping such as a
Protobuf tree, a timestamp of the wrong type, a value with no JSON form) it hands the *whole record* to
the general translator, which returns the same bytes or the same Rejection as it always did: the general
path stays the one definition of every rejection, and the generated one is only a shortcut to its result
(tests/pipeline/events/test_translate_compiled.py compares the two on random trees).

Nothing a user wrote becomes source text: keys, value maps and defaults are constants in the function's
namespace (``K0``, ``M1``, ...), referred to by generated names only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from rankwatch.pipeline.events.mapping import REQUIRED, Field, StreamMapping, digest_id
from rankwatch.pipeline.events.paths import ts_converter
from rankwatch.pipeline.events.validation import Rejection

TreeFn = Callable[[Any, bytes], Any]
_SLOW = "return slow(tree, raw)"
# Units the generated code converts inline: (int expression, float expression) of ``v``; floats only when
# finite (``v - v == 0.0`` is False for inf and NaN). Anything else goes to the unit's converter.
_UNIT_CODE = {
    "ms": (None, "round(v)"),
    "s": ("v * 1000", "round(v * 1000)"),
    "us": ("(v + 500) // 1000", "round(v / 1000)"),
    "ns": ("(v + 500000) // 1000000", "round(v / 1000000)"),
}


def _map_other(v: Any, vmap: Mapping[str, Any]) -> Any:
    """A value map for a value that is not a str (``paths._map_key``: TOML keys are strings)."""
    t = type(v)
    key = ("true" if v else "false") if t is bool else str(v) if t is int else None
    return vmap[key] if key is not None and key in vmap else v


class _Source:
    """The lines of the generated function and the namespace of constants they name."""

    def __init__(self, slow: TreeFn) -> None:
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {"slow": slow, "Rejection": Rejection, "dict": dict, "list": list,
                                   "int": int, "float": float, "str": str, "type": type, "round": round,
                                   "len": len, "map_other": _map_other, "KeyError": KeyError,
                                   "TypeError": TypeError, "ValueError": ValueError, "IndexError": IndexError,
                                   "digest": digest_id}

    def const(self, prefix: str, value: Any) -> str:
        """A generated name for ``value`` in the namespace (never the value's text in the source)."""
        name = f"{prefix}{len(self.ns)}"
        self.ns[name] = value
        return name

    def add(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)


def _chain(src: _Source, keys: tuple[str, ...]) -> None:
    """``v`` = the value at ``keys`` from the dict ``tree`` (None when absent); anything but an object (or
    a list, by a digit key) on the way hands the record to the general path."""
    src.add(1, f"v = tree.get({src.const('K', keys[0])})")
    for key in keys[1:]:
        src.add(1, f"if type(v) is dict: v = v.get({src.const('K', key)})")
        if key.isdigit():
            n = src.const("I", int(key))
            src.add(1, f"elif type(v) is list: v = v[{n}] if {n} < len(v) else None")
        src.add(1, f"elif v is not None: {_SLOW}")


def _convert(src: _Source, f: Field, ind: int) -> None:
    """The value map, then the unit (``ts``) or base (``position``) of ``f``, on a present ``v``."""
    if f.value_map is not None:
        m = src.const("M", dict(f.value_map))
        src.add(ind, "if type(v) is str:")
        src.add(ind + 1, f"if v in {m}: v = {m}[v]")
        src.add(ind, f"else: v = map_other(v, {m})")
    if f.name == "ts" and f.unit is not None:
        conv = src.const("C", _converter_of(f))
        if f.unit == "rfc3339":
            src.add(ind, "if type(v) is not str:")
        else:
            as_int, as_float = _UNIT_CODE[f.unit]
            src.add(ind, "if type(v) is int:" + ("" if as_int is None else f" v = {as_int}"))
            if as_int is None:
                src.add(ind + 1, "pass")
            src.add(ind, f"elif type(v) is float and v - v == 0.0: v = {as_float}")
            src.add(ind, "else:")
        src.add(ind + 1, f"v = {conv}(v)")
        src.add(ind + 1, f"if type(v) is Rejection: {_SLOW}")
    elif f.name == "position" and f.base == 0:
        src.add(ind, "if type(v) is int: v = v + 1")


def _converter_of(f: Field) -> Callable[[Any], Any]:
    """The unit's converter (the one the general path's rule calls): for values not converted inline."""
    conv = ts_converter(f.unit, f.path)
    assert conv is not None
    return conv


def _field(src: _Source, f: Field, out: str, *, required: bool) -> None:
    """``out`` = the value of event-level field ``f`` (None when absent and optional)."""
    _chain(src, f.keys)
    has_rule = f.value_map is not None or (f.name == "ts" and f.unit is not None) or (
        f.name == "position" and f.base == 0)
    if f.default is not None:
        src.add(1, f"if v is None: v = {src.const('D', f.default)}")
        _convert(src, f, 1)
    else:
        if f.name == "event_id" and not f.mapped:
            src.add(1, "if v is None: v = digest(raw)")  # the message's digest (mapping.digest_id)
        elif required or f.name == "event_id":
            src.add(1, f"if v is None: {_SLOW}")  # missing_field, named by the general path
        elif has_rule:
            src.add(1, "if v is not None:")
            _convert(src, f, 2)
            has_rule = False
        if has_rule:
            _convert(src, f, 1)
    src.add(1, f"{out} = v")


def _item_test(src: _Source, f: Field, var: str) -> tuple[str, str, bool]:
    """(condition on element ``el``, value expression, whether a None value must be caught in the JSON) of
    item field ``f``: a plain path is read by subscripts (a missing key raises KeyError, a None on the way
    TypeError); a None at its end is left to the ``:null`` check of the encoded event."""
    plain = f.default is None and f.value_map is None and not any(k.isdigit() for k in f.keys)
    if not plain:  # the field's rule getter: None or a Rejection sends the record to the general path
        g = src.const("G", f.get)
        return f"({var} := {g}(el)) is not None and type({var}) is not Rejection", var, False
    parts, cur = [], "el"
    for depth, key in enumerate(f.keys[:-1]):
        step = f"{var}_{depth}"
        parts.append(f"type({step} := {cur}[{src.const('K', key)}]) is dict")
        cur = step
    last = f"{cur}[{src.const('K', f.keys[-1])}]"
    if f.name == "position" and f.base == 0:  # an int shifted; anything else takes the general path
        parts.append(f"type({var} := {last}) is int")
        return " and ".join(parts), f"{var} + 1", False
    return " and ".join(parts), last, True


def compiled_translator(sm: StreamMapping, slow: TreeFn, item_type: type) -> TreeFn:
    """The generated per-record function of ``sm`` (see module docstring): ``slow`` is the general
    translator of the same stream, ``item_type`` the positional item struct the general path encodes."""
    src = _Source(slow)
    event = [f for f in sm.fields if f.name != "items"]
    event.sort(key=lambda f: f.name != "event_id")  # event_id first, as the general path's dict
    items_field = next((f for f in sm.fields if f.name == "items"), None)
    if items_field is None:  # item layout or feedback: the item fields from the root, after the others
        event += list(sm.item_fields)
    names = [f.name for f in event] + (["items"] if items_field is not None else [])
    # Absent optional fields are None and left out of the JSON (omit_defaults), as the dict leaves them out.
    struct = msgspec.defstruct(f"{sm.stream}_event", [(n, Any, None) for n in names], omit_defaults=True,
                              gc=False)
    src.ns.update(Event=struct, Item=item_type, encode=msgspec.json.Encoder().encode)
    src.add(0, "def translate_record(tree, raw):")
    src.add(1, f"if type(tree) is not dict: {_SLOW}")
    outs = []
    for n, f in enumerate(event):
        _field(src, f, f"x{n}", required=f.name in REQUIRED)
        outs.append(f"x{n}")
    if items_field is not None:
        _chain(src, items_field.keys)
        src.add(1, f"if type(v) is not list: {_SLOW}")
        conds, exprs, nulls = zip(*(_item_test(src, f, f"i{k}") for k, f in enumerate(sm.item_fields)), strict=True)
        test = " and ".join(["type(el) is dict", *(c for c in conds if c)])
        src.add(1, "try:")
        src.add(2, f"items = [Item({', '.join(exprs)}) for el in v if {test}]")
        src.add(1, "except (KeyError, TypeError, IndexError):")
        src.add(2, _SLOW)
        src.add(1, f"if len(items) != len(v): {_SLOW}")
        outs.append("items")
    src.add(1, "try:")
    src.add(2, f"out = encode(Event({', '.join(outs)}))")
    src.add(1, "except (TypeError, ValueError):")
    src.add(2, _SLOW)  # a value with no JSON form: the general path names it
    if items_field is not None and any(nulls):
        # An item value that is None (missing_field in the general path) is the only source of `:null` but
        # a NaN or a string holding those five characters, which the general path then reads as it always does.
        src.add(1, f"if b':null' in out: {_SLOW}")
    src.add(1, "return [out]")
    code = "\n".join(src.lines) + "\n"
    exec(compile(code, f"<rankwatch mapping {sm.stream}>", "exec"), src.ns)  # noqa: S102 (our own source)
    fn: TreeFn = src.ns["translate_record"]
    fn.source = code  # type: ignore[attr-defined]  # for reading and for the tests
    return fn
