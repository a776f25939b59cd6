"""Bounded memories: forgetting by watermark time and by capacity, against a naive model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.stream.memory import EarlyFeedback, ExpiringIds


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 5)), max_size=40), st.integers(1, 6))
def test_expiring_ids_against_naive(ops, capacity):
    ids = ExpiringIds(capacity=capacity, retention_ms=2)
    naive: list[tuple[int, str]] = []  # (tag, key) in arrival order
    wm = 0
    for key, step in ops:
        wm = max(wm, step)
        ids.expire(wm)
        naive = [(t, k) for t, k in naive if t + 2 >= wm]
        if key not in ids:
            assert key not in {k for _, k in naive}
            ids.add(key, wm)
            naive.append((wm, key))
            while len({k for _, k in naive}) > capacity:  # whole oldest tag group goes
                oldest = naive[0][0]
                naive = [(t, k) for t, k in naive if t != oldest]
        assert ids.ids == {k for _, k in naive}
    restored = ExpiringIds.from_state(ids.to_state(), capacity=capacity, retention_ms=2)
    assert restored.ids == ids.ids


def test_early_feedback_waits_then_orphans():
    early = EarlyFeedback(attribution_window_ms=100, step_ms=10, capacity=10)
    early.add("r1", ("i", 1, 5, False))
    early.add("r1", ("j", 2, 50, False))
    early.add("r2", ("k", 3, 20, False))
    assert len(early) == 3
    assert early.expire(105) == 0  # 5 + 100 is not yet behind a stepped watermark of 105 (bucket ends at 110)
    assert early.expire(110) == 1 and early.by_request["r1"] == [("j", 2, 50, False)]
    assert early.pop("r2") == [("k", 3, 20, False)] and len(early) == 1
    assert early.expire(130) == 0  # r2's bucket: already taken by its impression
    assert early.evict_oldest() == 1 and len(early) == 0 and early.by_request == {}
    state = EarlyFeedback(attribution_window_ms=100, step_ms=10, capacity=10)
    state.add("x", ("i", 1, 7, False))
    back = EarlyFeedback.from_state(state.to_state(), attribution_window_ms=100, step_ms=10, capacity=10)
    assert back.by_request == state.by_request and len(back) == 1


def test_early_feedback_never_exceeds_capacity_when_the_oldest_bucket_is_stale() -> None:
    # Found by tests/pipeline/stream/test_stream_batch.py: a bucket whose entries were all popped (their request
    # came) stays on the heap; evicting it freed nothing, the memory grew past capacity, and a processor
    # restored from a snapshot (no stale buckets) behaved differently from the original.
    from rankwatch.pipeline.stream.memory import EarlyFeedback

    early = EarlyFeedback(attribution_window_ms=1_000, step_ms=1_000, capacity=2)
    early.add("r1", ("i", 1, 0, False))  # bucket 1
    early.pop("r1")  # r1's impression came: bucket 1 is now stale
    early.add("r2", ("i", 1, 5_000, False))  # bucket 6
    early.add("r3", ("i", 1, 5_000, False))
    assert early.count == 2
    assert early.evict_oldest() == 2  # bucket 6, not the stale bucket 1
    assert early.count == 0 and not early.by_request
