"""The stall watch (consumers/watchdog.py) names a pair that fed nothing, holds nothing and lags, without a broker.

A fake service (its lock, pairs, paused set, outage flag, a consumer with fetch positions and the broker's
end offsets as the test sets them) around the real :class:`Watchdog`: one WARNING line per stall naming
the pair and its lag per topic; nothing for a pair that is caught up, that advanced, that holds records
(the older line names those), or while Kafka is unreachable.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from rankwatch.consumers.watchdog import Watchdog


class _Service:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._outage = SimpleNamespace(active=False)
        self._paused: set[Any] = set()
        self.positions: dict[Any, int] = {}
        self.ends: dict[Any, int] | None = {}
        self.asked: list[list[Any]] = []
        self._consumer = SimpleNamespace(_subscription=SimpleNamespace(assignment=self._assignment()))
        self._pairs = {p: self._pair(p) for p in (0, 1)}

    def _assignment(self) -> Any:
        service = self

        class Positions(dict):  # type: ignore[type-arg]
            def get(self, tp: Any, default: Any = None) -> Any:
                at = service.positions.get(tp)
                return None if at is None else SimpleNamespace(position=OffsetAndMetadata(at, "", -1))

        return Positions()

    @staticmethod
    def _pair(p: int) -> Any:
        imp, clk = TopicPartition("imp", p), TopicPartition("clk", p)
        return SimpleNamespace(partition=p, next_offset={imp: 10, clk: 20}, buffers={imp: deque(), clk: deque()},
                               impressions_tp=imp, clicks_tp=clk)

    def _end_offsets(self, tps: list[Any]) -> dict[Any, int] | None:
        self.asked.append(sorted(tps))
        return None if self.ends is None else {tp: self.ends.get(tp, 0) for tp in tps}


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_an_idle_pair_the_broker_has_records_for_is_named_once_with_its_lag(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rankwatch.consumers.service")
    svc = _Service()
    watch = Watchdog(svc)
    imp1, clk1 = TopicPartition("imp", 1), TopicPartition("clk", 1)
    svc.ends = {TopicPartition("imp", 0): 10, TopicPartition("clk", 0): 20, imp1: 25, clk1: 20}
    svc._paused = {imp1}
    watch.watch_stalls()  # the first watch only marks where the pairs are
    assert _lines(caplog) == [] and svc.asked == []
    watch.watch_stalls()  # 30 s later: neither fed; pair 0 is caught up, pair 1 lags 15 impressions
    assert _lines(caplog) == ["pair 1 fed nothing for 30 s and holds nothing while the broker has records "
                              "for it: lag {'imp': 15}, paused ['imp'], parked []"]
    watch.watch_stalls()  # still so: not said again
    assert len(_lines(caplog)) == 1
    svc._pairs[1].next_offset[imp1] = 12  # it fed: the stall is over ...
    watch.watch_stalls()
    watch.watch_stalls()  # ... and a new one (30 s without feeding again) is named again
    assert len(_lines(caplog)) == 2 and "lag {'imp': 13}" in _lines(caplog)[1]


def test_a_pair_that_never_fed_lags_from_its_fetch_position(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rankwatch.consumers.service")
    svc = _Service()
    del svc._pairs[1]
    pair = svc._pairs[0]
    pair.next_offset = {tp: None for tp in pair.buffers}  # nothing fed: the place is the fetch position
    svc.positions = {pair.impressions_tp: 0, pair.clicks_tp: 7}
    svc.ends = {pair.impressions_tp: 0, pair.clicks_tp: 9}
    watch = Watchdog(svc)
    watch.watch_stalls()
    watch.watch_stalls()
    assert _lines(caplog) == ["pair 0 fed nothing for 30 s and holds nothing while the broker has records "
                              "for it: lag {'clk': 2}, paused [], parked []"]


def test_no_line_for_a_pair_holding_records_advancing_or_in_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rankwatch.consumers.service")
    svc = _Service()
    svc.ends = {tp: 100 for pair in svc._pairs.values() for tp in pair.buffers}  # both lag
    watch = Watchdog(svc)
    svc._pairs[0].buffers[svc._pairs[0].clicks_tp].append(SimpleNamespace(offset=20))
    watch.watch_stalls()
    svc._pairs[1].next_offset[svc._pairs[1].impressions_tp] = 11  # pair 1 advances
    svc._outage.active = True
    watch.watch_stalls()
    svc._outage.active = False
    assert all("holds nothing" not in line for line in _lines(caplog))  # pair 0 has its own (older) line
    assert svc.asked == []  # nothing asked of the broker: no idle pair, or Kafka unreachable
    svc.ends = None  # the end offsets cannot be read: nothing is said
    watch.watch_stalls()
    watch.watch_stalls()
    assert all("holds nothing" not in line for line in _lines(caplog)) and svc.asked
