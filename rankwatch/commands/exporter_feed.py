"""What ``rankwatch run``'s consuming thread hands to the exporter, applied on a thread of its own.

Layout: :class:`WindowBatcher` (one exporter rebuild per batch of windows, kept to a share of the wall
time) and :class:`ExporterFeed` (the windows and the latest health, applied to the
:class:`exporters.state.MetricsState` by one background thread).

Why a thread: a rebuild of the online gauges (merging partitions, AUC standard errors over up to a million
distinct scores, roll-ups) costs 0.1-1.5 s on a backlog. On the consuming thread it stalled polling, and
with the streaming core in its own process (consumers/core_process.py) the core then idled too. Here the
consuming thread only appends to a list; the rebuild's numpy work runs beside it (numpy releases the GIL
in its loops). Every write to the exporter state happens on this one thread, in order: windows first,
then the health they are reported with.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class WindowBatcher:
    """Windows for the exporter, handed over in one ``publish_windows`` call per :meth:`flush`.

    The exporter rebuilds its online gauges (merging partitions, AUCs, rollups) once per call; a Kafka
    backlog replayed fast publishes many windows a second, and one rebuild each cost more than the whole
    streaming core (docs/benchmarks.md). :class:`ExporterFeed` asks for a flush on every health refresh
    (every 0.25 s) and forces one at shutdown.

    A rebuild is kept to ``budget`` (5 %) of the wall time: after a rebuild that took ``c`` seconds the
    next one waits ``c / budget`` (at most ``max_interval_s``, 60 s). A rebuild of a few milliseconds
    (windows closing one at a time) is not delayed at all; on a backlog, where one costs 0.1-1.5 s and
    windows close every second, the quality gauges on /metrics lag by 2-30 s (the health and event
    counters are not delayed: they are applied every second). The rebuild runs on the exporter feed's
    thread, but it still takes the consuming process's GIL for its Python parts, hence the budget.

    The cost of the first rebuild is not known before it runs, so it waits ``first_delay_s`` (5 s) after
    the first window arrived: a service started on a backlog catches up for those seconds instead of
    spending them on gauges of windows that are superseded at once. Live, the first window closes minutes
    after the start, and 5 s more is nothing.

    While the service catches up (``flush(catching_up=True)``: :class:`ExporterFeed` says so while the
    watermark is more than ``CATCH_UP_BEHIND_S`` behind the wall clock) a rebuild also waits
    ``max_interval_s`` after the previous one (or the first window): the windows of a backlog are hours
    old and superseded within seconds, and each rebuild took the consuming process's GIL from kafka-python
    (at 1m windows the first rebuild on a 300k-message backlog cost as much CPU as 10 µs per message).
    """

    def __init__(self, publish_many: Callable[[list[Any]], object], *, max_pending: int = 1_000,
                 budget: float = 0.05, max_interval_s: float = 60.0, first_delay_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.publish_many = publish_many
        self.max_pending = max_pending
        self.budget, self.max_interval_s, self.first_delay_s, self.clock = budget, max_interval_s, first_delay_s, clock
        self.pending: list[Any] = []
        self._next: float | None = None  # earliest time of the next rebuild (None: no window yet)
        self._last: float | None = None  # end of the last rebuild, or the first window's arrival

    def add(self, window: Any) -> None:
        if self._next is None:
            self._last = self.clock()
            self._next = self._last + self.first_delay_s
        self.pending.append(window)
        if len(self.pending) >= self.max_pending:
            self.flush(force=True)

    def flush(self, *, force: bool = False, catching_up: bool = False) -> bool:
        """Hand the pending windows over, unless the rebuild budget (or a catch-up) says wait (``force``:
        now). True when a batch was handed over."""
        if not self.pending:
            return False
        if not force and self._next is not None:
            now = self.clock()
            if now < self._next or (catching_up and self._last is not None and now < self._last + self.max_interval_s):
                return False
        batch, self.pending = self.pending, []
        start = self.clock()
        self.publish_many(batch)
        end = self._last = self.clock()
        self._next = end + min((end - start) / self.budget, self.max_interval_s)
        return True


# The watermark this far behind the wall clock means a backlog is being caught up (WindowBatcher).
CATCH_UP_BEHIND_S = 600.0


class ExporterFeed:
    """Windows (:meth:`add`) and health (:meth:`health`) for ``state``, applied by a background thread.

    Parameters
    ----------
    state
        The :class:`exporters.state.MetricsState` of the exporter.
    experiments
        The experiment collector (its parts are the pairs' experiment sums), or None.
    batcher
        How windows are batched (default: a :class:`WindowBatcher` of ``state.publish_windows``).
    wall_clock
        Seconds since the epoch (compared with the health's watermark: catching up or not).
    """

    def __init__(self, state: Any, *, experiments: Any = None, batcher: WindowBatcher | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.wall_clock = wall_clock
        self.catching_up = False
        self.experiments = experiments
        self.batcher = batcher or WindowBatcher(state.publish_windows)
        self._cond = threading.Condition()
        self._windows: list[Any] = []
        self._health: Any = None
        self._closed = False
        self.errors = 0
        self._thread = threading.Thread(target=self._loop, name="rankwatch-exporter-feed", daemon=True)
        self._thread.start()

    def add(self, window: Any) -> None:
        """A published window (consuming thread): queued, applied with the next health."""
        with self._cond:
            self._windows.append(window)

    def health(self, health: Any) -> None:
        """The service's health (every 0.25 s): wakes the thread; only the latest one is applied."""
        with self._cond:
            self._health = health
            self._cond.notify()

    def close(self, timeout_s: float = 30.0) -> None:
        """Apply everything queued (a forced rebuild) and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self._health is None:
                    self._cond.wait()
                windows, self._windows = self._windows, []
                health, self._health = self._health, None
                closed = self._closed
            if health is not None:
                self.catching_up = self._behind(health)
            for step, args in ((self._publish, (windows, closed)), (self._apply, (health,))):
                try:
                    step(*args)
                except Exception:  # an exporter bug must not end the service's metrics silently: logged,
                    self.errors += 1  # counted, and the other step still runs
                    log.exception("exporter update failed")
            if closed:
                return

    def _behind(self, health: Any) -> bool:
        """The slowest pair's watermark is more than ``CATCH_UP_BEHIND_S`` behind the wall clock."""
        mark = getattr(health.merged, "watermark_ms", None)
        return mark is not None and self.wall_clock() - mark / 1000 > CATCH_UP_BEHIND_S

    def _publish(self, windows: list[Any], force: bool) -> None:
        for window in windows:
            self.batcher.add(window)
        self.batcher.flush(force=force, catching_up=self.catching_up)

    def _apply(self, health: Any) -> None:
        if health is None:
            return
        state = self.state
        if health.merged is not None:
            state.set_stream_stats(health.merged)
        state.set_consumer_lag(health.lag)
        if self.experiments is not None:  # the pairs' experiment sums
            self.experiments.set_parts({p: s.experiments for p, s in health.stats.items()})
        state.set_kafka_outage(health.kafka_outage, health.kafka_outage_seconds)
        if getattr(health, "schema_registry_up", None) is not None:  # a Confluent-framed topic (decoding.py)
            state.set_schema_registry(health.schema_registry_up, health.schema_registry_outage_seconds)
