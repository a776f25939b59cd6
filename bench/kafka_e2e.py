"""Kafka end to end: ``rankwatch run``'s consume rate against raw clients on the same topics, and scale-out.

Needs a running broker (``deploy/kafka/local.sh start``; ``--bootstrap-servers`` to point elsewhere).

1. Fills two fresh co-partitioned topics with generated traffic (``--requests`` requests of 20 items, about
   2 feedback events each, 1 % duplicates, 0.5 % bad lines, ``--partitions`` partitions).
2. Raw rates, polling every message of both topics and discarding it, CRCs verified by both clients:
   confluent-kafka (librdkafka, ``consume(num_messages=2000)``, ``check.crcs=true``; the physical reference
   for a Python consumer here) and kafka-python (``max_poll_records=2000``, ``check_crcs=True``, the
   ``crc32c`` C extension), the client ``rankwatch run`` uses with the same settings.
3. ``rankwatch run``: :class:`consumers.service.ConsumerService` with the exporter's ``MetricsState`` (through
   the ``ExporterFeed`` thread) as the window and health sink, exactly as the command wires them (without
   the HTTP server), the streaming cores in their own process (``--in-process-core``: not), in a child process
   with a fresh group. Checkpoints, alignment and dead letters are all on.
4. Scale-out: two such children in one group, against one child, timed the same way. The broker runs on
   the same 2 cores, so two instances compete with it and with each other: the ratio is a floor.

Every rate is timed from the first record to the last one (group joins and client start-up left out).
``--cli`` adds ``rankwatch run --config`` itself, timed from the outside as a user would: its /metrics
scraped every 50 ms, from the first event counted to the final count (the counters move every 0.25 s).
The CPU of ``rankwatch run`` is that of both of its processes; the last lines split it.
Prints each run, medians over ``--repeat`` runs, and the ratios within each run (goal >= 0.6).

    python bench/kafka_e2e.py --requests 30000 --repeat 3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402

from rankwatch.consumers.producer import produce_events  # noqa: E402
from rankwatch.consumers.service import ConsumerService  # noqa: E402
from rankwatch.consumers.settings import KafkaSettings  # noqa: E402
from rankwatch.consumers.topics import ensure_topic  # noqa: E402
from rankwatch.crc import crc32c_is_c  # noqa: E402
from rankwatch.pipeline.stream.processor import StreamConfig  # noqa: E402
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_events  # noqa: E402

POLL_RECORDS = 2000


class WallClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


def fill(boot: str, prefix: str, requests: int, partitions: int, rate: float = 50.0) -> int:
    client = {"bootstrap_servers": [boot]}
    for t in ("imp", "clk"):
        ensure_topic(client, f"{prefix}-{t}", partitions=partitions)
    cfg = TrafficConfig(seed=1, start=datetime.now(UTC) - timedelta(seconds=requests / rate + 3600),
                        requests_per_second=rate, duration_s=requests / rate, items_per_request=20,
                        duplicate_rate=0.01, malformed_rate=0.005, out_of_order_ms=2000, attribution_window_ms=60_000)
    producer = KafkaProducer(**client, acks=1, linger_ms=50, batch_size=512 * 1024)
    report = produce_events(producer, generate_events(cfg), topics={"impressions": f"{prefix}-imp",
                                                                      "clicks": f"{prefix}-clk"})
    producer.close()
    return sum(report.sent.values())


def confluent_rate(boot: str, prefix: str, partitions: int, total: int) -> tuple[float, float]:
    """Messages per second of wall time and per second of this process's CPU time (all its threads)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as CTP

    consumer = Consumer({"bootstrap.servers": boot, "group.id": f"{prefix}-raw-c", "enable.auto.commit": False,
                         "check.crcs": True})
    consumer.assign([CTP(f"{prefix}-{t}", p, OFFSET_BEGINNING) for t in ("imp", "clk") for p in range(partitions)])
    rates = timed_from_first_record(
        lambda: sum(1 for m in consumer.consume(num_messages=POLL_RECORDS, timeout=0.5) if m.error() is None), total
    )
    consumer.close()
    return rates


def timed_from_first_record(poll_count: Callable[[], int], total: int) -> tuple[float, float]:
    """Messages per wall second and per CPU second of a poll loop, timed from the first record to the last
    (the first poll's records start the clock, so they are not counted)."""
    seen = n_first = 0
    first = None
    cpu0 = 0.0
    while seen < total:
        n = poll_count()
        if n and first is None:
            first, cpu0, n_first = time.perf_counter(), time.process_time(), n
        seen += n
    elapsed, cpu = time.perf_counter() - (first or time.perf_counter()), time.process_time() - cpu0
    return (seen - n_first) / elapsed, (seen - n_first) / cpu


def raw_rate(boot: str, prefix: str, partitions: int, total: int) -> tuple[float, float]:
    tps = [TopicPartition(f"{prefix}-{t}", p) for t in ("imp", "clk") for p in range(partitions)]
    consumer = KafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False, max_poll_records=POLL_RECORDS,
                             check_crcs=True)
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    rates = timed_from_first_record(lambda: sum(len(v) for v in consumer.poll(timeout_ms=500).values()), total)
    consumer.close()
    return rates


def stream_config(windows: str, attribution: str) -> StreamConfig:
    from rankwatch.pipeline.stream.durations import parse_duration_ms

    return StreamConfig(windows=tuple(windows.split(",")), attribution_window_ms=parse_duration_ms(attribution))


def _service_child(boot: str, prefix: str, group: str, quiet_s: float, stream: StreamConfig,
                   core_process: bool = True) -> None:
    """One ``rankwatch run`` (service + exporter state) until nothing was fed for ``quiet_s``; prints JSON."""
    from rankwatch.commands.exporter_feed import ExporterFeed
    from rankwatch.exporters.state import MetricsState

    settings = KafkaSettings(bootstrap_servers=(boot,), impressions_topic=f"{prefix}-imp", clicks_topic=f"{prefix}-clk",
                             group_id=group, checkpoint_topic=f"{prefix}.checkpoints",
                             dead_letter_topic=f"{prefix}.dead-letters", max_poll_records=POLL_RECORDS,
                             core_process=core_process)
    state = MetricsState.for_stream(stream)
    exporter = ExporterFeed(state)  # what rankwatch run wires

    from rankwatch.consumers import alignment

    counted = [0]
    feed = alignment.feed_pair

    def counting_feed(*a: Any, **kw: Any) -> Any:  # records fed, summed over every pair this child ever owned
        out = feed(*a, **kw)
        counted[0] += out[1]
        return out

    alignment.feed_pair = counting_feed  # type: ignore[assignment]
    service = ConsumerService(settings, stream, on_window=exporter.add, clock=WallClock(), on_health=exporter.health)
    service.start()
    calls: dict[str, list[tuple[float, float]]] = {"poll": [], "end_offsets": []}
    # Where the consuming thread waits: (start, seconds) of each call (end offsets have their own client).
    offsets = service._offsets.client if service._offsets is not None else service._consumer
    for name, client in (("poll", service._consumer), ("end_offsets", offsets)):
        setattr(client, name, _timed(getattr(client, name), calls[name]))
    spies: list[subprocess.Popen[bytes]] = []
    started = time.time()
    gc.freeze()  # as rankwatch run does
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    first = last = None
    fed_first = fed = 0
    cpu_first = cpu_last = core_first = core_last = 0.0
    while True:
        now, total = time.time(), counted[0]
        if total != fed:
            cpu, core = time.process_time(), _core_cpu(service)
            if first is None:
                first, fed_first, cpu_first, core_first = now, total, cpu, core
                spies = _py_spies(service, os.environ.get("RANKWATCH_BENCH_PY_SPY"))  # the core process is up now
            fed, last, cpu_last, core_last = total, now, cpu, core
        elif last is not None and now - last > quiet_s:
            break
        elif last is None and service.ready() and now - started > 30:
            break  # assigned, but the other instance had fed everything already
        elif not thread.is_alive():
            raise SystemExit("rankwatch run ended early (its error is above)")
        time.sleep(0.01)
    for spy in spies:
        spy.send_signal(2)  # py-spy writes its profile on SIGINT
        spy.wait(timeout=60)
    service.stop()
    thread.join(timeout=60)
    exporter.close()
    waits = {name: [d for t, d in spans if first is not None and last is not None and first <= t <= last]
             for name, spans in calls.items()}
    print(json.dumps({"first": first, "last": last, "fed_first": fed_first, "fed": fed, "cpu": cpu_last - cpu_first,
                      "core_cpu": core_last - core_first,
                      "waits": {name: [len(ds), sum(ds)] for name, ds in waits.items()}}))


def _py_spies(service: ConsumerService, out: str | None) -> list[subprocess.Popen[bytes]]:
    """``--py-spy DIR``: py-spy (raw collapsed stacks, idle included) on this child and on its core process."""
    if not out:
        return []
    process = getattr(service._cores, "_process", None)
    pids = {"consuming": os.getpid(), **({"core": process.pid} if process is not None and process.pid else {})}
    return [subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", "250", "--idle", "--threads", "--format",
                              "raw", "--output", str(Path(out) / f"{name}-{os.getpid()}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in pids.items()]


def _timed(fn: Callable[..., Any], spans: list[tuple[float, float]]) -> Callable[..., Any]:
    def timed(*a: Any, **kw: Any) -> Any:
        t0 = time.time()
        try:
            return fn(*a, **kw)
        finally:
            spans.append((t0, time.time() - t0))
    return timed


def _core_cpu(service: ConsumerService) -> float:
    """CPU seconds so far of the service's core process (0 when the cores run in-process)."""
    process = getattr(service._cores, "_process", None)
    if process is None or process.pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def service_rate(boot: str, prefix: str, instances: int, total: int, extra: list[str],
                 py_spy: str | None = None) -> tuple[float, float, float, float]:
    """``instances`` children in one fresh group: messages per second of wall time from the first record to
    the last, and per second of the children's CPU time (summed, core processes included); then the CPU
    µs per message of the consuming processes and of the core processes."""
    group = f"{prefix}-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    if py_spy:
        Path(py_spy).mkdir(parents=True, exist_ok=True)
        env["RANKWATCH_BENCH_PY_SPY"] = py_spy
    procs = [subprocess.Popen([sys.executable, __file__, "--bootstrap-servers", boot, *extra, "--child", prefix, group],
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(instances)]
    results = [json.loads(p.communicate(timeout=900)[0].strip().splitlines()[-1]) for p in procs]
    fed = sum(r["fed"] for r in results)
    assert fed >= total, (fed, total)  # a rebalance may re-feed records from a checkpoint, never lose any
    results = [r for r in results if r["first"] is not None]
    first = min(r["first"] for r in results)
    last = max(r["last"] for r in results)
    starts = [r["fed_first"] for r in results if r["first"] == first]
    n = fed - starts[0]
    consuming, core = sum(r["cpu"] for r in results), sum(r["core_cpu"] for r in results)
    for r in results:  # where each consuming thread waited, within its first-to-last-record span
        span = r["last"] - r["first"]
        print(f"    consuming thread, of {span:.2f} s: " + ", ".join(
            f"{name} {n} calls {t:.2f} s ({100 * t / span:.0f} %)" for name, (n, t) in r["waits"].items()), flush=True)
    return n / (last - first), n / (consuming + core), 1e6 * consuming / n, 1e6 * core / n


def _events_counted(url: str) -> float | None:
    """Sum of ``rankwatch_events_total`` over every stream and outcome on ``url`` (None: not answering)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("rankwatch_events_total{"))


def cli_rate(boot: str, prefix: str, windows: str, attribution: str, core_process: bool, quiet_s: float = 4.0) -> float:
    """``rankwatch run --config`` as a user starts it, timed from the outside: /metrics scraped every 50 ms,
    messages per second from the first scrape with events counted to the first one at the final count
    (the counters move once a second, with the health refresh: a run of a few seconds carries +-1 s)."""
    import socket
    import tempfile

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sizes = ", ".join(f'"{w}"' for w in windows.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "run.toml"
        config.write_text(f"""
[kafka]
bootstrap_servers = ["{boot}"]
group_id = "{prefix}-cli-{uuid.uuid4().hex[:6]}"
max_poll_records = {POLL_RECORDS}
core_process = {str(core_process).lower()}
[topics]
impressions = "{prefix}-imp"
clicks = "{prefix}-clk"
checkpoints = "{prefix}.checkpoints"
dead_letter = "{prefix}.dead-letters"
[windows]
sizes = [{sizes}]
attribution = "{attribution}"
[exporter]
enabled = true
port = {port}
""")
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        proc = subprocess.Popen([sys.executable, "-m", "rankwatch", "run", "--config", str(config), "--log-level", "warning"],
                                env=env, stdout=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/metrics"
        first = last = None
        count = 0.0
        started = time.perf_counter()
        try:
            while True:
                now, got = time.perf_counter(), _events_counted(url)
                if first is None and now - started > 90:
                    raise SystemExit("rankwatch run counted no event in 90 s (not assigned? see its /readyz)")
                if got:
                    if first is None:
                        first, first_count = now, got
                    if got != count:
                        count, last = got, now
                    elif now - last > quiet_s:
                        break
                if proc.poll() is not None:
                    raise SystemExit(f"rankwatch run exited with {proc.returncode}")
                time.sleep(0.05)
        finally:
            proc.terminate()
            proc.wait(60)
    assert first is not None and last is not None and last > first, "no events counted"
    return (count - first_count) / (last - first)


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
    parser.add_argument("--requests", type=int, default=30_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-scale-out", action="store_true", help="skip the two-instance runs")
    parser.add_argument("--paced-seconds", type=float, default=0.0, help="also measure the publication delay")
    parser.add_argument("--rate", type=float, default=50.0,
                        help="requests per second of event time in the filled traffic (all partitions together)")
    parser.add_argument("--windows", default="1m,5m", help="window sizes of rankwatch run (product default: 5m,1h)")
    parser.add_argument("--attribution", default="1m", help="attribution window (product default: 30m)")
    parser.add_argument("--cli", action="store_true",
                        help="also time `rankwatch run --config` from the outside (its /metrics event counters)")
    parser.add_argument("--in-process-core", action="store_true",
                        help="rankwatch run with [kafka] core_process = false (the core in the consuming process)")
    parser.add_argument("--py-spy", metavar="DIR",
                        help="record py-spy profiles (raw collapsed stacks) of each rankwatch run child's two processes")
    parser.add_argument("--child", nargs=2, metavar=("PREFIX", "GROUP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    boot = args.bootstrap_servers
    if args.child:
        _service_child(boot, args.child[0], args.child[1], quiet_s=3.0,
                       stream=stream_config(args.windows, args.attribution), core_process=not args.in_process_core)
        return
    print(f"kafka-python CRC-32C: {'crc32c C extension' if crc32c_is_c() else 'PURE PYTHON (install crc32c)'}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (the broker shares them)")
    prefix = "bench-" + uuid.uuid4().hex[:8]
    t0 = time.perf_counter()
    total = fill(boot, prefix, args.requests, args.partitions, args.rate)
    extra = ["--windows", args.windows, "--attribution", args.attribution, *(["--in-process-core"] if args.in_process_core else [])]
    print(f"filled {total} messages ({args.requests} requests, 20 items each, {args.rate:g} requests/s of event time, "
          f"{args.partitions} partitions per topic) in {time.perf_counter() - t0:.1f} s; rankwatch run: windows "
          f"{args.windows}, attribution {args.attribution}")
    rows: dict[str, list[tuple[float, ...]]] = {"confluent": [], "raw": [], "run": [], "run2": [], "cli": []}
    for i in range(args.repeat):
        # Interleaved, so a change of the machine's load hits every consumer alike.
        rows["confluent"].append(confluent_rate(boot, prefix, args.partitions, total))
        rows["raw"].append(raw_rate(boot, prefix, args.partitions, total))
        rows["run"].append(service_rate(boot, prefix, 1, total, extra, args.py_spy))
        (cw, cc), (rw, rc), (sw, sc, *_) = rows["confluent"][-1], rows["raw"][-1], rows["run"][-1]
        line = (f"run {i + 1}: msg/s wall (CPU): confluent-kafka {cw:,.0f} ({cc:,.0f}), kafka-python {rw:,.0f} ({rc:,.0f}), "
                f"rankwatch run {sw:,.0f} ({sc:,.0f}); run/kafka-python {sw / rw:.2f} wall, {sc / rc:.2f} CPU")
        if args.cli:
            rows["cli"].append((cli_rate(boot, prefix, args.windows, args.attribution, not args.in_process_core),))
            line += (f"; CLI from /metrics {rows['cli'][-1][0]:,.0f} ({rows['cli'][-1][0] / rw:.2f}x kafka-python, "
                     f"{rows['cli'][-1][0] / cw:.2f}x confluent-kafka)")
        if not args.no_scale_out:
            rows["run2"].append(service_rate(boot, prefix, 2, total, extra))
            line += f"; 2 instances {rows['run2'][-1][0]:,.0f} ({rows['run2'][-1][0] / sw:.2f}x one)"
        print(line, flush=True)

    def med(key: str, k: int) -> float:
        return statistics.median(r[k] for r in rows[key])

    wall = [s[0] / r[0] for s, r in zip(rows["run"], rows["raw"], strict=True)]
    cpu = [s[1] / r[1] for s, r in zip(rows["run"], rows["raw"], strict=True)]
    print(f"median of {args.repeat}, msg/s wall (CPU): confluent-kafka {med('confluent', 0):,.0f} ({med('confluent', 1):,.0f}), "
          f"kafka-python {med('raw', 0):,.0f} ({med('raw', 1):,.0f}), rankwatch run {med('run', 0):,.0f} ({med('run', 1):,.0f})")
    print(f"rankwatch run / kafka-python per run: wall {', '.join(f'{r:.2f}' for r in wall)} (median "
          f"{statistics.median(wall):.2f}, goal >= 0.6); CPU {', '.join(f'{r:.2f}' for r in cpu)} (median "
          f"{statistics.median(cpu):.2f}); kafka-python / confluent-kafka {med('raw', 0) / med('confluent', 0):.2f} wall")
    print(f"per message: kafka-python {1e6 / med('raw', 1):.1f} us CPU, rankwatch run {1e6 / med('run', 1):.1f} us CPU "
          f"(rankwatch adds {1e6 / med('run', 1) - 1e6 / med('raw', 1):.1f} us): consuming process {med('run', 2):.1f} us, "
          f"core process {med('run', 3):.1f} us (the slower of the two sets the rate when both have a core)")
    if rows["cli"]:
        ext = [c[0] / r[0] for c, r in zip(rows["cli"], rows["raw"], strict=True)]
        print(f"rankwatch run CLI timed from /metrics / kafka-python (wall): {', '.join(f'{x:.2f}' for x in ext)} "
              f"(median {statistics.median(ext):.2f}, goal >= 0.6)")
        conf = [c[0] / r[0] for c, r in zip(rows["cli"], rows["confluent"], strict=True)]
        print(f"rankwatch run CLI timed from /metrics / confluent-kafka (wall): {', '.join(f'{x:.2f}' for x in conf)} "
              f"(median {statistics.median(conf):.2f})")
    if rows["run2"]:
        scale = [b[0] / a[0] for a, b in zip(rows["run"], rows["run2"], strict=True)]
        print(f"two instances / one (wall): {', '.join(f'{x:.2f}' for x in scale)} (median {statistics.median(scale):.2f}; "
              "the broker runs on the same 2 cores)")
    if args.paced_seconds > 0:
        delays = publication_delay(boot, prefix + "-paced", args.paced_seconds)
        floor = 5.0 + 2.0  # attribution + allowed disorder (+ up to one 1 s finalization step)
        if delays:
            print(f"publication delay after window end, 10s windows, attribution 5s, disorder 2s (floor {floor:.0f} s): "
                  f"median {statistics.median(delays):.2f} s, max {max(delays):.2f} s over {len(delays)} windows")


if __name__ == "__main__":
    main()
