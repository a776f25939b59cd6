"""The mapped batch path equals translating each record and feeding its section 1 events per record."""

from __future__ import annotations

import json
import random

from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.events.deadletter import ListDeadLetterSink
from rankwatch.pipeline.events.mapping import EventMapping
from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.events.translate import translator_for
from rankwatch.pipeline.events.validation import Rejection
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor

T0 = 1_796_032_800_000
MAPPING = EventMapping.from_tables({
    "impressions": {"fields": {"request_id": "q", "ts": {"path": "t", "unit": "s"}, "items": "r",
                               "item_id": "id", "position": {"path": "k", "base": 0}, "score": "s"}},
    "clicks": {"fields": {"request_id": "q", "item_id": "id", "ts": {"path": "t", "unit": "s"}}}})
CFG = StreamConfig(windows=("10s", "1m"), attribution_window_ms=5_000, allowed_disorder_ms=1_000)


def _traffic(rng: random.Random, n: int) -> list[tuple[bool, bytes]]:
    out: list[tuple[bool, bytes]] = []
    for i in range(n):
        t = (T0 + 300 * i + rng.randrange(2000)) / 1000
        q = rng.randrange(n // 2)
        if rng.random() < 0.5:
            doc = {"q": q, "t": t, "r": [{"id": j, "k": j - (rng.random() < 0.03), "s": rng.random()}
                                         for j in range(rng.randrange(4))]}
            if rng.random() < 0.05:
                del doc["q"]
            out.append((True, json.dumps(doc).encode()))
        else:
            out.append((False, json.dumps({"q": q, "id": rng.randrange(3), "t": t, "action": "click"}).encode()))
        if rng.random() < 0.05:
            out.append(out[-1])  # byte-identical resend: a duplicate by its digest id
        if rng.random() < 0.02:
            out.append((rng.random() < 0.5, b"{"))
    return out


def _outcome(proc: StreamProcessor, windows: list, sink: ListDeadLetterSink) -> tuple:  # type: ignore[type-arg]
    return ([w.document() for w in windows], proc.stats(),
            [(d.stream, d.reason, d.raw, d.source) for d in sink.letters])


def test_mapped_batches_equal_translated_per_record() -> None:
    translator = translator_for(MAPPING)
    for seed in range(20):
        rng = random.Random(seed)
        seq = _traffic(rng, 200)
        sink1 = ListDeadLetterSink()
        per = StreamProcessor(CFG, clock=ManualClock(), dead_letters=sink1)
        out1: list = []  # type: ignore[type-arg]
        for i, (kind, raw) in enumerate(seq):
            stream = "impressions" if kind else "clicks"
            src = SourceRef("imp" if kind else "clk", 0, i)
            native = translator.translate(stream, raw)
            if isinstance(native, Rejection):
                per.reject(stream, raw, native.reason, native.detail, src)
                continue
            for value in native:
                before = len(sink1.letters)
                out1 += (per.process_impression if kind else per.process_feedback)(value, source=src)
                for k in range(before, len(sink1.letters)):  # the batch path keeps the original bytes
                    d = sink1.letters[k]
                    sink1.letters[k] = type(d)(d.stream, raw, d.reason, d.detail, d.source)
        out1 += per.flush()
        sink2 = ListDeadLetterSink()
        bat = StreamProcessor(CFG, clock=ManualClock(), dead_letters=sink2, translator=translator)
        out2: list = []  # type: ignore[type-arg]
        i = 0
        while i < len(seq):
            j = min(len(seq), i + rng.randint(1, 60))
            out2 += bat.process_batch([k for k, _ in seq[i:j]], [r for _, r in seq[i:j]], partition=0,
                                      offsets=range(i, j), topics=("imp", "clk"))
            i = j
        out2 += bat.flush()
        a, b = _outcome(per, out1, sink1), _outcome(bat, out2, sink2)
        assert a == b, seed
        assert b[1].outcomes["impressions"]["duplicate"] > 0 and b[1].rejects
