"""The packed join store against a naive dict-of-lists model."""

from __future__ import annotations

import random
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.events.records import Impression
from rankwatch.pipeline.events.validation import RejectReason
from rankwatch.pipeline.stream.join import FinalizedBatch, PendingRequests

ATTR = 1_000


def store(max_items: int = 200) -> PendingRequests:
    return PendingRequests(attribution_window_ms=ATTR, step_ms=100, max_items_per_request=max_items)


def imp(rid: str, ts: int, items: list[tuple[str, int, float]], eid: str = "e") -> Impression:
    ids, pos, sc = zip(*items, strict=True) if items else ((), (), ())
    return Impression(eid, rid, ts, tuple(ids), tuple(pos), tuple(sc))


def test_columns_are_packed_not_dicts_per_item():
    s = store()
    s.add(imp("r", 0, [(f"i{k}", k + 1, k / 10) for k in range(20)]), combo=0)
    slot = s.index["r"]
    record = s.record[slot]
    assert isinstance(record, bytes) and s.count[slot] == 20
    assert record[:160] == np.arange(20, dtype="<f8").__truediv__(10).tobytes()  # scores, in position order
    assert record[160:].split(b"\x00") == [f"i{k}".encode() for k in range(20)]
    assert s.positions[slot] is None  # positions 1..n in order cost nothing
    assert sys.getsizeof(record) < 20 * 20  # < 20 bytes per item for ids and scores together
    assert s.n_items == 20 and len(s) == 1


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_finalize_matches_naive_join(data):
    rng = random.Random(data.draw(st.integers(0, 10**6)))
    s = store()
    naive: dict[str, dict] = {}
    for r in range(data.draw(st.integers(1, 8))):
        n = rng.randint(1, 6)
        positions = rng.sample(range(1, 12), n)
        items = [(f"i{rng.randint(0, 9)}", p, round(rng.uniform(-2, 2), 3)) for p in positions]
        ts = rng.randint(0, 500)
        rid = f"r{r}"
        split = rng.random() < 0.5 and n > 1
        first = items[: n // 2] if split else items
        s.add(imp(rid, ts, first), combo=r % 3)
        if split:
            assert s.extend(s.index[rid], imp(rid, ts - 7, items[n // 2:])) is None
        rts = ts - 7 if split else ts
        fbs = [(rng.choice(items)[0], rng.randint(1, 3), rts + rng.randint(-50, ATTR + 50)) for _ in range(rng.randint(0, 4))]
        for item, grade, fts in fbs:
            s.add_feedback(s.index[rid], (item, grade, fts, fts >= ts))
        naive[rid] = {"ts": rts, "items": sorted(items, key=lambda it: it[1]), "fb": fbs, "combo": r % 3}
    slots = sorted(s.index.values(), key=lambda x: (s.ts[x], s.rid[x]))
    batch = s.finalize(slots)
    assert len(s) == 0 and s.n_items == 0
    order = sorted(naive, key=lambda rid: (naive[rid]["ts"], rid))
    assert batch.request_ids == order
    labels, scores, lengths = [], [], []
    for rid in order:
        req = naive[rid]
        for item, _, score in req["items"]:
            grades = [g for it, g, fts in req["fb"] if it == item and req["ts"] <= fts <= req["ts"] + ATTR]
            labels.append(max(grades, default=0))
            scores.append(score)
        lengths.append(len(req["items"]))
    np.testing.assert_array_equal(batch.labels, labels)
    np.testing.assert_array_equal(batch.scores, scores)
    np.testing.assert_array_equal(np.diff(batch.offsets), lengths)
    np.testing.assert_array_equal(batch.ts_ms, [naive[r]["ts"] for r in order])
    np.testing.assert_array_equal(batch.combo, [naive[r]["combo"] for r in order])


def test_extend_rejects_duplicate_positions_and_too_many_items():
    s = store(max_items=3)
    s.add(imp("r", 10, [("a", 1, 0.1), ("b", 2, 0.2)]), combo=0)
    slot = s.index["r"]
    assert s.extend(slot, imp("r", 11, [("c", 2, 0.3)])).reason == RejectReason.duplicate_position  # type: ignore[union-attr]
    assert s.extend(slot, imp("r", 11, [("c", 3, 0.3), ("d", 4, 0.4)])).reason == RejectReason.too_many_items  # type: ignore[union-attr]
    assert s.extend(slot, imp("r", 11, [("c", 3, 0.3)])) is None
    assert s.n_items == 3


def test_buckets_come_out_in_deadline_order_and_slots_are_reused():
    s = store()
    for k, ts in enumerate([450, 50, 250, 55]):
        s.add(imp(f"r{k}", ts, [("a", 1, 0.0)]), combo=0)
    s.extend(s.index["r0"], imp("r0", 30, [("b", 2, 0.0)]))  # r0 moves to an earlier bucket
    got = []
    while s.next_bucket() is not None:
        got.append([s.rid[x] for x in s.take_bucket()])
    assert [g for g in got if g] == [["r0", "r1", "r3"], ["r2"]]
    s.finalize([s.index[r] for r in ("r0", "r1", "r2", "r3")])
    s.add(imp("new", 0, [("a", 1, 0.0)]), combo=0)
    assert len(s.rid) == 4  # a freed slot was reused


def test_batch_select_concat_and_state():
    b = FinalizedBatch([], np.array([1, 2, 3]), np.array([0, 1, 0]), np.array([1.0, 0, 2, 0, 0, 3]),
                       np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]), np.array([0, 2, 3, 6]))
    sel = b.select(np.array([True, False, True]))
    np.testing.assert_array_equal(sel.scores, [0.1, 0.2, 0.4, 0.5, 0.6])
    np.testing.assert_array_equal(sel.offsets, [0, 2, 5])
    both = FinalizedBatch.concat([sel, b.select(np.array([False, True, False]))])
    np.testing.assert_array_equal(both.offsets, [0, 2, 5, 6])
    back = FinalizedBatch.from_state(b.to_state())
    for name in ("ts_ms", "combo", "labels", "scores", "offsets"):
        np.testing.assert_array_equal(getattr(back, name), getattr(b, name))
