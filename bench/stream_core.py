"""Benchmark of the streaming core: decode + validate + join + windows on one core, and pending memory.

Run: ``python bench/stream_core.py [--requests N] [--repeat R]``. Times are CPU time of this process
(``time.process_time``: one core's seconds, steadier than wall time on a shared machine). Prints, for the
same events in the same run, the rankwatch core and a plain dict-of-dicts reference join (``json``-free msgspec decode to dicts,
one dict per item, the kernel called once per finalized batch), as medians over ``--repeat`` runs, and
the memory of N pending 20-item requests (tracemalloc, and RSS growth) for both.

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


def run_core_batch(events: list[GeneratedEvent], batch: int = 1_000) -> tuple[float, int]:
    """The batch path: ``process_batch`` per ``batch`` events (a poll of one partition pair)."""
    proc = StreamProcessor(StreamConfig(), clock=ManualClock())
    t0 = time.process_time()
    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        proc.process_batch([e.stream == "impressions" for e in chunk], [e.value for e in chunk])
    proc.flush()
    elapsed = time.process_time() - t0
    return elapsed, proc.stats().finalized_requests


# -- mapped JSON (issue 22): the same events in SPEC section 6's nested list shape, through the translator --
MAPPED_CONFIG = """
[events.impressions.fields]
event_id = "meta.id"
request_id = "req.id"
ts = { path = "meta.sent_at", unit = "s" }
user_id = "user.id"
segment = { path = "user.tier", map = { N = "new_user", R = "returning", P = "power_user" } }
surface = "req.page"
variant = "exp.arm"
model = "ranker"
items = "results"
item_id = "sku"
position = { path = "rank", base = 0 }
score = "s"

[events.clicks.fields]
event_id = "click.id"
request_id = "click.req"
item_id = "click.sku"
ts = { path = "click.at", unit = "ms" }
action = { path = "kind", map = { CLICK = "click", CART = "add_to_cart", BUY = "purchase" } }
"""
_TIERS = {"new_user": "N", "returning": "R", "power_user": "P"}
_KINDS = {"click": "CLICK", "add_to_cart": "CART", "purchase": "BUY"}


def nested_list_events(events: list[GeneratedEvent]) -> list[GeneratedEvent]:
    """``events`` in the nested list shape of SPEC section 6 (seconds, 0-based ranks, coded tiers)."""
    dec, enc = msgspec.json.Decoder(), msgspec.json.Encoder()
    out = []
    for e in events:
        d = dec.decode(e.value)
        if e.stream == "impressions":
            doc = {"meta": {"id": d["event_id"], "sent_at": d["ts"] / 1000},
                   "req": {"id": d["request_id"], "page": d.get("surface")},
                   "user": {"id": d.get("user_id"), "tier": _TIERS.get(d.get("segment"), d.get("segment"))},
                   "exp": {"arm": d.get("variant")}, "ranker": d.get("model"),
                   "results": [{"sku": it["item_id"], "rank": it["position"] - 1, "s": it["score"]}
                               for it in d["items"]]}
        else:
            doc = {"click": {"id": d["event_id"], "req": d["request_id"], "sku": d["item_id"], "at": d["ts"]},
                   "kind": _KINDS[d["action"]]}
        out.append(GeneratedEvent(e.stream, e.key, enc.encode(doc), e.ts_ms))
    return out


def run_mapped_batch(events: list[GeneratedEvent], batch: int = 1_000) -> tuple[float, int]:
    """The service's mapped path: ``process_batch`` with a translator (JSON in the nested list shape)."""
    import tomllib

    from rankwatch.pipeline.events.mapping import EventMapping
    from rankwatch.pipeline.events.translate import translator_for

    mapping = EventMapping.from_tables(tomllib.loads(MAPPED_CONFIG)["events"], where="bench")
    proc = StreamProcessor(StreamConfig(), clock=ManualClock(), translator=translator_for(mapping))
    t0 = time.process_time()
    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        proc.process_batch([e.stream == "impressions" for e in chunk], [e.value for e in chunk])
    proc.flush()
    elapsed = time.process_time() - t0
    return elapsed, proc.stats().finalized_requests


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
    mapped_events, mapped = nested_list_events(events), []
    for _ in range(args.repeat):
        t, n_m = run_mapped_batch(mapped_events)
        mapped.append(t)
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
        assert n_b == n == n_m, (n_b, n, n_m)
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
    tm = statistics.median(mapped)
    print(f"mapped JSON (nested list): {n_imp / tm:10,.0f} requests/s  ({tm:.2f} s; {tb / tm:.2f}x the batch path's "
          f"requests/s, goal >= 0.6x)")
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
