"""Golden stream test: messy traffic through the core gives exactly the recorded windows and counts.

``golden/stream_messy.json`` was recorded by the per-record code before the batch path existed (issue 10).
Every number in it must come out identical (floats compared exactly) however the events are fed: per
record, in batches of any size, or with a snapshot/restore midway. Keys *absent* from the golden file are
ignored, so later additions (new result keys, new stats) do not need a new recording; a changed or removed
key fails. Re-record only for an intended change of results:
``PYTHONPATH=. python tests/pipeline/stream/test_stream_golden.py --record``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from golden_traffic import messy_traffic  # noqa: E402

from rankwatch.pipeline.clock import ManualClock  # noqa: E402
from rankwatch.pipeline.events.deadletter import ListDeadLetterSink  # noqa: E402
from rankwatch.pipeline.events.records import SourceRef  # noqa: E402
from rankwatch.pipeline.slicing import SliceSpec  # noqa: E402
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "stream_messy.json"
CONFIGS = {
    "default_like": (StreamConfig(windows=("1m", "5m"), attribution_window_ms=60_000, allowed_disorder_ms=10_000), ()),
    "tight": (StreamConfig(windows=("30s", "2m"), attribution_window_ms=20_000, allowed_disorder_ms=3_000,
                           max_pending_requests=25, max_pending_feedback=15, dedupe_capacity=100,
                           finalized_memory=60, max_event_bytes=4_000, max_items_per_request=12, finalize_step_ms=2_000,
                           slice_spec=SliceSpec(by=("segment", "surface"), max_values_per_label=3)), (0, 1)),
}
SEEDS = (1, 2)
TOPIC = {"impressions": "imp", "clicks": "clk"}


def _events(seed: int) -> list[tuple[str, bytes, int]]:
    return messy_traffic(seed)


def _processor(name: str, sink: ListDeadLetterSink) -> StreamProcessor:
    cfg, parts = CONFIGS[name]
    return StreamProcessor(cfg, clock=ManualClock(), dead_letters=sink, partitions=parts)


def _sources(events: list[tuple[str, bytes, int]], start: int = 0) -> list[SourceRef]:
    """Where each event came from; the offset is its index in the whole sequence."""
    return [SourceRef(TOPIC[s], p, start + i) for i, (s, _, p) in enumerate(events)]


def feed_per_record(proc: StreamProcessor, events: list[tuple[str, bytes, int]], start: int = 0) -> list[Any]:
    out: list[Any] = []
    for (stream, raw, _), src in zip(events, _sources(events, start), strict=True):
        out += (proc.process_impression if stream == "impressions" else proc.process_feedback)(raw, source=src)
    return out


def feed_batches(proc: StreamProcessor, events: list[tuple[str, bytes, int]], rng: random.Random,
                 start: int = 0, max_batch: int = 400) -> list[Any]:
    """``process_batch`` over random cuts of ``events`` (a cut also ends where the partition changes)."""
    out: list[Any] = []
    i = 0
    while i < len(events):
        j = min(len(events), i + rng.randint(1, max_batch))
        part = events[i][2]
        k = next((m for m in range(i, j) if events[m][2] != part), j)
        chunk = events[i:k]
        out += proc.process_batch([s == "impressions" for s, _, _ in chunk], [raw for _, raw, _ in chunk],
                                  partition=part, offsets=range(start + i, start + k), topics=("imp", "clk"))
        i = k
    return out


def outcome(proc: StreamProcessor, windows: list[Any], sink: ListDeadLetterSink) -> dict[str, Any]:
    stats = dataclasses.asdict(proc.stats())
    stats["rejects"] = {f"{s}/{r}": n for (s, r), n in sorted(stats["rejects"].items())}
    return {
        "windows": [w.document() for w in windows],
        "stats": stats,
        "dead_letters": [[d.stream, str(d.reason), d.detail, None if d.source is None else list(d.source)]
                         for d in sink.letters],
    }


def run_per_record(name: str, seed: int) -> dict[str, Any]:
    sink = ListDeadLetterSink()
    proc = _processor(name, sink)
    events = _events(seed)
    out = feed_per_record(proc, events)
    out += proc.flush()
    return outcome(proc, out, sink)


def record() -> dict[str, Any]:
    return {f"{name}/{seed}": run_per_record(name, seed) for name in CONFIGS for seed in SEEDS}


def assert_contains(got: Any, want: Any, path: str = "$") -> None:
    """``got`` equals ``want`` except for dict keys that ``want`` lacks (added later; ignored)."""
    if isinstance(want, dict):
        assert isinstance(got, dict), path
        for key, value in want.items():
            assert key in got, f"{path}.{key} missing"
            assert_contains(got[key], value, f"{path}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: {len(got)} items, want {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_contains(g, w, f"{path}[{i}]")
    else:
        assert got == want and type(got) is type(want), f"{path}: {got!r} != {want!r}"


def _normalised(doc: dict[str, Any]) -> Any:
    return json.loads(json.dumps(doc))  # tuples -> lists, keys -> str: the form stored in the file


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())  # type: ignore[no-any-return]


def test_golden_covers_the_mess(golden: dict[str, Any]) -> None:
    for case in golden.values():
        outcomes = case["stats"]["outcomes"]
        assert all(outcomes["impressions"][o] > 0 for o in ("accepted", "duplicate", "rejected", "late"))
        assert all(outcomes["clicks"][o] > 0 for o in ("accepted", "duplicate", "rejected", "orphan", "late"))
        assert len(case["windows"]) > 5
    reasons = {r.split("/")[1] for case in golden.values() for r in case["stats"]["rejects"]}
    assert len(reasons) == 18, sorted(reasons)  # every RejectReason
    tight = golden["tight/1"]["stats"]
    assert tight["evicted_requests"] > 0 and tight["dedupe_forgotten_at_capacity"] > 0
    assert sum(tight["label_overflow"].values()) > 0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_per_record_matches_golden(golden: dict[str, Any], name: str, seed: int) -> None:
    assert_contains(_normalised(run_per_record(name, seed)), golden[f"{name}/{seed}"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_snapshot_restore_midway_matches_golden(golden: dict[str, Any], name: str, seed: int) -> None:
    events = _events(seed)
    sink = ListDeadLetterSink()
    proc = _processor(name, sink)
    cut = random.Random(seed).randrange(len(events) // 4, 3 * len(events) // 4)
    out = feed_per_record(proc, events[:cut])
    proc = StreamProcessor.restore(proc.snapshot(), config=CONFIGS[name][0], clock=ManualClock(), dead_letters=sink)
    out += feed_per_record(proc, events[cut:], start=cut)
    out += proc.flush()
    assert_contains(_normalised(outcome(proc, out, sink)), golden[f"{name}/{seed}"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("max_batch", [1, 7, 400, 10_000])
def test_batches_match_golden(golden: dict[str, Any], name: str, seed: int, max_batch: int) -> None:
    events = _events(seed)
    sink = ListDeadLetterSink()
    proc = _processor(name, sink)
    out = feed_batches(proc, events, random.Random(max_batch), max_batch=max_batch)
    out += proc.flush()
    assert_contains(_normalised(outcome(proc, out, sink)), golden[f"{name}/{seed}"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_batches_with_snapshot_restore_midway_match_golden(golden: dict[str, Any], name: str, seed: int) -> None:
    events = _events(seed)
    sink = ListDeadLetterSink()
    proc = _processor(name, sink)
    rng = random.Random(seed + 100)
    cut = rng.randrange(len(events) // 4, 3 * len(events) // 4)
    out = feed_batches(proc, events[:cut], rng)
    proc = StreamProcessor.restore(proc.snapshot(), config=CONFIGS[name][0], clock=ManualClock(), dead_letters=sink)
    out += feed_batches(proc, events[cut:], rng, start=cut)
    out += proc.flush()
    assert_contains(_normalised(outcome(proc, out, sink)), golden[f"{name}/{seed}"])


if __name__ == "__main__" and "--record" in sys.argv:
    GOLDEN.write_text(json.dumps(record(), separators=(",", ":"), sort_keys=True) + "\n")
    print(GOLDEN, GOLDEN.stat().st_size, "bytes")
