"""The generated per-record translators (pipeline.events.translate_compiled) against the general one
(``Translator(..., fast=False)``, the path getters of pipeline.events.paths) on random mappings and random
trees: the same bytes out, or the same Rejection (reason and detail), every time."""

from __future__ import annotations

import json
import math
import random
from collections import OrderedDict
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pytest

from rankwatch.pipeline.events.mapping import EVENT_FIELDS, ITEM_FIELDS, TS_UNITS, EventMapping
from rankwatch.pipeline.events.translate import Translator, _Item, _tree_translator
from rankwatch.pipeline.events.translate_compiled import compiled_translator
from rankwatch.pipeline.events.validation import Rejection

KEYS = ["a", "b", "meta", "id", "x", "0", "1", 'q"uote', "it's", "{k}", "\\n"]
MAP_KEYS = ["CLICK", "BUY", "N", "1", "0", "true", "false", "x", 'q"']
MAP_VALUES = ["click", "purchase", "new_user", 3, 0.5, True, "m'\"v"]


def _path(rng: random.Random) -> str:
    return ".".join(rng.choice(KEYS) for _ in range(rng.choice((1, 1, 2, 2, 3))))


def _rule(rng: random.Random, name: str) -> Any:
    if rng.random() < 0.25:
        return None  # unmapped: section 1's own name is the path
    rule: dict[str, Any] = {"path": _path(rng)}
    if name != "items":
        if rng.random() < 0.2:
            rule["default"] = rng.choice(["dflt", 7, 1500, 2.5, False, "CLICK"])
        if rng.random() < 0.3:
            rule["map"] = {k: rng.choice(MAP_VALUES) for k in rng.sample(MAP_KEYS, rng.randint(1, 4))}
    if name == "ts" and rng.random() < 0.8:
        rule["unit"] = rng.choice(TS_UNITS)
    if name == "position" and rng.random() < 0.7:
        rule["base"] = rng.choice((0, 1))
    return rule if len(rule) > 1 or rng.random() < 0.5 else rule["path"]


def random_tables(rng: random.Random) -> dict[str, Any]:
    tables: dict[str, Any] = {}
    for stream in ("impressions", "clicks"):
        layout = rng.choice(("list", "item")) if stream == "impressions" else "item"
        names = EVENT_FIELDS[stream] + (ITEM_FIELDS if stream == "impressions" else ())
        if layout == "item":
            names = tuple(n for n in names if n != "items")
        fields = {n: r for n in names if (r := _rule(rng, n)) is not None}
        tables[stream] = {"fields": fields, "layout": layout} if stream == "impressions" else {"fields": fields}
    return tables


def _scalar(rng: random.Random, name: str, unit: str | None = None, bad_rate: float = 0.12) -> Any:
    """A value for field ``name``: mostly of the right type, now and then not."""
    good: dict[str, list[Any]] = {
        "ts": [1764460800123, 1764460800, 1764460800.5, 1764460800.1235, 1764460800123500, 1500, 500, 499,
               1764460800123500000, 2.5, -1500, "2025-11-30T00:00:00.123Z", datetime(2025, 11, 30, tzinfo=UTC),
               0, 0.0],
        "position": [0, 1, 2, 19, 0.0, 1.5],
        "score": [0.5, 1, -2.25, 0, 1e300],
        "action": ["click", "CLICK", "BUY", "purchase", "x"],
        "grade": [0, 1, 3, 9],
    }
    bad = [None, True, False, "1", "", "CLICK", 1, 0, 2**70, float("nan"), float("inf"), -float("inf"), [1],
           {"k": 1}, datetime(2025, 11, 30), {1, 2}, b"by", 1.25]
    if unit == "rfc3339":
        good["ts"] = ["2025-11-30T00:00:00.123Z", "x", datetime(2025, 11, 30, 0, 0, 0, 123500, tzinfo=UTC)]
    pool = good.get(name, ["r1", "u-7", 42, "N", "true", 'q"x'])
    return rng.choice(pool) if rng.random() >= bad_rate else rng.choice(bad)


def _put(rng: random.Random, tree: dict[str, Any], keys: tuple[str, ...], value: Any) -> None:
    node: Any = tree
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):  # a digit key into a list
            idx = int(key)
            while len(node) <= idx:
                node.append({})
            if last:
                node[idx] = value
                return
            if not isinstance(node[idx], dict | list):
                node[idx] = {}
            node = node[idx]
            continue
        if last:
            node[key] = value
            return
        nxt = keys[i + 1]
        if not isinstance(node.get(key), dict | list) or (isinstance(node[key], list) and not nxt.isdigit()):
            node[key] = [] if nxt.isdigit() and rng.random() < 0.5 else {}
        node = node[key]


def _perturb(rng: random.Random, node: Any, depth: int = 0) -> Any:
    """Now and then: a value swapped for a wrong type, a key dropped, a dict for another Mapping."""
    if isinstance(node, dict):
        for k in list(node):
            r = rng.random()
            if r < 0.02:
                del node[k]
            elif r < 0.04:
                node[k] = None
            elif r < 0.06:
                node[k] = rng.choice([[1, 2], "str", 3, True, 2.5, float("nan")])
            else:
                node[k] = _perturb(rng, node[k], depth + 1)
        r = rng.random()
        if r < 0.02:
            return MappingProxyType(node)
        if r < 0.03:
            return OrderedDict(node)
    elif isinstance(node, list):
        return [_perturb(rng, v, depth + 1) for v in node]
    return node


def random_tree(rng: random.Random, mapping: EventMapping, stream: str) -> Any:
    sm = mapping.stream(stream)
    tree: dict[str, Any] = {}
    clean = rng.random() < 0.4  # right types everywhere (absent optional fields aside)
    bad_rate = 0.0 if clean else 0.12
    for f in sm.fields:
        if f.name == "items":
            elements = []
            for position in range(rng.choice((0, 1, 3, 20))):
                el: dict[str, Any] = {}
                for g in sm.item_fields:
                    v = position if g.name == "position" and rng.random() < 0.9 else _scalar(rng, g.name,
                                                                                            bad_rate=bad_rate)
                    if clean or rng.random() < 0.97:
                        _put(rng, el, g.keys, v)
                elements.append(el)
            _put(rng, tree, f.keys, elements if clean or rng.random() < 0.95 else _scalar(rng, "x"))
        elif rng.random() < 0.93:
            _put(rng, tree, f.keys, _scalar(rng, f.name, f.unit, bad_rate))
    for g in sm.item_fields if not any(f.name == "items" for f in sm.fields) else ():
        if clean or rng.random() < 0.95:
            _put(rng, tree, g.keys, _scalar(rng, g.name, bad_rate=bad_rate))
    if rng.random() < 0.3:
        tree["extra"] = {"not": "mapped"}
    return _perturb(rng, tree) if not clean and rng.random() < 0.6 else tree


def _pair(mapping: EventMapping, stream: str) -> tuple[Any, Any, list[int]]:
    """(generated, general, [calls of the general path from the generated one])."""
    sm = mapping.stream(stream)
    general = _tree_translator(sm)
    fallbacks = [0]

    def counted(tree: Any, raw: bytes) -> Any:
        fallbacks[0] += 1
        return general(tree, raw)

    return compiled_translator(sm, counted, _Item), general, fallbacks


@pytest.mark.parametrize("seed", range(40))
def test_generated_equals_general_on_random_trees(seed: int) -> None:
    rng = random.Random(seed)
    mapping = EventMapping.from_tables(random_tables(rng))
    answered = 0
    n = 300
    for stream in ("impressions", "clicks"):
        fast, general, fallbacks = _pair(mapping, stream)
        for i in range(n):
            tree = random_tree(rng, mapping, stream)
            raw = f"message {seed} {i}".encode()
            expected = general(tree, raw)
            got = fast(tree, raw)
            assert got == expected, (stream, tree, fast.source)
            if type(expected) is not Rejection:  # bytes, and JSON the core can read
                assert isinstance(got, list) and all(type(b) is bytes for b in got)
        answered += n - fallbacks[0]
    assert answered > 0  # the generated code itself answered some records


def test_bench_shape_takes_the_generated_path() -> None:
    """docs/mapping.md's nested list shape: clean records never fall back to the general path."""
    fields = {"event_id": "meta.id", "request_id": "req.id", "ts": {"path": "meta.sent_at", "unit": "s"},
              "segment": {"path": "user.tier", "map": {"N": "new_user"}}, "items": "results",
              "item_id": "sku", "position": {"path": "rank", "base": 0}, "score": "s"}
    mapping = EventMapping.from_tables({"impressions": {"fields": fields}})
    fast, general, fallbacks = _pair(mapping, "impressions")
    tree = {"meta": {"id": "e1", "sent_at": 1764460800.1235}, "req": {"id": "r1"}, "user": {"tier": "N"},
            "results": [{"sku": f"s{k}", "rank": k, "s": 1.0 / (k + 1)} for k in range(20)]}
    out = fast(tree, b"raw")
    assert out == general(tree, b"raw") and fallbacks[0] == 0
    doc = json.loads(out[0])
    assert doc["ts"] == 1764460800124 and doc["segment"] == "new_user" and doc["items"][0]["position"] == 1
    tree["results"][3]["rank"] = 2.0  # not an int: the general path decides (and passes it on as it is)
    assert fast(tree, b"raw") == general(tree, b"raw") and fallbacks[0] == 1


def test_translator_fast_and_general_agree_on_bytes() -> None:
    """Through :meth:`Translator.translate` (JSON decoding, digest ids) and ``translate_tree``."""
    rng = random.Random(99)
    for _ in range(10):
        mapping = EventMapping.from_tables(random_tables(rng))
        fast, slow = Translator(mapping), Translator(mapping, fast=False)
        for stream in ("impressions", "clicks"):
            for _ in range(100):
                tree = random_tree(rng, mapping, stream)
                try:
                    raw = json.dumps(tree, default=str).encode()
                except (TypeError, ValueError):
                    raw = b"{}"
                assert fast.translate(stream, raw) == slow.translate(stream, raw)
                assert fast.translate_tree(stream, tree, raw) == slow.translate_tree(stream, tree, raw)
                assert fast.translate_many(stream, [raw, raw]) == slow.translate_many(stream, [raw, raw])
                kinds = [stream == "impressions"] * 2
                assert fast.translate_kinds(kinds, [raw, b"{"]) == slow.translate_kinds(kinds, [raw, b"{"]) == [
                    slow.translate(stream, raw), slow.translate(stream, b"{")]


def test_user_text_is_never_source() -> None:
    """Keys, maps and defaults that look like code stay data (constants in the function's namespace)."""
    evil = "x');__import__('os');('"
    fields = {"request_id": evil, "ts": {"path": "t", "unit": "ms"},
              "segment": {"path": '"]', "map": {evil: evil}, "default": evil}}
    mapping = EventMapping.from_tables({"clicks": {"fields": {"item_id": "i", "action": "a", **{
        k: v for k, v in fields.items() if k != "segment"}}}, "impressions": {"fields": fields}})
    fast, general, _ = _pair(mapping, "impressions")
    assert evil not in fast.source
    tree = {evil: "r", "t": 5, "items": [{"item_id": "i", "position": 1, "score": math.pi}]}
    assert fast(tree, b"") == general(tree, b"")
    assert json.loads(fast(tree, b"")[0])["segment"] == evil
