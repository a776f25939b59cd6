"""PartitionPair.feed: timestamp merge of the two topics, waiting for a topic that may still have records."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from rankwatch.consumers.alignment import OvertakeGrace, PartitionPair

TP = namedtuple("TP", "topic partition")
Rec = namedtuple("Rec", "topic partition offset timestamp value")
IMP, CLK = TP("imp", 0), TP("clk", 0)


class Recorder:
    """Stands in for StreamProcessor: remembers the order it was fed."""

    def __init__(self) -> None:
        self.fed: list[tuple[str, int]] = []

    def process_impression(self, raw: bytes, *, source: Any) -> list[Any]:
        self.fed.append(("imp", source.offset))
        return []

    def process_feedback(self, raw: bytes, *, source: Any) -> list[Any]:
        self.fed.append(("clk", source.offset))
        return []

    def process_batch(self, kinds: list[bool], values: list[bytes], *, partition: int, offsets: list[int],
                      topics: tuple[str, str]) -> list[Any]:
        self.fed += [("imp" if k else "clk", off) for k, off in zip(kinds, offsets, strict=True)]
        return []


def _pair(skew: int = 0) -> tuple[PartitionPair, Recorder]:
    rec = Recorder()
    return PartitionPair(0, IMP, CLK, rec, {IMP: None, CLK: None}, max_skew_ms=skew), rec  # type: ignore[arg-type]


def _records(tp: TP, stamps: list[int], first: int = 0) -> list[Rec]:
    return [Rec(tp.topic, 0, first + i, ts, b"{}") for i, ts in enumerate(stamps)]


def test_both_buffers_merge_by_timestamp_impression_first_on_ties() -> None:
    pair, rec = _pair()
    pair.add(IMP, _records(IMP, [10, 20, 30]))
    pair.add(CLK, _records(CLK, [15, 20, 40]))
    _, fed = pair.feed(lambda tp: False)
    # Stops when the impressions run out: clicks at 40 may not pass impressions not fetched yet.
    assert rec.fed == [("imp", 0), ("clk", 0), ("imp", 1), ("clk", 1), ("imp", 2)]
    assert fed == 5 and pair.next_offset == {IMP: 3, CLK: 2}


def test_a_topic_caught_up_lets_the_other_go_within_the_skew_budget_only() -> None:
    pair, rec = _pair(skew=100)
    pair.add(IMP, _records(IMP, [10]))
    pair.add(CLK, _records(CLK, [5, 50, 500]))
    pair.feed(lambda tp: True)
    # imp 10 last fed at 10: clicks up to 110 may pass a caught-up impressions topic, 500 needs confirmation.
    assert rec.fed == [("clk", 0), ("imp", 0), ("clk", 1)]
    assert pair.unconfirmed == {IMP}
    pair.unconfirmed.clear()
    pair.feed(lambda tp: True, lambda tp: tp == IMP)
    assert rec.fed[-1] == ("clk", 2) and not pair.unconfirmed


def test_records_already_fed_are_not_buffered_again() -> None:
    pair, rec = _pair()
    pair.next_offset[IMP] = 2
    pair.add(IMP, _records(IMP, [1, 2, 3, 4]))
    assert [r.offset for r in pair.buffers[IMP]] == [2, 3]


def test_overtake_grace_counts_from_the_first_turn_held_back_and_restarts_on_arrival() -> None:
    now = [100.0]
    grace = OvertakeGrace(0.25, lambda: now[0])
    assert grace.due([IMP]) == []  # first seen holding back: the wait starts
    now[0] += 0.2
    assert grace.due([IMP, CLK]) == []  # 0.2 s of 0.25; CLK starts its own wait
    now[0] += 0.05
    assert grace.due([IMP, CLK]) == [IMP]
    grace.arrived(IMP)  # a record came: whatever follows waits a whole grace again
    assert grace.due([IMP]) == []
    now[0] += 0.3
    assert grace.due([IMP]) == [IMP]
    assert grace.due([]) == [] and grace.due([IMP]) == []  # released in between: afresh
    assert OvertakeGrace(0.0, lambda: now[0]).due([CLK]) == [CLK]  # no grace: asked at once
