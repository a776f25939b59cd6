"""The watermark: max event time minus disorder, per partition minimum, idle partitions released by the clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.stream.watermark import Watermark


def test_single_partition_is_max_minus_disorder_and_monotonic():
    wm = Watermark(partitions=(), allowed_disorder_ms=100, idle_timeout_ms=1_000)
    assert wm.value is None
    assert wm.observe(None, 1_000) == 900
    assert wm.observe(None, 500) == 900  # an older event never moves it back
    assert wm.observe(7, 2_000) == 1_900  # partitions are ignored when none were given


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 10**6)), min_size=1, max_size=40))
def test_partitioned_watermark_matches_naive(events):
    wm = Watermark(partitions=(0, 1, 2), allowed_disorder_ms=10, idle_timeout_ms=10**9)
    seen: dict[int, int] = {}
    best = None
    for p, ts in events:
        got = wm.observe(p, ts)
        seen[p] = max(seen.get(p, ts), ts)
        if len(seen) == 3:
            candidate = min(seen.values()) - 10
            best = candidate if best is None else max(best, candidate)
        assert got == best


def test_unknown_partition_does_not_move_it():
    wm = Watermark(partitions=(0,), allowed_disorder_ms=0, idle_timeout_ms=1_000)
    assert wm.observe(5, 10_000) is None
    assert wm.observe(0, 100) == 100


def test_idle_partition_stops_holding_and_clock_takes_over():
    wm = Watermark(partitions=(0, 1), allowed_disorder_ms=50, idle_timeout_ms=1_000)
    wm.observe(0, 10_000)
    assert wm.tick(now_ms=0) is None  # partition 1 silent, but not idle yet
    wm.observe(0, 12_000)
    assert wm.tick(now_ms=999) is None
    assert wm.tick(now_ms=1_000) == 11_950  # partition 1 idle: partition 0 alone decides
    assert wm.tick(now_ms=2_500) == 11_950  # partition 0 idle too, clock (2 450) is behind: no step back
    assert wm.tick(now_ms=20_000) == 19_950  # every partition idle: the watermark follows the clock
    wm.observe(1, 5_000)  # an event wakes partition 1; the watermark stays where it was
    assert wm.value == 19_950 and 1 not in wm.idle


def test_state_round_trip():
    wm = Watermark(partitions=(3, 4), allowed_disorder_ms=5, idle_timeout_ms=10)
    wm.observe(3, 100)
    wm.observe(4, 50)
    wm.tick(0)
    other = Watermark(partitions=(3, 4), allowed_disorder_ms=5, idle_timeout_ms=10)
    other.load_state(wm.to_state())
    assert other.to_state() == wm.to_state() and other.value == 45
