"""The streaming core in its own process gives exactly what it gives in-process (no broker needed).

The same messy traffic (both impression forms, duplicates, disorder, late and orphan feedback, bad lines)
goes through a :class:`RemoteProcessor` and a plain :class:`StreamProcessor`: windows, dead letters (with
their sources), stats and snapshots must be identical, also across a snapshot taken in one and restored in
the other. Then the failure paths: an error raised in the worker, a worker killed, a dropped stand-in.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from golden_traffic import messy_traffic  # noqa: E402

from rankwatch.consumers.answer import ask_snapshot  # noqa: E402
from rankwatch.consumers.core_process import CoreProcess, CoreProcessError, InProcessCores  # noqa: E402
from rankwatch.pipeline.clock import ManualClock  # noqa: E402
from rankwatch.pipeline.events.deadletter import ListDeadLetterSink  # noqa: E402
from rankwatch.pipeline.slicing import SliceSpec  # noqa: E402
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor  # noqa: E402
from rankwatch.pipeline.stream.snapshot import SnapshotError  # noqa: E402

CONFIG = StreamConfig(windows=("30s", "2m"), attribution_window_ms=20_000, allowed_disorder_ms=3_000,
                      max_pending_requests=25, max_pending_feedback=15, dedupe_capacity=100, finalized_memory=60,
                      max_event_bytes=4_000, max_items_per_request=12, finalize_step_ms=2_000,
                      slice_spec=SliceSpec(by=("segment", "surface"), max_values_per_label=3))
PARTS = (0, 1)


def _batches(seed: int) -> list[tuple[list[bool], list[bytes], int, range]]:
    """Random cuts of the messy traffic, each within one partition, with offsets = positions."""
    events, rng, out, i = messy_traffic(seed), random.Random(seed), [], 0
    while i < len(events):
        j = min(len(events), i + rng.randint(1, 300))
        part = events[i][2]
        k = next((m for m in range(i, j) if events[m][2] != part), j)
        chunk = events[i:k]
        out.append(([s == "impressions" for s, _, _ in chunk], [raw for _, raw, _ in chunk], part, range(i, k)))
        i = k
    return out


def _letters(sink: ListDeadLetterSink) -> list[Any]:
    return [(d.stream, d.raw, str(d.reason), d.detail, d.source) for d in sink.letters]


class _Sinks:
    def __init__(self) -> None:
        self.windows: list[Any] = []
        self.dead = ListDeadLetterSink()

    def publish(self, windows: list[Any]) -> None:
        self.windows.extend(windows)


@pytest.fixture
def core() -> Any:
    sinks = _Sinks()
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    cp = CoreProcess(CONFIG, clock=clock, publish=sinks.publish, max_in_flight=2)
    cp.dead_letters = sinks.dead
    cp.sinks, cp.test_clock = sinks, clock  # type: ignore[attr-defined]
    yield cp
    cp.close()


def _feed(proc: Any, batches: list[Any], out: list[Any]) -> None:
    for kinds, values, part, offsets in batches:
        out += proc.process_batch(kinds, values, partition=part, offsets=list(offsets), topics=("imp", "clk"))


@pytest.mark.parametrize("seed", [1, 2])
def test_remote_processor_equals_in_process_windows_letters_stats_and_snapshots(core: Any, seed: int) -> None:
    batches = _batches(seed)
    half = len(batches) // 2
    local_sink, local_windows = ListDeadLetterSink(), []
    local = StreamProcessor(CONFIG, clock=core.test_clock, dead_letters=local_sink, partitions=PARTS)
    remote = core.new(PARTS)
    assert remote.process_batch([], []) == []  # windows come back through publish, never as a return value
    for proc, out in ((local, local_windows), (remote, [])):
        _feed(proc, batches[:half], out)
    assert remote.snapshot() == local.snapshot()  # answered after every batch sent before it
    assert [w.document() for w in core.sinks.windows] == [w.document() for w in local_windows]
    assert _letters(core.sinks.dead) == _letters(local_sink)
    # Continue from the remote snapshot in a fresh remote processor, and in-process from its own state.
    restored = core.restore(remote.snapshot())
    core.test_clock.advance(timedelta(minutes=5))
    _feed(restored, batches[half:], [])
    _feed(local, batches[half:], local_windows)
    core.test_clock.advance(timedelta(minutes=5))
    restored.tick()  # the consuming side's clock is the one the worker ticks with
    local_windows += local.tick()
    restored.flush()
    local_windows += local.flush()
    assert [w.document() for w in core.sinks.windows] == [w.document() for w in local_windows]
    assert len(local_windows) > 5 and len(local_sink.letters) > 5
    assert _letters(core.sinks.dead) == _letters(local_sink)
    assert dataclasses.asdict(restored.stats()) == dataclasses.asdict(local.stats())
    assert restored.snapshot() == local.snapshot()
    assert core.batches_sent == len(batches) + 1  # and the empty one above


def test_in_process_cores_build_plain_processors() -> None:
    cores = InProcessCores(CONFIG, clock=ManualClock())
    proc = cores.new(PARTS)
    assert isinstance(proc, StreamProcessor) and proc.partitions == PARTS
    assert cores.restore(proc.snapshot()).snapshot() == proc.snapshot()


def test_an_error_in_the_worker_is_raised_where_the_call_was_made_and_the_worker_goes_on(core: Any) -> None:
    with pytest.raises(SnapshotError, match="not a snapshot"):
        core.restore(b"not a snapshot")
    assert core.new(PARTS).stats().pending_requests == 0  # still serving


def test_a_dead_worker_ends_the_service_with_one_line(core: Any) -> None:
    proc = core.new(PARTS)
    os.kill(core._process.pid, signal.SIGKILL)
    core._process.join(10)
    with pytest.raises(CoreProcessError, match=r"the core process ended \(exit code -9\)"):
        proc.stats()
    with pytest.raises(CoreProcessError):  # and stays failed: no request reaches a lost state
        proc.snapshot()


def test_the_worker_ignores_sigterm_and_ends_with_its_connection(core: Any) -> None:
    proc = core.new(PARTS)
    os.kill(core._process.pid, signal.SIGTERM)  # e.g. a process-group kill: the consuming side shuts down first
    # The signal is delivered and handled: a SIGTERM that ended the worker would surface in the calls below
    # as "the core process ended". Each call is a round trip that the worker answers after the signal.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # many round trips over 2 s, each must be answered
        assert proc.stats().pending_requests == 0
        assert core._process.is_alive(), "the worker ended on SIGTERM"
    process = core._process
    core.close()
    assert not process.is_alive() and process.exitcode == 0


def test_a_dropped_stand_in_frees_its_state_in_the_worker(core: Any) -> None:
    kept, dropped = core.new(PARTS), core.new(PARTS)
    handle = dropped.handle
    del dropped
    gc.collect()
    kept.stats()  # the next request carries the drop
    with pytest.raises(KeyError):
        core.call("stats", handle)


def _until_done(core: Any, answer: Any) -> None:
    """Drain (as each turn of the service's loop does) until ``answer`` is read, up to a deadline."""
    deadline = time.monotonic() + 30.0
    while not answer.done:
        assert time.monotonic() < deadline, "waited 30 s for the snapshot's answer"
        core.drain()
        time.sleep(0.005)


def test_a_snapshot_asked_without_waiting_holds_what_was_sent_before_it_and_comes_after_its_windows(core: Any) -> None:
    batches = _batches(3)
    half = len(batches) // 2
    local_sink, local_windows = ListDeadLetterSink(), []
    local = StreamProcessor(CONFIG, clock=core.test_clock, dead_letters=local_sink, partitions=PARTS)
    remote = core.new(PARTS)
    _feed(local, batches[:half], local_windows)
    expected = local.snapshot()
    answers: list[Any] = []
    seen_done: list[bool] = []  # was the snapshot's answer already filled when a window or letter was handed on?
    publish, send = core.publish, core.dead_letters.send
    core.publish = lambda ws: (seen_done.extend([bool(answers) and answers[0].done] * len(ws)), publish(ws))
    core.dead_letters.send = lambda letter: (seen_done.append(bool(answers) and answers[0].done), send(letter))
    _feed(remote, batches[:half], [])
    answers.append(remote.snapshot_async())  # returns at once, behind the batches in flight
    _feed(remote, batches[half:], [])  # fed while the snapshot is pending: not in it
    _until_done(core, answers[0])
    assert answers[0].result() == expected
    windows_before = [w.document() for w in local_windows]
    assert [w.document() for w in core.sinks.windows][:len(windows_before)] == windows_before
    assert _letters(core.sinks.dead)[:len(local_sink.letters)] == _letters(local_sink)
    n_before = len(local_windows) + len(local_sink.letters)
    assert n_before > 5 and seen_done[:n_before] == [False] * n_before  # handed on before the answer
    _feed(local, batches[half:], local_windows)
    assert remote.snapshot() == local.snapshot()  # and the later batches went on as usual


def test_a_cancelled_answer_is_discarded_and_an_asked_error_is_kept_for_its_asker(core: Any) -> None:
    proc = core.new(PARTS)
    _feed(proc, _batches(4)[:5], [])
    cancelled = proc.snapshot_async()
    cancelled.cancel()
    failing = core.call_async("snapshot", 999)  # no such handle: the worker answers with a KeyError
    core.call("stats", proc.handle)  # a waiting call reads the earlier answers first
    assert cancelled.done and cancelled.cancelled
    with pytest.raises(AssertionError):
        cancelled.result()  # nothing kept
    assert failing.done
    with pytest.raises(KeyError):
        failing.result()  # raised where the result is asked for, not in the call that read it
    assert proc.snapshot_async() is not None and core.new(PARTS).stats().pending_requests == 0  # still serving


def test_asking_an_in_process_snapshot_is_answered_at_once() -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    proc = InProcessCores(CONFIG, clock=clock).new(PARTS)
    _feed(proc, _batches(5)[:5], [])
    answer = ask_snapshot(proc)
    assert answer.done and answer.result() == proc.snapshot()
