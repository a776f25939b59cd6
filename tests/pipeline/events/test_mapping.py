"""Field mapping (SPEC section 6): units, maps, defaults, base, null, list indexes, digest ids, layouts, and
one-line config errors naming the table and key."""

from __future__ import annotations

import json

import pytest

from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.mapping import EventMapping
from rankwatch.pipeline.events.translate import digest_id, translator_for
from rankwatch.pipeline.events.validation import Rejection, RejectReason


def tr(impressions=None, clicks=None):  # type: ignore[no-untyped-def]
    tables = {k: v for k, v in (("impressions", impressions), ("clicks", clicks)) if v is not None}
    return translator_for(EventMapping.from_tables(tables))


def one(t, stream, doc):  # type: ignore[no-untyped-def]
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    out = t.translate(stream, raw)
    return out if isinstance(out, Rejection) else json.loads(out[0])


@pytest.mark.parametrize(("unit", "value", "ms"), [
    ("ms", 1764460800123, 1764460800123), ("ms", 1764460800123.4, 1764460800123),
    ("s", 1764460800, 1764460800000), ("s", 1764460800.1235, 1764460800124),
    ("us", 1764460800123499, 1764460800123), ("us", 1764460800123500, 1764460800124),
    ("ns", 1764460800123499999, 1764460800123), ("ns", 1764460800123500000, 1764460800124),
    ("rfc3339", "2025-11-30T00:00:00.123Z", "2025-11-30T00:00:00.123Z"),
])
def test_ts_units(unit, value, ms):  # type: ignore[no-untyped-def]
    t = tr(clicks={"fields": {"ts": {"path": "at", "unit": unit}}})
    assert one(t, "clicks", {"event_id": "c", "request_id": "r", "item_id": "i", "at": value, "action": "click"})["ts"] == ms


@pytest.mark.parametrize(("unit", "value"), [("s", "17"), ("ms", True), ("s", None), ("rfc3339", 17)])
def test_ts_wrong_type_is_bad_timestamp_or_missing(unit, value):  # type: ignore[no-untyped-def]
    t = tr(clicks={"fields": {"ts": {"path": "at", "unit": unit}}})
    got = one(t, "clicks", {"event_id": "c", "request_id": "r", "item_id": "i", "at": value})
    assert isinstance(got, Rejection)
    assert got.reason == (RejectReason.missing_field if value is None else RejectReason.bad_timestamp)


def test_nested_list_map_default_base_null_and_list_index():  # type: ignore[no-untyped-def]
    t = tr(impressions={"fields": {
        "event_id": "meta.id", "request_id": "req.ids.0", "ts": {"path": "meta.at", "unit": "s"},
        "segment": {"path": "u.tier", "map": {"N": "new_user", "1": "one"}, "default": "N"},
        "surface": {"path": "page", "default": "home"}, "items": "results", "item_id": "sku",
        "position": {"path": "rank", "base": 0}, "score": "s"}})
    doc = {"meta": {"id": "e1", "at": 10}, "req": {"ids": ["r1", "r2"]}, "u": {"tier": None}, "page": "search",
           "results": [{"sku": 5, "rank": 0, "s": 0.5}, {"sku": "b", "rank": 1, "s": 1}]}
    assert one(t, "impressions", doc) == {"event_id": "e1", "request_id": "r1", "ts": 10_000, "segment": "new_user",
                                          "surface": "search", "items": [{"item_id": 5, "position": 1, "score": 0.5},
                                                                         {"item_id": "b", "position": 2, "score": 1}]}
    doc["u"] = {"tier": 1}
    del doc["page"]
    got = one(t, "impressions", doc)
    assert got["segment"] == "one" and got["surface"] == "home"
    doc["u"] = {"tier": "X"}  # not in the map: passes unchanged
    assert one(t, "impressions", doc)["segment"] == "X"
    assert one(t, "impressions", {**doc, "results": [{"sku": 5, "s": 1}]}).reason == RejectReason.missing_field
    assert one(t, "impressions", {**doc, "results": "x"}).reason == RejectReason.bad_type
    assert one(t, "impressions", {**doc, "req": "r1"}).reason == RejectReason.bad_type
    assert one(t, "impressions", {**doc, "req": {"ids": []}}).reason == RejectReason.missing_field


def test_digest_ids_and_item_layout():  # type: ignore[no-untyped-def]
    t = tr(impressions={"layout": "item", "fields": {"request_id": "rid", "ts": {"path": "t", "unit": "us"}}})
    raw = b'{"rid": 7, "t": 1000000, "item_id": 3, "position": 2, "score": 0.5}'
    got = json.loads(t.translate("impressions", raw)[0])
    assert got == {"event_id": digest_id(raw), "request_id": 7, "ts": 1000, "item_id": 3, "position": 2, "score": 0.5}
    assert t.translate("impressions", raw) == t.translate("impressions", raw)  # a byte-identical resend: same id
    assert json.loads(t.translate("impressions", raw.replace(b" ", b""))[0])["event_id"] != got["event_id"]


def test_bad_bytes_keep_section_1_reasons():  # type: ignore[no-untyped-def]
    t = tr(clicks={"fields": {"request_id": "r"}})
    for raw, reason in ((b"{", RejectReason.invalid_json), (b"[1]", RejectReason.not_an_object),
                        (b'{"r":"\xff"}', RejectReason.invalid_utf8), (b'{"s":1e999}', RejectReason.non_finite_score)):
        assert t.translate("clicks", raw).reason == reason, raw


def test_nothing_mapped_is_the_identity():  # type: ignore[no-untyped-def]
    assert translator_for(EventMapping.from_tables(None)) is None
    assert translator_for(EventMapping.from_tables({"impressions": {}, "clicks": {"fields": {}}})) is None


@pytest.mark.parametrize(("tables", "where"), [
    ({"impressions": {"fields": {"req": "x"}}}, "events.impressions.fields.req: not a section 1 field"),
    ({"impressions": {"fields": {"request_id": "a..b"}}}, "events.impressions.fields.request_id.path: malformed"),
    ({"impressions": {"fields": {"request_id": ""}}}, "events.impressions.fields.request_id.path: not a path"),
    ({"clicks": {"fields": {"ts": {"path": "t", "unit": "days"}}}}, "events.clicks.fields.ts.unit: must be one of"),
    ({"impressions": {"fields": {"score": {"path": "s", "unit": "s"}}}}, "fields.score.unit: only ts has a unit"),
    ({"impressions": {"fields": {"position": {"path": "p", "base": 2}}}}, "fields.position.base: must be 0 or 1"),
    ({"impressions": {"layout": "grid"}}, "events.impressions.layout: must be list or item"),
    ({"impressions": {"format": "xml"}}, "events.impressions.format: must be one of"),
    ({"impressions": {"colour": 1}}, "events.impressions.colour: unknown key"),
    ({"views": {}}, "events.views: unknown table"),
    ({"clicks": {"fields": {"grade": {"path": "g", "mapp": {}}}}}, "events.clicks.fields.grade.mapp: unknown key"),
])
def test_config_errors_name_table_and_key(tables, where):  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=None) as e:
        EventMapping.from_tables(tables, where="x.toml")
    assert str(e.value).startswith("x.toml: ") and where in str(e.value) and "\n" not in str(e.value)


def test_avro_without_its_decoder_names_the_extra():  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"events.impressions.format: avro needs .*rankwatch\[avro\]"):
        tr(impressions={"format": "avro"})
