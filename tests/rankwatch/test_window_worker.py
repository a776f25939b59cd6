"""The replay's window worker: the replay in one process is the oracle; failures are one line; nothing is left behind.

The worker (rankwatch/commands/window_worker.py) runs the kernel, the windows and the result document of a replay
in a forked process. The oracle of its output is the same replay with ``RANKWATCH_WINDOW_WORKER=inline``, on the
messy generated logs of tests/rankwatch/test_cli_replay.py (duplicates, bad lines, item-form and RFC 3339
impressions, orphans, late events), read in small chunks so that many batches and window closes travel.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import rankwatch.commands.log_reader as log_reader
from rankwatch.cli import main
from rankwatch.commands.window_worker import WindowWorker, start_window_worker
from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor
from tests.rankwatch.test_cli_replay import _replay_outputs, logs  # noqa: F401 - logs is a fixture

DEADLINE_S = 60.0  # for a process to end; the tests wait for what they assert, up to it


@pytest.mark.parametrize("reader", ["child", "inline"])
def test_the_worker_gives_the_replay_in_one_process(logs: Any, tmp_path: Path, capsys: Any,  # noqa: F811
                                                    monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    """Result document, summary, ``--windows-out`` lines and dead letters, byte for byte."""
    d, _, _ = logs
    monkeypatch.setenv("RANKWATCH_LOG_READER", reader)
    monkeypatch.setenv("RANKWATCH_WINDOW_WORKER", "process")  # whatever the CPUs
    monkeypatch.setattr(log_reader, "open_merge", functools.partial(log_reader.open_merge, chunk_bytes=1 << 13))
    started = _count_workers(monkeypatch)
    (tmp_path / "worker").mkdir()
    (tmp_path / "inline").mkdir()
    worker = _replay_outputs(d, tmp_path / "worker", capsys)
    assert started == [1]  # the replay above ran its windows in a worker
    monkeypatch.setenv("RANKWATCH_WINDOW_WORKER", "inline")
    inline = _replay_outputs(d, tmp_path / "inline", capsys)
    assert started == [1]
    assert worker == inline
    assert json.loads(worker[0])["overall"]["requests"] > 100 and worker[2].count("\n") > 10  # windows written


@pytest.mark.parametrize("fails", [False, True])
def test_the_rest_after_the_input_has_the_kernels_made_ahead_by_threads(
        logs: Any, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, fails: bool) -> None:  # noqa: F811
    """The worker's background thread is held until the core has sent everything, so the main thread applies every
    operation, its kernels made by the tail's threads: the same outputs as the replay in one process; a kernel
    failing in one of those threads is one line."""
    import threading

    import rankwatch.commands.window_worker as window_worker

    d, _, _ = logs
    monkeypatch.setenv("RANKWATCH_WINDOW_WORKER", "process")
    monkeypatch.setattr(log_reader, "open_merge", functools.partial(log_reader.open_merge, chunk_bytes=1 << 13))
    ended = threading.Event()  # in the worker (a fork of this process): the core's end is in its inbox
    put = window_worker._Inbox.put

    def put_and_tell(self: Any, data: bytes | None) -> None:
        put(self, data)
        if data == window_worker._END:
            ended.set()

    monkeypatch.setattr(window_worker._Inbox, "put", put_and_tell)
    monkeypatch.setattr(window_worker, "_lower_priority", lambda: ended.wait(DEADLINE_S))
    threads = tmp_path / "threads"
    make = StreamProcessor.offloaded_parts

    def recorded(self: StreamProcessor, op: tuple[Any, ...]) -> Any:
        with threads.open("a") as f:
            f.write(threading.current_thread().name + "\n")
        if fails:
            raise ValueError("no such slice")
        return make(self, op)

    monkeypatch.setattr(StreamProcessor, "offloaded_parts", recorded)
    if fails:
        rc = main(["replay", "--impressions", str(d / "impressions.jsonl"), "--clicks", str(d / "clicks-2.jsonl")])
        err = capsys.readouterr().err
        assert rc != 0 and "the window worker failed: ValueError: no such slice" in err
        assert len(err.strip().splitlines()) == 1
        return
    (tmp_path / "worker").mkdir()
    (tmp_path / "inline").mkdir()
    worker = _replay_outputs(d, tmp_path / "worker", capsys)
    made_by = threads.read_text().split()
    assert len(made_by) > 10 and all(name.startswith("rankwatch-window-kernel") for name in made_by)
    monkeypatch.setenv("RANKWATCH_WINDOW_WORKER", "inline")
    assert worker == _replay_outputs(d, tmp_path / "inline", capsys)


def _count_workers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    started = [0]
    original = WindowWorker.__init__

    def counting(self: WindowWorker, *args: Any) -> None:
        started[0] += 1
        original(self, *args)

    monkeypatch.setattr(WindowWorker, "__init__", counting)
    return started


def _failing_apply(how: str) -> Any:
    def apply(self: StreamProcessor, op: tuple[Any, ...], made: Any = None) -> Any:
        if op[0] == "aggregate":
            if how == "raises":
                raise ValueError("no such slice")
            os._exit(3)
        return []

    return apply


@pytest.mark.parametrize(("how", "message"), [
    ("raises", "the window worker failed: ValueError: no such slice"),
    ("exits", "the window worker process ended unexpectedly (exit status 3)"),
])
def test_a_failing_worker_is_one_line(logs: Any, tmp_path: Path, capsys: Any,  # noqa: F811
                                      monkeypatch: pytest.MonkeyPatch, how: str, message: str) -> None:
    d, _, _ = logs
    monkeypatch.setenv("RANKWATCH_WINDOW_WORKER", "process")
    monkeypatch.setattr(StreamProcessor, "apply_offloaded", _failing_apply(how))  # the fork inherits it
    rc = main(["replay", "--impressions", str(d / "impressions.jsonl"), "--clicks", str(d / "clicks-2.jsonl")])
    err = capsys.readouterr().err
    assert rc != 0 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _started_worker() -> tuple[StreamProcessor, WindowWorker]:
    proc = StreamProcessor(StreamConfig(windows=("1m",)), clock=ManualClock())
    worker = WindowWorker(proc, lambda windows: None, dict)
    proc.offload_windows(worker)
    assert worker is not None
    return proc, worker


def _wait_until_ended(worker: WindowWorker) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while worker._child.is_alive() and time.monotonic() < deadline:
        worker._child.join(0.1)
    assert not worker._child.is_alive()


def test_the_worker_leaves_when_the_core_has_gone() -> None:
    """The core's process closing its end (as when it is killed) ends the worker by itself, with no signal."""
    _, worker = _started_worker()
    worker._ops.close()
    _wait_until_ended(worker)
    assert worker._child.exitcode == 0


def test_stopping_ends_the_worker_and_an_empty_replay_is_published_nowhere() -> None:
    proc, worker = _started_worker()
    assert proc.flush() == []
    assert worker.finish() == {} and worker.published == {"1m": 0}
    _wait_until_ended(worker)
    _, other = _started_worker()
    other.stop()
    _wait_until_ended(other)


def test_when_the_worker_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import rankwatch.commands.window_worker as window_worker
    from rankwatch.pipeline.experiments.spec import ExperimentSpec
    from rankwatch.pipeline.slicing import SliceSpec

    with_experiment = StreamConfig(slice_spec=SliceSpec(by=("variant",)), experiments=(ExperimentSpec(name="e"),))
    monkeypatch.setenv("RANKWATCH_WINDOW_WORKER", "process")
    assert start_window_worker(StreamProcessor(with_experiment, clock=ManualClock()), print, dict) is None
    monkeypatch.setenv("RANKWATCH_WINDOW_WORKER", "inline")
    assert start_window_worker(StreamProcessor(StreamConfig(), clock=ManualClock()), print, dict) is None
    monkeypatch.delenv("RANKWATCH_WINDOW_WORKER")  # by default: from two CPUs
    monkeypatch.setattr(window_worker, "usable_cpus", lambda: 1)
    assert start_window_worker(StreamProcessor(StreamConfig(), clock=ManualClock()), print, dict) is None
    monkeypatch.setattr(window_worker, "usable_cpus", lambda: 2)
    worker = start_window_worker(StreamProcessor(StreamConfig(), clock=ManualClock()), print, dict)
    assert worker is not None
    worker.stop()


def test_a_failed_worker_stops_the_core_at_its_next_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only at the end: once the pipe to a failed worker is full (1 MiB), the core's next send raises."""
    import numpy as np

    from rankwatch.errors import RankwatchError
    from rankwatch.pipeline.stream.join import FinalizedBatch

    monkeypatch.setattr(StreamProcessor, "apply_offloaded", _failing_apply("raises"))
    _, worker = _started_worker()
    n = 1 << 16
    batch = FinalizedBatch([], np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(n), np.zeros(n),
                           np.array([0, n], np.int64))
    with pytest.raises(RankwatchError, match="the window worker failed: ValueError: no such slice"):
        for _ in range(1000):  # 1 MiB each: the worker fails on the first, the pipe fills within a few
            worker.aggregate(batch, [])
    _wait_until_ended(worker)
