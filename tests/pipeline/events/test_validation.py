"""Decoding and validation: every bad-input case of SPEC section 1 maps to its reason; good events decode."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.events.records import Feedback, Impression
from rankwatch.pipeline.events.validation import (
    MAX_TS_MS,
    Rejection,
    RejectReason,
    decode_feedback,
    decode_impression,
    sniff_ts_ms,
)

R = RejectReason


def imp(**fields) -> bytes:
    base = {"event_id": "e", "request_id": "r", "ts": 1764460800123,
            "items": [{"item_id": "a", "position": 1, "score": 0.5}, {"item_id": "b", "position": 2, "score": -3}]}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def fb(**fields) -> bytes:
    base = {"event_id": "c", "request_id": "r", "item_id": "a", "ts": 1764460803000, "action": "click"}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def test_list_form_decodes():
    got = decode_impression(imp(segment="new_user", surface="home", variant="t", model="m"))
    assert got == Impression("e", "r", 1764460800123, ("a", "b"), (1, 2), (0.5, -3.0), "new_user", "home", "t", "m", False)


def test_item_form_and_missing_labels():
    got = decode_impression(imp(items=..., item_id="x", position=4, score=2.7, segment=None))
    assert isinstance(got, Impression)
    assert (got.item_ids, got.positions, got.scores, got.item_form) == (("x",), (4,), (2.7,), True)
    assert (got.segment, got.surface, got.variant, got.model) == ("unknown",) * 4


@pytest.mark.parametrize("text", [
    "2026-11-30T10:00:00.250Z", "2026-11-30T12:00:00.250+02:00", "2026-11-30T05:00:00.250-05:00",
])
def test_rfc3339_times_with_zones(text):
    want = int((datetime(2026, 11, 30, 10, 0, 0, 250_000, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC))
               / timedelta(milliseconds=1))
    got = decode_impression(imp(ts=text))
    assert isinstance(got, Impression) and got.ts_ms == want
    assert sniff_ts_ms(imp(ts=text)) == want


@settings(max_examples=50, deadline=None)
@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9998, 12, 30),
                    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))])))
def test_rfc3339_matches_epoch_ms(when):
    when = when.replace(microsecond=when.microsecond // 1000 * 1000)
    want = (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    got = decode_feedback(fb(ts=when.isoformat()))
    assert isinstance(got, Feedback) and got.ts_ms == want


BAD_IMPRESSIONS = [
    (b"{not json", R.invalid_json),
    (b'{"event_id": "e", "x": "\xff"}', R.invalid_utf8),
    (b'{"event_id": "\xc3\x28"}', R.invalid_utf8),
    (b"[]", R.not_an_object),
    (b"42", R.not_an_object),
    (imp(event_id=...), R.missing_field),
    (imp(request_id=...), R.missing_field),
    (imp(ts=...), R.missing_field),
    (imp(items=...), R.missing_field),
    (imp(items=..., item_id="x", score=1.0), R.missing_field),
    (imp(request_id=True), R.bad_type),  # a bool is not an integer id
    (imp(request_id=1.5), R.bad_type),
    (imp(items="a,b"), R.bad_type),
    (imp(items=[{"item_id": "a", "position": True, "score": 1}]), R.bad_type),
    (imp(items=[{"item_id": "a", "position": 1, "score": "0.5"}]), R.bad_type),
    (imp(items=[{"item_id": "a", "position": 1.5, "score": 0.5}]), R.bad_type),
    (imp(segment=5), R.bad_type),
    (imp(event_id=""), R.bad_id),
    (imp(items=[{"item_id": "", "position": 1, "score": 0.5}]), R.bad_id),
    (imp(items=[{"item_id": "a\u0000b", "position": 1, "score": 0.5}]), R.bad_id),
    (imp(segment="s" * 300), R.bad_label),
    (imp(ts="yesterday"), R.bad_timestamp),
    (imp(ts="2026-11-30T10:00:00"), R.bad_timestamp),  # no zone
    (imp(ts="2026-11-30"), R.bad_timestamp),
    (imp(ts=1.5e12), R.bad_timestamp),
    (imp(ts=-1), R.bad_timestamp),
    (imp(ts=MAX_TS_MS + 1), R.bad_timestamp),
    (imp(ts=True), R.bad_timestamp),
    (imp(items=[{"item_id": "a", "position": 1, "score": 1e999}]).replace(b"Infinity", b"1e999"), R.non_finite_score),
    (imp().replace(b"0.5", b"NaN"), R.invalid_json),
    (imp().replace(b"0.5", b"Infinity"), R.invalid_json),
    (imp(items=[{"item_id": "a", "position": 0, "score": 1}]), R.bad_position),
    (imp(items=[{"item_id": "a", "position": -2, "score": 1}]), R.bad_position),
    (imp(items=[{"item_id": "a", "position": 2**40, "score": 1}]), R.bad_position),
    (imp(items=[{"item_id": "a", "position": 1, "score": 1}, {"item_id": "b", "position": 1, "score": 2}]),
     R.duplicate_position),
    (imp(items=[]), R.empty_items),
    (imp(item_id="x", position=1, score=1.0), R.ambiguous_form),
    (imp(items=[{"item_id": f"i{k}", "position": k + 1, "score": 0.0} for k in range(201)]), R.too_many_items),
    (b'{"event_id": "e", "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", R.too_deep),
    (imp(pad="x" * 1_000_001), R.too_large),
]


@pytest.mark.parametrize(("raw", "reason"), BAD_IMPRESSIONS, ids=[r.value + str(i) for i, (_, r) in enumerate(BAD_IMPRESSIONS)])
def test_bad_impressions(raw, reason):
    got = decode_impression(raw)
    assert isinstance(got, Rejection), got
    assert got.reason == reason, got.detail
    assert got.detail


def test_ten_megabyte_and_ten_thousand_items():
    assert decode_impression(b'{"x": "' + b"a" * 10_000_000 + b'"}').reason == R.too_large  # type: ignore[union-attr]
    many = imp(items=[{"item_id": f"i{k}", "position": k + 1, "score": 0.1} for k in range(10_000)])
    assert decode_impression(many, max_event_bytes=10**8).reason == R.too_many_items  # type: ignore[union-attr]
    ok = decode_impression(many, max_event_bytes=10**8, max_items=10_000)
    assert isinstance(ok, Impression) and len(ok.item_ids) == 10_000


BAD_FEEDBACK = [
    (fb(action="stare"), R.unknown_action),
    (fb(action=...), R.missing_field),
    (fb(item_id=...), R.missing_field),
    (fb(grade=-1), R.bad_grade),
    (fb(grade=21), R.bad_grade),
    (fb(grade=1.5), R.bad_type),
    (fb(grade="2"), R.bad_type),
    (fb(action=3), R.bad_type),
    (fb(ts="soon"), R.bad_timestamp),
    (b"[1]", R.not_an_object),
    (b"\xff", R.invalid_utf8),
]


@pytest.mark.parametrize(("raw", "reason"), BAD_FEEDBACK, ids=[r.value + str(i) for i, (_, r) in enumerate(BAD_FEEDBACK)])
def test_bad_feedback(raw, reason):
    got = decode_feedback(raw)
    assert isinstance(got, Rejection) and got.reason == reason, got


def test_grades_from_actions_and_overrides():
    assert decode_feedback(fb(action="purchase")).grade == 3  # type: ignore[union-attr]
    assert decode_feedback(fb(action="stare", grade=2)).grade == 2  # type: ignore[union-attr]
    assert decode_feedback(fb(action=..., grade=0)).grade == 0  # type: ignore[union-attr]
    assert decode_feedback(fb(action="like"), action_grades={"like": 4}).grade == 4  # type: ignore[union-attr]


def test_reason_codes_are_stable_snake_case():
    for reason in RejectReason:
        assert reason.value == reason.name and reason.value.islower() and " " not in reason.value
    assert str(R.invalid_json) == "invalid_json"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(raw):
    for result in (decode_impression(raw), decode_feedback(raw)):
        assert isinstance(result, Rejection | Impression | Feedback)
    assert sniff_ts_ms(raw) is None or isinstance(sniff_ts_ms(raw), int)


def test_integer_ids_read_as_their_decimal_text():
    """SPEC section 1: ``101`` and ``"101"`` are the same identifier; booleans are not integers."""
    got = decode_impression(imp(event_id=7, request_id=17, user_id=0,
                                items=[{"item_id": 101, "position": 1, "score": 0.5}]))
    assert got == Impression("7", "17", 1764460800123, ("101",), (1,), (0.5,), user_id="0")
    item = decode_impression(imp(items=..., request_id=-3, item_id=101, position=1, score=1.0))
    assert isinstance(item, Impression) and item.request_id == "-3" and item.item_ids == ("101",)
    assert decode_feedback(fb(event_id=1, request_id=17, item_id=101)) == Feedback("1", "17", "101", 1764460803000, 1,
                                                                                    "click")
    for bad in (imp(event_id=True), imp(items=[{"item_id": False, "position": 1, "score": 0.5}]), fb(item_id=True),
                imp(user_id=True)):
        got_bad = decode_impression(bad) if b'"items"' in bad or b'"position"' in bad else decode_feedback(bad)
        assert isinstance(got_bad, Rejection) and got_bad.reason == R.bad_type, (bad, got_bad)
