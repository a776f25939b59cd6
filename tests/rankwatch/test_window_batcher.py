"""``WindowBatcher``: one exporter rebuild per batch, kept to its share of the wall time (fake clock)."""

from __future__ import annotations

from rankwatch.commands.exporter_feed import WindowBatcher


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cheap_rebuild_is_never_delayed_and_an_expensive_one_waits_cost_over_budget() -> None:
    clock = Clock()
    batches: list[list[int]] = []
    cost = [0.001]

    def publish(batch: list[int]) -> None:
        batches.append(batch)
        clock.now += cost[0]  # the rebuild takes this long

    b = WindowBatcher(publish, budget=0.05, max_interval_s=10.0, first_delay_s=0.0, clock=clock)
    assert not b.flush()  # nothing pending
    b.add(1)
    assert b.flush() and batches == [[1]]
    clock.now += 0.5  # cheap rebuilds (1 ms): the next may come 20 ms later, so after 0.5 s it goes
    b.add(2)
    assert b.flush() and batches[-1] == [2]
    cost[0] = 0.2  # a backlog: rebuilds of 0.2 s
    clock.now += 1.0
    b.add(3)
    assert b.flush()  # the cost is only known after this one
    clock.now += 1.0
    b.add(4)
    b.add(5)
    assert not b.flush() and batches[-1] == [3]  # 1 s < 0.2 s / 5 % = 4 s: wait
    clock.now += 3.01
    assert b.flush() and batches[-1] == [4, 5]  # 4 s after the last rebuild ended
    b.add(6)
    assert b.flush(force=True) and batches[-1] == [6]  # shutdown does not wait


def test_the_wait_is_capped_and_a_full_batch_goes_at_once() -> None:
    clock = Clock()
    batches: list[list[int]] = []

    def publish(batch: list[int]) -> None:
        batches.append(batch)
        clock.now += 5.0  # absurdly slow: the wait is capped at max_interval_s

    b = WindowBatcher(publish, max_pending=3, budget=0.05, max_interval_s=10.0, first_delay_s=0.0, clock=clock)
    b.add(1)
    b.flush()
    clock.now += 10.0
    b.add(2)
    assert b.flush()  # 10 s, not 100 s
    for i in (3, 4, 5):
        b.add(i)  # the third pending window forces a flush (bounded memory)
    assert batches[-1] == [3, 4, 5] and not b.pending


def test_the_first_rebuild_waits_first_delay_after_the_first_window() -> None:
    clock = Clock()
    batches: list[list[int]] = []
    b = WindowBatcher(batches.append, first_delay_s=5.0, clock=clock)
    clock.now += 100.0  # no window for a long time: the delay starts with the first one
    b.add(1)
    assert not b.flush()
    clock.now += 4.9
    b.add(2)
    assert not b.flush() and not batches
    clock.now += 0.1
    assert b.flush() and batches == [[1, 2]]


def test_while_catching_up_a_rebuild_waits_max_interval_after_the_previous_one() -> None:
    clock = Clock()
    batches: list[list[int]] = []
    b = WindowBatcher(batches.append, first_delay_s=5.0, max_interval_s=60.0, clock=clock)
    b.add(1)
    clock.now += 5.0
    assert not b.flush(catching_up=True)  # the budget allows it, the catch-up does not
    clock.now += 55.0
    assert b.flush(catching_up=True) and batches == [[1]]
    b.add(2)
    clock.now += 1.0
    assert not b.flush(catching_up=True)
    assert b.flush() and batches[-1] == [2]  # caught up: the (free) budget alone decides
    b.add(3)
    assert b.flush(catching_up=True, force=True) and batches[-1] == [3]  # shutdown forces it


def test_the_feed_is_catching_up_while_the_watermark_is_far_behind_the_wall_clock() -> None:
    from types import SimpleNamespace

    from rankwatch.commands.exporter_feed import CATCH_UP_BEHIND_S, ExporterFeed

    feed = ExporterFeed(SimpleNamespace(publish_windows=lambda ws: None), wall_clock=lambda: 10_000.0)
    try:
        def behind(mark_s: float | None) -> bool:
            mark = None if mark_s is None else int(mark_s * 1000)
            return feed._behind(SimpleNamespace(merged=SimpleNamespace(watermark_ms=mark)))

        assert behind(10_000.0 - CATCH_UP_BEHIND_S - 1) and not behind(10_000.0 - 5) and not behind(None)
        assert not feed._behind(SimpleNamespace(merged=None))
    finally:
        feed.close()
