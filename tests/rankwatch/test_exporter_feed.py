"""``ExporterFeed``: the consuming thread only queues; one background thread applies windows, then health."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from rankwatch.commands.exporter_feed import ExporterFeed, WindowBatcher


class FakeState:
    """Records the calls the feed makes, and on which thread."""

    def __init__(self, fail_first: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.threads: set[str] = set()
        self.fail_first = fail_first
        self.applied = threading.Event()

    def publish_windows(self, windows: list[Any]) -> None:
        self.threads.add(threading.current_thread().name)
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("boom")
        self.calls.append(("windows", list(windows)))

    def set_stream_stats(self, stats: Any) -> None:
        self.calls.append(("stats", stats))

    def set_consumer_lag(self, lag: Any) -> None:
        self.calls.append(("lag", lag))

    def set_kafka_outage(self, active: bool, seconds: float) -> None:
        self.calls.append(("outage", (active, seconds)))
        self.applied.set()


def _health(n: int) -> Any:
    return SimpleNamespace(merged=f"stats-{n}", lag={("imp", 0): n}, stats={}, kafka_outage=False,
                           kafka_outage_seconds=0.0)


def test_windows_and_then_the_health_are_applied_on_the_feed_thread() -> None:
    state = FakeState()
    feed = ExporterFeed(state, batcher=WindowBatcher(state.publish_windows, budget=1e-9, first_delay_s=0.0))  # 2nd rebuild waits
    feed.add("w1")
    feed.add("w2")
    feed.health(_health(1))
    assert state.applied.wait(5)
    assert state.calls == [("windows", ["w1", "w2"]), ("stats", "stats-1"), ("lag", {("imp", 0): 1}),
                           ("outage", (False, 0.0))]
    assert state.threads == {"rankwatch-exporter-feed"}
    state.applied.clear()
    feed.add("w3")  # within the rebuild budget's wait: kept for later
    feed.health(_health(2))
    assert state.applied.wait(5)
    assert ("windows", ["w3"]) not in state.calls and state.calls[-3] == ("stats", "stats-2")
    feed.close()  # forces the rebuild: nothing queued is lost
    assert state.calls[-1] == ("windows", ["w3"])
    assert not feed._thread.is_alive()


def test_an_exporter_error_is_logged_and_counted_and_the_feed_goes_on(caplog: Any) -> None:
    state = FakeState(fail_first=True)
    feed = ExporterFeed(state, batcher=WindowBatcher(state.publish_windows, first_delay_s=0.0))
    feed.add("w1")
    feed.health(_health(1))
    assert state.applied.wait(5)  # the health is still applied after the failed rebuild
    feed.add("w2")
    feed.close()
    assert feed.errors == 1 and "exporter update failed" in caplog.text
    assert state.calls[-1] == ("windows", ["w2"])
