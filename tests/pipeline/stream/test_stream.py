"""The streaming core end to end: parity with an independent offline computation, bad input, event-time
properties, idle close, late/orphan/duplicate accounting, caps."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.clock import ManualClock, datetime_to_ms
from rankwatch.pipeline.events.deadletter import ListDeadLetterSink
from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.events.validation import RejectReason
from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.clusters import MAX_BINS
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.metrics.result import result_document
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_with_truth

START = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
T0 = datetime_to_ms(START)
# AUC SEs of folded states (past 16,384 items, docs/metrics.md 4a): measured up to 1.5 % apart (AUC-PR,
# 19,120 items) between the stream and the rows at once; twice that is the bound.
AUC_SE_FOLDED_REL = 0.03
RANK = MetricOptions().rank_metric_names  # every per-request mean (P/R/hit rate included)

MESSY = TrafficConfig(
    seed=11, start=START, duration_s=3 * 3600, requests_per_second=0.3, duplicate_rate=0.05, malformed_rate=0.05,
    out_of_order_ms=30_000, item_form_share=0.25, rfc3339_share=0.3, orphan_rate=0.05, late_rate=0.05,
)


def run(events, config: StreamConfig | None = None, sink=None) -> tuple[StreamProcessor, list[PublishedWindow]]:
    proc = StreamProcessor(config or StreamConfig(), clock=ManualClock(START), dead_letters=sink)
    out: list[PublishedWindow] = []
    for e in events:
        out += (proc.process_impression if e.stream == "impressions" else proc.process_feedback)(e.value)
    out += proc.flush()
    return proc, out


def oracle(rows: pd.DataFrame, by=("segment", "surface"), options: MetricOptions | None = None) -> dict:
    """Independent computation: group the joined rows per request in pandas, rank by position, kernel per slice."""
    options = options or MetricOptions()
    rows = rows.sort_values(["request_id", "position"])

    def agg(frame: pd.DataFrame) -> RankingAggregate:
        sizes = frame.groupby("request_id", sort=False).size().to_numpy()
        users = pd.factorize(frame.groupby("request_id", sort=False)["user_id"].first())[0]  # GAUC by user
        return RankingAggregate.from_lists(
            frame["label"].to_numpy(float), frame["score"].to_numpy(float),
            np.concatenate(([0], np.cumsum(sizes))), options, gauc_keys=users,
        )

    slices = {}
    if by:
        for key, frame in rows.groupby(list(by), sort=True):
            key = key if isinstance(key, tuple) else (key,)
            slices[tuple(zip(by, key, strict=True))] = agg(frame)
    return result_document(agg(rows), slices)


def assert_same_document(got: dict, want: dict) -> None:
    pairs = [(got["overall"], want["overall"])]
    assert [{k: v for k, v in s.items() if isinstance(v, str)} for s in got["slices"]] == [
        {k: v for k, v in s.items() if isinstance(v, str)} for s in want["slices"]
    ]
    pairs += list(zip(got["slices"], want["slices"], strict=True))
    for g, w in pairs:
        for key, expected in w.items():
            if key == "score_distribution":  # a baseline file's reference for score drift
                continue
            if (key in RANK or key == "gauc") and expected is not None:
                assert g[key] == pytest.approx(expected, abs=1e-9), key
            elif key == "stderr":  # same keys; floats up to summation order
                assert set(g[key]) == set(expected)
                for name, se in expected.items():
                    # AUC SEs are exact (summation order aside) within the 16,384-bin bound; a state past
                    # it folds, and the fold depends on the merge order (docs/metrics.md 4a).
                    folded = name.startswith("auc") and w["items"] > MAX_BINS
                    rel = AUC_SE_FOLDED_REL if folded else 1e-12
                    assert g[key][name] == (None if se is None else pytest.approx(se, rel=rel)), name
            else:
                assert g[key] == expected, key  # counts, labels and both AUCs: exact


@pytest.fixture(scope="module")
def messy():
    events, truth = generate_with_truth(MESSY)
    sink = ListDeadLetterSink()
    proc, published = run(events, sink=sink)
    return events, truth, proc, published, sink


def test_parity_every_window_and_slice(messy):
    _, truth, _, published, _ = messy
    assert {w.window for w in published} == {"5m", "1h"}
    hours = [w for w in published if w.window == "1h"]
    assert len(hours) >= 3
    for w in published:
        rows = truth[(truth.request_ts >= w.start) & (truth.request_ts < w.end)]
        assert_same_document(w.document(), oracle(rows))
    # every valid request is in exactly one window of each size
    assert sum(w.overall.requests for w in hours) == truth.request_id.nunique()


def test_parity_with_offline_baseline(messy):
    from rankwatch.pipeline.offline.baseline import compute_baseline

    _, truth, _, published, _ = messy
    w = next(w for w in published if w.window == "1h")
    rows = truth[(truth.request_ts >= w.start) & (truth.request_ts < w.end)].drop(columns=["request_ts"])
    assert_same_document(w.document(), compute_baseline(rows).document())


def test_messy_traffic_outcomes(messy):
    events, truth, proc, _, sink = messy
    st_ = proc.stats()
    imp, clk = st_.outcomes["impressions"], st_.outcomes["clicks"]
    n_events = {"impressions": 0, "clicks": 0}
    for e in events:
        n_events[e.stream] += 1
    assert sum(imp.values()) == n_events["impressions"]
    assert sum(clk.values()) == n_events["clicks"] + st_.pending_feedback
    assert imp["duplicate"] > 0 and clk["duplicate"] > 0
    assert clk["orphan"] > 0 and clk["late"] > 0
    assert imp["late"] == 0  # the generator delivers impressions within the allowed disorder
    assert imp["rejected"] + clk["rejected"] == len(sink.letters) == sum(st_.rejects.values())
    assert all(letter.raw for letter in sink.letters)
    assert st_.pending_requests == 0 and st_.pending_items == 0 and st_.pending_feedback == 0
    assert st_.finalized_requests == truth.request_id.nunique()


def _clean_cfg(**kw) -> TrafficConfig:
    base = dict(seed=5, start=START, duration_s=1800, requests_per_second=0.5, item_form_share=0.2)
    base.update(kw)
    return TrafficConfig(**base)


def _docs(published: list[PublishedWindow]) -> list[dict]:
    return [w.document() for w in published]


BAD_LINES = [
    b"not json", b"\xff\xfe{}", b"[1, 2]", b"null", b'"text"', b"{}",
    b'{"event_id": "x1", "request_id": "r-0", "ts": 1}',  # impression without items
    b'{"event_id": "x2", "request_id": "r-5-0", "ts": "yesterday", "item_id": "i", "position": 1, "score": 1}',
    b'{"event_id": "x3", "request_id": "r-5-0", "ts": 1796032800000, "item_id": "i", "position": 0, "score": 1}',
    b'{"event_id": "x4", "request_id": "r-5-0", "ts": 1796032800000, "item_id": "i", "position": 1, "score": 1e999}',
    b'{"event_id": "x5", "request_id": "r-5-0", "ts": 1796032800000, "items": [{"item_id": "a", "position": 1, "score": 1},'
    b' {"item_id": "b", "position": 1, "score": 2}]}',
    b'{"event_id": "x6", "request_id": "r-5-0", "ts": 1796032800000, "item_id": "i", "position": true, "score": 1}',
    b'{"event_id": "x7", "request_id": true, "ts": 1796032800000, "item_id": "i", "position": 1, "score": 1}',
    b'{"event_id": "x8", "request_id": "r-5-0", "ts": "2026-11-30T10:00:00", "item_id": "i", "position": 1, "score": 1}',
    b'{"event_id": "x9", "request_id": "r-5-0", "ts": 1796032800000, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"event_id": "x10", "request_id": "r-5-0", "ts": 1796032800000, "pad": "' + b"a" * 10_000_000 + b'"}',
    b'{"event_id": "x11", "request_id": "r-5-0", "ts": 1796032800000, "items": ['
    + b",".join(b'{"item_id": "i%d", "position": %d, "score": 0.5}' % (k, k + 1) for k in range(10_000)) + b"]}",
]
BAD_CLICKS = [
    b"{", b"[]", b'{"event_id": "c1", "request_id": "r-5-0", "item_id": "i", "ts": 1796032800000, "action": "stare"}',
    b'{"event_id": "c2", "request_id": "r-5-0", "item_id": "i", "ts": 1796032800000}',
    b'{"event_id": "c3", "request_id": "r-5-0", "item_id": "i", "ts": 1796032800000, "action": "click", "grade": -2}',
    b'{"event_id": "c4", "request_id": "r-5-0", "item_id": "i", "ts": 1796032800000.5, "action": "click"}',
    b'{"event_id": "c5", "request_id": "r-5-0", "ts": 1796032800000, "action": "click"}',
]


def test_bad_input_is_rejected_with_reason_and_changes_no_metric():
    events, _ = generate_with_truth(_clean_cfg())
    _, clean = run(events)
    rng = random.Random(3)
    mixed = list(events)
    for raw in BAD_LINES:
        mixed.insert(rng.randrange(len(mixed)), type(events[0])("impressions", b"k", raw, 0))
    for raw in BAD_CLICKS:
        mixed.insert(rng.randrange(len(mixed)), type(events[0])("clicks", b"k", raw, 0))
    sink = ListDeadLetterSink()
    proc, dirty = run(mixed, sink=sink)
    assert _docs(dirty) == _docs(clean)
    reasons = [letter.reason for letter in sink.letters]
    assert len(reasons) == len(BAD_LINES) + len(BAD_CLICKS)
    for expected in (RejectReason.invalid_json, RejectReason.invalid_utf8, RejectReason.not_an_object,
                     RejectReason.missing_field, RejectReason.bad_timestamp, RejectReason.bad_position,
                     RejectReason.non_finite_score, RejectReason.duplicate_position, RejectReason.bad_type,
                     RejectReason.too_deep, RejectReason.too_large, RejectReason.too_many_items,
                     RejectReason.unknown_action, RejectReason.bad_grade):
        assert expected in reasons, expected
    assert proc.stats().outcomes["impressions"]["rejected"] == len(BAD_LINES)


def _shuffle_within(events, disorder_ms: int, rng: random.Random):
    """Deliver each event at ts + U(0, disorder): any such order keeps every event ahead of the watermark."""
    keyed = [(e.ts_ms + rng.randint(0, disorder_ms), i, e) for i, e in enumerate(events)]
    return [e for _, _, e in sorted(keyed)]


@pytest.fixture(scope="module")
def ordered_traffic():
    cfg = _clean_cfg(seed=9, duration_s=2400, requests_per_second=0.3, duplicate_rate=0.05, late_rate=0.05,
                     orphan_rate=0.05, out_of_order_ms=0)
    events, _ = generate_with_truth(cfg)
    # generator order is ts order here; sort strictly by ts to get a canonical reference delivery
    events = sorted(events, key=lambda e: e.ts_ms)
    proc, published = run(events)
    return events, _docs(published), proc.stats().outcomes


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_arrival_order_within_disorder_does_not_change_windows(ordered_traffic, seed):
    events, reference, outcomes = ordered_traffic
    shuffled = _shuffle_within(events, 60_000, random.Random(seed))
    proc, published = run(shuffled)
    assert _docs(published) == reference  # bit-identical, floats included
    assert proc.stats().outcomes == outcomes


def _impression(rid: str, ts: int, n: int = 3, segment: str = "a", event_id: str | None = None) -> bytes:
    items = ",".join(f'{{"item_id": "i{k}", "position": {k + 1}, "score": {1.0 - k / 10}}}' for k in range(n))
    return (f'{{"event_id": "{event_id or "imp-" + rid}", "request_id": "{rid}", "ts": {ts}, '
            f'"segment": "{segment}", "surface": "s", "items": [{items}]}}').encode()


def _click(rid: str, item: str, ts: int, eid: str, action: str = "click") -> bytes:
    return f'{{"event_id": "{eid}", "request_id": "{rid}", "item_id": "{item}", "ts": {ts}, "action": "{action}"}}'.encode()


SMALL = StreamConfig(windows=("1m",), attribution_window_ms=10_000, allowed_disorder_ms=1_000, idle_timeout_ms=5_000)


def test_idle_close_with_injected_clock():
    clock = ManualClock(START)
    proc = StreamProcessor(SMALL, clock=clock)
    assert proc.process_impression(_impression("r1", T0 + 1_000)) == []
    assert proc.process_feedback(_click("r1", "i0", T0 + 2_000, "c1")) == []
    assert proc.tick() == []  # not idle yet
    clock.advance(timedelta(seconds=4))
    assert proc.tick() == []
    clock.advance(timedelta(seconds=2))  # 6 s without events > idle timeout; the watermark follows the clock
    assert proc.tick() == []  # clock at T0+6s: window [T0, T0+1m) still open
    clock.advance(timedelta(seconds=70))
    published = proc.tick()
    assert [w.window for w in published] == ["1m"]
    assert published[0].overall.requests == 1 and published[0].overall.values()["mrr"] == 1.0
    assert proc.stats().pending_requests == 0


def test_late_feedback_after_finalization_is_counted_and_changes_nothing():
    proc = StreamProcessor(SMALL, clock=ManualClock(START))
    proc.process_impression(_impression("r1", T0))
    proc.process_impression(_impression("r2", T0 + 30_000))  # watermark 29 s: r1 (deadline 10 s) final
    assert proc.stats().pending_requests == 1
    proc.process_feedback(_click("r1", "i0", T0 + 5_000, "late-1"))  # inside r1's window, but after it closed
    out = proc.flush()
    stats = proc.stats()
    assert stats.outcomes["clicks"]["late"] == 1 and stats.outcomes["clicks"]["accepted"] == 0
    assert out[0].overall.requests_with_relevant == 0


def test_feedback_outside_attribution_window_orphans_duplicates():
    proc = StreamProcessor(SMALL, clock=ManualClock(START))
    proc.process_feedback(_click("r1", "i1", T0 + 500, "early"))  # before its impression: waits
    proc.process_impression(_impression("r1", T0))
    proc.process_feedback(_click("r1", "i2", T0 + 10_001, "after-window"))
    proc.process_feedback(_click("r1", "i1", T0 + 600, "early"))  # duplicate event id
    proc.process_feedback(_click("nobody", "i1", T0 + 700, "orphan"))
    proc.process_impression(_impression("r1", T0, event_id="imp-r1"))  # duplicate impression
    [w] = proc.flush()
    clk = proc.stats().outcomes["clicks"]
    assert clk == {"accepted": 1, "duplicate": 1, "rejected": 0, "orphan": 1, "late": 1}
    assert proc.stats().outcomes["impressions"]["duplicate"] == 1
    assert w.overall.values()["mrr"] == pytest.approx(1 / 2)  # i1 is at position 2


def test_pending_cap_finalizes_oldest_early_and_counts_it():
    cfg = StreamConfig(windows=("1h",), max_pending_requests=3)
    proc = StreamProcessor(cfg, clock=ManualClock(START))
    for k in range(5):
        proc.process_impression(_impression(f"r{k}", T0 + k * 2_000))
    stats = proc.stats()
    assert stats.pending_requests <= 3 and stats.evicted_requests == 2
    proc.process_feedback(_click("r0", "i0", T0 + 10_000, "c-evicted"))  # its request is already final
    assert proc.stats().outcomes["clicks"]["late"] == 1
    [w] = proc.flush()
    assert w.overall.requests == 5


def test_item_form_assembles_one_list_in_position_order():
    proc = StreamProcessor(SMALL, clock=ManualClock(START))
    for pos, score in ((3, 0.1), (1, 0.9), (2, 0.5)):
        raw = (f'{{"event_id": "e{pos}", "request_id": "r", "ts": {T0 + pos}, "item_id": "i{pos}", '
               f'"position": {pos}, "score": {score}}}').encode()
        proc.process_impression(raw)
    dup = b'{"event_id": "e9", "request_id": "r", "ts": %d, "item_id": "x", "position": 2, "score": 0}' % (T0 + 4)
    sink = ListDeadLetterSink()
    proc.dead_letters = sink
    proc.process_impression(dup)
    proc.process_feedback(_click("r", "i3", T0 + 5, "c", action="purchase"))
    [w] = proc.flush()
    assert [letter.reason for letter in sink.letters] == [RejectReason.duplicate_position]
    assert w.overall.items == 3
    assert w.overall.values()["mrr"] == pytest.approx(1 / 3)


def test_label_values_are_capped_and_counted():
    cfg = StreamConfig(windows=("1h",), slice_spec=SliceSpec(by=("segment",), max_values_per_label=2))
    proc = StreamProcessor(cfg, clock=ManualClock(START))
    for k, seg in enumerate(["a", "b", "c", "d", "a"]):
        proc.process_impression(_impression(f"r{k}", T0 + k, segment=seg))
    [w] = proc.flush()
    assert sorted(v for ((_, v),) in w.slices) == ["__other__", "a", "b"]
    stats = proc.stats()
    assert stats.label_values == {"segment": 2} and stats.label_overflow == {"segment": 2}


def test_partition_watermark_waits_for_every_partition():
    proc = StreamProcessor(SMALL, clock=ManualClock(START), partitions=(0, 1))
    proc.process_impression(_impression("r1", T0), source=SourceRef("impressions", 0, 0))
    out = proc.process_impression(_impression("r2", T0 + 200_000), source=SourceRef("impressions", 0, 1))
    assert out == [] and proc.stats().watermark_ms is None  # partition 1 has said nothing yet
    out = proc.process_impression(_impression("r3", T0 + 200_000), source=SourceRef("impressions", 1, 0))
    assert [w.start for w in out] == [START] and out[0].partitions == (0, 1)
    assert proc.stats().watermark_ms == T0 + 199_000


_ids = st.sampled_from(["r1", "r2", "r3", ""])
_ts = st.one_of(st.integers(-5, 2**63), st.sampled_from([T0, T0 + 1, T0 + 700_000, 253_402_300_799_999]),
                st.sampled_from(["2026-11-30T10:00:00Z", "2026-11-30T10:00:00", "x"]))
_item = st.fixed_dictionaries({"item_id": st.sampled_from(["a", "b", "c"]), "position": st.integers(-1, 4),
                               "score": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers())})
_impression_doc = st.fixed_dictionaries(
    {"event_id": st.text(max_size=3), "request_id": _ids, "ts": _ts},
    optional={"items": st.lists(_item, max_size=4), "item_id": st.just("a"), "position": st.integers(0, 3),
              "score": st.floats(allow_nan=False, allow_infinity=False), "segment": st.sampled_from(["s", "", None])},
)
_feedback_doc = st.fixed_dictionaries(
    {"event_id": st.text(max_size=3), "request_id": _ids, "item_id": st.sampled_from(["a", "b"]), "ts": _ts},
    optional={"action": st.sampled_from(["click", "purchase", "stare"]), "grade": st.integers(-2, 30)},
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.one_of(_impression_doc, _feedback_doc)), max_size=25))
def test_arbitrary_event_sequences_never_crash_and_add_up(seq):
    import json

    proc = StreamProcessor(SMALL, clock=ManualClock(START))
    published = []
    for is_impression, doc in seq:
        raw = json.dumps(doc).encode()
        published += (proc.process_impression if is_impression else proc.process_feedback)(raw)
    published += proc.tick()
    published += proc.flush()
    stats = proc.stats()
    n_imp = sum(1 for i, _ in seq if i)
    assert sum(stats.outcomes["impressions"].values()) == n_imp
    assert sum(stats.outcomes["clicks"].values()) == len(seq) - n_imp
    assert stats.pending_requests == 0 and stats.pending_feedback == 0
    assert sum(w.overall.requests for w in published) == stats.finalized_requests


def test_the_last_accepted_timestamp_publishes_its_windows() -> None:
    # Found by hypothesis: a request at the very end of the accepted range once overflowed datetime when its
    # window was published. The accepted range now ends a year early (validation.MAX_TS_MS).
    import json

    from rankwatch.pipeline.events.validation import MAX_TS_MS

    def impression(event_id: str, request_id: str, ts: int) -> bytes:
        return json.dumps({"event_id": event_id, "request_id": request_id, "ts": ts, "segment": "s",
                           "surface": "f", "items": [{"item_id": "a", "position": 1, "score": 0.5},
                                                     {"item_id": "b", "position": 2, "score": 0.1}]}).encode()

    proc = StreamProcessor(StreamConfig(), clock=ManualClock(START))
    proc.process_impression(impression("e1", "r1", MAX_TS_MS))
    proc.process_feedback(json.dumps({"event_id": "c1", "request_id": "r1", "item_id": "a", "ts": MAX_TS_MS,
                                      "action": "click"}).encode())
    published = proc.flush()
    assert published and all(w.overall.requests == 1 for w in published)
    assert proc.process_impression(impression("e2", "r2", MAX_TS_MS + 1)) == []
    assert proc.stats().rejects == {("impressions", RejectReason.bad_timestamp.value): 1}
