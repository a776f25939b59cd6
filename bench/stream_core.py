"""Benchmark of the streaming core: decode + validate + join + windows on one core, and pending memory.

Run: ``python bench/stream_core.py [--requests N] [--repeat R] [--no-mapped]``. Times are CPU time of this process
(``time.process_time``: one core's seconds, steadier than wall time on a shared machine). Prints, for the
same events in the same run, the rankwatch core and a plain dict-of-dicts reference join (``json``-free msgspec decode to dicts,
one dict per item, the kernel called once per finalized batch), as medians over ``--repeat`` runs, and
the memory of N pending 20-item requests (tracemalloc, and RSS growth) for both. Rows for the same events in a
team's nested list shape (SPEC section 6) as mapped JSON and as Confluent-framed Avro go through the same batch
path with the translator and decoders ``rankwatch run`` builds, with their ratio to the native batch path.

Events: list-form impressions of 20 items from :mod:`pipeline.traffic.generator` (clean traffic at 2,000 requests
per second of event time, graded position-biased clicks), replicated with fresh ids to reach N requests.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rankwatch.pipeline.clock import ManualClock  # noqa: E402
from rankwatch.pipeline.events.validation import _FEEDBACK_DECODER, _IMPRESSION_DECODER  # noqa: E402
from rankwatch.pipeline.metrics.aggregates import aggregate_lists  # noqa: E402
from rankwatch.pipeline.metrics.options import MetricOptions  # noqa: E402
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor  # noqa: E402
from rankwatch.pipeline.traffic.generator import GeneratedEvent, TrafficConfig, generate_events  # noqa: E402

dec_imp, dec_fb = _IMPRESSION_DECODER.decode, _FEEDBACK_DECODER.decode

RATE = 2_000  # requests per second of event time


def build_events(n_requests: int, seed: int = 7, rate: float = RATE) -> list[GeneratedEvent]:
    """``n_requests`` requests' events in delivery order (a generated base, replicated with new ids)."""
    base_n = min(n_requests, 5_000)
    cfg = TrafficConfig(seed=seed, start=datetime(2026, 11, 30, tzinfo=UTC), requests_per_second=rate,
                        duration_s=base_n / rate)
    base = list(generate_events(cfg))
    span_ms = int(base_n / rate * 1000)
    dec, enc = msgspec.json.Decoder(), msgspec.json.Encoder()
    decoded = [(e.stream, dec.decode(e.value), e.ts_ms) for e in base]
    out: list[GeneratedEvent] = []
    copies = -(-n_requests // base_n)
    for c in range(copies):
        for stream, doc, ts in decoded:
            d = dict(doc)
            d["event_id"] = f"{c}-{d['event_id']}"
            d["request_id"] = f"{c}-{d['request_id']}"
            d["ts"] = int(ts + c * span_ms)
            out.append(GeneratedEvent(stream, d["request_id"].encode(), enc.encode(d), d["ts"]))
    return out


def run_core(events: list[GeneratedEvent]) -> tuple[float, int]:
    proc = StreamProcessor(StreamConfig(), clock=ManualClock())
    imp, fb = proc.process_impression, proc.process_feedback
    t0 = time.process_time()
    for e in events:
        if e.stream == "impressions":
            imp(e.value)
        else:
            fb(e.value)
    proc.flush()
    elapsed = time.process_time() - t0
    return elapsed, proc.stats().finalized_requests


def run_core_batch(events: list[GeneratedEvent], batch: int = 1_000, translator: Any = None,
                   values: list[bytes] | None = None) -> tuple[float, int]:
    """The batch path: ``process_batch`` per ``batch`` events (a poll of one partition pair); with a
    ``translator``, ``values`` are the same events in the team's schema (the mapped rows)."""
    proc = StreamProcessor(StreamConfig(), clock=ManualClock(), translator=translator)
    raws = values if values is not None else [e.value for e in events]
    kinds = [e.stream == "impressions" for e in events]
    t0 = time.process_time()
    for i in range(0, len(events), batch):
        proc.process_batch(kinds[i:i + batch], raws[i:i + batch])
    proc.flush()
    elapsed = time.process_time() - t0
    return elapsed, proc.stats().finalized_requests


# The nested list shape of SPEC section 6 (docs/mapping.md's cookbook), in JSON and Confluent-framed Avro.
TEAM_FIELDS = {
    "impressions": {"event_id": "meta.id", "request_id": "req.id", "ts": {"path": "meta.sent_at", "unit": "s"},
                    "user_id": "user.id", "segment": {"path": "user.tier", "map": {"N": "new_user", "R": "returning",
                                                                                  "P": "power_user"}},
                    "surface": "req.page", "variant": "exp.arm", "model": "ranker", "items": "results",
                    "item_id": "sku", "position": {"path": "rank", "base": 0}, "score": "s"},
    "clicks": {"event_id": "click.id", "request_id": "click.req", "item_id": "click.sku",
               "ts": {"path": "click.at", "unit": "ms"},
               "action": {"path": "kind", "map": {"CLICK": "click", "CART": "add_to_cart", "BUY": "purchase"}}},
}


def _opt(name: str, kind: Any) -> dict[str, Any]:
    return {"name": name, "type": ["null", kind], "default": None}


TEAM_AVRO = {
    "impressions": {"type": "record", "name": "Impression", "fields": [
        {"name": "meta", "type": {"type": "record", "name": "Meta", "fields": [
            {"name": "id", "type": "string"}, {"name": "sent_at", "type": "double"}]}},
        {"name": "req", "type": {"type": "record", "name": "Req", "fields": [
            {"name": "id", "type": "string"}, _opt("page", "string")]}},
        _opt("user", {"type": "record", "name": "User", "fields": [_opt("id", "string"), _opt("tier", "string")]}),
        _opt("exp", {"type": "record", "name": "Exp", "fields": [_opt("arm", "string")]}),
        _opt("ranker", "string"),
        {"name": "results", "type": {"type": "array", "items": {"type": "record", "name": "Result", "fields": [
            {"name": "sku", "type": "string"}, {"name": "rank", "type": "int"}, {"name": "s", "type": "double"}]}}}]},
    "clicks": {"type": "record", "name": "Click", "fields": [
        {"name": "click", "type": {"type": "record", "name": "ClickRef", "fields": [
            {"name": "id", "type": "string"}, {"name": "req", "type": "string"}, {"name": "sku", "type": "string"},
            {"name": "at", "type": "long"}]}},
        {"name": "kind", "type": "string"}, _opt("grade", "int")]},
}


def team_inputs(events: list[GeneratedEvent], fmt: str) -> tuple[Any, list[bytes]]:
    """(translator, values): the events written in the nested shape as ``fmt`` (``json`` or ``avro``,
    Confluent-framed, schemas served from memory as the service's SchemaCache does)."""
    import json

    from rankwatch.consumers.decoding import SchemaCache, format_specs, translator_of
    from rankwatch.pipeline.events.mapping import EventMapping
    from rankwatch.pipeline.events.reverse import reverser

    tables: dict[str, Any] = {s: {"fields": f} for s, f in TEAM_FIELDS.items()}
    if fmt == "avro":
        for s in tables:
            tables[s].update(format="avro", framing="confluent")
    mapping = EventMapping.from_tables(tables)
    cache = SchemaCache()
    writers: dict[str, Any] = {}
    for i, s in enumerate(("impressions", "clicks")):
        if fmt == "avro":
            from rankwatch.pipeline.events.formats.avro import ConfluentAvroEncoder, parse_schema

            cache.update({("AVRO", i + 1): (True, json.dumps(TEAM_AVRO[s]))})
            writers[s] = ConfluentAvroEncoder(i + 1, parse_schema(TEAM_AVRO[s])).encode
        else:
            writers[s] = msgspec.json.encode
    specs = format_specs(mapping, registry=object())
    reverse = {s: reverser(mapping, s) for s in ("impressions", "clicks")}
    values = [writers[e.stream](reverse[e.stream](msgspec.json.decode(e.value))[0]) for e in events]
    return translator_of(mapping, specs, cache.schema_of, 1_000_000), values


GRADES = {"click": 1, "add_to_cart": 2, "purchase": 3}


def run_reference(events: list[GeneratedEvent], attribution_ms: int = 1_800_000) -> tuple[float, int]:
    """A plain join: dicts from msgspec, a dict of item dicts per request, the kernel per 1 s of deadlines."""
    decode = msgspec.json.decode
    options = MetricOptions()
    pending: dict[str, dict[str, Any]] = {}
    done = 0
    max_ts = 0

    def finalize(upto: int) -> None:
        nonlocal done
        due = [rid for rid, r in pending.items() if r["ts"] + attribution_ms < upto]
        if not due:
            return
        labels: list[float] = []
        scores: list[float] = []
        lengths = []
        for rid in due:
            items = sorted(pending.pop(rid)["items"].values(), key=lambda it: it["position"])
            labels += [it["label"] for it in items]
            scores += [it["score"] for it in items]
            lengths.append(len(items))
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        aggregate_lists(labels, scores, offsets, np.zeros(len(lengths), np.int64), 1, options)
        done += len(due)

    t0 = time.process_time()
    next_check = 0
    for e in events:
        doc = decode(e.value)
        ts = doc["ts"]
        if e.stream == "impressions":
            pending[doc["request_id"]] = {
                "ts": ts,
                "items": {it["item_id"]: {"position": it["position"], "score": float(it["score"]), "label": 0.0}
                          for it in doc["items"]},
            }
        else:
            req = pending.get(doc["request_id"])
            if req is not None:
                item = req["items"].get(doc["item_id"])
                if item is not None:
                    item["label"] = max(item["label"], float(doc.get("grade") or GRADES[doc["action"]]))
        if ts > max_ts:
            max_ts = ts
            if max_ts - 60_000 >= next_check:  # watermark with 60 s disorder, 1 s steps
                finalize(max_ts - 60_000)
                next_check = max_ts - 60_000 + 1_000
    finalize(2**62)
    return time.process_time() - t0, done


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _hold(lines: Any, which: str) -> tuple[Any, int]:
    """Keep every impression of ``lines`` pending in the core, or in a dict-of-dicts join."""
    if which == "core":
        # An attribution window far longer than the data keeps every request pending.
        proc = StreamProcessor(StreamConfig(attribution_window_ms=10**12, max_pending_requests=10**8),
                               clock=ManualClock())
        for raw in lines:
            proc.process_impression(raw)
        return proc, proc.stats().pending_requests
    holder: dict[str, Any] = {}
    for raw in lines:
        doc = msgspec.json.decode(raw)
        holder[doc["request_id"]] = {
            "ts": doc["ts"],
            "items": {it["item_id"]: {"position": it["position"], "score": float(it["score"]), "label": 0.0}
                      for it in doc["items"]},
        }
    return holder, len(holder)


def pending_memory(events: list[GeneratedEvent], which: str) -> tuple[float, float, int]:
    """Bytes per pending request: tracemalloc here, and RSS growth in a fresh process reading a file."""
    impressions = [e.value for e in events if e.stream == "impressions"]
    gc.collect()
    tracemalloc.start()
    holder, n = _hold(impressions, which)
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del holder
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(b"".join(raw + b"\n" for raw in impressions))
    try:
        res = subprocess.run([sys.executable, __file__, "--rss-child", which, f.name],
                             capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    rss, n_child = (float(x) for x in res.stdout.split())
    assert int(n_child) == n
    return traced / n, rss / n, n


def _rss_child(which: str, path: str) -> None:
    gc.collect()
    before = rss_bytes()
    with open(path, "rb") as f:
        holder, n = _hold((line.rstrip(b"\n") for line in f), which)
    gc.collect()
    print(rss_bytes() - before, n)
    del holder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--memory-requests", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=RATE,
                    help="requests per second of event time (one partition pair's traffic; low = many watermark steps)")
    ap.add_argument("--no-mapped", dest="mapped", action="store_false",
                    help="skip the mapped JSON and Avro rows (the nested list shape, SPEC section 6)")
    ap.add_argument("--rss-child", nargs=2, metavar=("WHICH", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        _rss_child(*args.rss_child)
        return
    events = build_events(args.requests, rate=args.rate)
    # The event list is the benchmark's, not the service's (Kafka records come and go): keep its 300k
    # tracked tuples out of the garbage collector's full collections, as rankwatch run freezes its start-up.
    gc.collect()
    gc.freeze()
    n_imp = sum(e.stream == "impressions" for e in events)
    print(f"events: {len(events)} ({n_imp} impressions of 20 items, {len(events) - n_imp} clicks, "
          f"{args.rate:g} requests/s of event time); CPU time of one core")
    core, batched, ref, floor, typed = [], [], [], [], []
    mapped: dict[str, list[float]] = {"json": [], "avro": []}
    team = {fmt: team_inputs(events, fmt) for fmt in (("json", "avro") if args.mapped else ())}
    for _ in range(args.repeat):
        for fmt, (translator, values) in team.items():
            t, n_m = run_core_batch(events, translator=translator, values=values)
            mapped[fmt].append(t)
            assert n_m == n_imp, (fmt, n_m, n_imp)
        t0 = time.process_time()
        for e in events:
            msgspec.json.decode(e.value)
        floor.append(time.process_time() - t0)
        t0 = time.process_time()
        for e in events:
            (dec_imp if e.stream == "impressions" else dec_fb)(e.value)
        typed.append(time.process_time() - t0)
        t, n = run_core(events)
        core.append(t)
        t, n_b = run_core_batch(events)
        batched.append(t)
        assert n_b == n, (n_b, n)
        t, n_ref = run_reference(events)
        ref.append(t)
        assert n == n_ref == n_imp, (n, n_ref, n_imp)
    tc, tr, tb = statistics.median(core), statistics.median(ref), statistics.median(batched)
    print(f"batch:     {n_imp / tb:10,.0f} requests/s  {len(events) / tb:10,.0f} events/s  "
          f"{n_imp * 20 / tb:12,.0f} items/s  (median of {args.repeat}: {tb:.2f} s; process_batch per 1,000 events)")
    print(f"per-record:{n_imp / tc:10,.0f} requests/s  {len(events) / tc:10,.0f} events/s  "
          f"{n_imp * 20 / tc:12,.0f} items/s  (median of {args.repeat}: {tc:.2f} s)")
    print(f"reference: {n_imp / tr:10,.0f} requests/s  {len(events) / tr:10,.0f} events/s  "
          f"{n_imp * 20 / tr:12,.0f} items/s  (median of {args.repeat}: {tr:.2f} s)")
    for fmt, label in (("json", "mapped JSON"), ("avro", "Avro (Confluent)")):
        if mapped[fmt]:
            tm = statistics.median(mapped[fmt])
            print(f"{label + ':':17s}{n_imp / tm:10,.0f} requests/s  {len(events) / tm:10,.0f} events/s  "
                  f"(median of {args.repeat}: {tm:.2f} s; nested list shape, batch path) = {tb / tm:.2f}x the batch path")
    tf = statistics.median(floor)
    print(f"decode only (msgspec to dicts, no join): {n_imp / tf:10,.0f} requests/s  {len(events) / tf:10,.0f} events/s")
    tt = statistics.median(typed)
    print(f"decode only (msgspec to the core's typed structs): {n_imp / tt:10,.0f} requests/s")
    print(f"batch / per-record: {tc / tb:.2f}x; batch / reference: {tr / tb:.2f}x; per-record / reference: {tr / tc:.2f}x")
    print(f"time over the decode-only floor: batch {tb / tf:.2f}x (typed structs {tb / tt:.2f}x), per-record {tc / tf:.2f}x")
    mem_events = events if args.memory_requests == args.requests else build_events(args.memory_requests)
    del events
    for which in ("core", "reference"):
        traced, rss, n = pending_memory(mem_events, which)
        print(f"pending {which:9s}: {n} requests  {traced:7.0f} B/request ({traced / 20:5.1f} B/item) traced, "
              f"{rss:7.0f} B/request RSS growth")


if __name__ == "__main__":
    main()
