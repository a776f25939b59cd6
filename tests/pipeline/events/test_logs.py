"""Logged events merged chunk by chunk equal a per-line heap merge, and the batch path equals per-record.

The oracle is the obvious algorithm: every line keyed by ``(ts, stream, file, line)`` with a per-line
``sniff_ts_ms``, files merged by ``heapq.merge`` (which takes the smallest head, also of unsorted files), a
line without a readable ``ts`` handed over when its file is next read. Files here are unsorted, have bad
and empty lines, RFC 3339 times, ties across files and streams, gzip, and chunks of a few bytes.
"""

from __future__ import annotations

import gzip
import heapq
import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.events.deadletter import ListDeadLetterSink
from rankwatch.pipeline.events.logs import NO_TS, EventLogMerge, sniff_many
from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.events.validation import sniff_ts_ms
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_events


def _naive_order(files: list[tuple[Path, str]]) -> list[tuple[str, bytes, SourceRef]]:
    order = {"impressions": 0, "clicks": 1}
    out: list[tuple[str, bytes, SourceRef]] = []

    def keyed(index: int, path: Path, stream: str) -> Iterator[tuple[int, int, int, int, str, bytes]]:
        opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                line = line.strip()
                if not line:
                    continue
                ts = sniff_ts_ms(line)
                if ts is None:
                    out.append((stream, line, SourceRef(str(path), index, number)))
                    continue
                yield ts, order[stream], index, number, stream, line

    for _ts, _o, index, number, stream, line in heapq.merge(*(keyed(i, p, s) for i, (p, s) in enumerate(files))):
        out.append((stream, line, SourceRef(str(files[index][0]), index, number)))
    return out


def _merged(files: list[tuple[Path, str]], chunk_bytes: int) -> list[tuple[str, bytes, SourceRef]]:
    merge = EventLogMerge(files, chunk_bytes=chunk_bytes)
    out = []
    try:
        for kinds, values, sources in merge.batches():
            assert len(sources) == len(values) == len(kinds)
            out += [("impressions" if k else "clicks", v, sources(i)) for i, (k, v) in enumerate(zip(kinds, values, strict=True))]
    finally:
        merge.close()
    return out


def _random_line(rng: random.Random, ts: int) -> bytes:
    roll = rng.random()
    if roll < 0.05:
        return b'{"ts": "not a time"'
    if roll < 0.08:
        return b"not json at all"
    if roll < 0.10:
        return json.dumps({"event_id": "x", "ts": -5}).encode()
    if roll < 0.12:
        return json.dumps({"ts": f"2026-11-30T10:00:{ts % 60:02d}.{ts % 1000:03d}Z"}).encode()
    if roll < 0.14:
        return b"   "
    if roll < 0.15:
        return json.dumps({"ts": 10**30}).encode()
    return json.dumps({"event_id": f"e{rng.random()}", "ts": ts}).encode()


@pytest.mark.parametrize("seed", range(12))
def test_the_chunked_merge_is_the_per_line_heap_merge(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    files = []
    for i in range(rng.randint(1, 4)):
        stream = "impressions" if i == 0 or rng.random() < 0.5 else "clicks"
        base = rng.randint(0, 50)
        lines = [_random_line(rng, base + rng.randint(-20, 40) + j // 3) for j in range(rng.randint(0, 120))]
        path = tmp_path / f"f{i}.jsonl"
        data = b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b"")
        if rng.random() < 0.3:
            path = tmp_path / f"f{i}.jsonl.gz"
            data = gzip.compress(data)
        path.write_bytes(data)
        files.append((path, stream))
    files.sort(key=lambda f: f[1] != "impressions")  # impressions listed first, as the command does
    expected = _naive_order(files)
    for chunk in (7, 64, 1 << 22):
        assert _merged(files, chunk) == expected, chunk


def test_sniff_many_equals_sniff_ts_ms_line_by_line() -> None:
    rng = random.Random(3)
    lines = [_random_line(rng, rng.randint(0, 10**6)).strip() or b"{}" for _ in range(500)]
    lines += [b'{"ts": 1, "a": [1', b'2]}', b'{"ts": 5},{"ts": 6}', b'{"ts": true}', b'{"ts": 1.5}']
    expected = np.array([NO_TS if (t := sniff_ts_ms(line)) is None else t for line in lines], dtype=np.int64)
    assert np.array_equal(sniff_many(lines), expected)
    assert np.array_equal(sniff_many([]), np.zeros(0, dtype=np.int64))


def test_sniff_many_keeps_each_time_on_its_line_when_bad_lines_keep_the_count() -> None:
    """A line with two objects and two lines closing one object, each framed ``{...}``: the joined array has one
    element a line, but the times between them would land one line off."""
    good = [b'{"ts": %d, "x": {"y": [1, {}]}}' % t for t in range(10, 18)]
    bad = [b'{"ts": 1}, {"ts": 2}', *good[:3], b'{"ts": 5, "a": [{}', b'{}]}', *good[3:]]
    for lines in (bad, good[:2] + bad + good[2:], bad * 3):
        expected = np.array([NO_TS if (t := sniff_ts_ms(line)) is None else t for line in lines], dtype=np.int64)
        assert np.array_equal(sniff_many(lines), expected)


def _write_traffic(tmp_path: Path) -> list[tuple[Path, str]]:
    cfg = TrafficConfig(seed=11, requests_per_second=5.0, duration_s=900.0, malformed_rate=0.02, duplicate_rate=0.02,
                        orphan_rate=0.01, late_rate=0.01, item_form_share=0.1, rfc3339_share=0.1)
    by_stream: dict[str, list[bytes]] = {"impressions": [], "clicks": []}
    for e in generate_events(cfg):
        by_stream[e.stream].append(e.value)
    rng = random.Random(5)
    imp = by_stream["impressions"]
    for _ in range(40):  # local disorder beyond the allowed disorder, so some events are late
        i = rng.randrange(len(imp) - 1)
        imp[i], imp[i + 1] = imp[i + 1], imp[i]
    half = len(imp) // 2
    paths = {"a": imp[:half], "b": imp[half:], "c": by_stream["clicks"]}
    for name, lines in paths.items():
        (tmp_path / f"{name}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return [(tmp_path / "a.jsonl", "impressions"), (tmp_path / "b.jsonl", "impressions"),
            (tmp_path / "c.jsonl", "clicks")]


def test_replay_through_the_batch_path_equals_per_record_processing(tmp_path: Path) -> None:
    files = _write_traffic(tmp_path)
    config = StreamConfig(windows=("5m", "1h"))

    def run(batched: bool) -> tuple[list[dict], object, list]:
        sink = ListDeadLetterSink()
        proc = StreamProcessor(config, clock=ManualClock(), dead_letters=sink)
        windows = []
        if batched:
            merge = EventLogMerge(files, chunk_bytes=4096)
            for kinds, values, sources in merge.batches():
                windows += proc.process_batch(kinds, values, source_of=sources)
            merge.close()
        else:
            for stream, raw, ref in _naive_order(files):
                fn = proc.process_impression if stream == "impressions" else proc.process_feedback
                windows += fn(raw, source=ref)
        windows += proc.flush()
        letters = [(d.stream, d.reason, d.raw, d.source) for d in sink.letters]
        return [w.document() for w in windows], proc.stats(), letters

    batched, per_record = run(True), run(False)
    assert batched[0] == per_record[0] and batched[0]
    assert batched[1] == per_record[1]
    assert batched[2] == per_record[2] and batched[2]


def test_a_file_is_read_in_chunks_doubling_from_the_first_read(tmp_path: Path) -> None:
    """The first read is FIRST_CHUNK_BYTES (the first batch waits for it), each next one twice the last, up to
    the chunk size; every line comes once, in order, with its number."""
    from rankwatch.pipeline.events.logs import FIRST_CHUNK_BYTES, LogFile

    lines = [b'{"ts": %d, "pad": "%s"}' % (i, b"x" * (i % 200)) for i in range(40_000)]
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    log = LogFile(path, "impressions", 0, chunk_bytes=4 * FIRST_CHUNK_BYTES)
    sizes: list[int] = []
    got: list[bytes] = []
    numbers: list[int] = []
    while True:
        chunk, at = log.read_chunk()
        if not chunk:
            break
        sizes.append(sum(map(len, chunk)) + len(chunk))
        got += chunk
        numbers += at.tolist()
    assert got == lines and numbers == list(range(1, len(lines) + 1))
    slack = 1024  # a chunk also holds the end of the line the read before it cut
    first = FIRST_CHUNK_BYTES
    assert sizes[0] <= first < sizes[1] <= 2 * first + slack < sizes[2] <= 4 * first + slack
    assert all(s <= 4 * first + slack for s in sizes) and len(sizes) > 4
