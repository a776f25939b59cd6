"""Benchmark of ``rankwatch replay`` end to end, against two references measured in the same run.

Run: ``python bench/replay.py [--requests N] [--repeat R] [--rate RPS]``. Writes N clean 20-item requests
(list-form impressions and their graded clicks, from :mod:`pipeline.traffic.generator`, replicated with
fresh ids) as two JSONL files, then times, as medians over ``--repeat`` runs of CPU time of this process
(``time.process_time``: steadier than wall time on a shared machine):

- ``json.loads``: the standard library's decode of every line of both files (read from disk);
- ``process_batch``: the streaming core's batch path alone, on the same events already in memory, in merged
  order, in batches of 4,096;
- ``replay``: the ``rankwatch replay --format json`` command on the two files (reading, merging, the core,
  the final result document), in this process.

It prints requests/s of each and the two ratios the product goals are stated in: replay / json.loads and
replay / process_batch. Machines differ: quote the ratios.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream_core import build_events  # noqa: E402

from rankwatch.cli import main as cli_main  # noqa: E402
from rankwatch.pipeline.clock import ManualClock  # noqa: E402
from rankwatch.pipeline.events.logs import EventLogMerge  # noqa: E402
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor  # noqa: E402


def _cpu(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=20.0, help="requests per second of event time")
    args = ap.parse_args()

    events = build_events(args.requests, rate=args.rate)
    with tempfile.TemporaryDirectory() as tmp:
        imp, clk = Path(tmp) / "impressions.jsonl", Path(tmp) / "clicks.jsonl"
        with imp.open("wb") as fi, clk.open("wb") as fc:
            for e in events:
                (fi if e.stream == "impressions" else fc).write(e.value + b"\n")
        size_mb = (imp.stat().st_size + clk.stat().st_size) / 1e6
        merge = EventLogMerge([(imp, "impressions"), (clk, "clicks")])
        batches = [(k, v) for k, v, _ in merge.batches()]
        merge.close()
        merged = [(k, v) for ks, vs in batches for k, v in zip(ks, vs, strict=True)]

        def loads() -> None:
            for path in (imp, clk):
                for line in path.read_bytes().splitlines():
                    json.loads(line)

        def core() -> None:
            proc = StreamProcessor(StreamConfig(windows=("5m", "1h")), clock=ManualClock())
            for i in range(0, len(merged), 4096):
                chunk = merged[i:i + 4096]
                proc.process_batch([k for k, _ in chunk], [v for _, v in chunk])
            proc.flush()

        def replay() -> None:
            out, err = io.StringIO(), io.StringIO()
            with redirect_stdout(out), redirect_stderr(err):
                code = cli_main(["replay", "--impressions", str(imp), "--clicks", str(clk), "--format", "json"])
            if code:
                raise SystemExit(f"replay failed: {err.getvalue()}")
            json.loads(out.getvalue())

        times: dict[str, list[float]] = {"json.loads": [], "process_batch": [], "replay": []}
        for _ in range(args.repeat):
            times["json.loads"].append(_cpu(loads))
            times["process_batch"].append(_cpu(core))
            times["replay"].append(_cpu(replay))
    rate = {k: args.requests / statistics.median(v) for k, v in times.items()}
    print(f"{args.requests} requests, {len(events)} events, {size_mb:.0f} MB JSONL; medians of {args.repeat} (CPU s)")
    for k, v in rate.items():
        print(f"  {k:14s} {statistics.median(times[k]):7.2f} s  {v:10,.0f} requests/s")
    print(f"replay / json.loads     = {rate['replay'] / rate['json.loads']:.2f}x")
    print(f"replay / process_batch  = {rate['replay'] / rate['process_batch']:.2f}x")


if __name__ == "__main__":
    main()
