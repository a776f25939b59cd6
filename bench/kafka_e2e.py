"""Kafka end to end: ``rankwatch run``'s consume rate against raw kafka-python, and publication delay.

Needs a running broker (``deploy/kafka/local.sh start``; ``--bootstrap-servers`` to point elsewhere).

1. Fills two fresh co-partitioned topics with generated traffic (``--requests`` requests).
2. Raw rate: a kafka-python consumer polls every message of both topics and discards it (``--repeat`` runs).
3. Service rate: :class:`consumers.service.ConsumerService` (what ``rankwatch run`` runs, with checkpoints,
   alignment, dead letters and windows) consumes the same messages with a fresh group each run. Both rates
   are timed from the first record to the last one, so group joins and client start-up are left out.
4. Delay: traffic paced in real time for ``--paced-seconds`` with 10 s windows; for every published window
   the delay from its end (event time = wall time here) to its publication. The floor is the attribution
   window plus the allowed disorder (plus up to one finalization step): a window cannot close earlier.

Prints medians of the repeats and the ratio service / raw (goal >= 0.6).

    python bench/kafka_e2e.py --requests 20000 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from rankwatch.consumers.producer import produce_events
from rankwatch.consumers.service import ConsumerService
from rankwatch.consumers.settings import KafkaSettings
from rankwatch.consumers.topics import ensure_topic
from rankwatch.pipeline.generator import TrafficConfig, generate_events
from rankwatch.pipeline.stream import StreamConfig


class WallClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


def fill(boot: str, prefix: str, requests: int, partitions: int) -> int:
    client = {"bootstrap_servers": [boot]}
    for t in ("imp", "clk"):
        ensure_topic(client, f"{prefix}-{t}", partitions=partitions)
    rate = 50.0
    cfg = TrafficConfig(seed=1, start=datetime.now(UTC) - timedelta(seconds=requests / rate + 3600),
                        requests_per_second=rate, duration_s=requests / rate, items_per_request=20,
                        duplicate_rate=0.01, malformed_rate=0.005, out_of_order_ms=2000, attribution_window_ms=60_000)
    producer = KafkaProducer(**client, acks=1, linger_ms=50, batch_size=512 * 1024)
    report = produce_events(producer, generate_events(cfg), topics={"impressions": f"{prefix}-imp",
                                                                      "clicks": f"{prefix}-clk"})
    producer.close()
    return sum(report.sent.values())


def raw_rate(boot: str, prefix: str, partitions: int, total: int) -> float:
    tps = [TopicPartition(f"{prefix}-{t}", p) for t in ("imp", "clk") for p in range(partitions)]
    consumer = KafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False, max_poll_records=2000)
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    seen = 0
    first = None
    while seen < total:
        batch = consumer.poll(timeout_ms=500)
        n = sum(len(v) for v in batch.values())
        if n and first is None:
            first = time.perf_counter()
            n_first = n
        seen += n
    elapsed = time.perf_counter() - (first or time.perf_counter())
    consumer.close()
    return (seen - n_first) / elapsed


def service_rate(boot: str, prefix: str, partitions: int, total: int) -> tuple[float, int]:
    settings = KafkaSettings(bootstrap_servers=(boot,), impressions_topic=f"{prefix}-imp", clicks_topic=f"{prefix}-clk",
                             group_id=f"{prefix}-{uuid.uuid4().hex[:6]}", checkpoint_topic=f"{prefix}.checkpoints",
                             dead_letter_topic=f"{prefix}.dead-letters")
    windows: list[object] = []
    stream = StreamConfig(windows=("1m", "5m"), attribution_window_ms=60_000)  # windows close during the run
    service = ConsumerService(settings, stream, on_window=windows.append, clock=WallClock())
    service.start()
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    first = None
    fed_first = 0
    while True:
        pairs = list(service._pairs.values())
        fed = sum((off or 0) for pair in pairs for off in pair.next_offset.values())
        if fed and first is None:
            first, fed_first = time.perf_counter(), fed
        if fed >= total:
            break
        time.sleep(0.02)
    elapsed = time.perf_counter() - (first or time.perf_counter())
    service.stop()
    thread.join(timeout=60)
    return (total - fed_first) / elapsed, len(windows)


def publication_delay(boot: str, prefix: str, seconds: float) -> list[float]:
    client = {"bootstrap_servers": [boot]}
    for t in ("imp", "clk"):
        ensure_topic(client, f"{prefix}-{t}", partitions=2)
    settings = KafkaSettings(bootstrap_servers=(boot,), impressions_topic=f"{prefix}-imp", clicks_topic=f"{prefix}-clk",
                             group_id=f"{prefix}-delay", checkpoint_topic=f"{prefix}.checkpoints",
                             dead_letter_topic=f"{prefix}.dead-letters")
    stream = StreamConfig(windows=("10s",), attribution_window_ms=5_000, allowed_disorder_ms=2_000)
    delays: list[float] = []

    def on_window(w: object) -> None:
        delays.append(time.time() - w.end.timestamp())  # type: ignore[attr-defined]

    service = ConsumerService(settings, stream, on_window=on_window, clock=WallClock())
    service.start()
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    start = datetime.now(UTC)
    cfg = TrafficConfig(seed=2, start=start, requests_per_second=50, duration_s=seconds, items_per_request=20,
                        out_of_order_ms=500, attribution_window_ms=5_000)
    producer = KafkaProducer(**client, acks=1, linger_ms=5)
    produce_events(producer, generate_events(cfg), topics={"impressions": f"{prefix}-imp", "clicks": f"{prefix}-clk"},
                   pace_from_ms=int(start.timestamp() * 1000))
    producer.close()
    service.stop()
    thread.join(timeout=60)
    return delays[2:]  # the first windows start mid-way and wait for the group to join


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--paced-seconds", type=float, default=60.0)
    args = parser.parse_args()
    boot = args.bootstrap_servers
    prefix = "bench-" + uuid.uuid4().hex[:8]
    t0 = time.perf_counter()
    total = fill(boot, prefix, args.requests, args.partitions)
    print(f"filled {total} messages ({args.requests} requests, 20 items each) in {time.perf_counter() - t0:.1f} s")
    raws, svcs = [], []
    for i in range(args.repeat):
        raws.append(raw_rate(boot, prefix, args.partitions, total))
        rate, n_windows = service_rate(boot, prefix, args.partitions, total)
        svcs.append(rate)
        print(f"run {i + 1}: raw {raws[-1]:,.0f} msg/s, rankwatch run {svcs[-1]:,.0f} msg/s "
              f"(ratio {svcs[-1] / raws[-1]:.2f}, {n_windows} windows)")
    raw, svc = statistics.median(raws), statistics.median(svcs)
    print(f"median: raw kafka-python {raw:,.0f} msg/s, rankwatch run {svc:,.0f} msg/s, ratio {svc / raw:.2f} (goal >= 0.6)")
    if args.paced_seconds > 0:
        delays = publication_delay(boot, prefix + "-paced", args.paced_seconds)
        floor = 5.0 + 2.0  # attribution + allowed disorder (+ up to one 1 s finalization step)
        if delays:
            print(f"publication delay after window end, 10s windows, attribution 5s, disorder 2s (floor {floor:.0f} s): "
                  f"median {statistics.median(delays):.2f} s, max {max(delays):.2f} s over {len(delays)} windows")


if __name__ == "__main__":
    main()
