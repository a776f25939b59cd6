"""Messy traffic for the golden stream test, generated here (not by pipeline.traffic.generator, which other
changes may reshape): both impression forms, ties, gaps in positions, an item shown twice, RFC 3339 and
epoch timestamps, duplicates, disorder beyond the allowed bound, early/late/orphan/after-finalization
feedback, and bad lines of every reject reason. Deterministic for a seed."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

T0 = 1_796_032_800_000  # 2026-12-01T10:00:00Z


def _ts(rng: random.Random, ms: int) -> int | str:
    r = rng.random()
    if r < 0.6:
        return ms
    when = datetime.fromtimestamp(ms / 1000, UTC)
    if r < 0.8:
        return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return when.astimezone(__import__("datetime").timezone(timedelta(hours=1))).isoformat(timespec="milliseconds")


def _dump(doc: dict[str, object]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


BAD_IMPRESSIONS: list[bytes] = [
    b"not json",  # invalid_json
    b'{"event_id":"b1","request_id":"r\xff","ts":1,"item_id":"i","position":1,"score":1}',  # invalid_utf8
    b"[1,2]",  # not_an_object
    b'{"event_id":"b2","request_id":"rb","ts":' + T0.__str__().encode() + b',"x":' + b"[" * 3000 + b"]" * 3000 + b"}",  # too_deep
    b'{"event_id":"b3","request_id":"rb","ts":1,"pad":"' + b"a" * 5000 + b'"}',  # too_large (config B) / missing
    b'{"event_id":"b4","request_id":"rb","ts":1}',  # missing_field (no items, no item form)
    b'{"request_id":"rb","ts":1,"item_id":"i","position":1,"score":1}',  # missing_field
    b'{"event_id":"b5","request_id":true,"ts":1,"item_id":"i","position":1,"score":1}',  # bad_type (an int id is fine)
    b'{"event_id":"b6","request_id":"","ts":1,"item_id":"i","position":1,"score":1}',  # bad_id
    b'{"event_id":"b7","request_id":"r\\u0000x","ts":1,"item_id":"i","position":1,"score":1}',  # bad_id (NUL)
    b'{"event_id":"b8","request_id":"rb","ts":1,"items":[{"item_id":"a\\u0000","position":1,"score":1}]}',
    b'{"event_id":"b9","request_id":"rb","ts":1,"item_id":"i","position":1,"score":1,"segment":"' + b"s" * 300 + b'"}',
    b'{"event_id":"b10","request_id":"rb","ts":"yesterday","item_id":"i","position":1,"score":1}',  # bad_timestamp
    b'{"event_id":"b11","request_id":"rb","ts":"2026-12-01T10:00:00","item_id":"i","position":1,"score":1}',
    b'{"event_id":"b12","request_id":"rb","ts":-5,"item_id":"i","position":1,"score":1}',
    b'{"event_id":"b13","request_id":"rb","ts":1,"item_id":"i","position":1,"score":1e999}',  # non_finite_score
    b'{"event_id":"b14","request_id":"rb","ts":1,"item_id":"i","position":1,"score":"1"}',  # bad_type (score)
    b'{"event_id":"b15","request_id":"rb","ts":1,"item_id":"i","position":0,"score":1}',  # bad_position
    b'{"event_id":"b16","request_id":"rb","ts":1,"items":[{"item_id":"a","position":2,"score":1},'
    b'{"item_id":"b","position":2,"score":2}]}',  # duplicate_position
    b'{"event_id":"b17","request_id":"rb","ts":1,"items":[]}',  # empty_items
    b'{"event_id":"b18","request_id":"rb","ts":1,"items":[{"item_id":"a","position":1,"score":1}],"item_id":"a"}',
    b'{"event_id":"b19","request_id":"rb","ts":1,"items":['
    + b",".join(b'{"item_id":"i%d","position":%d,"score":0.5}' % (k, k + 1) for k in range(250)) + b"]}",
    b'{"event_id":"b20","request_id":"rb","ts":1,"item_id":"i","position":true,"score":1}',  # bad_type
    b"",  # invalid_json
]
BAD_CLICKS: list[bytes] = [
    b"{",
    b"[]",
    b'{"event_id":"c1","request_id":"r-1","item_id":"i","ts":1,"action":"stare"}',  # unknown_action
    b'{"event_id":"c2","request_id":"r-1","item_id":"i","ts":1}',  # missing_field (action or grade)
    b'{"event_id":"c3","request_id":"r-1","item_id":"i","ts":1,"action":"click","grade":-2}',  # bad_grade
    b'{"event_id":"c4","request_id":"r-1","item_id":"i","ts":1,"grade":21}',  # bad_grade
    b'{"event_id":"c5","request_id":"r-1","item_id":"i","ts":1.5,"action":"click"}',  # bad_timestamp
    b'{"event_id":"c6","request_id":"r-1","ts":1,"action":"click"}',  # missing_field
    b'{"event_id":"c7","request_id":"r-1","item_id":"","ts":1,"action":"click"}',  # bad_id
    b'{"event_id":"c8","request_id":"r-1","item_id":"i\\u0000","ts":1,"action":"click"}',  # bad_id
    b'{"event_id":"c9","request_id":"r-1","item_id":"i","ts":1,"action":5}',  # bad_type
    b'{"event_id":"c10","request_id":"r-1","item_id":"i","ts":1,"grade":true}',  # bad_type
]


def messy_traffic(seed: int, n_requests: int = 600, attribution_ms: int = 60_000) -> list[tuple[str, bytes, int]]:
    """``(stream, raw, partition)`` in delivery order."""
    rng = random.Random(seed)
    timed: list[tuple[float, str, bytes, int]] = []  # (delivery key, stream, raw, partition)
    segs, surfs = ("new", "ret", "pow", "odd1", "odd2"), ("home", "search")
    eid = 0
    for r in range(n_requests):
        rid = f"r-{r}"
        part = r % 2
        rts = T0 + r * 700 + rng.randrange(500)
        k = rng.choice((1, 2, 3, 5, 8, 12, 20))
        ids = [f"i{rng.randrange(40)}" for _ in range(k)]
        if k > 3 and rng.random() < 0.1:
            ids[-1] = ids[0]  # one item shown at two positions
        positions = list(range(1, k + 1))
        if rng.random() < 0.15:
            positions = sorted(rng.sample(range(1, 3 * k + 1), k))  # gaps
        scores = [round(rng.uniform(0, 1), 1) if rng.random() < 0.7 else 0.5 for _ in range(k)]
        labels = {"segment": rng.choice(segs if rng.random() < 0.05 else segs[:3]), "surface": rng.choice(surfs)}
        if rng.random() < 0.1:
            del labels["surface"]
        items = list(zip(ids, positions, scores, strict=True))
        if rng.random() < 0.2:
            rng.shuffle(items)  # list order is not position order
        docs: list[tuple[int, dict[str, object]]] = []
        if rng.random() < 0.25:  # item form: one event per item, at slightly different times
            for iid, pos, sc in items:
                ts = rts + rng.randrange(3000)
                eid += 1
                docs.append((ts, {"event_id": f"e{eid}", "request_id": rid, "ts": _ts(rng, ts), "item_id": iid,
                                  "position": pos, "score": sc, **labels}))
        else:
            eid += 1
            docs.append((rts, {"event_id": f"e{eid}", "request_id": rid, "ts": _ts(rng, rts),
                               "items": [{"item_id": i, "position": p, "score": s} for i, p, s in items], **labels}))
        for ts, doc in docs:
            raw = _dump(doc)
            lag = rng.expovariate(1 / 2000) if rng.random() < 0.97 else rng.uniform(15_000, 200_000)
            timed.append((ts + lag, "impressions", raw, part))
            if rng.random() < 0.05:
                timed.append((ts + lag + rng.uniform(0, 90_000), "impressions", raw, part))  # duplicate
        for _ in range(rng.choice((0, 0, 1, 2, 3, 4))):
            iid = rng.choice(ids) if rng.random() < 0.9 else "i-never-shown"
            u = rng.random()
            if u < 0.75:
                fts = rts + rng.randrange(attribution_ms)
            elif u < 0.85:
                fts = rts + attribution_ms + rng.randrange(1, 30_000)  # outside the window: late
            else:
                fts = rts - rng.randrange(1, 5_000)  # before the request: early
            eid += 1
            doc2: dict[str, object] = {"event_id": f"e{eid}", "request_id": rid, "item_id": iid, "ts": _ts(rng, fts)}
            if rng.random() < 0.8:
                doc2["action"] = rng.choice(("click", "click", "add_to_cart", "purchase"))
            else:
                doc2["grade"] = rng.randrange(0, 6)
            raw = _dump(doc2)
            v = rng.random()
            lag = rng.expovariate(1 / 1500) if v < 0.93 else rng.uniform(-8_000, 400_000)  # some after finalization
            timed.append((fts + lag, "clicks", raw, part))
            if rng.random() < 0.05:
                timed.append((fts + lag + rng.uniform(0, 5000), "clicks", raw, part))
    for o in range(40):  # feedback for requests never seen
        eid += 1
        fts = T0 + rng.randrange(n_requests * 700)
        raw = _dump({"event_id": f"e{eid}", "request_id": f"orphan-{o}", "item_id": "i1", "ts": fts, "action": "click"})
        timed.append((fts + rng.randrange(2000), "clicks", raw, o % 2))
    end = T0 + n_requests * 700
    for raw in BAD_IMPRESSIONS:
        timed.append((rng.uniform(T0, end), "impressions", raw, rng.randrange(2)))
    for raw in BAD_CLICKS:
        timed.append((rng.uniform(T0, end), "clicks", raw, rng.randrange(2)))
    timed.sort(key=lambda t: t[0])
    return [(s, raw, p) for _, s, raw, p in timed]
