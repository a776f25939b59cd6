"""Rows made as the lines are read (rankwatch/commands/rows_as_read.py): the merge's times and each batch's rows.

The oracles: :func:`pipeline.events.logs.sniff_many` for the times (which order the merge), and
:func:`pipeline.stream.prepare.prepare_rows` of each merged batch for its rows, on messy lines (bad JSON, RFC 3339
and out-of-range times, item-form and out-of-order impressions, integer ids, NUL escapes), in chunks of a few
lines, with the reader ahead or not at random.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from rankwatch.commands.rows_as_read import RowsAsRead
from rankwatch.pipeline.events.logs import EventLogMerge, sniff_many
from rankwatch.pipeline.stream.config import StreamConfig
from rankwatch.pipeline.stream.prepare import BatchSpec, prepare_rows


def _impression(rng: random.Random, i: int, ts: int) -> bytes:
    roll = rng.random()
    n = rng.randint(1, 4)
    items = [{"item_id": f"i{rng.randint(0, 9)}", "position": p + 1, "score": rng.random()} for p in range(n)]
    doc: dict[str, object] = {"event_id": f"e{i}", "request_id": f"r{i}", "ts": ts, "items": items,
                              "segment": rng.choice(["a", "b", None]), "user_id": rng.choice(["u1", "u2", None])}
    if roll < 0.05:
        return b'{"ts": 5, "items": ['
    if roll < 0.1:
        doc["ts"] = f"2026-11-30T10:00:{ts % 60:02d}Z"
    elif roll < 0.15:
        rng.shuffle(items)
    elif roll < 0.2:
        doc["request_id"] = i
    elif roll < 0.25:
        doc["ts"] = -ts
    elif roll < 0.3:
        items[0]["item_id"] = "a\u0000b"
    return json.dumps(doc).encode()


def _click(rng: random.Random, i: int, ts: int) -> bytes:
    if rng.random() < 0.1:
        return b"not json"
    doc = {"event_id": f"c{i}", "request_id": f"r{rng.randint(0, i)}", "item_id": f"i{rng.randint(0, 9)}", "ts": ts,
           "action": rng.choice(["click", "purchase", "unknown"])}
    return json.dumps(doc).encode()


def _files(tmp_path: Path, seed: int) -> list[tuple[Path, str]]:
    rng = random.Random(seed)
    imp = [_impression(rng, i, 1000 + i * 3 + rng.randint(-5, 5)) for i in range(rng.randint(0, 300))]
    clk = [_click(rng, i, 1000 + i * 2 + rng.randint(-5, 5)) for i in range(rng.randint(0, 400))]
    (tmp_path / "i.jsonl").write_bytes(b"\n".join(imp) + b"\n")
    (tmp_path / "c.jsonl").write_bytes(b"\n".join(clk) + b"\n")
    return [(tmp_path / "i.jsonl", "impressions"), (tmp_path / "c.jsonl", "clicks")]


def test_it_applies_with_one_file_a_stream() -> None:
    assert RowsAsRead.applies(["impressions", "clicks"]) and RowsAsRead.applies(["impressions"])
    assert not RowsAsRead.applies(["impressions", "clicks", "clicks"])


@pytest.mark.parametrize("seed", range(6))
def test_the_times_and_the_rows_are_those_of_the_lines(tmp_path: Path, seed: int) -> None:
    files = _files(tmp_path, seed)
    config = StreamConfig()
    spec = BatchSpec.of(config)
    rng = random.Random(seed)
    as_read = RowsAsRead(spec, config, lambda: None)
    ts_of = as_read.ts_of

    def checked_ts_of(stream: str, lines: list[bytes]) -> object:
        ts = ts_of(stream, lines)
        assert ts.tolist() == sniff_many(lines).tolist()
        return ts

    chunk = rng.choice([64, 700])  # bytes: chunks of a line or a few
    plain = list(EventLogMerge(files, chunk_bytes=chunk).batches())
    merged = list(EventLogMerge(files, chunk_bytes=chunk, ts_of=checked_ts_of).batches())
    assert [(k, v) for k, v, _ in merged] == [(k, v) for k, v, _ in plain]  # the same order
    # again, the rows taken batch by batch as the merge reads on, the reader ahead or not at random
    as_read = RowsAsRead(spec, config, lambda: None)
    missing = set()
    for kinds, values, _ in EventLogMerge(files, chunk_bytes=chunk, ts_of=as_read.ts_of).batches():
        packed = as_read.take(kinds, lambda: rng.random() < 0.5)
        expected = prepare_rows(spec, kinds, values)
        if packed is None:
            missing.add(3)
            continue
        missing.add(packed.missing)
        assert packed.completed(spec, kinds, values) == expected
    assert {0, 1, 2} <= missing  # batches with both kinds made in the reader, or one
    assert as_read._queued[True] == as_read._queued[False] == type(as_read._queued[True])()


def _guard(cap: int = 100) -> tuple[Any, list[int | None]]:
    from rankwatch.commands.rows_as_read import RepeatGuard

    config = StreamConfig(attribution_window_ms=10_000, finalize_step_ms=1_000, max_pending_requests=cap)
    core: list[int | None] = [None]
    return RepeatGuard(config, lambda: core[0]), core


def test_the_guard_flags_a_request_seen_before_until_the_core_has_finalized_it() -> None:
    """A request id seen before is flagged (the core may hold it pending) until the core's watermark step says the
    deadline bucket of the newest time of the last chunk it came in has ended (a step of margin); an unreadable line
    (no id) is neither flagged nor kept. Both ways: the usual chunk's (no repeat) and the per-line one."""
    guard, core = _guard()
    assert guard.flagged(["a", None, "b"], 900) == []  # the usual chunk
    assert guard.flagged(["c", "a", None, "c"], 1_500) == [1, 3]  # 'a' now last came in this chunk
    # the first chunk (newest 900): bucket 10, ends at 11,000; with a step of margin its ids go at 12,000
    core[0] = 12_000
    assert guard.flagged(["b", "a"], 20_000) == [1]  # 'b' forgotten; 'a' stays with the second chunk
    core[0] = 13_000  # the second chunk (newest 1,500: bucket 11) goes, and 'a', 'c' with it
    assert guard.flagged(["c", "a", "b"], 21_000) == [1, 2]  # 'a' and 'b' came again in the third chunk


def test_the_guard_keeps_a_request_the_core_made_pending_from_a_later_line() -> None:
    """The core may reject a request's first line (empty items) and make it pending from a later one: the id is kept
    with the later chunk, so a third impression is flagged while the core may still hold the request (the review's
    case: forgetting by the first chunk let a line through that the core then read)."""
    guard, core = _guard()
    assert guard.flagged(["R"], 1_000) == []  # rejected by the core
    assert guard.flagged(["R"], 6_000) == [0]  # made pending by the core, its bucket 16 ending at 17,000
    core[0] = 15_000  # the first chunk is long finalized, the request is not
    assert guard.flagged(["R"], 15_950) == [0]
    core[0] = 26_000  # R last came in the third chunk (15,950: bucket 25), kept until 27,000
    assert guard.flagged(["S"], 26_000) == []
    assert guard.flagged(["R"], 26_500) == [0]
    core[0] = 30_000  # the fourth chunk (26,500: bucket 36) is not finalized: R stays
    assert guard.flagged(["R"], 30_000) == [0]
    core[0] = 50_000
    assert guard.flagged(["R"], 50_000) == []  # every chunk it came in is finalized: new again


def test_the_guard_at_the_cap_is_blind_until_the_core_has_finalized_all_it_read() -> None:
    """At the pending cap's worth of ids the guard keeps no more and flags every line until the core's step has
    passed the newest time read by then (the review's case: ids flagged at the cap and not kept let a later line of
    a request the core held through). Its memory stays at the cap."""
    guard, core = _guard(cap=3)
    assert guard.flagged(["a", "b"], 1_000) == []
    assert guard.flagged(["c", "d", "e"], 2_000) == [1, 2]  # the cap: blind from 'd' on
    core[0] = 13_000  # the first chunk's time is finalized, the blind time (2,000: bucket 12) is not
    assert guard.flagged(["f", None], 3_000) == [0]
    assert len(guard._ids) <= 3
    core[0] = 15_000  # every time read while blind (up to 3,000: bucket 13, ends 14,000) is finalized: afresh
    assert guard.flagged(["d", "e", "g"], 20_000) == []
