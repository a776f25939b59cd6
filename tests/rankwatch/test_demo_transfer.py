"""The demo's model versions: history at start-up, one version per period of the given (event) clock, the
exporter's samples reloaded by the watcher, and the one-line summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from rankwatch.demo_transfer import DemoVersions, transfer_line
from rankwatch.exporters import names
from rankwatch.exporters.state import MetricsState
from rankwatch.pipeline.stream.processor import StreamConfig
from rankwatch.pipeline.transfer.ledger import read_ledgers

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_versions_fill_the_ledger_as_the_clock_passes(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    state = MetricsState.for_stream(StreamConfig(windows=("5m",)))
    versions = DemoVersions(ledger, state, START, seed=7, every_s=300, history=4, max_versions=6, resamples=200)
    versions.start_up()
    entries = read_ledgers([ledger])
    assert len(entries) == 4 * 4  # 4 versions x (3 segments + all)
    assert sorted({e.recorded_at for e in entries}) == ["2026-03-01T11:45:00Z", "2026-03-01T11:50:00Z",
                                                         "2026-03-01T11:55:00Z", "2026-03-01T12:00:00Z"]
    counts = {s.labels["segment"]: s.value for s in state.snapshot().transfer[names.TRANSFER_COMPARISONS]}
    assert counts == {"all": 4.0, "new_user": 4.0, "returning": 4.0, "power_user": 4.0}

    assert not versions.advance(START + timedelta(seconds=299))
    assert versions.advance(START + timedelta(seconds=300)) and versions.versions == 5
    assert versions.advance(START + timedelta(hours=2)) and versions.versions == 6  # at most max_versions
    assert not versions.advance(START + timedelta(hours=3))
    assert versions.watcher.reload()  # the demo's scheduler job
    entries = read_ledgers([ledger])
    assert len(entries) == 6 * 4
    assert {e.recorded_at for e in entries if e.candidate == "ranker-v6"} == {"2026-03-01T12:10:00Z"}
    snap = state.snapshot()
    counts = {s.labels["segment"]: s.value for s in snap.transfer[names.TRANSFER_COMPARISONS]}
    assert counts["new_user"] == 6.0
    points = snap.transfer[names.TRANSFER_OFFLINE_DIFF]
    assert {(s.labels["segment"], s.labels["candidate"]) for s in points} >= {("new_user", "ranker-v6")}
    line = transfer_line(snap)
    assert line is not None and line.startswith("transfer ndcg@10 corrected slope: all ")
    assert "new_user" in line and "(6)" in line


def test_no_samples_no_line() -> None:
    state = MetricsState.for_stream(StreamConfig(windows=("5m",)))
    assert transfer_line(state.snapshot()) is None


def test_write_versions_spreads_them_over_the_traffic(tmp_path: Path) -> None:
    from rankwatch.demo_transfer import write_versions

    ledger = tmp_path / "ledger.jsonl"
    assert write_versions(ledger, seed=1, start=START, duration_s=600, count=3) == 12
    entries = read_ledgers([ledger])
    assert sorted({(e.candidate, e.recorded_at) for e in entries}) == [
        ("ranker-v1", "2026-03-01T12:03:20Z"), ("ranker-v2", "2026-03-01T12:06:40Z"),
        ("ranker-v3", "2026-03-01T12:10:00Z")]
