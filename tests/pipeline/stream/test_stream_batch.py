"""``StreamProcessor.process_batch`` equals the per-record calls, for any sequence cut into any batches."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.events.deadletter import ListDeadLetterSink
from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.prepare import BatchSpec, PreparedRows, prepare_rows
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor

T0 = 1_796_032_800_000
CFG = StreamConfig(windows=("10s", "1m"), attribution_window_ms=5_000, allowed_disorder_ms=1_000, idle_timeout_ms=5_000,
                   max_pending_requests=4, max_pending_feedback=3, dedupe_capacity=6, finalized_memory=3,
                   max_items_per_request=4, slice_spec=SliceSpec(by=("segment", "surface"), max_values_per_label=2))

# Integer ids read as their decimal text (SPEC section 1): 1 and "1" are one request; True is bad_type.
_rid = st.sampled_from(["r1", "r2", "r3", "r4", "", 1, "1", True])
_grid = st.integers(0, 15).map(lambda k: T0 + 1_000 * k)  # whole seconds: boundaries (ts == deadline) get hit
_ts = st.one_of(_grid, _grid, st.integers(T0, T0 + 15_000), st.integers(-5, 2**63),
                st.sampled_from(["2026-12-01T10:00:01Z", "2026-12-01T10:00:00", "x"]))
_item = st.fixed_dictionaries({"item_id": st.sampled_from(["a", "b", "c", "a\u0000", 7, "7", False]), "position": st.integers(0, 5),
                               "score": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers())})
_label = st.sampled_from(["s", "t", "u", "", None, "é"])
_impression = st.fixed_dictionaries(
    {"event_id": st.sampled_from(["e1", "e2", "e3", "e4", "e5", "e6", "e7", "", 5, "5"]), "request_id": _rid, "ts": _ts},
    optional={"items": st.lists(_item, max_size=5), "item_id": st.just("a"), "position": st.integers(0, 3),
              "score": st.floats(allow_nan=False, allow_infinity=False), "segment": _label, "surface": _label},
)
_feedback = st.fixed_dictionaries(
    {"event_id": st.sampled_from(["f1", "f2", "f3", "f4", "e1", 5]), "request_id": _rid,
     "item_id": st.sampled_from(["a", "b", "z", 7, "7"]), "ts": _ts},
    optional={"action": st.sampled_from(["click", "purchase", "stare"]), "grade": st.integers(-2, 30)},
)
_eid = st.text(alphabet="abcdefghij", min_size=1, max_size=2)  # mostly distinct, some duplicates
# An impression in canonical list form with positions 1..n (the batch path's inline case), shuffled or not.
_clean = st.builds(
    lambda eid, rid, ts, n, rev, seg: {"event_id": eid, "request_id": rid, "ts": ts, "segment": seg,
                                      "items": [{"item_id": k if k % 2 else f"i{k}", "position": k + 1, "score": k / 2}
                                                for k in (range(n)[::-1] if rev else range(n))]},
    st.text(alphabet="abcdefghij", min_size=1, max_size=2), _rid, st.one_of(_grid, st.integers(T0, T0 + 15_000)),
    st.integers(1, 5),
    st.booleans(), _label)
_clean_feedback = st.builds(
    lambda eid, rid, item, ts, grade: {"event_id": eid, "request_id": rid, "item_id": item, "ts": ts,
                                       **({"action": "click"} if grade is None else {"grade": grade})},
    _eid, _rid, st.sampled_from(["i0", "i1", "i3", "z", 1, 3]), _grid, st.one_of(st.none(), st.integers(0, 4)))
_event = st.one_of(st.tuples(st.just(True), _impression), st.tuples(st.just(True), _clean),
                   st.tuples(st.just(True), _clean), st.tuples(st.just(False), _feedback),
                   st.tuples(st.just(False), _clean_feedback), st.tuples(st.just(False), _clean_feedback))


def _raw(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def _outcome(proc: StreamProcessor, windows: list[Any], sink: ListDeadLetterSink) -> Any:
    """What a run gives: its windows, stats and dead letters, and its state (the watermark's included)."""
    return ([w.document() for w in windows], proc.stats(),
            [(d.stream, d.reason, d.detail, d.source) for d in sink.letters], proc.snapshot())


def _bounds(n: int, cuts: list[int]) -> list[int]:
    return sorted({0, n, *(c % (n + 1) for c in cuts)})


def _per_record(seq: list[tuple[bool, bytes, int]], parts: tuple[int, ...], cuts: list[int]) -> Any:
    """Per-record calls; the stats and the state are also taken at every cut (where the batched run is between
    calls)."""
    sink = ListDeadLetterSink()
    proc = StreamProcessor(CFG, clock=ManualClock(), dead_letters=sink, partitions=parts)
    out: list[Any] = []
    at = set(_bounds(len(seq), cuts))
    midway = []
    for i, (kind, raw, p) in enumerate(seq):
        if i in at:
            midway.append((proc.stats(), proc.snapshot()))
        src = SourceRef("imp" if kind else "clk", p, i)
        out += (proc.process_impression if kind else proc.process_feedback)(raw, source=src)
    out += proc.flush()
    return _outcome(proc, out, sink), midway


def _batched(seq: list[tuple[bool, bytes, int]], parts: tuple[int, ...], cuts: list[int], restore_at: int,
             prepared: int | None = None) -> Any:
    """With ``prepared``, each call is handed the rows of its first ``prepared`` records (modulo its length),
    made apart and pickled, as the replay's log reader makes them in its process."""
    sink = ListDeadLetterSink()
    proc = StreamProcessor(CFG, clock=ManualClock(), dead_letters=sink, partitions=parts)
    out: list[Any] = []
    bounds = _bounds(len(seq), cuts)
    midway = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        midway.append((proc.stats(), proc.snapshot()))
        if a == restore_at % (len(seq) + 1):
            proc = StreamProcessor.restore(proc.snapshot(), config=CFG, clock=ManualClock(), dead_letters=sink)
        i = a
        while i < b:  # one call per run of one partition, as the consumer hands a pair's records
            j = next((m for m in range(i, b) if seq[m][2] != seq[i][2]), b)
            kinds, values = [k for k, _, _ in seq[i:j]], [r for _, r, _ in seq[i:j]]
            rows = None
            if prepared is not None:
                m = prepared % (j - i + 1)
                rows = pickle.loads(pickle.dumps(prepare_rows(BatchSpec.of(CFG), kinds[:m], values[:m], {})))
            out += proc.process_batch(kinds, values, partition=seq[i][2], offsets=range(i, j), topics=("imp", "clk"),
                                      rows=rows)
            i = j
    out += proc.flush()
    return _outcome(proc, out, sink), midway


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_event, st.integers(0, 1)), max_size=40), st.lists(st.integers(0, 60), max_size=6),
       st.integers(0, 60), st.sampled_from([(), (0, 1), (0,)]), st.one_of(st.none(), st.integers(0, 60)))
def test_batches_equal_per_record(events: list[Any], cuts: list[int], restore_at: int, parts: tuple[int, ...],
                                  prepared: int | None) -> None:
    seq = [(kind, _raw(doc), p) for (kind, doc), p in events]
    assert _batched(seq, parts, cuts, restore_at, prepared) == _per_record(seq, parts, cuts)


def test_without_offsets_no_source_is_attached() -> None:
    raw = b"not json"
    sink = ListDeadLetterSink()
    proc = StreamProcessor(CFG, clock=ManualClock(), dead_letters=sink)
    proc.process_batch([True, False], [raw, raw])
    assert [d.source for d in sink.letters] == [None, None]
    assert proc.stats().outcomes["impressions"]["rejected"] == proc.stats().outcomes["clicks"]["rejected"] == 1


def _dense(rng: Any, n: int) -> list[tuple[bool, bytes, int]]:
    """Mostly clean events on a coarse time grid, so boundaries (ts == deadline, == request ts) are common."""
    seq: list[tuple[bool, bytes, int]] = []
    for _ in range(n):
        rid, ts, p = f"r{rng.randrange(4)}", T0 + 1_000 * rng.randrange(16), rng.randrange(2)
        eid = f"e{rng.randrange(3 * n)}"
        if rng.random() < 0.4:
            k = rng.randrange(1, 5)
            order = list(range(k))
            if rng.random() < 0.3:
                rng.shuffle(order)
            doc: dict[str, Any] = {"event_id": eid, "request_id": rid, "ts": ts, "segment": rng.choice("stu"),
                                   "items": [{"item_id": f"i{j}", "position": j + 1, "score": j / 4} for j in order]}
            if rng.random() < 0.1:
                doc = {"event_id": eid, "request_id": rid, "ts": ts, "item_id": "i9", "position": 9, "score": 0.1}
            seq.append((True, _raw(doc), p))
        else:
            fb = {"event_id": eid, "request_id": rid, "item_id": f"i{rng.randrange(5)}", "ts": ts}
            fb.update({"action": "purchase"} if rng.random() < 0.7 else {"grade": rng.randrange(-1, 4)})
            seq.append((False, _raw(fb), p))
        if rng.random() < 0.02:
            seq.append((bool(rng.randrange(2)), b"{", p))
    return seq


@pytest.mark.parametrize("part", [3, 512])
def test_dense_random_sequences_equal_per_record(part: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with the batch prepared and applied a few records at a time (``_PART``), and with the rows of a
    prefix made apart."""
    import random

    import rankwatch.pipeline.stream.batch as batch_module

    monkeypatch.setattr(batch_module, "_PART", part)
    for seed in range(150):
        rng = random.Random(seed)
        seq = _dense(rng, 60)
        parts = [(), (0, 1)][seed % 2]
        cuts = [rng.randrange(len(seq)) for _ in range(rng.randrange(5))]
        prepared = None if seed % 3 == 0 else rng.randrange(len(seq))
        assert _batched(seq, parts, cuts, rng.randrange(len(seq)), prepared) == _per_record(seq, parts, cuts), seed


def test_users_of_the_batch_path_equal_per_record_with_the_key_cache_emptied(monkeypatch: Any) -> None:
    """The batch path remembers user keys per user_id (bounded: emptied at USER_KEY_CACHE entries); every
    pending request still gets user_key_of its user, as per-record (str, int, empty and absent user ids)."""
    import rankwatch.pipeline.stream.prepare as prepare_module
    from rankwatch.pipeline.stream.join import user_key_of

    monkeypatch.setattr(prepare_module, "USER_KEY_CACHE", 3)
    users: list[Any] = ["u1", "u2", "u1", 7, "7", "", None, 0, "u3", "u4", "u1", "u2", "u5", "u1"]
    cfg = StreamConfig(windows=("1m",), attribution_window_ms=60_000, max_pending_requests=100)
    seq = []
    for k, user in enumerate(users):
        doc: dict[str, Any] = {"event_id": f"e{k}", "request_id": f"r{k}", "ts": T0 + k,
                               "items": [{"item_id": "a", "position": 1, "score": 0.5}]}
        if user is not None:
            doc["user_id"] = user
        seq.append(_raw(doc))
    batched = StreamProcessor(cfg, clock=ManualClock())
    batched.process_batch([True] * len(seq), seq)
    single = StreamProcessor(cfg, clock=ManualClock())
    for raw in seq:
        single.process_impression(raw)
    keys = {rid: batched._pending.user[s] for rid, s in batched._pending.index.items()}
    assert keys == {rid: single._pending.user[s] for rid, s in single._pending.index.items()}
    assert keys["r0"] == user_key_of("r0", "u1") == keys["r13"] and keys["r3"] == keys["r4"] == user_key_of("r3", "7")
    assert keys["r5"] == user_key_of("r5", None) != keys["r6"]  # no user: a group of its own request
    assert len(batched._pending.user_keys) <= 3


def test_rows_of_parts_concatenate_to_the_rows_of_the_whole() -> None:
    """``PreparedRows.concat`` of the rows of consecutive parts is the rows of the whole, also at empty parts."""
    import random

    spec = BatchSpec.of(CFG)
    for seed in range(40):
        rng = random.Random(seed)
        seq = _dense(rng, rng.randrange(0, 50))
        kinds, values = [k for k, _, _ in seq], [r for _, r, _ in seq]
        cuts = _bounds(len(seq), [rng.randrange(len(seq) + 1) for _ in range(rng.randrange(4))])
        parts = [prepare_rows(spec, kinds[a:b], values[a:b], {}) for a, b in zip(cuts, cuts[1:], strict=False)]
        whole = prepare_rows(spec, kinds, values, {})
        assert PreparedRows.concat(parts or [whole]) == whole, seed
        assert whole.n_records == len(seq) and len(whole.impressions[0]) == sum(kinds)


def test_packed_rows_unpack_to_the_rows() -> None:
    """``PreparedRows.packed`` (what the replay's reader pipes) gives back rows equal to the rows, placeholders of
    the rows left to the per-record path included, on messy records and empty batches."""
    import pickle
    import random

    spec = BatchSpec.of(CFG)
    slow = 0
    for seed in range(60):
        rng = random.Random(seed)
        seq = _dense(rng, rng.randrange(0, 60))
        rows = prepare_rows(spec, [k for k, _, _ in seq], [r for _, r, _ in seq], {})
        packed = pickle.loads(pickle.dumps(rows.packed(), protocol=pickle.HIGHEST_PROTOCOL))
        assert packed.unpacked() == rows, seed
        assert packed.every_row_clean == (None not in rows.impressions[0] + rows.feedback[0])
        slow += not packed.every_row_clean
    assert slow > 10  # the messy records left some rows to the per-record path


def test_rows_with_columns_of_unequal_lengths_are_an_error_not_a_crash() -> None:
    """Rows handed in by a caller are checked (the C apply loop reads every column by the first's length)."""
    proc = StreamProcessor(CFG, clock=ManualClock())
    lines = [_raw({"event_id": f"e{k}", "request_id": f"r{k}", "ts": T0 + k,
                   "items": [{"item_id": "a", "position": 1, "score": 0.5}]}) for k in range(2)]
    rows = prepare_rows(BatchSpec.of(CFG), [True, True], lines, {})
    for column in rows.impressions[2:]:
        del column[1:]
    with pytest.raises((TypeError, ValueError)):
        proc.process_batch([True, True], lines, rows=rows)
