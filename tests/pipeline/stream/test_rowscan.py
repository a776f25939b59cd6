"""The C row scanner (pipeline/stream/_rowscan.c) against msgspec's path, its oracle: for any line, the rows of
``prepare_rows`` equal those of ``prepare_rows_msgspec``; a line the scanner takes is not left; a line it is unsure
of is left to msgspec (and so still named by its reason on the per-record path)."""

from __future__ import annotations

import json
import random
import struct
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream import native, prepare
from rankwatch.pipeline.stream.config import StreamConfig
from rankwatch.pipeline.stream.join import USER_KEY_CACHE, user_key_of
from rankwatch.pipeline.stream.prepare import BatchSpec, prepare_rows, prepare_rows_msgspec

rowscan = pytest.importorskip("rankwatch.pipeline.stream._rowscan", reason="built without a C compiler")

SPEC = BatchSpec.of(StreamConfig(windows=("1m",), max_items_per_request=6,
                                 slice_spec=SliceSpec(by=("segment", "surface", "variant", "model"))))
SPEC_TWO = BatchSpec.of(StreamConfig(windows=("1m",), slice_spec=SliceSpec(by=("surface", "model"))))
T0 = 1_796_032_800_000


def _scan(spec: BatchSpec, kind: bool, lines: list[bytes]) -> tuple[list[list[Any]], list[int]]:
    """The scanner's columns and left indexes, called directly."""
    if kind:
        by = tuple(prepare._LABEL_FIELDS.index(lbl) for lbl in spec.by)
        return rowscan.impressions(lines, spec.max_event_bytes, spec.max_items_per_request, by, {}, {},
                                   USER_KEY_CACHE, user_key_of)
    return rowscan.feedback(lines, spec.max_event_bytes, dict(spec.action_grades))


def _assert_same_rows(spec: BatchSpec, kinds: list[bool], lines: list[bytes]) -> None:
    made = prepare_rows(spec, kinds, lines, {})
    oracle = prepare_rows_msgspec(spec, kinds, lines, {})
    assert made == oracle
    # and packed bytes identical (a float's sign of zero, say, which == does not see in the scores)
    assert made.packed() == oracle.packed()


def _impression(rng: random.Random, i: int) -> dict[str, Any]:
    n = rng.randint(1, 6)
    positions = list(range(1, n + 1))
    if rng.random() < 0.3:
        rng.shuffle(positions)
    items = [{"item_id": rng.choice([f"i-{rng.randint(0, 50)}", rng.randint(-5, 10**12), "x y", "é"[:0] + "a/b"]),
              "position": p, "score": _score(rng)} for p in positions]
    for it in items:
        if rng.random() < 0.1:
            it["extra"] = rng.choice([1, "s", None, True, 2.5])
    d: dict[str, Any] = {"event_id": rng.choice([f"e-{i}", i, -i - 1]), "request_id": rng.choice([f"r-{i}", 10**6 + i]),
                         "ts": T0 + rng.randint(0, 10**6), "items": items}
    for lbl in ("segment", "surface", "variant", "model"):
        r = rng.random()
        if r < 0.7:
            d[lbl] = rng.choice(["a", "b", "", "with space"])
        elif r < 0.85:
            d[lbl] = None
    r = rng.random()
    if r < 0.6:
        d["user_id"] = rng.choice([f"u-{rng.randint(0, 20)}", ""])
    elif r < 0.7:
        d["user_id"] = None
    if rng.random() < 0.2:
        d["client"] = rng.choice([1, "web", None, False, -0.5, {"device": "ios", "v": [1, 2.5, None]}, [], {},
                                  [[{"a": [True]}]]])
    if rng.random() < 0.05:
        d[rng.choice(["item_id", "position", "score"])] = None
    keys = list(d)
    rng.shuffle(keys)
    return {k: d[k] for k in keys}


def _score(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.4:
        return round(rng.uniform(-1, 1), rng.randint(0, 6))
    if r < 0.6:
        return rng.uniform(-1e6, 1e6)
    if r < 0.7:
        return rng.randint(-10**6, 10**6)
    if r < 0.8:
        return rng.choice([0.0, -0.0, 1e-300, 5e-324, 1.7976931348623157e308, 123456789.123456789])
    return float(f"{rng.randint(1, 10**rng.randint(1, 17))}e{rng.randint(-40, 40)}")


def _feedback(rng: random.Random, i: int) -> dict[str, Any]:
    d: dict[str, Any] = {"event_id": rng.choice([f"f-{i}", i]), "request_id": rng.choice([f"r-{i}", 7]),
                         "item_id": rng.choice(["i-1", 3]), "ts": T0 + rng.randint(0, 10**6)}
    r = rng.random()
    if r < 0.6:
        d["action"] = rng.choice(["click", "purchase", "add_to_cart"])
    elif r < 0.9:
        d["grade"] = rng.randint(0, 20)
        if rng.random() < 0.5:
            d["action"] = rng.choice(["click", "whatever", None])
    else:
        d["action"] = "click"
        d["grade"] = None
    if rng.random() < 0.2:
        d["session"] = rng.choice(["s", 3, None, {"id": "s", "n": [1, {}]}])
    keys = list(d)
    rng.shuffle(keys)
    return {k: d[k] for k in keys}


def _dumps(d: dict[str, Any], rng: random.Random) -> bytes:
    text = json.dumps(d, separators=(",", ":")) if rng.random() < 0.7 else json.dumps(d, indent=rng.choice([None, 1]))
    if rng.random() < 0.1:
        text = " \t" + text + " \r"
    return text.encode()


@pytest.mark.parametrize("seed", range(4))
def test_well_formed_lines_are_scanned_to_msgspecs_rows(seed: int) -> None:
    rng = random.Random(seed)
    imps = [_dumps(_impression(rng, i), rng) for i in range(600)]
    fbs = [_dumps(_feedback(rng, i), rng) for i in range(600)]
    for spec in (SPEC, SPEC_TWO):
        _assert_same_rows(spec, [True] * len(imps), imps)
        _assert_same_rows(spec, [False] * len(fbs), fbs)
        kinds = [rng.random() < 0.5 for _ in range(800)]
        mixed = [(imps if k else fbs)[rng.randrange(600)] for k in kinds]
        _assert_same_rows(spec, kinds, mixed)
    # the scanner took them itself: only what it is documented to leave was left
    _, left = _scan(SPEC, True, imps)
    taken = [i for i in range(len(imps)) if i not in set(left)]
    assert len(taken) > 0.8 * len(imps)
    for i in left:
        assert _documented_left(json.loads(imps[i]))
    _, left_fb = _scan(SPEC, False, fbs)
    for i in left_fb:
        fb = json.loads(fbs[i])
        assert fb.get("grade") is None and fb.get("action") not in dict(SPEC.action_grades)


def _documented_left(d: dict[str, Any]) -> bool:
    """What the scanner leaves of a generated impression: an id of more than 18 digits or -0, a score it reads
    its own way (an integer of more than 18 digits), or an item-form field that is not null."""
    ids = [d["event_id"], d["request_id"], *(it["item_id"] for it in d["items"])]
    long_int = any(type(v) is int and len(str(abs(v))) > 18 for v in ids)
    return long_int or any(d.get(f) is not None for f in ("item_id", "position", "score"))


_MUTATIONS = [b"\\", b"\\u0000", b"\x00", b"\x7f", "é".encode(), b"\xff", b"{", b"}", b"[", b"]", b",", b":", b'"',
              b"-", b"0", b"1", b".", b"e", b"E", b"+", b" ", b"null", b"true", b"1e400", b"NaN", b"-0"]


@pytest.mark.parametrize("seed", range(3))
def test_any_mutated_line_gets_msgspecs_row(seed: int) -> None:
    """Lines cut, spliced and mutated byte by byte: the scanner leaves what it cannot take, and what it takes is
    msgspec's row."""
    rng = random.Random(100 + seed)
    lines: list[bytes] = []
    kinds: list[bool] = []
    for i in range(1500):
        kind = rng.random() < 0.5
        raw = _dumps(_impression(rng, i) if kind else _feedback(rng, i), rng)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(raw) + 1)
            op = rng.random()
            if op < 0.4:
                raw = raw[:at] + raw[at + rng.randint(1, 3):]
            elif op < 0.8:
                raw = raw[:at] + rng.choice(_MUTATIONS) + raw[at:]
            else:
                raw = raw[:at] + rng.choice(_MUTATIONS) + raw[at + 1:]
        lines.append(raw)
        kinds.append(kind)
    _assert_same_rows(SPEC, kinds, lines)


EDGE_IMPRESSIONS = [
    # duplicate fields, at the top and in an item
    b'{"event_id":"e","event_id":"f","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","item_id":"b","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}],"items":[]}',
    # escapes, non-ASCII, control characters
    b'{"event_id":"e\\u0041","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_\\u0069d":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"\xc3\xa9","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e\x01","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}',
    # ids: empty, -0, 19 digits, bool, float
    b'{"event_id":"","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":-0,"request_id":"r","ts":1,"items":[{"item_id":-0,"position":1,"score":1}]}',
    b'{"event_id":1234567890123456789,"request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":true,"request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":1.0,"request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}',
    # ts: negative, beyond the range, float, text, -0
    b'{"event_id":"e","request_id":"r","ts":-1,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":253370764800000,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":253370764799999,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1e3,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":"2026-12-01T10:00:00Z","items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":-0,"items":[{"item_id":"a","position":1,"score":1}]}',
    # items: empty, null, too many, positions duplicated, missing, 0, out of order, float
    b'{"event_id":"e","request_id":"r","ts":1,"items":[]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":null}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[' + b",".join(
        b'{"item_id":"a","position":%d,"score":1}' % p for p in range(1, 8)) + b"]}",
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1},'
    b'{"item_id":"b","position":1,"score":2}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":2,"score":1},'
    b'{"item_id":"b","position":1,"score":2}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":3,"score":1},'
    b'{"item_id":"b","position":1,"score":2}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":0,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1.0,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1,"x":[1]}]}',
    # scores: overflow, the smallest subnormal, long mantissas, exponents, an integer of 19+ digits, -0.0
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1e400}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":4.9e-324}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":0.1000000000000000055511151231257827}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":9007199254740993}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":12345678901234567890123}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":-0.0}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":-0}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":-0e0}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":123456789012345678}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1E+22}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1e-23}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":00.5}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":.5}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1.}]}',
    # item form, both forms, nulls of the item form
    b'{"event_id":"e","request_id":"r","ts":1,"item_id":"a","position":1,"score":1}',
    b'{"event_id":"e","request_id":"r","ts":1,"item_id":"a","items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"item_id":null,"items":[{"item_id":"a","position":1,"score":1}]}',
    # labels: too long, a number, null; users: a number, empty, too long
    b'{"event_id":"e","request_id":"r","ts":1,"segment":"' + b"x" * 257 + b'","items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"segment":"' + b"x" * 256 + b'","items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"segment":3,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"user_id":3,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"user_id":0,"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"user_id":"","items":[{"item_id":"a","position":1,"score":1}]}',
    # not an object, trailing bytes, missing fields, trailing comma, an unknown nested field
    b'[1]', b'', b'null', b'{}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]} x',
    b'{"event_id":"e","request_id":"r","items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}],}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1},]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":{"a":1},"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":{"a":[1,{"b":null}],"c":{}},"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":' + b"[" * 40 + b"]" * 40 + b',"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":' + b"[" * 20 + b"]" * 20 + b',"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":{"a":1,},"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":{"a"},"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":{"a" 1},"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":{1:2},"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":[1 2],"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":{"a":"\\u0041"},"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"ctx":[,],"items":[{"item_id":"a","position":1,"score":1}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1,"x":{"y":[]}}]}',
    b'{"event_id":"e","request_id":"r","ts":1,"segment":{"a":1},"items":[{"item_id":"a","position":1,"score":1}]}',
]

EDGE_FEEDBACK = [
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1,"action":"click"}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1,"action":"nope"}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1,"action":"nope","grade":3}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1,"grade":21}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1,"grade":-1}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1,"grade":true}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1,"grade":2.0}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1,"grade":null,"action":"click"}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1,"action":3,"grade":1}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1}',
    b'{"event_id":"f","request_id":"r","ts":1,"action":"click"}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":1,"action":"click","action":"click"}',
    b'{"event_id":"f","request_id":"r","item_id":"","ts":1,"action":"click"}',
    b'{"event_id":"f","request_id":"r","item_id":"a","ts":"1","action":"click"}',
]


def test_edge_lines_get_msgspecs_rows() -> None:
    _assert_same_rows(SPEC, [True] * len(EDGE_IMPRESSIONS), EDGE_IMPRESSIONS)
    _assert_same_rows(SPEC, [False] * len(EDGE_FEEDBACK), EDGE_FEEDBACK)
    _assert_same_rows(SPEC, [True] * len(EDGE_IMPRESSIONS) + [False] * len(EDGE_FEEDBACK),
                      EDGE_IMPRESSIONS + EDGE_FEEDBACK)


_TIMES = ["2026-11-30T00:00:00.019Z", "2026-11-30T00:00:00Z", "2026-11-30T00:00:00.5+01:00", "2026-11-30T00:00:00-00:00",
          "2026-11-30T23:59:59.999999-23:59", "2024-02-29T12:00:00Z", "2026-02-29T12:00:00Z", "2026-11-30T00:00:60Z",
          "2026-11-30T24:00:00Z", "2026-13-01T00:00:00Z", "2026-11-31T00:00:00Z", "2026-11-30T00:00:00.1234565Z",
          "2026-11-30T00:00:00.Z", "2026-11-30T00:00Z", "2026-11-30t00:00:00z", "2026-11-30 00:00:00Z",
          "2026-11-30T00:00:00", "2026-11-30T00:00:00+0100", "1969-12-31T23:59:59.999Z", "1970-01-01T00:00:00.000Z",
          "1970-01-01T00:30:00+01:00", "9998-12-31T23:59:59.999Z", "9999-01-01T00:00:00Z", "0001-01-01T00:00:00Z",
          "2026-11-30T00:00:00.0000001Z", "2026-11-30T00:00:00+24:00", "2026-11-30T00:00:00+01:60", "x",
          "2100-02-29T00:00:00Z", "2000-02-29T00:00:00Z", "1969-12-31T23:59:59.9995Z", "1970-01-01T00:00:00.0005+00:01"]


def test_rfc3339_times_are_read_as_the_per_record_path_reads_them() -> None:
    """Epoch ms rounded down, as validation._ts_ms; a form the scanner does not take (a lowercase letter, a space,
    seven fraction digits, no zone) is left to msgspec, which decides."""
    imps = [b'{"event_id":"e%d","request_id":"r%d","ts":"%s","items":[{"item_id":"a","position":1,"score":1}]}'
            % (i, i, t.encode()) for i, t in enumerate(_TIMES)]
    fbs = [b'{"event_id":"f%d","request_id":"r","item_id":"a","ts":"%s","action":"click"}' % (i, t.encode())
           for i, t in enumerate(_TIMES)]
    _assert_same_rows(SPEC, [True] * len(imps), imps)
    _assert_same_rows(SPEC, [False] * len(fbs), fbs)
    columns, left = _scan(SPEC, True, imps[:6])
    assert left == [] and columns[2][0] == 1_795_996_800_019  # 2026-11-30T00:00:00.019Z
    assert _scan(SPEC, False, fbs[:6])[1] == []


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(1969, 12, 30), max_value=datetime(9999, 12, 31)),
       st.integers(-23 * 60 - 59, 23 * 60 + 59), st.integers(0, 6))
def test_rfc3339_times_read_to_the_millisecond(when: datetime, offset_min: int, digits: int) -> None:
    zone = timezone(timedelta(minutes=offset_min))
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        text += "." + f"{when.microsecond:06d}"[:digits]
    text += "Z" if offset_min == 0 else when.replace(tzinfo=zone).strftime("%z")[:3] + ":" + f"{abs(offset_min) % 60:02d}"
    line = b'{"event_id":"e","request_id":"r","ts":"%s","items":[{"item_id":"a","position":1,"score":1}]}' % text.encode()
    _assert_same_rows(SPEC, [True], [line])
    oracle = prepare_rows_msgspec(SPEC, [True], [line], {})
    if oracle.impressions[0][0] is not None:  # in range: the scanner took it itself
        assert _scan(SPEC, True, [line])[1] == []


def test_lines_beyond_the_size_cap_are_left() -> None:
    line = b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}'
    small = BatchSpec(len(line) - 1, 6, SPEC.action_grades, SPEC.by)
    assert _scan(small, True, [line])[1] == [0]
    _assert_same_rows(small, [True], [line])
    assert _scan(SPEC, True, [line])[1] == []


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["r", "e", "g"]))
def test_scores_read_to_the_bit(x: float, style: str) -> None:
    text = repr(x) if style == "r" else f"{x:e}" if style == "e" else f"{x:.17g}"
    line = b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":%s}]}' % text.encode()
    if "inf" in text or "nan" in text:
        return
    columns, left = _scan(SPEC, True, [line])
    if not left:  # an integer literal is an integer made a float (-0 is the integer zero: 0.0)
        value = float(int(text)) if text.lstrip("-").isdigit() else float(text)
        assert columns[5][0][:8] == struct.pack("<d", value)
    _assert_same_rows(SPEC, [True], [line])


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789", min_size=1, max_size=24), st.text(alphabet="0123456789", max_size=24),
       st.integers(-330, 330), st.booleans())
def test_decimal_texts_read_to_the_bit(whole: str, fraction: str, exponent: int, negative: bool) -> None:
    """Decimal texts of every length (long mantissas, large exponents: beyond the fast path) as Python reads them."""
    whole = whole.lstrip("0") or "0"
    text = ("-" if negative else "") + whole + ("." + fraction if fraction else "") + f"e{exponent}"
    line = b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":%s}]}' % text.encode()
    columns, left = _scan(SPEC, True, [line])
    value = float(text)
    if left:
        assert value in (float("inf"), float("-inf"))
    else:
        assert columns[5][0][:8] == struct.pack("<d", value)
    _assert_same_rows(SPEC, [True], [line])


def test_the_user_key_cache_is_emptied_at_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [b'{"event_id":"e%d","request_id":"r%d","ts":1,"user_id":"u%d","items":[{"item_id":"a","position":1,'
             b'"score":1}]}' % (i, i, i % 7) for i in range(50)]
    by = tuple(prepare._LABEL_FIELDS.index(lbl) for lbl in SPEC.by)
    cache: dict[str, int] = {}
    columns, _ = rowscan.impressions(lines, SPEC.max_event_bytes, 6, by, {}, cache, 4, user_key_of)
    assert columns[6] == [user_key_of(f"r{i}", f"u{i % 7}") for i in range(50)]
    assert 0 < len(cache) <= 4


def test_without_the_scanner_every_row_is_msgspecs(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    lines = [_dumps(_impression(rng, i), rng) for i in range(200)]
    with_scanner = prepare_rows(SPEC, [True] * 200, lines, {})
    monkeypatch.setattr(native, "rowscan", None)
    assert prepare_rows(SPEC, [True] * 200, lines, {}) == with_scanner


def test_kinds_and_values_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        prepare_rows(SPEC, [True, False], [b"{}"], {})


def test_item_caps_the_scanner_does_not_take_fall_back_to_msgspec() -> None:
    """A hand-built spec beyond StreamConfig's range of ``max_items_per_request`` (1..65535): every row by msgspec."""
    line = b'{"event_id":"e","request_id":"r","ts":1,"items":[{"item_id":"a","position":1,"score":1}]}'
    for cap in (0, 2**60):
        spec = BatchSpec(1000, cap, SPEC.action_grades, SPEC.by)
        _assert_same_rows(spec, [True], [line])
        with pytest.raises(ValueError, match="outside"):
            _scan(spec, True, [line])
