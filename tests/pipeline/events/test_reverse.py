"""The mapping run backwards (pipeline/events/reverse.py): a section 1 event written in a team's shape and
read back through the forward mapping is the same event (list and item layouts, units, maps, 0-based)."""

from __future__ import annotations

import json

import pytest

from rankwatch.pipeline.events.mapping import EventMapping
from rankwatch.pipeline.events.reverse import reverser
from rankwatch.pipeline.events.translate import translator_for

IMPRESSION = {"event_id": "imp-1", "request_id": "r-1", "ts": 1_764_460_800_123, "user_id": "u-9",
              "segment": "new_user", "surface": "search", "variant": "treatment", "model": "m1",
              "items": [{"item_id": "a", "position": 1, "score": 0.5}, {"item_id": "b", "position": 2, "score": 0.25}]}
CLICK = {"event_id": "c-1", "request_id": "r-1", "item_id": "b", "ts": 1_764_460_801_000, "action": "add_to_cart"}
LIST = {
    "impressions": {"fields": {
        "event_id": "meta.id", "request_id": "req.id", "ts": {"path": "meta.sent_at", "unit": "s"},
        "user_id": "user.id", "segment": {"path": "user.tier", "map": {"N": "new_user", "R": "returning"}},
        "surface": "req.page", "variant": "exp.arm", "model": "ranker", "items": "results", "item_id": "sku",
        "position": {"path": "rank", "base": 0}, "score": "s"}},
    "clicks": {"fields": {"event_id": "click.id", "request_id": "click.req", "item_id": "click.sku",
                          "ts": {"path": "click.at", "unit": "rfc3339"},
                          "action": {"path": "kind", "map": {"CLICK": "click", "CART": "add_to_cart"}}}},
}
ITEM = {
    "impressions": {"layout": "item", "fields": {"request_id": "rid", "ts": {"path": "t", "unit": "us"},
                                                  "item_id": "sku", "position": "pos", "score": "sc"}},
    "clicks": {"fields": {"ts": {"path": "t", "unit": "ns"}}},
}


def _roundtrip(tables: dict, stream: str, event: dict) -> list[dict]:
    mapping = EventMapping.from_tables(tables)
    translator = translator_for(mapping)
    out = []
    for record in reverser(mapping, stream)(event):
        native = translator.translate(stream, json.dumps(record).encode())  # type: ignore[union-attr]
        assert isinstance(native, list), native
        out += [json.loads(v) for v in native]
    return out


def test_list_layout_reads_back_as_the_same_event() -> None:
    record = reverser(EventMapping.from_tables(LIST), "impressions")(IMPRESSION)
    assert record == [{"meta": {"id": "imp-1", "sent_at": 1_764_460_800.123}, "req": {"id": "r-1", "page": "search"},
                       "user": {"id": "u-9", "tier": "N"}, "exp": {"arm": "treatment"}, "ranker": "m1",
                       "results": [{"sku": "a", "rank": 0, "s": 0.5}, {"sku": "b", "rank": 1, "s": 0.25}]}]
    assert _roundtrip(LIST, "impressions", IMPRESSION) == [IMPRESSION]
    back = _roundtrip(LIST, "clicks", CLICK)
    assert back == [{**CLICK, "ts": "2025-11-30T00:00:01.000Z"}]


@pytest.mark.parametrize("stream", ["impressions", "clicks"])
def test_item_layout_one_record_per_item(stream: str) -> None:
    event = IMPRESSION if stream == "impressions" else CLICK
    back = _roundtrip(ITEM, stream, event)
    if stream == "clicks":
        assert back == [CLICK]
        return
    head = {k: v for k, v in IMPRESSION.items() if k != "items"}
    assert back == [{**head, **item} for item in IMPRESSION["items"]]  # type: ignore[dict-item]
