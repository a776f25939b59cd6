"""The finalize step's label matching in C (pipeline/stream/_labels.c) against the Python loop it replaces, its
oracle: the same score parts, label pairs (in order) and counters on random requests, with items shown at
several positions, feedback on items not shown, non-ASCII ids and feedback on both edges of the window."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from rankwatch.pipeline.stream import native
from rankwatch.pipeline.stream.join import SEP, finalize_labels_py

labels = pytest.importorskip("rankwatch.pipeline.stream._labels", reason="built without a C compiler")

ATT = 1_000
IDS = ["a", "b", "c", "dd", "é", "日本", "a b", "x" * 40]


def _requests(rng: random.Random, m: int) -> tuple[list[bytes], list[int], list[Any], list[int]]:
    records, lengths, feedback, ts = [], [], [], []
    for _ in range(m):
        n = rng.randint(1, 8)
        ids = [rng.choice(IDS) for _ in range(n)]  # repeats: an item shown at several positions
        scores = [rng.uniform(-1, 1) for _ in range(n)]
        records.append(struct.pack(f"<{n}d", *scores) + SEP.join(ids).encode())
        lengths.append(n)
        rts = rng.randint(0, 10_000)
        ts.append(rts)
        if rng.random() < 0.4:
            feedback.append(None)
            continue
        entries = []
        for _ in range(rng.randint(1, 5)):
            fts = rng.choice([rts, rts + ATT, rts - 1, rts + ATT + 1, rts + rng.randint(-ATT, 2 * ATT)])
            entries.append((rng.choice([*IDS, "zz"]), rng.randint(0, 20), fts, rng.random() < 0.5))
        feedback.append(tuple(entries))
    return records, lengths, feedback, ts


@pytest.mark.parametrize("seed", range(20))
def test_the_c_finalize_equals_the_python_loop(seed: int) -> None:
    rng = random.Random(seed)
    records, lengths, feedback, ts = _requests(rng, rng.choice([1, 5, 50, 400]))
    got = labels.finalize(tuple(records), lengths, tuple(feedback), ts, ATT)
    want = finalize_labels_py(records, lengths, feedback, ts, ATT)
    assert got == want
    if len(records) >= 50:
        assert got[1] and got[3] and got[4] and got[5], "labels and every counter met"


def test_every_position_showing_the_item_is_labelled() -> None:
    rec = struct.pack("<4d", 1, 2, 3, 4) + SEP.join(["a", "b", "a", "ab"]).encode()
    fb = (("a", 3, 5, True), ("ab", 1, 5, False), ("b", 2, 99, True), ("zz", 2, 5, False), ("b", 4, 2, False))
    parts, at, grade, accepted, late, detached = labels.finalize((rec,), [4], (fb,), [5], 10)
    assert parts == [struct.pack("<4d", 1, 2, 3, 4)]
    assert (at, grade) == ([0, 2, 3], [3, 3, 1])
    assert (accepted, late, detached) == (2, 1, 1)  # "ab" and "zz" now, "b" at 2 before the request, "b" at 99


def test_flat_indexes_run_across_requests() -> None:
    recs = (struct.pack("<2d", 0, 0) + b"a\x00b", struct.pack("<3d", 0, 0, 0) + b"c\x00b\x00b")
    out = labels.finalize(recs, [2, 3], (None, (("b", 1, 0, True),)), [0, 0], 10)
    assert out[1:3] == ([3, 4], [1, 1])


def test_an_item_id_no_record_can_hold_labels_nothing() -> None:
    """A lone surrogate cannot be in a record (ids are stored as UTF-8): it matches nothing, as in Python."""
    rec = struct.pack("<1d", 0) + b"a"
    fb = (("\ud800", 1, 0, True), ("a", 2, 0, True))
    assert labels.finalize((rec,), [1], (fb,), [0], 10) == finalize_labels_py([rec], [1], [fb], [0], 10)


def test_bad_columns_are_refused() -> None:
    rec = struct.pack("<2d", 0, 0) + b"a\x00b"
    with pytest.raises(ValueError, match="fewer scores"):
        labels.finalize((rec,), [3], (None,), [0], 10)
    with pytest.raises(ValueError, match="differ in length"):
        labels.finalize((rec,), [2, 1], (None,), [0], 10)
    with pytest.raises(TypeError):
        labels.finalize((rec,), [2], ([("a", 1, 0, True)],), [0], 10)


def test_finalize_lists_takes_the_c_loop_where_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The join finalizes through ``native.labels`` when it is there, and through the Python loop without it,
    to the same lists."""
    from rankwatch.pipeline.stream.join import PendingRequests

    def finalized() -> Any:
        pending = PendingRequests(attribution_window_ms=ATT, step_ms=100, max_items_per_request=8)
        rng = random.Random(3)
        records, lengths, feedback, ts = _requests(rng, 30)
        for i, (rec, n, fb, t) in enumerate(zip(records, lengths, feedback, ts, strict=True)):
            slot = len(pending.rid)
            pending.rid.append(f"r{i}"), pending.ts.append(t), pending.combo.append(0), pending.user.append(0)
            pending.record.append(rec), pending.count.append(n), pending.positions.append(None)
            pending.feedback.append(fb)
            pending.index[f"r{i}"] = slot
            pending.n_items += n
        return pending.finalize_lists(list(range(30)))

    calls: list[Any] = []
    real = labels  # the built module itself, also where RANKWATCH_NATIVE=off leaves native.labels None

    class Recorded:
        @staticmethod
        def finalize(*args: Any) -> Any:
            calls.append(args)
            return real.finalize(*args)

    monkeypatch.setattr(native, "labels", Recorded)
    with_c = finalized()
    monkeypatch.setattr(native, "labels", None)
    assert finalized() == with_c
    assert len(calls) == 1
