"""Liveness of the pair alignment with flow control: while records are left, a pair always makes progress.

A fake broker holds the two topics' logs (producers may still be appending); each poll returns records of
a random subset of the *unpaused* topic-partitions, a random number of each, and refreshes only those
partitions' high watermarks (stale "caught up", as kafka-python's). The loop is the service's: add, feed,
confirm with fresh end offsets when the pair asks, then :meth:`PartitionPair.flow` with a random buffer
cap down to 1. The property: after every step the pair either fed something or has an unpaused partition
with records left to fetch or a high watermark still to learn (so it can never stop for good), and in the end every record was fed exactly
once, in offset order.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.consumers.alignment import PartitionPair

TP = namedtuple("TP", "topic partition")
Rec = namedtuple("Rec", "topic partition offset timestamp value")
IMP, CLK = TP("imp", 0), TP("clk", 0)


class Recorder:
    def __init__(self) -> None:
        self.fed: dict[str, list[int]] = {"imp": [], "clk": []}

    def process_impression(self, raw: bytes, *, source: Any) -> list[Any]:
        self.fed["imp"].append(source.offset)
        return []

    def process_feedback(self, raw: bytes, *, source: Any) -> list[Any]:
        self.fed["clk"].append(source.offset)
        return []

    def process_batch(self, kinds: list[bool], values: list[bytes], *, partition: int, offsets: list[int],
                      topics: tuple[str, str]) -> list[Any]:
        # the consumer feeds each poll's merged records in one call (consumers/batch_feed.py)
        for is_impression, offset in zip(kinds, offsets, strict=True):
            self.fed["imp" if is_impression else "clk"].append(offset)
        return []


def _append(log: list[int], n: int, draw: Any) -> None:
    ts = log[-1] if log else 0
    for _ in range(n):
        ts += draw(st.integers(0, 3000))
        log.append(ts)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), cap=st.integers(1, 40), skew=st.sampled_from([0, 500, 5000]))
def test_pair_always_progresses_and_feeds_every_record_once(data: Any, cap: int, skew: int) -> None:
    draw = data.draw
    logs: dict[Any, list[int]] = {IMP: [], CLK: []}
    _append(logs[IMP], draw(st.integers(0, 120)), draw)
    _append(logs[CLK], draw(st.integers(0, 240)), draw)
    appends_left = draw(st.integers(0, 6))
    position = {IMP: 0, CLK: 0}
    highwater: dict[Any, int | None] = {IMP: None, CLK: None}
    paused: set[Any] = set()
    rec = Recorder()
    pair = PartitionPair(0, IMP, CLK, rec, {IMP: None, CLK: None}, max_skew_ms=skew)  # type: ignore[arg-type]

    def caught_up(tp: Any) -> bool:
        hw = highwater[tp]
        return hw is not None and position[tp] >= hw

    def confirmed(tp: Any) -> bool:  # a fresh end-offsets answer
        return position[tp] >= len(logs[tp])

    for _step in range(5000):
        if appends_left and draw(st.booleans()):
            appends_left -= 1
            _append(logs[draw(st.sampled_from([IMP, CLK]))], draw(st.integers(1, 60)), draw)
        # one poll: a random subset of the fetchable partitions, a random number of records of each
        for tp in (IMP, CLK):
            if tp in paused or not draw(st.booleans()):
                continue
            n = min(draw(st.integers(1, 80)), len(logs[tp]) - position[tp])
            records = [Rec(tp.topic, 0, o, logs[tp][o], b"") for o in range(position[tp], position[tp] + n)]
            position[tp] += n
            highwater[tp] = len(logs[tp])
            pair.add(tp, records)
        pair.unconfirmed.clear()
        _, fed = pair.feed(caught_up)
        if pair.unconfirmed:
            pair.unconfirmed.clear()
            _, more = pair.feed(caught_up, confirmed)
            fed += more
        pause, resume = pair.flow(cap, paused)
        paused.update(pause)
        paused.difference_update(resume)
        left = sum(len(logs[tp]) for tp in logs) - len(rec.fed["imp"]) - len(rec.fed["clk"])
        if left == 0 and not appends_left:
            break
        # An unpaused partition with records left, or whose high watermark the pair has not seen yet (the
        # next fetch of it, even an empty one, brings that): the next poll changes the pair's state.
        fetchable = [tp for tp in (IMP, CLK) if tp not in paused and (position[tp] < len(logs[tp]) or not caught_up(tp))]
        assert fed or fetchable or appends_left or not any(pair.buffers.values()), (
            f"stalled: buffers {[len(b) for b in pair.buffers.values()]}, paused {paused}, cap {cap}")
        assert all(len(pair.buffers[tp]) <= max(cap, 80) + cap for tp in logs)
    assert rec.fed["imp"] == list(range(len(logs[IMP])))
    assert rec.fed["clk"] == list(range(len(logs[CLK])))


def test_cap_one_resumes_once_the_buffer_is_empty() -> None:
    pair = PartitionPair(0, IMP, CLK, Recorder(), {IMP: None, CLK: None})  # type: ignore[arg-type]
    pair.add(IMP, [Rec("imp", 0, 0, 5, b"")])
    assert pair.flow(1, set()) == ([IMP], [])
    pair.buffers[IMP].clear()
    assert pair.flow(1, {IMP}) == ([], [IMP])


def test_an_impression_waits_for_the_first_fetch_of_an_empty_clicks_partition() -> None:
    """The case hypothesis found: one impression, clicks empty and never fetched yet, cap 1. The impression
    is paused and waits until a fetch of the clicks partition shows its high watermark; then it is fed."""
    rec = Recorder()
    pair = PartitionPair(0, IMP, CLK, rec, {IMP: None, CLK: None})  # type: ignore[arg-type]
    pair.add(IMP, [Rec("imp", 0, 0, 0, b"")])
    highwater: dict[Any, int | None] = {IMP: 1, CLK: None}
    assert pair.feed(lambda tp: highwater[tp] is not None)[1] == 0  # clicks not known to be caught up
    assert pair.flow(1, set()) == ([IMP], [])
    highwater[CLK] = 0  # an empty fetch response of the (unpaused) clicks partition
    pair.unconfirmed.clear()
    assert pair.feed(lambda tp: highwater[tp] is not None, lambda tp: True)[1] == 1
    assert rec.fed == {"imp": [0], "clk": []}
