"""Decoding and validation of raw event bytes (SPEC section 1) into :mod:`pipeline.events.records` types.

Every way an event can be bad maps to one stable :class:`RejectReason` code. Decoding uses msgspec typed
structs (C speed, UTF-8 validated, strict types: ``true`` is not an integer, ``1.5`` is not a timestamp);
the checks msgspec cannot express (finite scores, positions, duplicates, timestamps with a zone, grades)
follow in plain Python on the decoded values. Nothing here raises on bad input: it returns a
:class:`Rejection`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any

import msgspec

from rankwatch.pipeline.events.records import Feedback, Impression

DEFAULT_ACTION_GRADES: Mapping[str, int] = {"click": 1, "add_to_cart": 2, "purchase": 3}
MAX_GRADE = 20  # 2**20 - 1 keeps exponential gains exact in float64
MAX_POSITION = 2**31 - 1
# 9998-12-31T23:59:59.999Z, not the end of 9999: a window that starts at the last accepted timestamp must
# still end inside datetime's range (a year-long window included), or publishing it would overflow.
MAX_TS_MS = 253_370_764_799_999
MAX_LABEL_CHARS = 256
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


class RejectReason(StrEnum):
    """Why an event was rejected. The values are stable: they appear in metrics and dead letters."""

    invalid_utf8 = "invalid_utf8"  # bytes are not UTF-8
    invalid_json = "invalid_json"  # not parseable JSON
    too_deep = "too_deep"  # JSON nested deeper than the decoder's recursion limit
    not_an_object = "not_an_object"  # JSON, but not an object
    too_large = "too_large"  # more bytes than StreamConfig.max_event_bytes
    missing_field = "missing_field"  # a required field is absent
    bad_type = "bad_type"  # a field has the wrong JSON type
    bad_id = "bad_id"  # empty event_id/request_id/item_id, or one containing NUL
    bad_label = "bad_label"  # segment/surface/variant/model longer than MAX_LABEL_CHARS
    bad_timestamp = "bad_timestamp"  # ts not epoch ms / RFC 3339 with a zone, or out of range
    non_finite_score = "non_finite_score"  # NaN, +-inf or out of float range
    bad_position = "bad_position"  # position < 1 or too large
    duplicate_position = "duplicate_position"  # two items at one position of one request
    empty_items = "empty_items"  # list form with no item
    ambiguous_form = "ambiguous_form"  # both ``items`` and item-form fields
    too_many_items = "too_many_items"  # more items than StreamConfig.max_items_per_request
    unknown_action = "unknown_action"  # action not in the grade map and no ``grade``
    bad_grade = "bad_grade"  # grade outside 0..MAX_GRADE
    # issue 22, events in a team's own schema (docs/mapping.md):
    undecodable = "undecodable"  # bytes the configured format cannot decode (JSON, Avro, Protobuf)
    unknown_schema = "unknown_schema"  # a schema id the registry does not have


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: RejectReason
    detail: str


# -- wire formats (what msgspec decodes; validation of meaning follows) ---------------------------------
# Constraints checked by msgspec in C; their errors are mapped to reasons by the field they name.
# Identifiers are non-empty strings or integers; an integer is read as its decimal text (SPEC section 1):
# msgspec is strict, so ``true`` is still not an integer and stays ``bad_type``.
_Id = Annotated[str, msgspec.Meta(min_length=1)] | int
_Label = Annotated[str, msgspec.Meta(max_length=MAX_LABEL_CHARS)]
_Position = Annotated[int, msgspec.Meta(ge=1, le=MAX_POSITION)]


class _WireItem(msgspec.Struct, gc=False):  # gc=False: no cycles, and much cheaper to create
    item_id: _Id
    position: _Position
    score: float


class _WireImpression(msgspec.Struct, gc=False):
    event_id: _Id
    request_id: _Id
    ts: int | datetime
    items: list[_WireItem] | None = None
    item_id: _Id | None = None
    position: _Position | None = None
    score: float | None = None
    segment: _Label | None = None
    surface: _Label | None = None
    variant: _Label | None = None
    model: _Label | None = None
    user_id: _Label | int | None = None  # issue 13: the GAUC group


class _WireFeedback(msgspec.Struct, gc=False):
    event_id: _Id
    request_id: _Id
    item_id: _Id
    ts: int | datetime
    action: str | None = None
    grade: int | None = None


_IMPRESSION_DECODER = msgspec.json.Decoder(_WireImpression)
_FEEDBACK_DECODER = msgspec.json.Decoder(_WireFeedback)


def _path_reason(message: str) -> RejectReason:
    """Map a msgspec ValidationError message to a reason, by the field it names."""
    if "Object missing required field" in message:
        return RejectReason.missing_field
    if message.startswith("Expected `object`") and "- at `" not in message:
        return RejectReason.not_an_object
    at = message.rsplit("- at `", 1)[-1].rstrip("`") if "- at `" in message else ""
    field = at.rsplit(".", 1)[-1]
    wrong_type = ", got `" in message
    if field == "ts":
        return RejectReason.bad_timestamp
    if field == "score":
        return RejectReason.non_finite_score if "out of range" in message else RejectReason.bad_type
    if wrong_type:
        return RejectReason.bad_type
    if field == "position":
        return RejectReason.bad_position
    if field == "grade":
        return RejectReason.bad_grade
    if field in ("event_id", "request_id", "item_id"):
        return RejectReason.bad_id
    if field in ("segment", "surface", "variant", "model", "user_id"):
        return RejectReason.bad_label
    return RejectReason.bad_type


def _decode(decoder: msgspec.json.Decoder, raw: bytes, max_event_bytes: int) -> object:
    if len(raw) > max_event_bytes:
        return Rejection(RejectReason.too_large, f"{len(raw)} bytes > {max_event_bytes}")
    if not raw.isascii():
        # msgspec checks UTF-8 only inside the fields it keeps; unknown fields are skipped unchecked.
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return Rejection(RejectReason.invalid_utf8, f"invalid UTF-8 at byte {e.start}")
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as e:
        msg = str(e)
        return Rejection(_path_reason(msg), msg)
    except msgspec.DecodeError as e:
        msg = str(e)
        if "UTF-8" in msg:
            return Rejection(RejectReason.invalid_utf8, msg)
        return Rejection(RejectReason.invalid_json, msg)
    except RecursionError:
        return Rejection(RejectReason.too_deep, "JSON nested too deeply")


def _ts_ms(ts: int | datetime) -> int | Rejection:
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            return Rejection(RejectReason.bad_timestamp, "RFC 3339 timestamp without a zone")
        ms = (ts - _EPOCH) // _MS
    else:
        ms = ts
    if not 0 <= ms <= MAX_TS_MS:
        return Rejection(RejectReason.bad_timestamp, f"timestamp {ms} ms out of range")
    return ms


_IN_ORDER: dict[int, tuple[int, ...]] = {}


def _in_order(n: int) -> tuple[int, ...]:
    """``(1, ..., n)``: the usual positions, which cannot hold a duplicate."""
    seq = _IN_ORDER.get(n)
    if seq is None:
        seq = _IN_ORDER[n] = tuple(range(1, n + 1))
    return seq


def decode_impression(
    raw: bytes, *, max_event_bytes: int = 1_000_000, max_items: int = 200
) -> Impression | Rejection:
    """Decode and validate one impression event (list form or item form)."""
    return impression_or_rejection(raw, max_event_bytes, max_items)


def _decode_fast(decoder: Any, raw: bytes, max_event_bytes: int) -> Any:
    """The wire struct, or a Rejection; the usual small ASCII event skips the checks that find the reason."""
    if len(raw) <= max_event_bytes and raw.isascii():
        try:
            return decoder.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            pass  # decode again below, to name the reason
    return _decode(decoder, raw, max_event_bytes)


def _event_ts(ts: Any) -> Any:
    """Epoch milliseconds of a wire ``ts`` (an in-range int passes straight through), or a Rejection."""
    if type(ts) is int and 0 <= ts <= MAX_TS_MS:
        return ts
    return _ts_ms(ts)


def _text(value: Any) -> str:
    """An identifier as text: an integer (never a bool: the decoder refuses those) as its decimal digits."""
    return value if type(value) is str else str(value)


def impression_or_rejection(raw: bytes, max_event_bytes: int, max_items: int) -> Impression | Rejection:
    """:func:`decode_impression` with positional arguments (the per-event path of the stream)."""
    wire = _decode_fast(_IMPRESSION_DECODER, raw, max_event_bytes)
    if type(wire) is not _WireImpression:
        return wire  # type: ignore[no-any-return]
    eid, rid = _text(wire.event_id), _text(wire.request_id)
    # JSON strings can only hold NUL escaped, so without "\u0000" in the bytes no id contains one.
    nul = b"\\u0000" in raw
    if nul and ("\x00" in eid or "\x00" in rid):
        return Rejection(RejectReason.bad_id, "event_id/request_id contains NUL")
    ts = _event_ts(wire.ts)
    if type(ts) is not int:
        return ts  # type: ignore[no-any-return]
    items = wire.items
    if items is not None:
        if wire.item_id is not None or wire.position is not None or wire.score is not None:
            return Rejection(RejectReason.ambiguous_form, "both items and item_id/position/score")
        n = len(items)
        if n == 0:
            return Rejection(RejectReason.empty_items, "items is empty")
        if n > max_items:
            return Rejection(RejectReason.too_many_items, f"{n} items > {max_items}")
        item_ids = tuple([_text(it.item_id) for it in items])
        positions = tuple([it.position for it in items])
        scores = tuple([it.score for it in items])
        if positions != _in_order(n) and len(set(positions)) != n:
            return Rejection(RejectReason.duplicate_position, "two items at one position")
        if nul and "\x00".join(item_ids).count("\x00") != n - 1:
            return Rejection(RejectReason.bad_id, "item_id contains NUL")
        item_form = False
    else:
        if wire.item_id is None or wire.position is None or wire.score is None:
            missing = next(f for f in ("item_id", "position", "score") if getattr(wire, f) is None)
            return Rejection(RejectReason.missing_field, f"Object missing required field `{missing}` (or items)")
        item_id = _text(wire.item_id)
        if nul and "\x00" in item_id:
            return Rejection(RejectReason.bad_id, "item_id contains NUL")
        item_ids, positions, scores = (item_id,), (wire.position,), (wire.score,)
        item_form = True
    # Scores are finite here: msgspec refuses NaN/Infinity tokens and out-of-range numbers.
    user = wire.user_id
    return Impression(
        eid, rid, ts, item_ids, positions, scores,
        wire.segment or "unknown", wire.surface or "unknown", wire.variant or "unknown", wire.model or "unknown",
        item_form, "" if user is None else _text(user),
    )


def decode_feedback(
    raw: bytes,
    *,
    action_grades: Mapping[str, int] = DEFAULT_ACTION_GRADES,
    max_event_bytes: int = 1_000_000,
) -> Feedback | Rejection:
    """Decode and validate one feedback event; the grade is ``grade`` if given, else the action's."""
    return feedback_or_rejection(raw, action_grades, max_event_bytes)


def feedback_or_rejection(raw: bytes, action_grades: Mapping[str, int], max_event_bytes: int) -> Feedback | Rejection:
    """:func:`decode_feedback` with positional arguments (the per-event path of the stream)."""
    wire = _decode_fast(_FEEDBACK_DECODER, raw, max_event_bytes)
    if type(wire) is not _WireFeedback:
        return wire  # type: ignore[no-any-return]
    eid, rid, item = _text(wire.event_id), _text(wire.request_id), _text(wire.item_id)
    if b"\\u0000" in raw and ("\x00" in eid or "\x00" in rid or "\x00" in item):
        return Rejection(RejectReason.bad_id, "id contains NUL")
    ts = _event_ts(wire.ts)
    if type(ts) is not int:
        return ts  # type: ignore[no-any-return]
    grade = wire.grade
    if grade is None:
        if wire.action is None:
            return Rejection(RejectReason.missing_field, "Object missing required field `action` (or grade)")
        grade = action_grades.get(wire.action)
        if grade is None:
            return Rejection(RejectReason.unknown_action, f"unknown action {wire.action[:64]!r} and no grade")
    if not 0 <= grade <= MAX_GRADE:
        return Rejection(RejectReason.bad_grade, f"grade {grade} outside 0..{MAX_GRADE}")
    return Feedback(eid, rid, item, ts, grade, wire.action)


class _WireTs(msgspec.Struct, gc=False):
    ts: int | datetime


_TS_DECODER = msgspec.json.Decoder(_WireTs)


class _WireTsRequest(msgspec.Struct, gc=False):
    ts: int | datetime
    request_id: msgspec.Raw = msgspec.Raw(b"null")  # kept raw: its value never fails the decode of ``ts``


_TS_REQUEST_DECODER = msgspec.json.Decoder(_WireTsRequest)
_ID_DECODER = msgspec.json.Decoder(str | int)


def sniff_ts_and_request(raw: bytes) -> tuple[int | None, str | None]:
    """:func:`sniff_ts_ms` of ``raw`` (the same time, the same None), and its request id as the core reads it (text;
    an integer as its digits), None where unreadable. Both None where the time is: the core rejects such a line."""
    try:
        wire = _TS_REQUEST_DECODER.decode(raw)
        ts = _event_ts(wire.ts)
    except (msgspec.DecodeError, RecursionError):
        return None, None
    if type(ts) is not int:
        return None, None
    try:
        rid = _ID_DECODER.decode(wire.request_id)
    except (msgspec.DecodeError, RecursionError):
        return ts, None
    return ts, (rid if type(rid) is str else str(rid))


def sniff_ts_ms(raw: bytes) -> int | None:
    """The event time of a raw event in epoch ms, or None when it has no valid ``ts`` (cheap; for ordering)."""
    try:
        ts = _event_ts(_TS_DECODER.decode(raw).ts)
    except (msgspec.DecodeError, RecursionError):
        return None
    return ts if type(ts) is int else None
