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


def test_the_guard_flags_a_request_seen_before_until_the_core_has_finalized_it() -> None:
    """A request id seen before is flagged (the core may hold it pending) until the core's watermark step says the
    deadline bucket of its chunk's newest time has ended (a step of margin); at the pending cap every new id is
    flagged; an unreadable line (no id) is neither flagged nor kept. Both ways: the usual chunk's (no repeat) and
    the per-line one."""
    from rankwatch.commands.rows_as_read import RepeatGuard

    config = StreamConfig(attribution_window_ms=10_000, finalize_step_ms=1_000, max_pending_requests=4)
    core: list[int | None] = [None]
    guard = RepeatGuard(config, lambda: core[0])
    assert guard.flagged(["a", None, "b"], 900) == []  # the usual chunk
    assert guard.flagged(["c", "a", None, "c"], 1_500) == [1, 3]
    # the first chunk (newest 900): bucket 10, ends at 11,000; with a step of margin its ids go at 12,000
    core[0] = 11_999
    assert guard.flagged(["a"], 20_000) == [0]
    core[0] = 12_000
    assert guard.flagged(["a", "b"], 20_000) == []  # both forgotten, seen again
    assert guard.flagged(["d", "e"], 20_000) == [1]  # c a b d: the cap of 4
    core[0] = 13_000  # the second chunk's ('c', newest 1,500: bucket 11) goes
    assert guard.flagged(["c", "a"], 21_000) == [1]
