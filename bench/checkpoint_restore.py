"""Restore time of a partition pair's checkpoint as a function of pending requests.

Run: ``python bench/checkpoint_restore.py [--sizes 1000,10000,100000,300000] [--items 20]
[--bootstrap HOST:PORT]``. For each size N, a stream processor is filled with N pending requests (list-form
impressions of ``--items`` items, all inside one attribution window, so none is finalized), then:

* ``snapshot``: :meth:`StreamProcessor.snapshot` (taken under the pair lock on every checkpoint);
* ``restore``: :meth:`StreamProcessor.restore` from those bytes (what the loop does after a rebalance);
* ``longest stall``: the longest gap seen by a thread that wakes every 5 ms during the restore, i.e. the
  longest GIL hold. It bounds how long kafka-python's I/O thread (heartbeats) cannot run;
* with ``--bootstrap``: ``write`` and ``read`` through :class:`consumers.checkpoints.CheckpointStore` on a
  real broker (chunked, acknowledged; read back from the compacted topic).

Times are wall seconds of one run on a loaded machine: compare sizes within a run, not across runs.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rankwatch.pipeline.clock import ManualClock  # noqa: E402
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor  # noqa: E402

T0 = 1_796_000_000_000  # event time of the first request (ms)


def filled(n: int, items: int, config: StreamConfig) -> StreamProcessor:
    """A processor holding ``n`` pending requests (one per ms of event time, none finalized)."""
    proc = StreamProcessor(config, clock=ManualClock())
    enc = msgspec.json.Encoder()
    segs, surfaces, variants = ("new_user", "returning", "power_user"), ("home_feed", "search"), ("control", "treatment")
    for i in range(n):
        doc = {"event_id": f"e{i}", "request_id": f"r{i}", "ts": T0 + i // 10, "user_id": f"u{i % 997}",
               "segment": segs[i % 3], "surface": surfaces[i % 2], "variant": variants[i % 2], "model": "m1",
               "items": [{"item_id": f"i{(i * 7 + k) % 50_000}", "position": k + 1, "score": 1.0 - k / items}
                         for k in range(items)]}
        proc.process_impression(enc.encode(doc))
    return proc


class StallWatch:
    """A thread waking every 5 ms; ``longest`` is the longest gap between two wake-ups (GIL holds)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.005)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last - 0.005)
            last = now

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000,300000", help="pending requests, comma-separated")
    ap.add_argument("--items", type=int, default=20, help="items per request")
    ap.add_argument("--bootstrap", default=None, help="also write and read through a real broker")
    args = ap.parse_args(argv)
    config = StreamConfig(windows=("1m", "5m"), attribution_window_ms=2 * 3_600_000, max_pending_requests=2_000_000)
    store = None
    if args.bootstrap:
        from kafka import KafkaProducer

        from rankwatch.consumers.checkpoints import CheckpointStore
        from rankwatch.consumers.topics import CHECKPOINT_TOPIC_CONFIG, ensure_topic

        topic = f"bench-ckpt-{int(time.time())}"
        client = {"bootstrap_servers": [args.bootstrap]}
        ensure_topic(client, topic, partitions=1, config=CHECKPOINT_TOPIC_CONFIG)
        producer = KafkaProducer(**client, acks="all", linger_ms=5, max_request_size=2 * 1024 * 1024)
        store = CheckpointStore(producer, topic, client, read_timeout_s=600)
    print("| pending requests | snapshot MB | snapshot s | restore s | longest stall s | write s | read s |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        proc = filled(n, args.items, config)
        assert proc.stats().pending_requests == n, proc.stats().pending_requests
        t = time.perf_counter()
        data = proc.snapshot()
        t_snap = time.perf_counter() - t
        del proc
        with StallWatch() as watch:
            t = time.perf_counter()
            back = StreamProcessor.restore(data, config=config, clock=ManualClock())
            t_restore = time.perf_counter() - t
        assert back.stats().pending_requests == n
        del back
        t_write = t_read = float("nan")
        if store is not None:
            t = time.perf_counter()
            ref = store.write(0, data, impressions_offset=0, clicks_offset=0, previous=None, timeout_s=600)
            t_write = time.perf_counter() - t
            t = time.perf_counter()
            got, _ = store.read(0, ref)
            t_read = time.perf_counter() - t
            assert got.snapshot == data
        print(f"| {n:,} | {len(data) / 1e6:.1f} | {t_snap:.2f} | {t_restore:.2f} | {watch.longest:.3f} "
              f"| {t_write:.2f} | {t_read:.2f} |", flush=True)
    if store is not None:
        store.close()
        store.producer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
