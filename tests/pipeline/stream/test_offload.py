"""``StreamProcessor.offload_windows``: the aggregation half run on a copy gives the windows of the processor itself."""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
from typing import Any

import pytest

from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.events.deadletter import ListDeadLetterSink
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor
from tests.pipeline.stream.test_stream_batch import CFG, _dense

# Wider windows than CFG's and more slice values: windows of two sizes are closed by the watermark, new slice keys
# turn up after the first batches (the key table is sent as it grows).
CFG_WIDE = dataclasses.replace(CFG, max_pending_requests=10_000, dedupe_capacity=10_000, finalized_memory=10_000,
                               slice_spec=SliceSpec(by=("segment",), max_values_per_label=10))


class Copy:
    """What rankwatch/commands/window_worker.py does across processes, in one: the operations are pickled (as
    they travel) and applied, in order, to a processor of the same configuration that saw no event (the worker
    is a fork of the fresh processor)."""

    def __init__(self, proc: StreamProcessor) -> None:
        self.twin = StreamProcessor(proc.config, clock=ManualClock())
        self.published: dict[str, int] = {}
        self.windows: list[Any] = []
        self.sent = 0

    def aggregate(self, batch: Any, combo_keys: list[Any]) -> None:
        self._apply(("aggregate", dataclasses.replace(batch, request_ids=[]), combo_keys[self.sent:]))
        self.sent = len(combo_keys)

    def close(self, horizon_ms: int | None, partitions: tuple[int, ...]) -> None:
        self._apply(("close", horizon_ms, partitions))

    def _apply(self, op: tuple[Any, ...]) -> None:
        self.windows += self.twin.apply_offloaded(pickle.loads(pickle.dumps(op)))
        self.published = self.twin.stats().windows_published


def _run(config: StreamConfig, seq: list[tuple[bool, bytes, int]], offload: bool, batch: int) -> Any:
    sink = ListDeadLetterSink()
    proc = StreamProcessor(config, clock=ManualClock(), dead_letters=sink)
    elsewhere = Copy(proc) if offload else None
    if elsewhere is not None:
        proc.offload_windows(elsewhere)
    out: list[Any] = []
    for a in range(0, len(seq), batch):
        part = seq[a:a + batch]
        out += proc.process_batch([k for k, _, _ in part], [r for _, r, _ in part])
    out += proc.flush()
    if elsewhere is not None:
        assert out == []  # published elsewhere
        out = elsewhere.windows
    return [w.document() for w in out], proc.stats(), [(d.stream, d.reason, d.detail) for d in sink.letters]


def _drifting(rng: random.Random, n: int) -> list[tuple[bool, bytes, int]]:
    """:func:`_dense`'s events spread over ``n / 2`` seconds (each moved by its place in the sequence, keeping
    some disorder), with a new segment every 40 events: windows of both sizes close, and slice keys turn up
    after the first batches were aggregated."""
    out = []
    for i, (kind, raw, p) in enumerate(_dense(rng, n)):
        doc = json.loads(raw) if raw != b"{" else None
        if doc is None:
            out.append((kind, raw, p))
            continue
        if isinstance(doc.get("ts"), int):
            doc["ts"] += 500 * i
        if kind and "segment" in doc:
            doc["segment"] = f"v{i // 40}"
        out.append((kind, json.dumps(doc).encode(), p))
    return out


@pytest.mark.parametrize("config", [CFG, CFG_WIDE], ids=["small caps", "wide"])
def test_windows_made_on_a_copy_equal_the_processors_own(config: StreamConfig) -> None:
    for seed in range(30):
        rng = random.Random(seed)
        seq = _drifting(rng, 400)
        batch = rng.choice([1, 5, 64, 10_000])
        here, there = _run(config, seq, False, batch), _run(config, seq, True, batch)
        assert there == here, seed
        assert here[0], seed  # windows were published


def test_experiments_and_snapshots_stay_with_the_processor() -> None:
    spec = ExperimentSpec(name="e")
    by_variant = dataclasses.replace(CFG, slice_spec=SliceSpec(by=("variant",)), experiments=(spec,))
    proc = StreamProcessor(by_variant, clock=ManualClock())
    with pytest.raises(ValueError, match="experiments"):
        proc.offload_windows(Copy(proc))
    plain = StreamProcessor(CFG, clock=ManualClock())
    plain.offload_windows(Copy(plain))
    with pytest.raises(ValueError, match="elsewhere"):
        plain.snapshot()


def _published(config: StreamConfig, seq: list[tuple[bool, bytes, int]], counted_only: list[str]) -> Any:
    proc = StreamProcessor(config, clock=ManualClock())
    if counted_only:
        proc.count_only_windows(counted_only)
    out: list[Any] = []
    for a in range(0, len(seq), 64):
        part = seq[a:a + 64]
        out += proc.process_batch([k for k, _, _ in part], [r for _, r, _ in part])
    out += proc.flush()
    return [w.document() for w in out], proc.stats()


def test_windows_counted_only_are_counted_and_the_others_unchanged() -> None:
    for seed in range(20):
        seq = _drifting(random.Random(seed), 400)
        (every, stats), (some, counted_stats) = _published(CFG_WIDE, seq, []), _published(CFG_WIDE, seq, ["10s"])
        assert some == [w for w in every if w["window"] == "1m"], seed
        assert counted_stats == stats, seed  # windows_published counts the 10s windows too
        assert stats.windows_published["10s"] > stats.windows_published["1m"] > 0, seed


def test_counting_only_is_decided_before_any_event_and_without_experiments() -> None:
    proc = StreamProcessor(CFG_WIDE, clock=ManualClock())
    with pytest.raises(ValueError, match="no such window size: 5m"):
        proc.count_only_windows(["5m"])
    proc.count_only_windows(["10s"])
    with pytest.raises(ValueError, match="no state"):
        proc.snapshot()
    seq = _drifting(random.Random(1), 200)
    late = StreamProcessor(CFG_WIDE, clock=ManualClock())
    late.process_batch([k for k, _, _ in seq], [r for _, r, _ in seq])
    with pytest.raises(ValueError, match="before any event"):
        late.count_only_windows(["10s"])
    spec = ExperimentSpec(name="e")
    by_variant = dataclasses.replace(CFG, slice_spec=SliceSpec(by=("variant",)), experiments=(spec,))
    with pytest.raises(ValueError, match="experiments"):
        StreamProcessor(by_variant, clock=ManualClock()).count_only_windows(["10s"])


def _flush_at_once(proc: StreamProcessor) -> list[Any]:
    """The flush as it was: every bucket finalized first, then every staged group aggregated in key order."""
    while proc._pending.next_bucket() is not None:
        proc._finalize_bucket(evicted=False)
    proc._clk["orphan"] += proc._early.expire(2**62)
    for staged in proc._staging.complete(None):
        proc._aggregate(staged)
    return proc._close(None)


class _Calls:
    """The staged batches handed to the kernel, in order (a WindowsElsewhere that records)."""

    def __init__(self) -> None:
        self.batches: list[Any] = []
        self.published: dict[str, int] = {}

    def aggregate(self, batch: Any, combo_keys: list[Any]) -> None:
        self.batches.append((batch.to_state(), list(combo_keys)))

    def close(self, horizon_ms: int | None, partitions: tuple[int, ...]) -> None:
        self.batches.append(("close", horizon_ms))


# An attribution window of six 10s groups: the flush finalizes several groups' requests.
CFG_LONG = dataclasses.replace(CFG_WIDE, attribution_window_ms=60_000)


@pytest.mark.parametrize("config", [CFG, CFG_WIDE, CFG_LONG], ids=["small caps", "wide", "long attribution"])
def test_the_flush_aggregates_each_group_once_complete_with_the_calls_of_the_end(config: StreamConfig) -> None:
    """``flush`` hands a staged group to the kernel as soon as its requests are finalized (a worker then
    aggregates it while the rest is finalized): the same kernel calls in the same order, windows and stats as
    the flush that aggregated every group at the end."""
    progressive = 0
    for seed in range(30):
        rng = random.Random(seed)
        seq = _drifting(rng, rng.choice([60, 400]))
        runs = []
        for flush in (StreamProcessor.flush, _flush_at_once):
            proc = StreamProcessor(config, clock=ManualClock())
            calls = _Calls()
            proc.offload_windows(calls)
            for a in range(0, len(seq), 64):
                part = seq[a:a + 64]
                proc.process_batch([k for k, _, _ in part], [r for _, r, _ in part])
            finalize = proc._finalize_bucket

            def finalize_marked(*, evicted: bool, proc: Any = proc, calls: _Calls = calls, finalize: Any = finalize) -> None:
                calls.batches.append(("finalized",))
                finalize(evicted=evicted)

            proc._finalize_bucket = finalize_marked  # type: ignore[method-assign]
            flush(proc)
            runs.append(([c for c in calls.batches if c[0] != "finalized"], proc.stats(), calls.batches))
        (now, stats, marked), (then, then_stats, _) = runs
        assert now == then and stats == then_stats, seed
        # the same calls, but a group came before the last bucket was finalized
        last = max((i for i, c in enumerate(marked) if c[0] == "finalized"), default=-1)
        progressive += any(c[0] not in ("close", "finalized") for c in marked[:last])
        assert _run(config, seq, False, 64) == _run(config, seq, True, 64), seed
    if config is CFG_LONG:
        assert progressive > 10
