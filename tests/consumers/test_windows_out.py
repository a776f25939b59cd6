"""--windows-out: one line per identity across restarts; a cut-off last line is dropped and rewritten."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from rankwatch.consumers.windows_out import WindowsOutWriter, read_windows
from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.published import PublishedWindow

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def _window(minute: int, partition: int, revision: int = 0) -> PublishedWindow:
    agg = RankingAggregate(MetricOptions())
    start = T0 + timedelta(minutes=minute)
    return PublishedWindow("1m", start, start + timedelta(minutes=1), agg, {}, (partition,), revision)


def test_republication_is_skipped_even_after_reopening(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    w = WindowsOutWriter(path)
    assert w.write(_window(0, 0)) and w.write(_window(0, 1)) and not w.write(_window(0, 0))
    w.close()
    w = WindowsOutWriter(path)
    assert not w.write(_window(0, 1))
    assert w.write(_window(1, 1))
    assert w.write(_window(0, 1, revision=1))  # a new revision is a new value
    w.close()
    docs = read_windows(path)
    assert [(d["start"], d["partitions"], d["revision"]) for d in docs] == [
        ("2026-11-30T10:00:00Z", [0], 0), ("2026-11-30T10:00:00Z", [1], 0),
        ("2026-11-30T10:01:00Z", [1], 0), ("2026-11-30T10:00:00Z", [1], 1),
    ]


def test_a_partial_last_line_from_a_crash_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    w = WindowsOutWriter(path)
    w.write(_window(0, 0))
    w.close()
    with path.open("a") as f:
        f.write('{"window": "1m", "start": "2026-11-30T10:01')  # killed mid-write
    w = WindowsOutWriter(path)
    assert w.write(_window(1, 0))
    w.close()
    assert [d["start"] for d in read_windows(path)] == ["2026-11-30T10:00:00Z", "2026-11-30T10:01:00Z"]
    assert path.read_text().count("\n") == 2
